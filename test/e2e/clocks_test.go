package e2e

import (
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/test/harness"
)

// Each clock measures its own interval. The long waits here are the hook's: its clock is moved
// on (HookClock) rather than waited out, since what is tested is what the planner measures
// from, not how long real time takes; the pod's Pending is a short real delay.

// removed reports whether a sync since from started removing member.
func removed(env *harness.Env, from int, member string) bool {
	for _, rec := range env.MC.History()[from:] {
		if a := rec.Answer.Status.Action; a != nil && a.Type == "RemoveMember" && a.Member == member {
			return true
		}
	}
	return false
}

// TestDownVoterReplacedWhileBackupsRun: a follower's node is cut off while a backup falls due
// every minute of the hook's clock, each one a step of its own, with a few syncs between two.
// The follower is replaced once it has been unhealthy for the grace period by its own record,
// whatever ran in between.
func TestDownVoterReplacedWhileBackupsRun(t *testing.T) {
	t.Parallel()
	s := spec(3)
	s.Backup = &v1alpha1.BackupSpec{Schedule: "* * * * *", Destination: realS3(t)}
	env := newEnv(t, false)
	addCredentials(t, env)
	env.Create(s)
	waitSteady(t, env, 3)

	victim := followerOf(t, env)
	from := env.MC.Syncs()
	if err := env.Isolate(victim); err != nil {
		t.Fatal(err)
	}
	backups := 0
	for minute := 1; minute <= 14 && !removed(env, from, victim); minute++ {
		before := lastBackup(env)
		env.AdvanceHookClock(time.Minute)
		// A backup falls due each minute; wait for it to be recorded, or for the replacement.
		if _, err := env.WaitFor(changeBound, func() (bool, string) {
			b := lastBackup(env)
			return removed(env, from, victim) || b != nil && b.LastScheduleTime != nil && (before == nil || before.LastScheduleTime == nil || b.LastScheduleTime.After(before.LastScheduleTime.Time)),
				"the backup of minute " + time.Duration(minute*int(time.Minute)).String() + " has not run"
		}); err != nil {
			t.Fatalf("%v\n%s", err, env.Describe())
		}
		backups++
		// The planner syncs between two backups, as it does between scheduled ones in real time.
		after := env.MC.Syncs()
		if _, err := env.WaitFor(changeBound, func() (bool, string) {
			return env.MC.Syncs() >= after+2, "no sync after the backup"
		}); err != nil {
			t.Fatal(err)
		}
	}
	if !removed(env, from, victim) {
		for _, rec := range env.MC.History()[max(from, env.MC.Syncs()-8):] {
			st := rec.Answer.Status
			if st.Action != nil {
				t.Logf("sync %d: %s %s: %s; members %+v", rec.N, st.Action.Type, st.Action.Member, st.Action.Reason, st.Members)
			}
		}
		t.Fatalf("%s down for 14 minutes of the hook's clock, with %d backups in between, and never replaced\n%s", victim, backups, env.Describe())
	}
	if backups < 5 {
		t.Fatalf("only %d backups ran before the replacement", backups)
	}
	t.Logf("%s replaced after %d backups", victim, backups)
	// Its node comes back; the member added in its place starts there from an empty data dir.
	env.Heal(victim)
	waitSteady(t, env, 3)
}

// TestPendingLearnerKeptOnceStarted: a scale-out's new pod stays Pending while eleven minutes
// pass on the hook's clock (its image pulling, its volume attaching), and its container starts
// a little after. Once it starts, its learner is given its own time to catch up, and is
// promoted, not removed as stuck.
func TestPendingLearnerKeptOnceStarted(t *testing.T) {
	t.Parallel()
	var slow atomic.Bool
	opts := envOptions(t, false)
	const pending = 40 * time.Second // 4s in real time
	others := opts.PendingFor
	opts.PendingFor = func(pod string) time.Duration {
		if pod == "etcd-3" && slow.Load() {
			return pending
		}
		return others(pod)
	}
	env := startEnv(t, opts)
	env.Create(spec(3))
	waitSteady(t, env, 3)

	slow.Store(true)
	from := env.MC.Syncs()
	env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { s.Size = ptr(int32(4)) })
	podPhase := func() corev1.PodPhase {
		if o, ok := env.Store.Get("Pod", "etcd-3"); ok {
			return o.(*corev1.Pod).Status.Phase
		}
		return ""
	}
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		return podPhase() == corev1.PodPending, "etcd-3 is not Pending"
	}); err != nil {
		t.Fatalf("%v\n%s", err, env.Describe())
	}
	// Its node also holds the container back once the pod leaves Pending (the kubelet's
	// back-off), so that a sync sees the pod past Pending before its etcd ever ran.
	if err := env.Isolate("etcd-3"); err != nil {
		t.Fatal(err)
	}
	env.AdvanceHookClock(11 * time.Minute)
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		return podPhase() == corev1.PodRunning, "etcd-3 is still Pending"
	}); err != nil {
		t.Fatalf("%v\n%s", err, env.Describe())
	}
	after := env.MC.Syncs()
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		return env.MC.Syncs() >= after+3, "no syncs after the Pending"
	}); err != nil {
		t.Fatal(err)
	}
	env.Heal("etcd-3")
	waitSteady(t, env, 4)
	if removed(env, from, "etcd-3") {
		t.Fatalf("the learner etcd-3 was removed after its pod's Pending\n%s", env.Describe())
	}
}

func ptr[T any](v T) *T { return &v }
