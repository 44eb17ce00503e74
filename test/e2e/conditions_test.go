package e2e

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/test/harness"
)

// planned checks, once the scenario has settled, that no sync of it set Degraded.
func planned(act func(*testing.T, *harness.Env) int) func(*testing.T, *harness.Env) int {
	return func(t *testing.T, env *harness.Env) int {
		from := env.MC.Syncs()
		t.Cleanup(func() {
			recs := steps(t, env, from)
			for _, rec := range recs {
				st := rec.Answer.Status
				if st.Phase != v1alpha1.PhaseRunning || condition(st, v1alpha1.ConditionDegraded).Status == metav1.ConditionTrue {
					t.Errorf("planned work, and yet: %s", harness.SyncLine(rec))
				}
			}
			if !sawStatus(recs, v1alpha1.ConditionProgressing, metav1.ConditionTrue) {
				t.Error("no sync reported Progressing")
			}
		})
		return act(t, env)
	}
}

// unplanned checks, once the scenario has settled, that a sync of it set Degraded, and that
// the last no longer does.
func unplanned(act func(*testing.T, *harness.Env) int) func(*testing.T, *harness.Env) int {
	return func(t *testing.T, env *harness.Env) int {
		from := env.MC.Syncs()
		t.Cleanup(func() {
			recs := steps(t, env, from)
			if !sawStatus(recs, v1alpha1.ConditionDegraded, metav1.ConditionTrue) {
				t.Error("a fault, and no sync reported Degraded")
			}
			if last := env.Store.Parent().Status; condition(last, v1alpha1.ConditionDegraded).Status != metav1.ConditionFalse {
				t.Errorf("repaired, and still %s", harness.Conditions(last))
			}
		})
		return act(t, env)
	}
}

// nodeLost takes a follower's node away until a sync reports its member unhealthy, then
// brings it back: a member down that no step of the operator explains.
func nodeLost(t *testing.T, env *harness.Env) int {
	victim := followerOf(t, env)
	from := env.MC.Syncs()
	if err := env.Isolate(victim); err != nil {
		t.Fatal(err)
	}
	_, err := env.WaitFor(changeBound, func() (bool, string) {
		for _, rec := range env.MC.History()[from:] {
			for _, m := range rec.Answer.Status.Members {
				if m.Name == victim && !m.Healthy {
					return true, ""
				}
			}
		}
		return false, "no sync saw " + victim + " unhealthy"
	})
	env.Heal(victim)
	if err != nil {
		t.Fatal(err)
	}
	return 3
}

// steps are the applied syncs since from; with -v each change of action, phase or
// conditions is logged, one line a step.
func steps(t *testing.T, env *harness.Env, from int) []harness.SyncRecord {
	t.Helper()
	var recs []harness.SyncRecord
	last := ""
	var lines []string
	for _, rec := range env.MC.History()[from:] {
		if rec.Err != nil || !rec.Applied || rec.Replayed {
			continue
		}
		recs = append(recs, rec)
		st := rec.Answer.Status
		key := fmt.Sprintf("%s %s %s %s", st.Action.Type, st.Action.Member, st.Phase, harness.Conditions(st))
		if key != last {
			lines = append(lines, fmt.Sprintf("  sync %3d  %-16s %-8s %-8s %s", rec.N, st.Action.Type, st.Action.Member, st.Phase, harness.Conditions(st)))
			last = key
		}
	}
	t.Logf("conditions per step (P: Progressing's reason when True, D: Degraded's when True, in parentheses when False and planned):\n%s", strings.Join(lines, "\n"))
	return recs
}

func condition(st v1alpha1.EtcdClusterStatus, typ string) metav1.Condition {
	for _, c := range st.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return metav1.Condition{}
}

func sawStatus(recs []harness.SyncRecord, typ string, status metav1.ConditionStatus) bool {
	for _, rec := range recs {
		if condition(rec.Answer.Status, typ).Status == status {
			return true
		}
	}
	return false
}
