package e2e

import (
	"testing"
	"time"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/test/harness"
)

// recoveryFenceWait is the hook's fenceMountDelay: how long the fences must stand in the join
// ConfigMap before the survivor is told to force.
const recoveryFenceWait = 3 * time.Minute

// passFencing waits until the recovery is in phase Fencing, then for the kubelet's longest
// mount delay in real time (scaled: the harness kubelet runs ten times faster), so that every
// kubelet that can refresh its files has; then it moves the hook's clock past the 3 minutes
// the hook waits for a real kubelet, which this run cannot afford in real time.
func passFencing(t *testing.T, env *harness.Env, mountDelay time.Duration) {
	t.Helper()
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		r := env.Store.Parent().Status.Recovery
		if r == nil {
			return false, "no recovery yet"
		}
		return r.Phase == "Fencing" || r.Phase == "Forcing" || r.Phase == "Done", "recovery " + r.Phase
	}); err != nil {
		t.Fatalf("the recovery did not start fencing: %v\n%s", err, env.Describe())
	}
	time.Sleep(time.Duration(float64(mountDelay*3/2) * timeScale))
	env.AdvanceHookClock(recoveryFenceWait)
}

// askRecovery waits for the cluster to report quorum lost, asks for a recovery from survivor
// with the annotation, and lets the fences pass (passFencing).
func askRecovery(t *testing.T, env *harness.Env, survivor string) {
	t.Helper()
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		p := env.Store.Parent()
		return p.Status.Phase == v1alpha1.PhaseUnavailable, "phase " + string(p.Status.Phase)
	}); err != nil {
		t.Fatalf("quorum not reported lost: %v\n%s", err, env.Describe())
	}
	env.Store.AnnotateParent(v1alpha1.AnnotationForceNewClusterFrom, survivor)
	passFencing(t, env, kubeletMountDelay*6/4)
}

// TestQuorumRecoveryStaleMount recovers a lost quorum from the leader while one lost member
// comes back on its old data: etcd-A's volume is lost for good (its pod restarts on an empty
// disk, which the launcher refuses), etcd-B's node is cut off (its etcd stopped, its kubelet
// refreshing nothing) and returns after the survivor forced a new cluster, starting its etcd
// on the files it has, from before the fences. Mounted files reach each pod a minute or more
// late. The history stays linearizable, nothing acknowledged is lost, and no fork is seen:
// etcd-B, told by the survivor that it was removed, stops, and is rebuilt as a learner.
func TestQuorumRecoveryStaleMount(t *testing.T) {
	t.Parallel()
	onCluster(t, spec(3), scenario{name: "lost-member-back-on-a-stale-mount", act: staleMountRecovery,
		expectPanic: "etcd v3.7.3 panics on a request to a member removed while still running (\"failed to find local ID in cluster members\"); the member that came back on the old membership is removed by the survivor and rebuilt",
		panicSays:   "failed to find local ID in cluster members"})
}

func staleMountRecovery(t *testing.T, env *harness.Env) int {
	survivor := leaderOf(t, env)
	var others []string
	for _, m := range env.Monitor.View().Members {
		if m.Name != survivor {
			others = append(others, m.Name)
		}
	}
	lost, back := others[0], others[1]
	if err := env.Wipe(lost); err != nil {
		t.Fatal(err)
	}
	if err := env.Isolate(back); err != nil {
		t.Fatal(err)
	}
	askRecovery(t, env, survivor)
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		r := env.Store.Parent().Status.Recovery
		return r != nil && r.Phase == "Done", "recovery not done"
	}); err != nil {
		t.Fatalf("the survivor did not force a new cluster: %v\n%s", err, env.Describe())
	}
	env.Heal(back)
	waitSteady(t, env, 3)
	r := env.Store.Parent().Status.Recovery
	if r == nil || r.Phase != "Done" || r.Survivor != survivor {
		t.Errorf("status.recovery %+v, want Done from %s", r, survivor)
	}
	return 3
}
