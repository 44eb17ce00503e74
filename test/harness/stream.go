package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	gosync "sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/sync"
)

// Streams plays the Deployment controller and the kubelet for the continuous backup's
// Deployment: while the store holds it, one pod runs its container's command (the member
// tool's stream-backup) in-process, on a loopback address of its own, so that its Service
// resolves to it. A changed template or a deleted Deployment stops the pod before another
// starts (Recreate). Kill stops the process; it restarts after the kubelet's back-off, and
// meanwhile the pod is not Ready.
type Streams struct {
	Store     *Store
	Tools     Tools
	TimeScale float64
	// Mounts materialises a pod's volumes and returns mount path → directory.
	Mounts func(p *corev1.Pod) (map[string]string, error)
	Logf   func(format string, args ...any)

	mu   gosync.Mutex
	runs map[string]*streamRun // Deployment name → its pod
	seq  int
}

type streamRun struct {
	template string
	pod      string
	stop     context.CancelFunc
	done     chan struct{}

	mu     gosync.Mutex
	kill   context.CancelFunc // the running process, nil between two
	starts int
}

// NewStreams returns the stream runner.
func NewStreams(s *Store, tools Tools, timeScale float64, logf func(string, ...any)) *Streams {
	return &Streams{Store: s, Tools: tools, TimeScale: timeScale, Logf: logf, runs: map[string]*streamRun{}}
}

// Run reconciles on every change until ctx ends, then stops every pod.
func (s *Streams) Run(ctx context.Context) {
	runOnChange(ctx, s.Store, 200*time.Millisecond, func() { s.reconcile(ctx) })
	s.mu.Lock()
	runs := s.runs
	s.runs = map[string]*streamRun{}
	s.mu.Unlock()
	for _, r := range runs {
		r.stop()
		<-r.done
	}
}

func (s *Streams) reconcile(ctx context.Context) {
	want := map[string]*appsv1.Deployment{}
	for _, o := range s.Store.List("Deployment") {
		d := o.(*appsv1.Deployment)
		want[d.Name] = d
	}
	s.mu.Lock()
	var gone []*streamRun
	for name, r := range s.runs {
		if d, ok := want[name]; !ok || templateOf(d) != r.template {
			gone = append(gone, r)
			delete(s.runs, name)
		}
	}
	s.mu.Unlock()
	for _, r := range gone {
		r.stop()
		<-r.done
		s.Store.Remove("Pod", r.pod)
	}
	for name, d := range want {
		s.mu.Lock()
		_, ok := s.runs[name]
		if !ok {
			s.seq++
		}
		seq := s.seq
		s.mu.Unlock()
		if ok {
			continue
		}
		if r, err := s.start(ctx, d, seq); err != nil {
			s.Logf("deployment %s: %v", name, err)
		} else {
			s.mu.Lock()
			s.runs[name] = r
			s.mu.Unlock()
		}
	}
}

func templateOf(d *appsv1.Deployment) string {
	b, _ := json.Marshal(d.Spec.Template)
	return string(b)
}

// start creates the Deployment's pod and runs its container until stopped.
func (s *Streams) start(ctx context.Context, d *appsv1.Deployment, seq int) (*streamRun, error) {
	pod, args, err := s.pod(d, fmt.Sprintf("%s-%05d", d.Name, seq))
	if err != nil {
		return nil, err
	}
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID, Controller: ptr(true)}}
	if err := s.Store.Create(pod); err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(ctx)
	r := &streamRun{template: templateOf(d), pod: pod.Name, stop: stop, done: make(chan struct{})}
	go s.loop(runCtx, r, args)
	return r, nil
}

// pod is a pod of Deployment d's template named name, on a loopback address of its own, with
// its volumes materialised, and the command its container runs there.
func (s *Streams) pod(d *appsv1.Deployment, name string) (*corev1.Pod, []string, error) {
	pod := &corev1.Pod{ObjectMeta: *d.Spec.Template.ObjectMeta.DeepCopy(), Spec: *d.Spec.Template.Spec.DeepCopy()}
	pod.Name = name
	ip := allocateIP()
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, HostIP: "127.0.0.1"}
	args, err := streamArgs(pod, s.Mounts)
	if err != nil {
		return nil, nil, err
	}
	return pod, args, nil
}

// streamArgs is the member tool's command line a stream pod's one container runs, on the
// pod's address (status.podIP) and volumes (mounts materialises them).
func streamArgs(pod *corev1.Pod, mounts func(p *corev1.Pod) (map[string]string, error)) ([]string, error) {
	cs := pod.Spec.Containers
	if len(cs) != 1 {
		return nil, fmt.Errorf("want one container, got %d", len(cs))
	}
	argv := append(append([]string(nil), cs[0].Command...), cs[0].Args...)
	if len(argv) < 2 || filepath.Base(argv[0]) != toolBinary {
		return nil, fmt.Errorf("the harness runs only %s, got %q", toolBinary, argv)
	}
	dirs, err := mounts(pod)
	if err != nil {
		return nil, err
	}
	// The container's environment, as the kubelet expands $(VAR) in its command: the pod's
	// name and namespace are all the stream's takes.
	env := map[string]string{}
	for _, e := range cs[0].Env {
		if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil {
			env[e.Name] = e.Value
			continue
		}
		switch e.ValueFrom.FieldRef.FieldPath {
		case "metadata.name":
			env[e.Name] = pod.Name
		case "metadata.namespace":
			env[e.Name] = pod.Namespace
		}
	}
	args := make([]string, 0, len(argv)-1)
	for _, a := range argv[1:] {
		if addr, ok := strings.CutPrefix(a, "--metrics-addr=:"); ok {
			a = "--metrics-addr=" + pod.Status.PodIP + ":" + addr
		}
		args = append(args, rewritePath(expand(a, env), dirs))
	}
	return args, nil
}

// RunByHand runs, beside Deployment deployment's pod, a second stream with its command, as a
// person would in a pod of their own named name: outside the Deployment and its Service. It
// runs until stop, which waits for it to end; metrics is its metrics address.
func (s *Streams) RunByHand(ctx context.Context, deployment, name string) (stop func(), metrics string, err error) {
	o, ok := s.Store.Get("Deployment", deployment)
	if !ok {
		return nil, "", fmt.Errorf("no Deployment %s", deployment)
	}
	pod, args, err := s.pod(o.(*appsv1.Deployment), name)
	if err != nil {
		return nil, "", err
	}
	for _, a := range args {
		if addr, ok := strings.CutPrefix(a, "--metrics-addr="); ok {
			metrics = addr
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Logf("pod %s (by hand) runs %s", pod.Name, strings.Join(args, " "))
		out, err := s.Tools.Member(ctx, args)
		s.Logf("pod %s (by hand): stream-backup ended: %v %s", pod.Name, err, out)
	}()
	return func() { cancel(); <-done }, metrics, nil
}

// loop runs the container, restarting it after each exit with the kubelet's back-off.
func (s *Streams) loop(ctx context.Context, r *streamRun, args []string) {
	streamLoop(ctx, s.Tools, r, args, s.TimeScale, s.Logf, func(ready bool) { s.setReady(r.pod, ready) })
}

// streamLoop runs a stream pod's container (r) until ctx ends, restarting it after each exit
// with the kubelet's back-off; ready hears whether it runs. It closes r.done at the end.
func streamLoop(ctx context.Context, tools Tools, r *streamRun, args []string, timeScale float64, logf func(string, ...any), ready func(bool)) {
	defer close(r.done)
	for ctx.Err() == nil {
		pctx, kill := context.WithCancel(ctx)
		r.mu.Lock()
		r.kill = kill
		r.starts++
		r.mu.Unlock()
		ready(true)
		logf("pod %s runs %s", r.pod, strings.Join(args, " "))
		out, err := tools.Member(pctx, args)
		kill()
		ready(false)
		logf("pod %s: stream-backup ended: %v %s", r.pod, err, out)
		select {
		case <-ctx.Done():
		case <-time.After(max(time.Duration(float64(10*time.Second)*timeScale), 100*time.Millisecond)):
		}
	}
}

// setReady sets the pod's Ready condition: Ready while its process runs, as a readiness
// probe of its metrics port would say.
func (s *Streams) setReady(pod string, ready bool) {
	o, ok := s.Store.Get("Pod", pod)
	if !ok {
		return
	}
	p := o.(*corev1.Pod)
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st, LastTransitionTime: now}, {Type: corev1.ContainersReady, Status: st, LastTransitionTime: now}}
	_ = s.Store.UpdateStatus(p)
}

// Kill stops the running stream-backup of Deployment name, as a container killed; false
// when none runs. The pod restarts it after the back-off.
func (s *Streams) Kill(name string) bool {
	s.mu.Lock()
	r := s.runs[name]
	s.mu.Unlock()
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.kill == nil {
		return false
	}
	r.kill()
	r.kill = nil
	return true
}

// Starts counts the times Deployment name's current pod started its process; 0 when no pod.
func (s *Streams) Starts(name string) int {
	s.mu.Lock()
	r := s.runs[name]
	s.mu.Unlock()
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts
}

// isStreamPod: the continuous backup's pod, which Streams runs, not the kubelet.
func isStreamPod(p *corev1.Pod) bool { return p.Labels[sync.LabelBackupStreamOf] != "" }

// KillStream kills the cluster's continuous backup process (Streams.Kill).
func (e *Env) KillStream() bool {
	killed := e.Streams.Kill(sync.BackupStreamName(e.Cluster))
	if killed {
		e.logf("continuous backup of %s killed", e.Cluster)
	}
	return killed
}

// BindClaim makes claim name a bound volume at dir, outside any StatefulSet: a backup
// destination that Jobs, the stream and a restoring seed mount.
func (c *StatefulSets) BindClaim(name, dir string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.volumes[name] = dir
}
