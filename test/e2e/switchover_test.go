package e2e

import (
	"strings"
	"testing"
	"time"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/harness"
)

// TestSwitchover asks for leadership on a follower with the etcdops.dev/switchover-to
// annotation, under the workload: the operator's move-leader Job hands it over, real etcd
// says the follower leads, and status records the request served and the step in its
// history. The annotation left in place asks nothing more: leadership moved away by hand
// stays where it went. A request naming no member is refused with a Hold, and nothing moves.
func TestSwitchover(t *testing.T) {
	t.Parallel()
	onCluster(t, spec(3),
		scenario{name: "switchover-to-a-follower", act: switchoverToFollower},
		scenario{name: "switchover-to-no-member", act: switchoverToNoMember},
	)
}

// switchoverQuiet is how long a request already served, or refused, is watched for a step it
// must not cause: several of the hook's resyncs.
const switchoverQuiet = 15 * time.Second

func switchoverToFollower(t *testing.T, env *harness.Env) int {
	target := followerOf(t, env)
	from := leaderOf(t, env)
	env.Store.AnnotateParent(v1alpha1.AnnotationSwitchoverTo, target)
	took, err := env.WaitFor(changeBound, func() (bool, string) {
		st, leader := env.Store.Parent().Status, env.Monitor.View().Leader
		served := st.LastSwitchover != nil && st.LastSwitchover.Request == target
		return leader == target && served, "etcd says " + leader + " leads; status.lastSwitchover " + describeSwitchover(st.LastSwitchover)
	})
	if err != nil {
		t.Fatalf("leadership not moved to %s: %v\n%s", target, err, env.Describe())
	}
	t.Logf("leadership moved from %s to %s in %s", from, target, took.Round(time.Millisecond))
	st := env.Store.Parent().Status
	if r := st.LastSwitchover; !r.Moved || r.Member != from {
		t.Errorf("status.lastSwitchover = %+v, want moved from %s", r, from)
	}
	var step *v1alpha1.StepRecord
	for i := range st.History {
		if r := &st.History[i]; r.Type == sync.MoveLeader.String() && r.Member == target && strings.Contains(r.Reason, "switchover requested") {
			step = r
		}
	}
	if step == nil || step.Job == "" {
		t.Errorf("status.history has no MoveLeader step by a Job for the switchover: %+v", st.History)
	}

	// Served once: leadership moved elsewhere by hand stays there.
	other := ""
	for _, m := range env.Monitor.View().Members {
		if m.Name != target && !m.IsLearner {
			other = m.Name
		}
	}
	if err := env.MoveLeader(other); err != nil {
		t.Fatal(err)
	}
	syncs0 := env.MC.Syncs()
	time.Sleep(switchoverQuiet)
	if leader := env.Monitor.View().Leader; leader != other {
		t.Errorf("after leadership was moved to %s by hand, %s leads", other, leader)
	}
	noMoveLeader(t, env, syncs0, "the request already served")
	return 3
}

func switchoverToNoMember(t *testing.T, env *harness.Env) int {
	leader := leaderOf(t, env)
	env.Store.AnnotateParent(v1alpha1.AnnotationSwitchoverTo, "etcd-9")
	syncs0 := env.MC.Syncs()
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		a := env.Store.Parent().Status.Action
		return a != nil && a.Type == sync.Hold.String() && a.Member == "etcd-9" && strings.Contains(a.Reason, "refused: etcd-9 is no member of the cluster"),
			"action " + describeAction(a)
	}); err != nil {
		t.Fatalf("the request naming no member was not refused: %v\n%s", err, env.Describe())
	}
	time.Sleep(switchoverQuiet)
	if now := env.Monitor.View().Leader; now != leader {
		t.Errorf("leadership moved from %s to %s on a refused request", leader, now)
	}
	noMoveLeader(t, env, syncs0, "a refused request")
	if r := env.Store.Parent().Status.LastSwitchover; r != nil && r.Request == "etcd-9" {
		t.Errorf("the refused request is recorded as served: %+v", r)
	}
	// Withdrawn, the cluster is steady again.
	env.Store.AnnotateParent(v1alpha1.AnnotationSwitchoverTo, "")
	return 3
}

// noMoveLeader fails the test when a sync from syncs0 on answered with a MoveLeader.
func noMoveLeader(t *testing.T, env *harness.Env, syncs0 int, after string) {
	t.Helper()
	for _, rec := range env.MC.History()[syncs0:] {
		if a := rec.Answer.Status.Action; a != nil && a.Type == sync.MoveLeader.String() {
			t.Errorf("sync %d after %s: %s %s: %s", rec.N, after, a.Type, a.Member, a.Reason)
		}
	}
}

func describeSwitchover(r *v1alpha1.SwitchoverRecord) string {
	if r == nil {
		return "unset"
	}
	return r.Request + " (led by " + r.Member + ")"
}

func describeAction(a *v1alpha1.Action) string {
	if a == nil {
		return "none"
	}
	return a.Type + " " + a.Member + ": " + a.Reason
}
