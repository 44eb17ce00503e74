package e2e

import (
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"etcdops.dev/etcdops/test/harness"
)

// TestCrashBoundaries crashes at every step boundary, each time a step reaches it: at all
// boundaries while the cluster is created (the bootstrap, the Jobs that add members), then
// one tour per boundary, each taking the cluster through every other step the planner takes
// (add a learner, grow the StatefulSet, promote, move leadership, remove a member, shrink the
// StatefulSet, replace pods). A tour fails when one of its steps was never crashed, so that a
// change in the planner cannot quietly skip a boundary. Killed Jobs need no pod replaced:
// that tour leaves out the configuration change, which runs no other Job.
func TestCrashBoundaries(t *testing.T) {
	t.Parallel()
	onClusterCrashing(t, spec(3), harness.Crashes{LoseAnswers: true, KillJobs: true, RestartHook: true},
		crashTour("lost-answers", harness.Crashes{LoseAnswers: true}, harness.BoundaryLostAnswer, harness.Steps, true),
		crashTour("killed-jobs", harness.Crashes{KillJobs: true}, harness.BoundaryKilledJob, harness.JobVerbs, false),
		crashTour("hook-restarts", harness.Crashes{RestartHook: true}, harness.BoundaryHookRestart, harness.Steps, true),
	)
}

// crashTour runs tour with the harness crashing at c, and checks that every step was
// crashed at boundary.
func crashTour(name string, c harness.Crashes, boundary string, steps []string, roll bool) scenario {
	return scenario{name: name, act: func(t *testing.T, env *harness.Env) int {
		before := env.CrashesSoFar()
		env.CrashAt(c)
		defer env.CrashAt(harness.Crashes{})
		tour(t, env, roll)
		checkCrashed(t, env, before, boundary, steps)
		return 3
	}}
}

// checkCrashed fails the test for each step not crashed at boundary since before, and logs
// how often each was.
func checkCrashed(t *testing.T, env *harness.Env, before map[string]int, boundary string, steps []string) {
	t.Helper()
	after := env.CrashesSoFar()
	var hit []string
	for _, step := range steps {
		key := boundary + " " + step
		n := after[key] - before[key]
		if n == 0 {
			t.Errorf("never crashed at %s", key)
		}
		hit = append(hit, fmt.Sprintf("%s ×%d", step, n))
	}
	sort.Strings(hit)
	t.Logf("%s at: %s", boundary, strings.Join(hit, ", "))
}

// rolls numbers the configuration changes of the tours, so each is a new one.
var rolls atomic.Int64

// tour takes a steady 3-member cluster through every step of the planner and back: scale to
// 4 (a learner, the StatefulSet grown, a promotion), leadership on the member that goes, scale
// to 3 (leadership moved, the member removed, the StatefulSet shrunk), then, with roll, a
// configuration change with leadership on the first pod to roll (leadership moved, each pod
// replaced).
func tour(t *testing.T, env *harness.Env, roll bool) {
	scaleTo(env, 4)
	waitSteady(t, env, 4)
	must(t, env.MoveLeader(env.Pod(3)))
	scaleTo(env, 3)
	waitSteady(t, env, 3)
	if !roll {
		return
	}
	must(t, env.MoveLeader(env.Pod(2)))
	rollingConfigChange(int(30000+rolls.Add(1)))(t, env)
	waitSteady(t, env, 3)
}

// staleReads injects the violation the checker must catch: a client reads one follower
// alone with serializable reads and records them as linearizable gets, while that follower
// is cut off from its peers and the others go on writing.
func staleReads() scenario {
	var victim string
	return scenario{
		name:     "injected-stale-reads",
		injected: "serializable reads from a partitioned follower recorded as linearizable",
		workload: func(t *testing.T, env *harness.Env) harness.WorkloadOptions {
			victim = followerOf(t, env)
			return harness.WorkloadOptions{SerializableFrom: victim}
		},
		act: func(t *testing.T, env *harness.Env) int {
			must(t, env.Partition(victim))
			time.Sleep(2 * time.Second)
			env.Mend(victim)
			return 3
		},
	}
}
