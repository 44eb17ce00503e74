package sync

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"etcdops.dev/etcdops/api/v1alpha1"
)

func TestWarnings(t *testing.T) {
	even4 := v1alpha1.EvenSizeWarning(4)
	for _, tc := range []struct {
		story   string
		size    int32
		storage bool
		want    []string
	}{
		{"three members with volumes: nothing to warn about", 3, true, nil},
		{"four members tolerate one failure, like three", 4, true, []string{even4}},
		{"without volumes a lost pod loses its data", 3, false, []string{noStorageWarning}},
		{"both, the size first", 4, false, []string{even4, noStorageWarning}},
		{"a single member is odd", 1, false, []string{noStorageWarning}},
	} {
		c := v1alpha1.EtcdCluster{}
		c.Spec.Size = &tc.size
		if tc.storage {
			c.Spec.StorageSpec = &v1alpha1.StorageSpec{VolumeSizeRequest: resource.MustParse("1Gi")}
		}
		if got := warnings(&c); !slices.Equal(got, tc.want) {
			t.Errorf("%s: warnings %q, want %q", tc.story, got, tc.want)
		}
	}
}

// TestOnlyTransitionsReadTheClock: planned again a second later, a sync that changes nothing
// gives the same decision, and writes back the status it read: an action's since and a
// condition's lastTransitionTime move only when the action or the condition changes.
func TestOnlyTransitionsReadTheClock(t *testing.T) {
	for _, tc := range []struct {
		story  string
		setup  func(*simWorld)
		action ActionType
	}{
		{"steady: three healthy members, nothing to do", func(*simWorld) {}, Steady},
		{"waiting: the add-learner Job of a scale-out is running", func(w *simWorld) {
			w.cluster.Spec.Size = ptrTo(int32(4))
			w.sync() // AddLearner: the Job is created
			w.sync() // Wait: it runs (Jobs run on ticks, and none passed)
		}, Wait},
	} {
		w := newSimWorld(t, 3, true)
		w.run(100)
		tc.setup(w)
		obs := w.observe()
		first := Plan(simConfig, obs)
		obs.Now = obs.Now.Add(time.Second)
		second := Plan(simConfig, obs)
		if first.Action.Type != tc.action {
			t.Fatalf("%s: planned %v, want %v", tc.story, first.Action, tc.action)
		}
		if !reflect.DeepEqual(first, second) {
			t.Errorf("%s: a second later the decision differs:\n%s\n%s", tc.story, encodeDecision(t, first), encodeDecision(t, second))
		}
		if !reflect.DeepEqual(first.Status, obs.Cluster.Status) {
			t.Errorf("%s: the status read is not written back:\n%+v\n%+v", tc.story, obs.Cluster.Status, first.Status)
		}
	}

	// A transition takes the clock's reading: a scale-out turns Steady into AddLearner and
	// Progressing true.
	w := newSimWorld(t, 3, true)
	w.run(100)
	w.cluster.Spec.Size = ptrTo(int32(4))
	obs := w.observe()
	d := Plan(simConfig, obs)
	if d.Action.Type != AddLearner || !d.Status.Action.Since.Time.Equal(obs.Now) {
		t.Errorf("a new action %v since %v, want AddLearner since %v", d.Action, d.Status.Action.Since, obs.Now)
	}
	for _, c := range d.Status.Conditions {
		if c.Type == v1alpha1.ConditionProgressing && !c.LastTransitionTime.Time.Equal(obs.Now) {
			t.Errorf("Progressing turned true at %v, want %v", c.LastTransitionTime, obs.Now)
		}
	}
}

// TestBackoffResyncIsWholeSeconds: the resync after a failed Job lands on or after the retry
// time, in whole seconds, whatever fraction of a second the clock reads.
func TestBackoffResyncIsWholeSeconds(t *testing.T) {
	w := newSimWorld(t, 3, true)
	w.run(100)
	w.cluster.Spec.Size = ptrTo(int32(4))
	w.failJobs = 1
	w.step() // the add-learner Job is created, and fails within the tick
	obs := w.observe()
	for _, late := range []time.Duration{0, 300 * time.Millisecond, 9*time.Second + 999*time.Millisecond} {
		obs.Now = w.now.Add(late)
		d := Plan(simConfig, obs)
		if !strings.Contains(d.Action.Reason, "retrying at") {
			t.Fatalf("%v late: %v, want a wait for the retry", late, d.Action)
		}
		// The Job failed at w.now, a whole second; its retry is one backoff later.
		left := jobBackoff(0) - late
		if want := math.Ceil(left.Seconds()); d.ResyncAfterSeconds != want {
			t.Errorf("%v late: resync %gs, want %gs (%v left, rounded up)", late, d.ResyncAfterSeconds, want, left)
		}
	}
}

// conditionsLine is one sync in a scenario file's watch: the phase, Progressing and Degraded
// with their reasons, and the action.
func conditionsLine(d Decision) string {
	cond := map[string]string{}
	for _, c := range d.Status.Conditions {
		cond[c.Type] = fmt.Sprintf("%s=%s %s", c.Type, c.Status, c.Reason)
	}
	return fmt.Sprintf("%s | %s | %s | %s", d.Status.Phase, cond[v1alpha1.ConditionProgressing], cond[v1alpha1.ConditionDegraded], actionLine(d.Action))
}

// historyLine is one record of status.history, its times counted from the simulator's start.
func historyLine(r v1alpha1.StepRecord) string {
	s := fmt.Sprintf("t+%s %s %s: %s", r.Started.Sub(simStart), r.Type, r.Member, r.Result)
	if r.Finished != nil {
		s += " after " + r.Finished.Sub(r.Started.Time).String()
	}
	if r.Repair {
		s += " (repair)"
	}
	return s + ": " + r.Reason
}
