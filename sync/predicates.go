package sync

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/joinstate"
)

// Thresholds of the health judgements.
const (
	// crashRestarts: a pod whose etcd container restarted this often and is backing off
	// again is failing, not starting.
	crashRestarts = 5
	// stuckAfter: a member that has been waited on this long is given up on and replaced (a
	// voter) or removed (a learner).
	stuckAfter = 10 * time.Minute
	// learnerReadyPercent: a learner whose raft index is within this share of the leader's
	// is caught up; etcd refuses promotion below 90%.
	learnerReadyPercent = 90
	// startDeadline: a pod created this long ago whose containers the kubelet still has not
	// created cannot start (its volume does not attach or mount, its image does not arrive).
	// As long as a voter's grace period, which also waits that long for its pod: a voter whose
	// pod is still Pending then is held, never given up on (failureReason asks first).
	startDeadline = 10 * time.Minute
)

// isCaughtUp: the learner answered and its raft index is close enough to the leader's that
// etcd will promote it.
func isCaughtUp(learner, leader etcdstate.Member) bool {
	if !learner.Reachable || !learner.Healthy || leader.RaftIndex == 0 {
		return false
	}
	return learner.RaftIndex*100 >= leader.RaftIndex*learnerReadyPercent
}

// hasAlarm reports whether the member raised alarm (e.g. "CORRUPT", "NOSPACE").
func hasAlarm(m etcdstate.Member, alarm string) bool {
	for _, a := range m.Alarms {
		if a == alarm {
			return true
		}
	}
	return false
}

func isTerminating(p *corev1.Pod) bool { return p.DeletionTimestamp != nil }

// isReady: the pod's Ready condition is true. The StatefulSet controller replaces the next
// pod once the ones above it are ready.
func isReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// nodeNotReporting: the pod's Ready condition is False while the kubelet's last report of its
// etcd container says it runs and is ready. The kubelet writes both together; the node
// lifecycle controller, once the node stops reporting, sets only the pod's Ready condition
// to False (MarkPodsNotReady: the condition's reason stays the kubelet's, an event
// NodeNotReady goes on the pod) and leaves the container statuses as they were. So nothing
// on the node said etcd stopped: it may still run and serve its peers, and the pod is as
// unknown as a member only the hook cannot reach.
func nodeNotReporting(p *corev1.Pod) bool {
	cs := etcdStatus(p)
	return !isReady(p) && cs != nil && cs.Ready && cs.State.Running != nil
}

// mayServe: the pod is not going away and, as far as anything on its node last said, its etcd
// runs: Ready, or marked not Ready by the node controller alone.
func mayServe(p *corev1.Pod) bool {
	return p != nil && !isTerminating(p) && (isReady(p) || nodeNotReporting(p))
}

// etcdRunning: the pod is not going away and the kubelet reports its etcd container running.
func etcdRunning(p *corev1.Pod) bool {
	if p == nil || isTerminating(p) {
		return false
	}
	cs := etcdStatus(p)
	return cs != nil && cs.State.Running != nil
}

// isCrashLooping: the etcd container is in crash-loop back-off after restarting again and
// again; waiting longer will not help.
func isCrashLooping(p *corev1.Pod) bool {
	cs := etcdStatus(p)
	return cs != nil && cs.RestartCount >= crashRestarts && cs.State.Waiting != nil && cs.State.Waiting.Reason == "CrashLoopBackOff"
}

// etcdHasRun: the kubelet reports the pod's etcd container running, ready, or as having run
// and ended at least once.
func etcdHasRun(pod *corev1.Pod) bool {
	if isReady(pod) {
		return true
	}
	cs := etcdStatus(pod)
	return cs != nil && (cs.RestartCount > 0 || cs.State.Running != nil || cs.State.Terminated != nil || cs.LastTerminationState.Terminated != nil)
}

// etcdStatus is what the kubelet reports of the pod's etcd container; nil before it does.
func etcdStatus(p *corev1.Pod) *corev1.ContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if cs := &p.Status.ContainerStatuses[i]; cs.Name == "etcd" {
			return cs
		}
	}
	return nil
}

// launcherRefusal is why the pod's launcher refused to start etcd the last time the container
// ended, from the termination message it leaves (joinstate.Refused); "" when etcd runs, or
// the container ended for another reason.
func launcherRefusal(p *corev1.Pod) string {
	cs := etcdStatus(p)
	if cs == nil || cs.State.Running != nil {
		return ""
	}
	t := cs.State.Terminated
	if t == nil {
		t = cs.LastTerminationState.Terminated
	}
	if t == nil {
		return ""
	}
	why, ok := strings.CutPrefix(t.Message, joinstate.Refused)
	if !ok {
		return ""
	}
	return strings.TrimSpace(why)
}

// podStartFailure says why a pod cannot start its etcd at all (an image that cannot be pulled, a
// container that cannot be created, no node to run on, a claim that holds another cluster's
// data), or "". Replacing the member would not help: the new pod would fail the same way until
// the spec, the nodes or the claim change.
func podStartFailure(p *corev1.Pod) string {
	if why := launcherRefusal(p); strings.HasPrefix(why, joinstate.ForeignCluster) {
		return "its launcher refuses: " + why
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return "unschedulable: " + c.Message
		}
	}
	for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil {
			switch w.Reason {
			case "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError":
				return cs.Name + " container: " + w.Reason
			}
		}
	}
	return ""
}

// cannotStart says why the pod cannot start its etcd, or "": what podStartFailure reads from
// the pod, a claim whose file system failed to grow while the pod waits to mount it, or a pod
// still Pending with its containers not created startDeadline after it was created. The
// kubelet reports a mount that fails (an attach that never completes, a file system that
// cannot grow on an offline resize) only in Events, which the hook is not sent: the pod stays
// Pending, its containers waiting (ContainerCreating, or PodInitializing behind the init
// container). Nothing the planner does to the member helps then: replacing it would create the
// same pod on the same claim.
func (v *view) cannotStart(p *corev1.Pod) string {
	if why := podStartFailure(p); why != "" {
		return why
	}
	if p.Status.Phase != corev1.PodPending || isTerminating(p) {
		return ""
	}
	if ord, ok := ownPod(v.c, p); ok {
		if why := v.resizeFailure(ord); why != "" {
			return why
		}
	}
	if v.elapsedSince(p.CreationTimestamp.Time) < startDeadline {
		return ""
	}
	waiting := "its containers are not created"
	if cs := etcdStatus(p); cs != nil && cs.State.Waiting != nil && cs.State.Waiting.Reason != "" {
		waiting = "container etcd " + cs.State.Waiting.Reason
	}
	name := p.Name
	if c := podCondition(p, corev1.PodReadyToStartContainers); c != nil && c.Status == corev1.ConditionFalse {
		waiting += ", PodReadyToStartContainers False: its volumes are not mounted"
	}
	return fmt.Sprintf("Pending since %s, more than %s (%s); kubectl describe pod %s shows the kubelet's events",
		p.CreationTimestamp.UTC().Format(time.RFC3339), startDeadline, waiting, name)
}

// resizeFailure says why the claim at ord cannot grow, as its status reports it: the node or
// the controller failed to resize it (the NodeResizeError and ControllerResizeError
// conditions, or a resize marked infeasible); "" when it does not say so.
func (v *view) resizeFailure(ord int) string {
	vol := v.volumeOf(ord)
	if vol.claim == nil {
		return ""
	}
	for _, c := range vol.claim.Status.Conditions {
		if c.Status == corev1.ConditionTrue && (c.Type == corev1.PersistentVolumeClaimNodeResizeError || c.Type == corev1.PersistentVolumeClaimControllerResizeError) {
			return fmt.Sprintf("claim %s reports %s: %s", vol.name, c.Type, c.Message)
		}
	}
	switch s := vol.claim.Status.AllocatedResourceStatuses[corev1.ResourceStorage]; s {
	case corev1.PersistentVolumeClaimNodeResizeInfeasible, corev1.PersistentVolumeClaimControllerResizeInfeasible:
		return fmt.Sprintf("claim %s reports its resize %s", vol.name, s)
	}
	return ""
}

// podCondition is the pod's condition of type t, or nil.
func podCondition(p *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}
