package sync

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// simDrain is a node drain against the PodDisruptionBudget as rendered: the disruption
// controller, which counts the selected pods that are Ready and not terminating against
// minAvailable (a count, or "100%" of the StatefulSet's replicas) once per tick, and the
// eviction API, which refuses while the budget's spec changed since the controller last
// counted (status.observedGeneration behind metadata.generation) or when it allows no more
// disruptions, and otherwise deletes the pod gracefully and counts one disruption more.
// Evictions come between an answer being applied and the world moving on, when the controller
// has not seen the answer's effect yet. Installed as the world's drain, it counts after every
// tick and, while draining, evicts a pod at random in one step of three (simWorld.step).
type simDrain struct {
	w        *simWorld
	rng      *rand.Rand
	draining bool
	// spec is the budget as last applied; generation counts its changes, observed is the one
	// the controller last counted for, and allowed what it found.
	spec                 string
	generation, observed int
	allowed              int
	evicted, refused     int
}

// minAvailable is the applied budget's: a count, or every expected pod ("100%"); false when
// there is none.
func (d *simDrain) minAvailable() (string, bool) {
	raw, ok := d.w.applied["PodDisruptionBudget/"+PDBName(d.w.cluster.Name)]
	if !ok {
		return "", false
	}
	return minAvailableOf(d.w.t, raw), true
}

// minAvailableOf reads a rendered budget's minAvailable, as it is written.
func minAvailableOf(t testing.TB, raw []byte) string {
	t.Helper()
	var pdb struct {
		Spec struct {
			MinAvailable json.RawMessage `json:"minAvailable"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(raw, &pdb); err != nil || len(pdb.Spec.MinAvailable) == 0 {
		t.Fatalf("the PodDisruptionBudget has no minAvailable: %v", err)
	}
	return strings.Trim(string(pdb.Spec.MinAvailable), `"`)
}

// applied notes a change of the budget's spec, as the API server bumps its generation.
func (d *simDrain) applied() {
	raw := string(d.w.applied["PodDisruptionBudget/"+PDBName(d.w.cluster.Name)])
	if raw != d.spec {
		d.spec = raw
		d.generation++
	}
}

// count is the disruption controller's pass.
func (d *simDrain) count() {
	d.applied()
	d.observed = d.generation
	ma, ok := d.minAvailable()
	if !ok {
		d.allowed = 0
		return
	}
	// A percentage is of the StatefulSet's replicas, which the controller reads through its
	// scale subresource; a count is the count.
	desired := len(d.w.pods)
	if d.w.sts != nil {
		desired = d.w.sts.replicas
	}
	if ma != "100%" {
		n, err := strconv.Atoi(ma)
		if err != nil {
			d.w.t.Fatalf("minAvailable %q", ma)
		}
		desired = n
	}
	healthy := 0
	for ord, p := range d.w.pods {
		if !p.terminating && d.w.ready(ord) {
			healthy++
		}
	}
	d.allowed = max(0, healthy-desired)
}

// evictSometimes is the drain's move between a sync and the next tick: while draining, in one
// step of three it asks the eviction API for a pod picked at random.
func (d *simDrain) evictSometimes() {
	if !d.draining || d.rng.Intn(3) != 0 {
		return
	}
	if p := d.w.randomPod(d.rng); p != nil && !p.terminating {
		d.evictPod(p)
	}
}

// evictPod asks the eviction API for p.
func (d *simDrain) evictPod(p *simPod) {
	d.applied()
	if d.observed < d.generation || d.allowed <= 0 {
		d.refused++
		return
	}
	d.allowed--
	d.evicted++
	p.terminating = true
	d.w.log = append(d.w.log, fmt.Sprintf("drain: %s evicted", d.w.podName(p.ord)))
}

// TestRandomDrains runs scale and rolling changes, and defragmentations that take minutes,
// while a drain evicts a pod at random moments, as often as the budget allows. No other fault
// is injected, so every quorum lost is one an eviction the budget allowed caused: each fails
// the run (checkWorld), as does any other invariant broken; and the cluster converges once
// the drain stops.
func TestRandomDrains(t *testing.T) {
	for seed := int64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewSource(seed))
			w, _ := created(t, 3, seed%2 == 1) // odd seeds with volumes, even ones without
			d := &simDrain{w: w, rng: rng}
			w.drain = d
			d.count()
			changes := []func(){
				func() { w.cluster.Spec.Size = ptrTo(int32(5)) },
				func() { w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=5000"} },
				func() { w.cluster.Spec.Version = "v3.6.17" },
				func() { w.cluster.Spec.Size = ptrTo(int32(3)) },
				func() {
					w.slowDatabases(1<<30, 4<<30)
					w.cluster.Spec.Maintenance = &v1alpha1.MaintenanceSpec{Defragment: &v1alpha1.DefragmentSpec{InUseBelowPercent: 50, MinFree: ptrTo(resource.MustParse("1Mi"))}}
				},
			}
			for _, change := range changes {
				change()
				w.cluster.Generation++
				d.draining = true
				for range 80 {
					w.step()
				}
				d.draining = false
				w.run(500)
			}
			if d.evicted == 0 || d.refused == 0 {
				t.Errorf("%d evictions, %d refused: the drain did not test the budget", d.evicted, d.refused)
			}
			t.Logf("%d pods evicted, %d evictions refused", d.evicted, d.refused)
		})
	}
}

// TestBudgetClosesForTheOperatorsSteps: the answer that starts each step taking a member down
// carries a budget that allows no disruption, and a drain that evicts right after it is
// refused; without that, the eviction and the step together take two of three voters. The
// steady cluster's budget allows one.
func TestBudgetClosesForTheOperatorsSteps(t *testing.T) {
	for _, tc := range []struct {
		story   string
		storage bool
		change  func(*simWorld)
		step    ActionType
	}{
		{"a pod replaced for a roll", true, func(w *simWorld) { w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=5000"} }, ReplacePod},
		{"a member removed for a roll without volumes", false, func(w *simWorld) { w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=5000"} }, RemoveMember},
		{"leadership moved before a roll", true, func(w *simWorld) {
			w.setLeader(2)
			w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=5000"}
		}, MoveLeader},
		{"a defragmentation", true, func(w *simWorld) {
			w.slowDatabases(1<<30, 4<<30)
			w.cluster.Spec.Maintenance = &v1alpha1.MaintenanceSpec{Defragment: &v1alpha1.DefragmentSpec{InUseBelowPercent: 50, MinFree: ptrTo(resource.MustParse("1Mi"))}}
		}, Defragment},
	} {
		t.Run(tc.story, func(t *testing.T) {
			w, _ := created(t, 3, tc.storage)
			w.lag = nil
			d := &simDrain{w: w}
			if got := pdbOf(t, w.sync()); got != "2" {
				t.Fatalf("steady: minAvailable %s, want 2", got)
			}
			w.tick()
			d.count()
			tc.change(w)
			w.cluster.Generation++
			var dec Decision
			for i := 0; dec.Action.Type != tc.step; i++ {
				if i == 20 {
					t.Fatalf("no %v in 20 syncs:\n%s", tc.step, strings.Join(w.log, "\n"))
				}
				if i > 0 {
					w.tick()
					d.count()
					w.checkWorld()
				}
				dec = w.sync()
			}
			if got := pdbOf(t, dec); got != "100%" {
				t.Errorf("%v: minAvailable %s, want 100%%", dec.Action.Type, got)
			}
			// The lowest pod the step is not about: with the step's own member, two of three go.
			victim := w.pods[0]
			if dec.Action.Member == w.podName(0) {
				victim = w.pods[1]
			}
			before := d.evicted
			d.evictPod(victim)
			for range 3 {
				w.tick()
				d.count()
				w.checkWorld()
			}
			if d.evicted != before {
				t.Errorf("an eviction was allowed right after the %v answer", tc.step)
			}
		})
	}
}

// pdbOf is the minAvailable of the budget a decision renders.
func pdbOf(t *testing.T, d Decision) string {
	t.Helper()
	for _, c := range d.Children {
		if c.Kind == "PodDisruptionBudget" {
			b, err := json.Marshal(c.Object)
			if err != nil {
				t.Fatal(err)
			}
			return minAvailableOf(t, b)
		}
	}
	t.Fatal("no PodDisruptionBudget in the answer")
	return ""
}
