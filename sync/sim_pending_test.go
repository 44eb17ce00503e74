package sync

import (
	"math/rand"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The simulator's slow node: a pod stays Pending after it is created while its image pulls
// and its volume attaches, for minutes and differently for each pod, and a learner on a large
// database takes long to apply the leader's log. Both are what a real cluster does and what
// the planner's clocks must not mistake for a failure.

// simPace is how slow the simulated nodes are.
type simPace struct {
	// pending is how long the next pod created at an ordinal stays Pending.
	pending map[int]time.Duration
	// random, when set, draws each new pod's Pending time, up to maxPending.
	random     *rand.Rand
	maxPending time.Duration
	// catchUp is how long a learner started at an ordinal takes to apply the leader's log.
	catchUp map[int]time.Duration
	// started is when each slow learner (by member ID) started applying.
	started map[uint64]time.Time
}

func (w *simWorld) paced() *simPace {
	if w.pace == nil {
		w.pace = &simPace{pending: map[int]time.Duration{}, catchUp: map[int]time.Duration{}, started: map[uint64]time.Time{}}
	}
	return w.pace
}

// pendingUntil is until when a pod created now at ord stays Pending.
func (w *simWorld) pendingUntil(ord int) time.Time {
	if w.pace == nil {
		return time.Time{}
	}
	d, ok := w.pace.pending[ord]
	delete(w.pace.pending, ord)
	if !ok && w.pace.random != nil {
		d = time.Duration(w.pace.random.Int63n(int64(w.pace.maxPending)))
	}
	return w.now.Add(d)
}

// followed is the raft index m reaches this tick behind leader: the leader's, or for a slow
// learner a share of it that grows with the time since it started, as a learner receiving and
// applying a large database does.
func (w *simWorld) followed(m, leader *simMember) uint64 {
	if w.pace == nil || !m.learner {
		return leader.raft
	}
	d, ok := w.pace.catchUp[m.ord]
	if !ok {
		return leader.raft
	}
	start, ok := w.pace.started[m.id]
	if !ok {
		start = w.now
		w.pace.started[m.id] = start
	}
	if took := w.now.Sub(start); took < d {
		return max(m.raft, leader.raft*uint64(took)/uint64(d))
	}
	delete(w.pace.catchUp, m.ord)
	return leader.raft
}

// notStarted renders a pod the kubelet has not started, as Kubernetes reports it: Pending and
// scheduled, its init container and etcd waiting PodInitializing (the kubelet's reason while a
// pod with init containers has started none), not ready to start containers (its volumes are
// not mounted yet). Why it waits, a slow pull or attach or a mount that keeps failing, is in the
// kubelet's Events alone, which a hook is not sent.
func notStarted(pod *corev1.Pod, etcd *corev1.ContainerStatus) {
	pod.Status.Phase = corev1.PodPending
	pod.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
		{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionFalse},
		{Type: corev1.PodInitialized, Status: corev1.ConditionFalse, Reason: "ContainersNotInitialized"},
		{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady"},
	}
	waiting := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}
	etcd.State, etcd.Ready = waiting, false
	pod.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "install", State: waiting}}
}

// mountFails: p cannot start because its volume cannot be mounted: an attach that never
// completes (mount-fails), or a claim whose file system waits to grow on this very mount while
// the node fails to grow it (remount-fails): the kubelet does not start a pod on a volume in an
// uncertain state. It stays Pending.
func (w *simWorld) mountFails(p *simPod) bool {
	c := w.volumes.claims[p.ord]
	switch {
	case c != nil && c.fsPending && w.volumes.remountFails && p.uid != c.mountedBy:
		p.mountFails, c.resizeFailed = true, true
	case p.mountFails && c != nil && c.resizeFailed:
		// The node can grow it again: the kubelet's next try mounts it.
		p.mountFails, c.resizeFailed = false, false
	}
	return p.mountFails
}

// paceCommand runs the scenario commands of this file:
//
//	pending POD DURATION   the next pod created at POD's ordinal stays Pending that long
//	catch-up POD DURATION  a learner starting at POD's ordinal takes that long to catch up
func (w *simWorld) paceCommand(t *testing.T, cmd string, args []string) {
	t.Helper()
	if len(args) != 2 {
		t.Fatalf("%s %v: want POD DURATION", cmd, args)
	}
	d, err := time.ParseDuration(args[1])
	if err != nil {
		t.Fatalf("%s %v: %v", cmd, args, err)
	}
	ord := w.ordinalOf(args[0])
	switch cmd {
	case "pending":
		w.paced().pending[ord] = d
	case "catch-up":
		w.paced().catchUp[ord] = d
	}
}

// slowNodes makes every new pod of w stay Pending a random time up to max, drawn from rng.
func (w *simWorld) slowNodes(rng *rand.Rand, max time.Duration) {
	p := w.paced()
	p.random, p.maxPending = rng, max
}

// TestSimPending checks the slow node itself: a pod stays Pending for its own delay, then
// starts; a slow learner's index rises over its catch-up time, not at once.
func TestSimPending(t *testing.T) {
	w, _ := created(t, 3, true)
	w.paceCommand(t, "pending", []string{"etcd-3", "3m"})
	w.paceCommand(t, "catch-up", []string{"etcd-3", "5m"})
	w.cluster.Spec.Size = ptrTo(int32(4))
	w.cluster.Generation++
	var created time.Time
	for i := 0; i < 100 && created.IsZero(); i++ {
		w.step()
		if p := w.pods[3]; p != nil {
			created = p.created
		}
	}
	if created.IsZero() {
		t.Fatal("the StatefulSet never created etcd-3")
	}
	for w.now.Sub(created) < 3*time.Minute {
		if w.pods[3].running {
			t.Fatalf("etcd-3 runs %s after it was created, within its 3m Pending", w.now.Sub(created))
		}
		w.step()
	}
	var rose []uint64
	for i := 0; i < 20; i++ {
		w.step()
		if m := w.memberAt(3); m != nil && m.learner && m.raft > 0 {
			rose = append(rose, m.raft)
		}
	}
	l := w.memberByID(w.leader)
	if len(rose) < 10 || rose[len(rose)-1] >= l.raft*9/10 {
		t.Fatalf("learner indexes %v against the leader's %d: want a slow rise, below 90%% after 200s", rose, l.raft)
	}
	for i := 1; i < len(rose); i++ {
		if rose[i] <= rose[i-1] {
			t.Fatalf("learner indexes %v: want each above the last", rose)
		}
	}
	w.run(400)
}
