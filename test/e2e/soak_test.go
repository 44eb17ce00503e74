package e2e

import (
	"math/rand/v2"
	"testing"
	"time"

	"etcdops.dev/etcdops/test/harness"
)

// TestSoak injects random faults and changes into one cluster for -soak-time (go test
// ./test/e2e -run TestSoak -soak), one at a time, each followed by convergence. It is one
// row of the figures table; the seed is logged so a failure can be replayed with -soak-seed.
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
	onCluster(t, spec(3), scenario{"random-faults", func(t *testing.T, env *harness.Env) int {
		size := 3
		deadline := time.Now().Add(*soakTime)
		snapshot := 20000
		faults := []struct {
			name string
			do   func() int
		}{
			{"kill a follower", func() int { must(t, env.Kill(followerOf(t, env))); return size }},
			{"kill the leader", func() int { must(t, env.Kill(leaderOf(t, env))); return size }},
			{"wipe a follower", func() int { must(t, env.Wipe(followerOf(t, env))); return size }},
			{"partition a follower", func() int {
				victim := followerOf(t, env)
				must(t, env.Partition(victim))
				time.Sleep(time.Duration(1+rng.IntN(3)) * time.Second)
				env.Mend(victim)
				return size
			}},
			{"roll a config change", func() int {
				snapshot += 1000
				return rollingConfigChange(snapshot)(t, env)
			}},
			{"scale between 3 and 5", func() int {
				size = 8 - size
				scaleTo(env, int32(size))
				return size
			}},
		}
		for i := 0; i < 1000 && time.Now().Before(deadline); i++ {
			f := faults[rng.IntN(len(faults))]
			t.Logf("soak step %d: %s", i, f.name)
			waitSteady(t, env, f.do())
		}
		return size
	}})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
