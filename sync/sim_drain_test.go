package sync

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// simDrain is a node drain against the PodDisruptionBudget as rendered, through the eviction
// API, which refuses while the budget's spec changed since the disruption controller last
// counted it (status.observedGeneration behind metadata.generation, simBudget) or when it
// allows no more disruptions, and otherwise deletes the pod gracefully and counts one
// disruption more. Evictions come between the hook's view and its answer being applied (the
// view does not show them), and between an answer and the world moving on, when the
// controller has not seen the answer's effect yet. Installed as the world's drain, while
// draining it evicts a pod at random in one of three of those moments (simWorld.sync,
// simWorld.step).
type simDrain struct {
	w                *simWorld
	rng              *rand.Rand
	draining         bool
	evicted, refused int
}

// simBudget is the disruption controller's record of the budget as last applied: spec, its
// generation (the API server bumps it on every change), the generation the controller last
// counted for, and what it found.
type simBudget struct {
	spec                 string
	generation, observed int64
	allowed, healthy     int
	desired              int
}

// minAvailable is the applied budget's: a count, or every expected pod ("100%"); false when
// there is none.
func (w *simWorld) minAvailable() (string, bool) {
	raw, ok := w.applied["PodDisruptionBudget/"+PDBName(w.cluster.Name)]
	if !ok {
		return "", false
	}
	return minAvailableOf(w.t, raw), true
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

// budgetApplied notes a change of the budget's spec, as the API server bumps its generation.
func (w *simWorld) budgetApplied() {
	raw := string(w.applied["PodDisruptionBudget/"+PDBName(w.cluster.Name)])
	if raw != w.budget.spec {
		w.budget.spec = raw
		w.budget.generation++
	}
}

// countBudget is the disruption controller's pass, once a tick: the selected pods that are
// Ready and not terminating against minAvailable (a count, or "100%" of the StatefulSet's
// replicas, which it reads through the scale subresource).
func (w *simWorld) countBudget() {
	b := &w.budget
	w.budgetApplied()
	b.observed = b.generation
	b.healthy = 0
	for ord, p := range w.pods {
		if !p.terminating && w.ready(ord) {
			b.healthy++
		}
	}
	ma, ok := w.minAvailable()
	if !ok {
		b.allowed, b.desired = 0, 0
		return
	}
	b.desired = len(w.pods)
	if w.sts != nil {
		b.desired = w.sts.replicas
	}
	if ma != "100%" {
		n, err := strconv.Atoi(ma)
		if err != nil {
			w.t.Fatalf("minAvailable %q", ma)
		}
		b.desired = n
	}
	b.allowed = max(0, b.healthy-b.desired)
}

// budgetStatus is the status the controller last wrote, on the budget o as observed.
func (w *simWorld) budgetStatus(o *policyv1.PodDisruptionBudget) {
	w.budgetApplied()
	o.Generation = w.budget.generation
	o.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: w.budget.observed, CurrentHealthy: int32(w.budget.healthy),
		DesiredHealthy: int32(w.budget.desired), DisruptionsAllowed: int32(w.budget.allowed), ExpectedPods: int32(len(w.pods))}
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
	b := &d.w.budget
	d.w.budgetApplied()
	if b.observed < b.generation || b.allowed <= 0 {
		d.refused++
		return
	}
	b.allowed--
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
	for seed := int64(1); seed <= seeds(8); seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewSource(seed))
			w, _ := created(t, 3, seed%2 == 1) // odd seeds with volumes, even ones without
			d := &simDrain{w: w, rng: rng}
			w.drain = d
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
			tc.change(w)
			w.cluster.Generation++
			var dec Decision
			for i := 0; dec.Action.Type != tc.step; i++ {
				if i == 20 {
					t.Fatalf("no %v in 20 syncs:\n%s", tc.step, strings.Join(w.log, "\n"))
				}
				if i > 0 {
					w.tick()
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

// TestEvictionBetweenViewAndAnswer: a drain's eviction lands after the hook took its view and
// before the answer that would start a step taking a member down is applied, and the evicted
// pod is slow to come back (Pending for a minute, as an image pull and a volume attaching
// make it). The budget was open when the eviction came, so it went through; the step must
// not start on top of it. Without the fence (budgetFenced) the answer lowered the partition
// onto a second pod, or started the step's Job, and two of three voters went down.
func TestEvictionBetweenViewAndAnswer(t *testing.T) {
	for _, tc := range []struct {
		story   string
		storage bool
		change  func(*simWorld)
	}{
		{"a roll with volumes: pods replaced", true, func(w *simWorld) { w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=5000"} }},
		{"a roll without volumes: members removed", false, func(w *simWorld) { w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=5000"} }},
		{"a defragmentation", true, func(w *simWorld) {
			w.slowDatabases(1<<30, 4<<30)
			w.cluster.Spec.Maintenance = &v1alpha1.MaintenanceSpec{Defragment: &v1alpha1.DefragmentSpec{InUseBelowPercent: 50, MinFree: ptrTo(resource.MustParse("1Mi"))}}
		}},
	} {
		t.Run(tc.story, func(t *testing.T) {
			w, _ := created(t, 3, tc.storage)
			w.lag = nil
			d := &simDrain{w: w}
			w.drain = d
			w.sync()
			w.tick()
			tc.change(w)
			w.cluster.Generation++
			// The first answer that closes the budget, for a step taking a member down, was
			// planned from a view without the eviction: the lowest pod the step is not about is
			// evicted before the answer lands.
			disrupting := false
			w.duringSync = func(dec Decision) {
				if disrupting || pdbOf(t, dec) != "100%" {
					return
				}
				disrupting = true
				victim := w.pods[0]
				if dec.Action.Member == w.podName(0) {
					victim = w.pods[1]
				}
				w.paced().pending[victim.ord] = time.Minute
				d.evictPod(victim)
			}
			for range 60 {
				w.step()
			}
			if !disrupting || d.evicted != 1 {
				t.Fatalf("the eviction did not land between a view and its answer (%d evicted)", d.evicted)
			}
			w.duringSync = nil
			w.run(300)
		})
	}
}

// closeBudget applies the budget closed, as the answer before a step that takes a member down
// does, and lets the disruption controller count it: the next plan may start that step. For
// tests of a single plan about something else (a grace period, a version path).
func (w *simWorld) closeBudget() {
	w.t.Helper()
	key := "PodDisruptionBudget/" + PDBName(w.cluster.Name)
	var pdb map[string]any
	if err := json.Unmarshal(w.applied[key], &pdb); err != nil {
		w.t.Fatalf("the applied PodDisruptionBudget: %v", err)
	}
	pdb["spec"].(map[string]any)["minAvailable"] = "100%"
	raw, err := json.Marshal(pdb)
	if err != nil {
		w.t.Fatal(err)
	}
	w.applied[key] = raw
	w.countBudget()
}
