package sync

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

func TestEvents(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	addLearner := v1alpha1.StepRecord{Type: "AddLearner", Member: "etcd-3", Reason: "scale out to 5", Job: "etcd-add-learner-etcd-3-1", Result: v1alpha1.StepRunning, Started: t0}
	succeeded, failed := addLearner, addLearner
	succeeded.Result, succeeded.Finished = v1alpha1.StepSucceeded, &t1
	failed.Result, failed.Finished = v1alpha1.StepFailed, &t1
	promote := v1alpha1.StepRecord{Type: "PromoteLearner", Member: "etcd-3", Reason: "caught up", Result: v1alpha1.StepRunning, Started: t1}
	cond := func(typ string, status metav1.ConditionStatus, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, LastTransitionTime: t0}
	}
	healthy := []metav1.Condition{
		cond(v1alpha1.ConditionAvailable, metav1.ConditionTrue, ReasonQuorumHealthy, "3 of 3 voters healthy"),
		cond(v1alpha1.ConditionProgressing, metav1.ConditionFalse, "Steady", ""),
		cond(v1alpha1.ConditionDegraded, metav1.ConditionFalse, ReasonHealthy, ""),
	}
	degraded := slices.Clone(healthy)
	degraded[2] = cond(v1alpha1.ConditionDegraded, metav1.ConditionTrue, ReasonMemberUnhealthy, "etcd-1 unhealthy since 10:00")
	progressing := slices.Clone(healthy)
	progressing[1] = cond(v1alpha1.ConditionProgressing, metav1.ConditionTrue, "AddLearner", "scale out")
	hold := &v1alpha1.Action{Type: Hold.String(), Reason: "etcd not reachable"}

	for _, tc := range []struct {
		story      string
		prev, next v1alpha1.EtcdClusterStatus
		want       []Event
	}{
		{"nothing changed: a replayed sync emits nothing",
			v1alpha1.EtcdClusterStatus{History: []v1alpha1.StepRecord{addLearner}, Conditions: degraded, Action: hold},
			v1alpha1.EtcdClusterStatus{History: []v1alpha1.StepRecord{addLearner}, Conditions: degraded, Action: hold},
			nil},
		{"a step starts: its type is the reason; Progressing is told by the step, not again",
			v1alpha1.EtcdClusterStatus{Conditions: healthy},
			v1alpha1.EtcdClusterStatus{History: []v1alpha1.StepRecord{addLearner}, Conditions: progressing},
			[]Event{{corev1.EventTypeNormal, "AddLearner", "AddLearner etcd-3 (Job etcd-add-learner-etcd-3-1): scale out to 5"}}},
		{"a step ends well and the next starts",
			v1alpha1.EtcdClusterStatus{History: []v1alpha1.StepRecord{addLearner}},
			v1alpha1.EtcdClusterStatus{History: []v1alpha1.StepRecord{succeeded, promote}},
			[]Event{
				{corev1.EventTypeNormal, EventStepSucceeded, "AddLearner etcd-3 (Job etcd-add-learner-etcd-3-1): succeeded"},
				{corev1.EventTypeNormal, "PromoteLearner", "PromoteLearner etcd-3: caught up"},
			}},
		{"a step's Job fails: a warning",
			v1alpha1.EtcdClusterStatus{History: []v1alpha1.StepRecord{addLearner}},
			v1alpha1.EtcdClusterStatus{History: []v1alpha1.StepRecord{failed}},
			[]Event{{corev1.EventTypeWarning, EventStepFailed, "AddLearner etcd-3 (Job etcd-add-learner-etcd-3-1): failed"}}},
		{"a step that started and ended between two observed statuses is told both ways",
			v1alpha1.EtcdClusterStatus{},
			v1alpha1.EtcdClusterStatus{History: []v1alpha1.StepRecord{failed}},
			[]Event{
				{corev1.EventTypeNormal, "AddLearner", "AddLearner etcd-3 (Job etcd-add-learner-etcd-3-1): scale out to 5"},
				{corev1.EventTypeWarning, EventStepFailed, "AddLearner etcd-3 (Job etcd-add-learner-etcd-3-1): failed"},
			}},
		{"a hold begins: a warning with its reason; a hold that goes on is not told again",
			v1alpha1.EtcdClusterStatus{Action: &v1alpha1.Action{Type: Steady.String()}},
			v1alpha1.EtcdClusterStatus{Action: hold},
			[]Event{{corev1.EventTypeWarning, EventHold, "etcd not reachable"}}},
		{"Degraded turns True, then back: a warning, then a normal event, each with the condition's reason",
			v1alpha1.EtcdClusterStatus{Conditions: healthy},
			v1alpha1.EtcdClusterStatus{Conditions: degraded},
			[]Event{{corev1.EventTypeWarning, ReasonMemberUnhealthy, "Degraded=True: etcd-1 unhealthy since 10:00"}}},
		{"Degraded clears",
			v1alpha1.EtcdClusterStatus{Conditions: degraded},
			v1alpha1.EtcdClusterStatus{Conditions: healthy},
			[]Event{{corev1.EventTypeNormal, ReasonHealthy, "Degraded=False: "}}},
		{"conditions that first appear healthy are no news; a bad one is",
			v1alpha1.EtcdClusterStatus{},
			v1alpha1.EtcdClusterStatus{Conditions: append(slices.Clone(healthy), cond(v1alpha1.ConditionBackedUp, metav1.ConditionFalse, "BackupFailed", "no snapshot stored"))},
			[]Event{{corev1.EventTypeWarning, "BackupFailed", "BackedUp=False: no snapshot stored"}}},
	} {
		if got := events(&tc.prev, &tc.next); !slices.Equal(got, tc.want) {
			t.Errorf("%s:\n got %q\nwant %q", tc.story, got, tc.want)
		}
	}
}

// checkEvents checks the Events of every simulated sync (sim_test.go): well formed, a start
// told for every step the history gained, a warning for every Degraded that turned True, and
// none for a status that is already the one answered.
func checkEvents(t testing.TB, prev *v1alpha1.EtcdClusterStatus, d Decision) {
	t.Helper()
	for _, e := range d.Events {
		if e.Type != corev1.EventTypeNormal && e.Type != corev1.EventTypeWarning || !camelCase.MatchString(e.Reason) || len(e.Reason) > 128 ||
			e.Message == "" || len(e.Message) > maxEventMessage {
			t.Fatalf("malformed event %+v", e)
		}
	}
	told := func(typ, reason string) bool {
		return slices.ContainsFunc(d.Events, func(e Event) bool { return e.Type == typ && e.Reason == reason })
	}
	for _, r := range d.Status.History {
		if findStep(prev.History, r) == nil && !told(corev1.EventTypeNormal, r.Type) {
			t.Fatalf("step %s %s started without an event: %+v", r.Type, r.Member, d.Events)
		}
	}
	if c := findCondition(d.Status.Conditions, v1alpha1.ConditionDegraded); c != nil && c.Status == metav1.ConditionTrue {
		if old := findCondition(prev.Conditions, v1alpha1.ConditionDegraded); (old == nil || old.Status != c.Status || old.Reason != c.Reason) && !told(corev1.EventTypeWarning, c.Reason) {
			t.Fatalf("Degraded=True (%s) without a warning: %+v", c.Reason, d.Events)
		}
	}
	if again := events(&d.Status, &d.Status); len(again) > 0 {
		t.Fatalf("a status already answered emits %+v", again)
	}
}
