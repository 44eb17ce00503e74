package sync

import (
	"math/rand"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"etcdops.dev/etcdops/etcdstate"
)

// Job latency: a member Job acts some ticks after the sync that decided it, as a real one does
// (the Job controller creates its pod, the scheduler places it, its image is pulled, a failed
// attempt backs off). The world moves on meanwhile, so every tool must check what it acts on
// live, as the member tool does: add-learner refuses a second learner, promote a learner
// behind, remove a voter whose removal would cost quorum among the voters that answer,
// move-leader a transferee that is not a healthy voter, restart-pod a member that leads or
// while another voter is down.

// simLatency draws how many ticks each new Job waits before it acts.
type simLatency struct {
	fixed int
	rng   *rand.Rand
	max   int
}

// jobLatency is how many ticks a Job created now waits before it acts.
func (w *simWorld) jobLatency() int {
	l := w.latency
	switch {
	case l == nil:
		return 0
	case l.rng != nil:
		return l.rng.Intn(l.max + 1)
	}
	return l.fixed
}

// latencyCommand runs the scenario command
//
//	job-latency N    every Job created from now on acts N ticks after the sync that decided it
func (w *simWorld) latencyCommand(t *testing.T, line string, args []string) {
	t.Helper()
	n, err := strconv.Atoi(strings.Join(args, " "))
	if err != nil || n < 0 {
		t.Fatalf("%q: want a number of ticks", line)
	}
	w.latency = &simLatency{fixed: n}
}

// randomLatency makes every Job of w act up to max ticks late, drawn from rng.
func (w *simWorld) randomLatency(rng *rand.Rand, max int) {
	w.latency = &simLatency{rng: rng, max: max}
}

// TestRestartChecksLive: a restart-pod Job decided while every member was up acts two ticks
// later, after another voter crashed, or after leadership came back to the member it
// restarts. It must not take a second voter down, nor the leader: it fails and is retried.
func TestRestartChecksLive(t *testing.T) {
	for _, tc := range []struct {
		name    string
		between func(w *simWorld, target int)
	}{
		{"another voter crashed", func(w *simWorld, target int) {
			for ord, p := range w.pods {
				if ord != target && w.memberAt(ord).id != w.leader {
					p.crash = true
					return
				}
			}
		}},
		{"leadership came back", func(w *simWorld, target int) { w.setLeader(target) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, _ := created(t, 3, true)
			w.volumes.offline = true
			w.latency = &simLatency{fixed: 2}
			w.cluster.Spec.StorageSpec.VolumeSizeRequest = resource.MustParse("2Gi")
			w.cluster.Generation++
			var d Decision
			for i := 0; i < 80 && d.Action.Type != RestartPod; i++ {
				d = w.step()
			}
			if d.Action.Type != RestartPod {
				t.Fatalf("no restart decided: %v", d.Action)
			}
			target := w.ordinalOf(d.Action.Member)
			tc.between(w, target)
			for range 4 {
				w.step()
			}
			if w.volumes.restarts != 0 {
				t.Fatalf("the Job deleted %s after the world changed under it\n%s\n%s", d.Action.Member, w.describe(), strings.Join(lastN(w.log, 6), "\n"))
			}
		})
	}
}

// quorumAfterRemoval is the remove tool's check: the voters other than m that answer keep a
// quorum of the voters left.
func (w *simWorld) quorumAfterRemoval(m *simMember) bool {
	rest, up := 0, 0
	for _, o := range w.members {
		if o != m && !o.learner {
			rest++
			if w.healthy(o) {
				up++
			}
		}
	}
	return etcdstate.QuorumAfterRemoval(rest+1, up)
}
