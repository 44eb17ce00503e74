package harness

import (
	"context"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The continuous backup's pod on an APINode. The real Deployment and ReplicaSet controllers
// create it from the Deployment the hook returns; the node runs its one container, the member
// tool's stream-backup, in-process on a loopback address of its own (its pod IP, which the
// stream's Service resolves to), Ready while the process runs and restarted after the
// kubelet's back-off when it ends, as Streams does in the end-to-end tier. A deleted pod's
// process is stopped before the pod goes.

// syncStreams starts the stream pods of ours that do not run yet and stops those deleted.
func (n *APINode) syncStreams(ctx context.Context, ours map[string]*corev1.Pod) {
	live := map[types.UID]bool{}
	for name, p := range ours {
		if !isStreamPod(p) {
			continue
		}
		live[p.UID] = true
		n.mu.Lock()
		r := n.streams[p.UID]
		n.mu.Unlock()
		switch {
		case p.DeletionTimestamp != nil:
			n.stopStream(p.UID, r)
			n.Store.Remove("Pod", name)
			delete(ours, name)
			err := n.Client.CoreV1().Pods(n.Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0)), Preconditions: &metav1.Preconditions{UID: &p.UID}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				n.Logf("node %s: deleting pod %s: %v", n.Name, name, err)
			}
		case r == nil:
			n.startStream(ctx, p)
		}
	}
	n.mu.Lock()
	var gone []types.UID
	for uid := range n.streams {
		if !live[uid] {
			gone = append(gone, uid)
		}
	}
	n.mu.Unlock()
	// A pod deleted at once (no grace): its process dies with it.
	for _, uid := range gone {
		n.mu.Lock()
		r := n.streams[uid]
		n.mu.Unlock()
		n.stopStream(uid, r)
	}
}

// stopStream stops a stream pod's process and waits for it.
func (n *APINode) stopStream(uid types.UID, r *streamRun) {
	if r == nil {
		return
	}
	r.stop()
	<-r.done
	n.mu.Lock()
	delete(n.streams, uid)
	n.mu.Unlock()
}

// startStream gives the mirrored pod an address and runs its container until the pod goes.
// A pod whose command the harness cannot run is logged once and left Pending.
func (n *APINode) startStream(ctx context.Context, p *corev1.Pod) {
	o, ok := n.Store.Get("Pod", p.Name)
	if !ok || o.GetUID() != p.UID {
		return
	}
	pod := o.(*corev1.Pod).DeepCopy()
	ip := allocateIP()
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		HostIP: "127.0.0.1", HostIPs: []corev1.HostIP{{IP: "127.0.0.1"}}, StartTime: &now}
	dir := filepath.Join(n.Root, "pods", p.Name+"-"+string(p.UID)[len(p.UID)-6:])
	args, err := streamArgs(pod, func(p *corev1.Pod) (map[string]string, error) { return n.Kubelet.jobMounts(p, dir) })
	runCtx, stop := context.WithCancel(ctx)
	r := &streamRun{pod: p.Name, stop: stop, done: make(chan struct{})}
	n.mu.Lock()
	n.streams[p.UID] = r
	n.mu.Unlock()
	if err != nil {
		n.Logf("node %s: stream pod %s: %v", n.Name, p.Name, err)
		stop()
		close(r.done)
		return
	}
	if err := n.Store.UpdateStatus(pod); err != nil {
		n.Logf("node %s: stream pod %s: %v", n.Name, p.Name, err)
	}
	n.work.Add(1)
	go func() {
		defer n.work.Done()
		streamLoop(runCtx, n.Tools, r, args, n.Kubelet.TimeScale, n.Logf, func(ready bool) { n.setStreamReady(pod, r, ready) })
	}()
}

// setStreamReady writes the stream pod's conditions and container status: Ready while its
// process runs, as a readiness probe of its metrics port would say.
func (n *APINode) setStreamReady(started *corev1.Pod, r *streamRun, ready bool) {
	o, ok := n.Store.Get("Pod", started.Name)
	if !ok || o.GetUID() != started.UID {
		return
	}
	p := o.(*corev1.Pod).DeepCopy()
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: *started.Status.StartTime},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: *started.Status.StartTime},
		{Type: corev1.ContainersReady, Status: st, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: st, LastTransitionTime: now},
	}
	c := p.Spec.Containers[0]
	r.mu.Lock()
	restarts := int32(max(r.starts-1, 0))
	r.mu.Unlock()
	cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: ready, Started: ptr(ready), RestartCount: restarts}
	if ready {
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: now}
	} else {
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}
	}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{cs}
	_ = n.Store.UpdateStatus(p)
}
