package sync

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// Event is one Kubernetes Event the hook emits on the EtcdCluster: what changed between the
// status the sync started from and the one it answers. Reasons are the status's own (the
// step's action type, the condition's reason), so that an Event and the status it reports
// read the same.
type Event struct {
	// Type is corev1.EventTypeNormal or corev1.EventTypeWarning.
	Type    string
	Reason  string
	Message string
}

// Event reasons of their own: a step's end. A step's start takes its action type as reason,
// a condition's change the condition's reason.
const (
	EventStepSucceeded   = "StepSucceeded"
	EventStepFailed      = "StepFailed"
	EventStepInterrupted = "StepInterrupted"
	EventHold            = "Hold"
)

// maxEventMessage bounds a message, as the API server does (1 KiB for core Events' notes);
// longer ones are cut.
const maxEventMessage = 1024

// events are the Events a sync emits: each step of the history that started or ended, a hold
// that began, and each condition other than Progressing (which the steps tell) that changed
// status or reason. A repeated sync, whose status is already the one it answers, emits none.
func events(prev, next *v1alpha1.EtcdClusterStatus) []Event {
	var out []Event
	add := func(typ, reason, format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if len(msg) > maxEventMessage {
			msg = msg[:maxEventMessage-3] + "..."
		}
		out = append(out, Event{Type: typ, Reason: reason, Message: msg})
	}
	for _, r := range next.History {
		before := findStep(prev.History, r)
		if before == nil {
			add(corev1.EventTypeNormal, r.Type, "%s", stepText(r, r.Reason))
		}
		if before != nil && before.Result == r.Result || r.Result == v1alpha1.StepRunning {
			continue
		}
		switch r.Result {
		case v1alpha1.StepSucceeded:
			add(corev1.EventTypeNormal, EventStepSucceeded, "%s", stepText(r, "succeeded"))
		case v1alpha1.StepFailed:
			add(corev1.EventTypeWarning, EventStepFailed, "%s", stepText(r, "failed"))
		case v1alpha1.StepInterrupted:
			add(corev1.EventTypeNormal, EventStepInterrupted, "%s", stepText(r, "interrupted"))
		}
	}
	if a := next.Action; a != nil && a.Type == Hold.String() && (prev.Action == nil || prev.Action.Type != Hold.String()) {
		add(corev1.EventTypeWarning, EventHold, "%s", a.Reason)
	}
	for _, c := range next.Conditions {
		if c.Type == v1alpha1.ConditionProgressing {
			continue
		}
		old := findCondition(prev.Conditions, c.Type)
		if old != nil && old.Status == c.Status && old.Reason == c.Reason {
			continue
		}
		if old == nil && !badCondition(c) {
			continue // a condition that starts out well is news to nobody
		}
		typ := corev1.EventTypeNormal
		if badCondition(c) {
			typ = corev1.EventTypeWarning
		}
		add(typ, c.Reason, "%s=%s: %s", c.Type, c.Status, c.Message)
	}
	return out
}

// findStep is the record of prev for the same step: its type, member and start.
func findStep(prev []v1alpha1.StepRecord, r v1alpha1.StepRecord) *v1alpha1.StepRecord {
	for i := range prev {
		p := &prev[i]
		if p.Type == r.Type && p.Member == r.Member && p.Started.Equal(&r.Started) {
			return p
		}
	}
	return nil
}

func findCondition(conds []metav1.Condition, typ string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}

// badCondition: a condition a person should hear of. Degraded is bad when True; the others
// (Available, BackedUp, VolumesExpanded) when not True.
func badCondition(c metav1.Condition) bool {
	if c.Type == v1alpha1.ConditionDegraded {
		return c.Status == metav1.ConditionTrue
	}
	return c.Status != metav1.ConditionTrue
}

// stepText names a step: its type, its member and its Job, then what is said of it.
func stepText(r v1alpha1.StepRecord, what string) string {
	var b strings.Builder
	b.WriteString(r.Type)
	if r.Member != "" {
		b.WriteString(" " + r.Member)
	}
	if r.Job != "" {
		b.WriteString(" (Job " + r.Job + ")")
	}
	if what != "" {
		b.WriteString(": " + what)
	}
	return b.String()
}
