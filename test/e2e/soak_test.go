package e2e

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"etcdops.dev/etcdops/test/harness"
)

// TestSoak mixes random faults, operator actions and crashes at step boundaries on one
// cluster for -soak-time (go test ./test/e2e -run TestSoak -soak), one step at a time, each
// step a window of its own: a recorded workload, the step, convergence, the history checked
// and the cluster searched for forks. It adds one row to the figures table with the sums and
// logs the operations checked, the violations and the checker's time; the seed is logged so
// a failure can be replayed with -soak-seed.
func TestSoak(t *testing.T) {
	if !*soak {
		t.Skip("the soak runs with -soak")
	}
	seed := *soakSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("soak seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	env := newEnv(t, false)
	env.Create(spec(3))
	waitSteady(t, env, 3)
	size := 3
	snapshot := 20000
	faults := []struct {
		name string
		do   func(t *testing.T) int
	}{
		{"kill a follower", func(t *testing.T) int { must(t, env.Kill(followerOf(t, env))); return size }},
		{"kill the leader", func(t *testing.T) int { must(t, env.Kill(leaderOf(t, env))); return size }},
		{"wipe a follower", func(t *testing.T) int { must(t, env.Wipe(followerOf(t, env))); return size }},
		{"partition a follower", func(t *testing.T) int {
			victim := followerOf(t, env)
			must(t, env.Partition(victim))
			time.Sleep(time.Duration(1+rng.IntN(3)) * time.Second)
			env.Mend(victim)
			return size
		}},
		{"move leadership to the highest ordinal", func(t *testing.T) int { must(t, env.MoveLeader(env.Pod(size-1))); return size }},
		{"roll a config change", func(t *testing.T) int {
			snapshot += 1000
			return rollingConfigChange(snapshot)(t, env)
		}},
		{"scale between 3 and 5", func(t *testing.T) int {
			size = 8 - size
			scaleTo(env, int32(size))
			return size
		}},
	}
	total := Figure{Linearizable: true}
	violations := 0
	steps := 0
	deadline := time.Now().Add(*soakTime)
	for ; steps < 1000 && time.Now().Before(deadline) && !t.Failed(); steps++ {
		f := faults[rng.IntN(len(faults))]
		crashes := harness.Crashes{LoseAnswers: rng.IntN(3) == 0, KillJobs: rng.IntN(3) == 0, RestartHook: rng.IntN(3) == 0}
		t.Logf("soak step %d: %s, crashing at %+v", steps, f.name, crashes)
		fig := window(t, env, scenario{act: func(t *testing.T, env *harness.Env) int {
			env.CrashAt(crashes)
			defer env.CrashAt(harness.Crashes{})
			n := f.do(t)
			waitSteady(t, env, n)
			return n
		}})
		if !fig.Linearizable || fig.Forks > 0 {
			violations++
		}
		total.add(fig)
	}
	total.Scenario = fmt.Sprintf("%s (%d steps)", t.Name(), steps)
	record(total)
	t.Logf("soak: %d steps, %d operations checked, %d watch events checked, %d violations, %d forks, checker %s in all",
		steps, total.Ops, total.WatchEvents, violations, total.Forks, total.CheckTime.Round(time.Millisecond))
	if violations > 0 {
		t.Errorf("%d soak steps had a violation", violations)
	}
}
