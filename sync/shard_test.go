package sync

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// TestFinalizeRefusedUnlessDeleted: Metacontroller calls finalize for a parent that stops
// matching its CompositeController's labelSelector (a relabelled cluster, a narrowed shard)
// as for one being deleted. Only a deletionTimestamp lets a teardown start; without one
// every observed child is kept, Jobs included, nothing is finalized, and the status says why.
func TestFinalizeRefusedUnlessDeleted(t *testing.T) {
	steady := func(t *testing.T) *simWorld {
		w := newSimWorld(t, 3, true)
		w.run(60)
		return w
	}
	midScale := func(t *testing.T) *simWorld {
		w := steady(t)
		w.cluster.Spec.Size = ptrTo(int32(5))
		w.cluster.Generation++
		for i := 0; i < 20 && len(w.observe().Children.Jobs) == 0; i++ {
			w.step()
		}
		if len(w.observe().Children.Jobs) == 0 {
			t.Fatal("the scale-out started no member Job")
		}
		return w
	}
	for _, tc := range []struct {
		story      string
		world      func(*testing.T) *simWorld
		finalizing bool
		deleted    bool
		// want is the action type; keepAll: every observed child returned.
		want      ActionType
		keepAll   bool
		finalized bool
	}{
		{"steady, finalize without deletion", steady, true, false, Hold, true, false},
		{"member Job running, finalize without deletion", midScale, true, false, Hold, true, false},
		{"steady, deleted", steady, true, true, Teardown, false, false},
		{"member Job running, deleted", midScale, true, true, Teardown, false, false},
		{"steady, sync", steady, false, false, Steady, true, false},
	} {
		t.Run(tc.story, func(t *testing.T) {
			w := tc.world(t)
			if tc.deleted {
				ts := metav1.NewTime(w.now)
				w.cluster.DeletionTimestamp = &ts
			}
			w.unmatched = tc.finalizing && !tc.deleted
			obs := w.observe()
			d := Plan(simConfig, obs)
			if d.Action.Type != tc.want || d.Finalized != tc.finalized {
				t.Fatalf("action %s (%s), finalized %v; want %s, finalized %v", d.Action.Type, d.Action.Reason, d.Finalized, tc.want, tc.finalized)
			}
			observed := childKeys(observedChildren(obs.Children))
			if got := childKeys(d.Children); tc.keepAll && !slices.Equal(got, observed) {
				t.Errorf("children %v, want every observed child %v", got, observed)
			}
			if tc.want != Hold {
				return
			}
			if d.Action.Reason != ReasonNotBeingDeleted {
				t.Errorf("reason %q, want %q", d.Action.Reason, ReasonNotBeingDeleted)
			}
			if d.Status.Phase != obs.Cluster.Status.Phase || !slices.EqualFunc(d.Status.Conditions, obs.Cluster.Status.Conditions, sameCondition) ||
				len(d.Status.Members) != len(obs.Cluster.Status.Members) {
				t.Errorf("status phase %s, %d conditions, %d members; want the cluster's: %s, %d, %d", d.Status.Phase, len(d.Status.Conditions),
					len(d.Status.Members), obs.Cluster.Status.Phase, len(obs.Cluster.Status.Conditions), len(obs.Cluster.Status.Members))
			}
			if len(d.Events) != 1 || d.Events[0].Reason != EventHold || d.Events[0].Message != ReasonNotBeingDeleted {
				t.Errorf("events %+v, want one Hold saying why", d.Events)
			}
			// Asked again, as Metacontroller does every resync: the same hold, no new Event.
			w.apply(d)
			w.now = w.now.Add(10e9)
			again := Plan(simConfig, w.observe())
			if again.Action.Type != Hold || len(again.Events) != 0 || !again.Status.Action.Since.Equal(&d.Status.Action.Since) {
				t.Errorf("asked again: %s since %v with events %+v; want the same hold since %v and no Event",
					again.Action.Type, again.Status.Action.Since, again.Events, d.Status.Action.Since)
			}
		})
	}
}

// TestRelabelledClusterKeepsRunning: a 3-member cluster whose finalize Metacontroller calls
// for a minute of resyncs, as after a shard label changed, loses no child, no member and no
// quorum, and once it is synced again it is steady without a membership change.
func TestRelabelledClusterKeepsRunning(t *testing.T) {
	w := newSimWorld(t, 3, true)
	w.run(60)
	before := sortedKeysOf(w.applied)
	w.unmatched = true
	for i := 0; i < 12; i++ {
		d := w.step()
		if d.Action.Type != Hold || d.Finalized {
			t.Fatalf("finalize %d of a cluster not being deleted: %s (%s), finalized %v", i, d.Action.Type, d.Action.Reason, d.Finalized)
		}
		if got := sortedKeysOf(w.applied); !slices.Equal(got, before) {
			t.Fatalf("finalize %d changed the children: %v, was %v", i, got, before)
		}
		if !w.hasQuorum() {
			t.Fatalf("finalize %d: quorum lost\n%s", i, w.describe())
		}
	}
	w.unmatched = false
	if s := w.run(20); s.adds+s.removes+s.replacements != 0 {
		t.Errorf("synced again after the refusals: %s, want no membership change", s)
	}
	if p := w.cluster.Status.Phase; p != v1alpha1.PhaseRunning {
		t.Errorf("phase %s, want %s", p, v1alpha1.PhaseRunning)
	}
}

func childKeys(children []Child) []string {
	var keys []string
	for _, c := range children {
		keys = append(keys, c.Kind+"/"+c.Name)
	}
	slices.Sort(keys)
	return keys
}

func sameCondition(a, b metav1.Condition) bool {
	return a.Type == b.Type && a.Status == b.Status && a.Reason == b.Reason
}
