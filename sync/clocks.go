package sync

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// Every clock measures its own interval, recorded per member in status (so that it survives a
// hook restart, and goes with the member): a voter unhealthy since, a learner running since and
// applying since. None of them is the current action's age, which any other step (a backup, a
// leader move) restarts.

// clockSkewMargin is added to a grace period measured from a time the API server or a
// controller wrote (a pod's creationTimestamp, a backup Job's completion time): their clocks
// and the hook's may differ, and skew must never end a wait early.
const clockSkewMargin = time.Minute

// elapsedSince is how long ago t was, by the hook's clock, for a time another clock wrote:
// less the margin, so a clock running ahead of the hook's never shortens a wait.
func (v *view) elapsedSince(t time.Time) time.Duration {
	return v.obs.Now.Sub(t) - clockSkewMargin
}

// record is what the last status recorded of the same member (name and ID), or nil.
func (v *view) record(m *member) *v1alpha1.MemberStatus {
	id := fmt.Sprintf("%x", m.ID)
	for i := range v.obs.Cluster.Status.Members {
		if prev := &v.obs.Cluster.Status.Members[i]; prev.Name == m.name && prev.ID == id {
			return prev
		}
	}
	return nil
}

// unhealthyCounts: m is a voter whose being unhealthy can be waited out. A member only the
// hook cannot reach has its own record (unansweredSince); one whose pod cannot start is
// blocked on the spec or the nodes, and its wait starts once the pod can start.
func (v *view) unhealthyCounts(m *member) bool {
	return !m.IsLearner && !m.Healthy && !m.unanswered() && (m.pod == nil || v.cannotStart(m.pod) == "")
}

// unhealthySince is when the hook first found m unhealthy while that counted (see
// unhealthyCounts); false when it does not count now.
func (v *view) unhealthySince(m *member) (time.Time, bool) {
	if !v.unhealthyCounts(m) {
		return time.Time{}, false
	}
	if prev := v.record(m); prev != nil && prev.UnhealthySince != nil {
		return prev.UnhealthySince.Time, true
	}
	return v.obs.Now, true
}

// runningSince is when the hook first found the learner's etcd started on its current pod:
// the pod past Pending, and its etcd container running, Ready, or having run and ended (a
// member that fails to start fails past Pending); false before. A pod still Pending
// (scheduling, attaching its volume, pulling its image, or in the kubelet's back-off on a
// pull) is not the learner's time to catch up. Once started, the clock runs on through
// restarts, until the pod goes or is Pending again.
func (v *view) runningSince(l *member) (time.Time, bool) {
	p := l.pod
	if p == nil || isTerminating(p) || p.Status.Phase == corev1.PodPending {
		return time.Time{}, false
	}
	if prev := v.record(l); prev != nil && prev.RunningSince != nil {
		return prev.RunningSince.Time, true
	}
	if etcdHasRun(p) {
		return v.obs.Now, true
	}
	return time.Time{}, false
}

// progressRecordEvery: a learner's progress is recorded at most this often, so that status
// does not change on every sync while it catches up. The wait after its last progress is
// longer by as much, so that the coarser record never ends it early.
const progressRecordEvery = time.Minute

// applied is the learner's progress: the highest raft index it was seen to have applied, and
// when that last rose (zero before it ever rose). Only a learner that answers healthy makes
// progress: one with an alarm or errors would not be promoted, however far it applies. One
// that did not answer keeps its last record.
func (v *view) applied(l *member) (uint64, time.Time) {
	prev := v.record(l)
	if prev == nil || prev.RunningSince == nil {
		// Progress is measured from the first sighting of its etcd running: a pod recreated
		// without a volume starts again from nothing.
		return l.RaftAppliedIndex, time.Time{}
	}
	var since time.Time
	if prev.ProgressSince != nil {
		since = prev.ProgressSince.Time
	}
	if l.Healthy && l.RaftAppliedIndex > prev.AppliedIndex && (since.IsZero() || v.obs.Now.Sub(since) >= progressRecordEvery) {
		return l.RaftAppliedIndex, v.obs.Now
	}
	return prev.AppliedIndex, since
}

// learnerIdle is how long the learner has run without applying anything new: from the later
// of its start and its last progress. False while it has not started.
func (v *view) learnerIdle(l *member) (time.Duration, bool) {
	since, ok := v.runningSince(l)
	if !ok {
		return 0, false
	}
	if _, rose := v.applied(l); rose.After(since) {
		// The record may lag the last rise by up to progressRecordEvery: never counted as idle.
		return v.obs.Now.Sub(rose) - progressRecordEvery, true
	}
	return v.obs.Now.Sub(since), true
}

// recordClocks writes m's clocks into its status record.
func (v *view) recordClocks(ms *v1alpha1.MemberStatus, m *member) {
	stamp := func(t time.Time) *metav1.Time {
		mt := metav1.NewTime(t)
		return &mt
	}
	if t, ok := v.unhealthySince(m); ok {
		ms.UnhealthySince = stamp(t)
	}
	if !m.IsLearner {
		return
	}
	if t, ok := v.runningSince(m); ok {
		ms.RunningSince = stamp(t)
	}
	index, rose := v.applied(m)
	ms.AppliedIndex = index
	if !rose.IsZero() {
		ms.ProgressSince = stamp(rose)
	}
}

// learnerOverdue says why a learner has waited past its deadline, "" when none has: its etcd
// has run stuckAfter without catching up (its own clock, runningSince; one still applying is
// still waited for, but no longer quietly), or it was given up on as stuck and added again
// (status.history's last removal or promotion of the name is that removal), which goes on for
// as long as what keeps it from catching up does. A member to be a voter is missing meanwhile:
// in a replacement, no step of the operator's is under way to say so.
func (v *view) learnerOverdue() string {
	for _, l := range v.learners() {
		if since, ok := v.runningSince(l); ok && v.obs.Now.Sub(since) >= stuckAfter {
			return fmt.Sprintf("learner %s has run since %s and has not caught up with the leader (docs/runbooks.md, a learner that never catches up)",
				l.name, since.UTC().Format(time.RFC3339))
		}
		if at, ok := v.givenUpOn(l.name); ok {
			return fmt.Sprintf("learner %s was given up on as stuck at %s and added again; it has not caught up since (docs/runbooks.md, a learner that never catches up)",
				l.name, at.UTC().Format(time.RFC3339))
		}
	}
	return ""
}

// givenUpOn is when member name was last removed as a stuck learner, if that is the last
// removal or promotion of the name status.history records.
func (v *view) givenUpOn(name string) (time.Time, bool) {
	hist := v.obs.Cluster.Status.History
	for i := len(hist) - 1; i >= 0; i-- {
		r := hist[i]
		if r.Member != name || r.Type != RemoveMember.String() && r.Type != PromoteLearner.String() {
			continue
		}
		return r.Started.Time, r.Type == RemoveMember.String() && strings.HasPrefix(r.Reason, "learner "+name+" is stuck")
	}
	return time.Time{}, false
}
