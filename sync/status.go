package sync

import (
	"fmt"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
)

// Reasons of the Degraded condition when it is True: why the cluster is not as it should be,
// or why the operator cannot go on. A closed list; docs/conditions.md explains each (a test
// checks that the table and this list agree).
const (
	ReasonInvalidSpec              = "InvalidSpec"
	ReasonEtcdUnreachable          = "EtcdUnreachable"
	ReasonEtcdInconsistent         = "EtcdInconsistent"
	ReasonEtcdForked               = "EtcdForked"
	ReasonStrangerMember           = "StrangerMember"
	ReasonClusterIDChanged         = "ClusterIDChanged"
	ReasonQuorumLost               = "QuorumLost"
	ReasonRecoveryPhaseUnknown     = "RecoveryPhaseUnknown"
	ReasonQuorumUnconfirmed        = "QuorumUnconfirmed"
	ReasonMemberUnanswered         = "MemberUnanswered"
	ReasonNodeNotReporting         = "NodeNotReporting"
	ReasonMemberUnhealthy          = "MemberUnhealthy"
	ReasonPodCannotStart           = "PodCannotStart"
	ReasonRemovedMemberRunning     = "RemovedMemberRunning"
	ReasonVolumeTooSmall           = "VolumeTooSmall"
	ReasonJobFailing               = "JobFailing"
	ReasonJobAttemptsExhausted     = "JobAttemptsExhausted"
	ReasonNoSpace                  = "NoSpace"
	ReasonUnplacedAlarm            = "UnplacedAlarm"
	ReasonNoVolumeToRoll           = "NoVolumeToRoll"
	ReasonProgressDeadlineExceeded = "ProgressDeadlineExceeded"
	ReasonLearnerOverdue           = "LearnerOverdue"
	ReasonTLSSecretMissing         = "TLSSecretMissing"
	ReasonTLSCertificate           = "TLSCertificateInvalid"
	ReasonStepSnapshotFailed       = "StepSnapshotFailed"
	ReasonAuthRootLost             = "AuthRootLost"
	ReasonBlocked                  = "Blocked"
)

// The other reasons of the conditions. Progressing also takes the action types (Steady, Hold
// when False; the step or Wait when True), Blocked and ProgressDeadlineExceeded; Available
// also QuorumLost and QuorumUnconfirmed.
const (
	// Degraded=False: every voter is healthy.
	ReasonHealthy = "Healthy"
	// Degraded=False: a member is down only because a step of the operator took it down, and
	// the step is within its deadline.
	ReasonPlannedDisruption = "PlannedDisruption"
	// Available=True: a majority of voters is healthy.
	ReasonQuorumHealthy = "QuorumHealthy"
	// Available=Unknown: etcd did not answer, or its answer cannot be trusted.
	ReasonEtcdUnknown = "EtcdUnknown"
)

// Status never churns: the same observation gives the same status. Times come from
// Observed.Now and are carried over from the last status while nothing changed (an action's
// Since while its type and member stay; a condition's LastTransitionTime while its status
// stays; a step's Started and Finished once written).

// replaceDeadline is how long a pod replacement may take: the old pod stops, the new one is
// scheduled, attaches the member's volume, pulls its image, and its member catches up.
const replaceDeadline = 5 * time.Minute

// stepDeadline is how long a step may run, from its start (status.history) until its result
// is known, before it is overdue: then the cluster is Degraded (ProgressDeadlineExceeded). A
// membership change has its Job's deadline, past which the Job fails; growing the StatefulSet
// includes the new learner catching up, which the planner gives stuckAfter before it gives
// up on it. Teardown has no deadline.
func stepDeadline(t ActionType) time.Duration {
	switch t {
	case ReplacePod, RestartPod:
		return replaceDeadline
	case AddLearner, PromoteLearner, RemoveMember, MoveLeader, Compact, Defragment, DisarmAlarm, TakeBackup, UpdatePeerURL, ExpandVolume:
		return jobDeadline * time.Second
	case RestoreDrill:
		return drillDeadline * time.Second
	case ScaleStatefulSet, Bootstrap:
		return stuckAfter
	}
	return 0
}

// isStep: the action starts a step of status.history. Steady, Wait and Hold change nothing.
func isStep(t ActionType) bool {
	switch t {
	case Steady, Wait, Hold:
		return false
	}
	return true
}

// noStorageWarning is the status warning of a cluster without a storageSpec.
const noStorageWarning = "no storageSpec: member data lives in emptyDir volumes and does not survive the loss of a pod; " +
	"a lost member is replaced from the others, but losing a majority of the pods at once loses the data"

// warnings are the status warnings the spec alone calls for, in a fixed order.
func warnings(c *v1alpha1.EtcdCluster) []string {
	var out []string
	if w := v1alpha1.EvenSizeWarning(*c.Spec.Size); w != "" {
		out = append(out, w)
	}
	if c.Spec.StorageSpec == nil {
		out = append(out, noStorageWarning)
	}
	return out
}

// sameAction: the last status reported this action (type and member) already.
func sameAction(prev *v1alpha1.Action, a Action) bool {
	return prev != nil && prev.Type == a.Type.String() && prev.Member == a.Member && !prev.Since.IsZero()
}

// newStatus starts from what the last status knew of etcd, reports the action, records it
// in the history when it starts a step, and warns about the spec (c is defaulted).
func newStatus(obs *Observed, c *v1alpha1.EtcdCluster, phase v1alpha1.Phase, a Action) v1alpha1.EtcdClusterStatus {
	prev := obs.Cluster.Status
	since := metav1.NewTime(obs.Now)
	if sameAction(prev.Action, a) {
		since = prev.Action.Since
	}
	return v1alpha1.EtcdClusterStatus{
		Phase:          phase,
		ReadyMembers:   prev.ReadyMembers,
		Members:        prev.Members,
		Leader:         prev.Leader,
		ClusterID:      prev.ClusterID,
		CurrentVersion: prev.CurrentVersion,
		V2LogIndex:     prev.V2LogIndex,
		Action:         &v1alpha1.Action{Type: a.Type.String(), Member: a.Member, Reason: a.Reason, Since: since},
		Warnings:       warnings(c),
		Maintenance:    prev.Maintenance,
		Recovery:       prev.Recovery,
		History:        startStep(prev.History, prev.Action, a, "", false, obs.Now),
		Backup:         prev.Backup,
		RestoredFrom:   prev.RestoredFrom,
		// The seed reports the revision it restored once; status keeps it.
		RestoredRevision: prev.RestoredRevision,
		RestoredTime:     prev.RestoredTime,
		RestoreDuration:  prev.RestoreDuration,
		RestoredLineage:  prev.RestoredLineage,
		Client:           prev.Client,
		LastSwitchover:   prev.LastSwitchover,
		Auth:             prev.Auth,
	}
}

// startStep adds a record for a step the last status did not report yet; the step before,
// if still running, ends there: Interrupted when its result would have needed evidence
// (a Job's outcome, a pod back on the current spec), Succeeded otherwise. At most MaxHistory
// records are kept, the newest.
func startStep(hist []v1alpha1.StepRecord, prev *v1alpha1.Action, a Action, job string, repair bool, now time.Time) []v1alpha1.StepRecord {
	if !isStep(a.Type) || sameAction(prev, a) {
		return hist
	}
	return appendStep(hist, v1alpha1.StepRecord{Type: a.Type.String(), Member: a.Member, Reason: a.Reason, Job: job,
		Result: v1alpha1.StepRunning, Repair: repair, Started: metav1.NewTime(now)})
}

// appendStep adds record r, Running, to a copy of hist; the step before, if still running,
// ends when r started, or when it started itself if r's start (read from another clock) is
// earlier.
func appendStep(hist []v1alpha1.StepRecord, r v1alpha1.StepRecord) []v1alpha1.StepRecord {
	hist = slices.Clone(hist)
	if n := len(hist); n > 0 && hist[n-1].Result == v1alpha1.StepRunning {
		result := v1alpha1.StepSucceeded
		if hist[n-1].Job != "" || hist[n-1].Type == ReplacePod.String() {
			result = v1alpha1.StepInterrupted
		}
		finishStep(&hist[n-1], result, latest(hist[n-1].Started.Time, r.Started.Time))
	}
	hist = append(hist, r)
	return hist[max(0, len(hist)-v1alpha1.MaxHistory):]
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// restoreStep gives hist back the record of a step whose start it lacks though the step's
// Job is observed. Metacontroller may hand a sync the EtcdCluster as its cache held it before
// the status that recorded the step, and write that sync's status over it; the Job is then
// the step's only record. A Job of ours that no record names, and whose step is not the
// newest record's, is such a step: a step's Job lives no longer than a few syncs past the
// step, far fewer than the history's records. Its record is rebuilt from the Job, started
// when the Job was created (the API server's clock), a repair when the status handed in says
// Degraded (as it did when the step began), Running; this sync's reading of the Job ends it
// as any record's. A backup or drill, which may run beside another step, is not restored
// over a step still running.
func (v *view) restoreStep(hist []v1alpha1.StepRecord) []v1alpha1.StepRecord {
	running := runningStep(hist) != nil
	var lost *batchv1.Job
	for _, j := range v.jobs {
		verb, created := j.Labels[LabelAction], j.CreationTimestamp
		if created.IsZero() || stepRecorded(hist, j) || running && (verb == verbBackup || verb == verbDrill) {
			continue
		}
		if lost == nil || lost.CreationTimestamp.Before(&created) {
			lost = j
		}
	}
	if lost == nil {
		return hist
	}
	verb, who := lost.Labels[LabelAction], lost.Labels[LabelMember]
	what := verb + " " + who
	if g := guardOf(lost); g != nil {
		// Worded as the guard's own backup step (backupTrigger), which the history is read for.
		what = "backup before " + g.Step
	}
	c := findCondition(v.obs.Cluster.Status.Conditions, v1alpha1.ConditionDegraded)
	degraded := c != nil && c.Status == metav1.ConditionTrue
	return appendStep(hist, v1alpha1.StepRecord{Type: actionOfVerb(verb).String(), Member: who, Job: lost.Name,
		Reason: fmt.Sprintf("%s: Job %s (this record, written over by a status from before it, was restored from the Job)", what, lost.Name),
		Result: v1alpha1.StepRunning, Repair: degraded, Started: lost.CreationTimestamp})
}

// stepRecorded: a record of hist names Job j, or the newest record is of j's step and stands
// for it (a Job of the step under way, rendered again under another name).
func stepRecorded(hist []v1alpha1.StepRecord, j *batchv1.Job) bool {
	if slices.ContainsFunc(hist, func(r v1alpha1.StepRecord) bool { return r.Job == j.Name }) {
		return true
	}
	n := len(hist)
	return n > 0 && hist[n-1].Type == actionOfVerb(j.Labels[LabelAction]).String() && hist[n-1].Member == j.Labels[LabelMember]
}

func finishStep(r *v1alpha1.StepRecord, result string, now time.Time) {
	at := metav1.NewTime(now)
	r.Result, r.Finished = result, &at
}

// setCondition sets one condition, True or False, keeping its transition time while its
// status stays.
func setCondition(st *v1alpha1.EtcdClusterStatus, obs *Observed, c *v1alpha1.EtcdCluster, typ string, on bool, reason, msg string) {
	status := metav1.ConditionFalse
	if on {
		status = metav1.ConditionTrue
	}
	setConditionValue(st, obs, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: c.Generation, LastTransitionTime: metav1.NewTime(obs.Now)})
}

func setConditionValue(st *v1alpha1.EtcdClusterStatus, obs *Observed, cond metav1.Condition) {
	for _, p := range obs.Cluster.Status.Conditions {
		if p.Type == cond.Type && p.Status == cond.Status && !p.LastTransitionTime.IsZero() {
			cond.LastTransitionTime = p.LastTransitionTime
		}
	}
	for i := range st.Conditions {
		if st.Conditions[i].Type == cond.Type {
			st.Conditions[i] = cond
			return
		}
	}
	st.Conditions = append(st.Conditions, cond)
}

// condition is a condition of the cluster's generation, transitioning now.
func (v *view) condition(typ string, status metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: v.c.Generation, LastTransitionTime: metav1.NewTime(v.obs.Now)}
}

// health is how this sync judges the cluster for its conditions and phase: which unhealthy
// voters a step of the operator explains, which it does not, whether the current step has
// overrun its deadline, and what else keeps the cluster from being as it should.
type health struct {
	// current is the step under way (the last record of the history, still Running), or nil.
	current *v1alpha1.StepRecord
	// planned are the unhealthy voters the current step took down; unplanned the others.
	planned, unplanned []string
	// electing are the planned voters that only see no leader while leadership moves: they
	// count toward quorum.
	electing int
	// overdue: the current step has run longer than its deadline.
	overdue bool
	// plannedHold: the planner holds on the member the current step took down or adds (the
	// hook has not reached the recreated member or the new learner yet, or a cluster of one
	// cannot be reached while its only pod is recreated): the hold is part of the step.
	plannedHold bool
	// blocked: the planner reports a reason to be Degraded, unless it is the outage the
	// current step of a cluster of one makes on purpose.
	blocked bool
	// noSpace are the members with a NOSPACE alarm, which refuses every write.
	noSpace []*member
	// lateLearner says why a learner has waited past its deadline (learnerOverdue), "" when
	// none has.
	lateLearner string
}

// judge sorts the unhealthy voters into planned and unplanned against the current step, and
// gathers what else the conditions and the phase report.
func (v *view) judge(s step, hist []v1alpha1.StepRecord, asked bool) health {
	h := health{current: runningStep(hist)}
	cur := h.current
	if cur != nil {
		d := stepDeadline(actionType(cur.Type))
		h.overdue = d > 0 && v.obs.Now.Sub(cur.Started.Time) > d
		if cur.Repair {
			cur = nil // a repair explains nothing
		}
	}
	if asked {
		h.planned, h.unplanned, h.electing = v.sortUnhealthy(cur)
		h.noSpace = v.alarmed("NOSPACE")
		h.lateLearner = v.learnerOverdue()
	}
	if held := v.heldMember(s); v.holdIsPlanned(cur, held) {
		h.plannedHold = true
		if !slices.Contains(h.planned, held) {
			h.planned = append(h.planned, held)
		}
		h.unplanned = slices.DeleteFunc(h.unplanned, func(n string) bool { return n == held })
	}
	h.blocked = s.degraded != "" && !h.plannedHold
	return h
}

// runningStep is the last record of the history while it is still Running, or nil.
func runningStep(hist []v1alpha1.StepRecord) *v1alpha1.StepRecord {
	if n := len(hist); n > 0 && hist[n-1].Result == v1alpha1.StepRunning {
		return &hist[n-1]
	}
	return nil
}

// sortUnhealthy sorts the unhealthy voters into those the step cur took down and the others;
// electing counts the planned ones that are down only while leadership moves.
func (v *view) sortUnhealthy(cur *v1alpha1.StepRecord) (planned, unplanned []string, electing int) {
	for _, m := range v.voters() {
		switch {
		case m.Healthy:
		case v.takesDown(cur, m.name, m.pod):
			planned = append(planned, m.name)
			if cur.Type == MoveLeader.String() {
				electing++
			}
		default:
			unplanned = append(unplanned, m.name)
		}
	}
	return planned, unplanned, electing
}

// takesDown: the step cur explains the member name, on pod, being down. A pod replacement
// takes its member down while the pod is gone, going or new with an etcd that has not failed;
// while leadership moves, members see no leader for a moment, and one whose pod is Ready (the
// kubelet's probe of its own health passes) is down for that alone.
func (v *view) takesDown(cur *v1alpha1.StepRecord, name string, pod *corev1.Pod) bool {
	switch {
	case cur == nil:
		return false
	case cur.Type == ReplacePod.String():
		return cur.Member == name && (podDownAsPlanned(v, pod) || v.deletionNotSeenYet(cur, pod))
	case cur.Type == RestartPod.String():
		return cur.Member == name && podDownAsPlanned(v, pod)
	case cur.Type == MoveLeader.String():
		return pod != nil && !isTerminating(pod) && isReady(pod)
	case cur.Type == UpdatePeerURL.String():
		// Its peers reach it only once etcd has its new URL (tls.go).
		return cur.Member == name && pod != nil && !isTerminating(pod)
	}
	return false
}

// heldMember is the member the planner holds on for want of an answer: the one the hook does
// not reach, or the only voter status knew of when etcd did not answer; "" for none.
func (v *view) heldMember(s step) string {
	switch s.degradedBy {
	case ReasonMemberUnanswered:
		return s.action.Member
	case ReasonEtcdUnreachable:
		var voters []string
		for _, m := range v.obs.Cluster.Status.Members {
			if !m.IsLearner {
				voters = append(voters, m.Name)
			}
		}
		if len(voters) == 1 {
			return voters[0]
		}
	}
	return ""
}

// holdIsPlanned: the step cur explains the hook not reaching held, as it takes held's pod
// down, or adds held as a learner that is still joining.
func (v *view) holdIsPlanned(cur *v1alpha1.StepRecord, held string) bool {
	ord, ok := Ordinal(v.c.Name, held)
	if !ok || cur == nil {
		return false
	}
	if (cur.Type == ReplacePod.String() || cur.Type == RestartPod.String()) && v.takesDown(cur, held, v.pods[ord]) {
		return true
	}
	m := v.byOrd[ord]
	return cur.Member == held && m != nil && m.IsLearner
}

// podCacheLag bounds how long after a replacement starts the pod it deletes may still look
// untouched to the hook (Metacontroller's pod cache lags the kubelet, which already stopped
// its etcd).
const podCacheLag = time.Minute

// deletionNotSeenYet: the replacement cur has just lowered the partition onto pod, which the
// StatefulSet deletes, and the hook's cache still shows it as it was: Ready, not terminating.
// A pod not Ready was down before the replacement touched it.
func (v *view) deletionNotSeenYet(cur *v1alpha1.StepRecord, pod *corev1.Pod) bool {
	if pod == nil || isTerminating(pod) || !isReady(pod) || !v.outdated(pod) || v.obs.Now.Sub(cur.Started.Time) > podCacheLag {
		return false
	}
	ord, ok := ownPod(v.c, pod)
	return ok && v.partition <= ord
}

// podDownAsPlanned: the pod is gone, going, or new on the current spec with an etcd that
// has not failed yet (no restart, nothing keeping it from starting). An outdated pod that is
// not terminating was not touched by a replacement: its member is down for another reason.
func podDownAsPlanned(v *view, p *corev1.Pod) bool {
	if p == nil || isTerminating(p) {
		return true
	}
	if v.outdated(p) || v.cannotStart(p) != "" {
		return false
	}
	cs := etcdStatus(p)
	return cs == nil || cs.RestartCount <= 0
}

// actionType is the ActionType of a status action type; Hold for an unknown name.
func actionType(name string) ActionType {
	for t, n := range actionNames {
		if n == name {
			return ActionType(t)
		}
	}
	return Hold
}

// updateResult brings the running step's result up to date with what this sync observes: a
// Job's outcome, a pod back on the current spec with its member healthy, or a cluster steady
// again after a step that leaves nothing to check.
func (v *view) updateResult(s step, hist []v1alpha1.StepRecord, asked bool) []v1alpha1.StepRecord {
	n := len(hist)
	if n == 0 || hist[n-1].Result != v1alpha1.StepRunning {
		return hist
	}
	r := hist[n-1]
	result := ""
	switch {
	case r.Job != "":
		found := false
		for _, j := range v.jobs {
			if j.Name != r.Job {
				continue
			}
			found = true
			switch state, _ := stateOf(j); state {
			case jobSucceeded:
				result = v1alpha1.StepSucceeded
			case jobFailed:
				result = v1alpha1.StepFailed
			}
		}
		if r.Type == RestartPod.String() && (result == v1alpha1.StepSucceeded || !found) {
			// Its Job only deletes the pod: like a replacement, the step is done once the
			// member is back, on a new pod (or the cluster is steady before its pod shows
			// Ready).
			result = ""
			if ord, ok := Ordinal(v.c.Name, r.Member); ok && asked && (v.restartedForResize(ord) || s.action.Type == Steady) {
				result = v1alpha1.StepSucceeded
			}
		}
		if result == "" && s.action.Type == Steady {
			result = v1alpha1.StepInterrupted
		}
	case r.Type == ReplacePod.String():
		if ord, ok := Ordinal(v.c.Name, r.Member); ok && asked && v.replaced(ord) {
			result = v1alpha1.StepSucceeded
		}
	case s.action.Type == Steady:
		result = v1alpha1.StepSucceeded
	}
	if result == "" {
		return hist
	}
	hist = slices.Clone(hist)
	finishStep(&hist[n-1], result, v.obs.Now)
	return hist
}

// replaced: the pod at ord runs the current spec and its member, if it has one, is a learner
// or a healthy voter on a Ready pod (the StatefulSet controller waits for Ready too).
func (v *view) replaced(ord int) bool {
	p, m := v.pods[ord], v.byOrd[ord]
	return p != nil && !isTerminating(p) && !v.outdated(p) && (m == nil || m.IsLearner || m.Healthy && isReady(p))
}

// answer is the status and the resync of a decided step, as the status table fills them in.
type answer struct {
	step   step
	job    *Child // the step's rendered Job, if any
	ledger ledger // the ledger the join ConfigMap carries after the step
	st     v1alpha1.EtcdClusterStatus
	resync float64
}

// stepStatus reports a step over a view: membership as etcd has it, the history of steps, and
// the three conditions.
func (v *view) stepStatus(a *answer) {
	s, job := a.step, a.job
	// Membership as etcd answered, unless the answer cannot be trusted: then status keeps what
	// it knew, above all the cluster ID, which a stranger's answer must not overwrite.
	asked := v.unknown == ""
	hist := v.updateResult(s, v.restoreStep(v.obs.Cluster.Status.History), asked)
	h := v.judge(s, hist, asked)
	degraded, degradedWhy, degradedMsg := degradedCondition(s, h)

	st := newStatus(v.obs, v.c, v.phase(s, h), s.action)
	if s.maintenance != nil {
		st.Maintenance = s.maintenance
	}
	if s.switchover != nil {
		st.LastSwitchover = s.switchover
	}
	st.Recovery, st.V2LogIndex, st.ForkSeenSince = v.recoveryAfter(s), v.safe.v2LogIndex, s.forkSeen
	jobName := ""
	if job != nil {
		jobName = job.Name
	}
	// A step started while the cluster is Degraded is a repair.
	st.History = startStep(hist, v.obs.Cluster.Status.Action, s.action, jobName, degraded, v.obs.Now)
	st.JobFailures = jobFailures(s)
	if asked {
		v.reportMembership(&st)
	} else {
		st.Members = v.refreshVolumes(st.Members)
	}

	v.setAvailable(&st, s, h, asked)
	cur := h.current
	if r := runningStep(st.History); r != nil {
		cur = r
	}
	on, why, msg := progressing(s, h, cur)
	setCondition(&st, v.obs, v.c, v1alpha1.ConditionProgressing, on, why, msg)
	setCondition(&st, v.obs, v.c, v1alpha1.ConditionDegraded, degraded, degradedWhy, degradedMsg)
	a.st = st
}

// degradedCondition is the Degraded condition: whether it is True, its reason and message.
// It is the one place that says what makes the cluster Degraded, the most pressing cause
// reported first; the phase and the repair mark of a step follow it.
func degradedCondition(s step, h health) (degraded bool, reason, msg string) {
	switch {
	case h.blocked:
		reason = s.degradedBy
		if reason == "" {
			reason = ReasonBlocked
		}
		return true, reason, s.degraded
	case len(h.noSpace) > 0:
		// Degraded while the alarm stands, whatever is being done about it.
		return true, ReasonNoSpace, "NOSPACE alarm raised by " + memberNames(h.noSpace) + ": etcd refuses writes until it is disarmed"
	case len(h.unplanned) > 0:
		return true, ReasonMemberUnhealthy, "unhealthy: " + strings.Join(h.unplanned, ", ")
	case h.overdue:
		return true, ReasonProgressDeadlineExceeded, overdueMessage(h.current, s)
	case h.lateLearner != "":
		return true, ReasonLearnerOverdue, h.lateLearner
	case len(h.planned) > 0:
		c := h.current
		return false, ReasonPlannedDisruption, fmt.Sprintf("down for the current step: %s (%s %s, started %s, deadline %s)",
			strings.Join(h.planned, ", "), c.Type, c.Member, c.Started.UTC().Format(time.RFC3339), stepDeadline(actionType(c.Type)))
	}
	return false, ReasonHealthy, "no unhealthy member seen"
}

// phase is the cluster's phase: Creating until etcd first answers and while the cluster grows
// to its first full size, Unavailable when etcd did not answer or no quorum of voters may be
// healthy, Degraded as the Degraded condition says, Running otherwise.
func (v *view) phase(s step, h health) v1alpha1.Phase {
	if s.phase != "" {
		return s.phase
	}
	// answered: etcd answered at all; the phase follows what it said, trusted or not.
	answered := v.obs.Etcd.Asked && len(v.members) > 0
	voters, healthy := len(v.voters()), v.healthyVoters()
	prev := v.obs.Cluster.Status.Phase
	if prev == v1alpha1.PhaseCreating && s.action.Type != Hold {
		// While the cluster is created, voters not healthy yet are starting, not failing.
		h.unplanned = nil
	}
	degraded, _, _ := degradedCondition(s, h)
	switch {
	case !answered && v.obs.Cluster.Status.ClusterID == "":
		return v1alpha1.PhaseCreating
	case !answered || !etcdstate.HasQuorum(voters, healthy+h.electing+len(v.unansweredVoters())):
		return v1alpha1.PhaseUnavailable
	case degraded:
		return v1alpha1.PhaseDegraded
	case (prev == v1alpha1.PhaseCreating || prev == "") && voters < v.size:
		// Still growing to its first full size.
		return v1alpha1.PhaseCreating
	}
	return v1alpha1.PhaseRunning
}

// jobFailures is status.jobFailures for the step: the attempt of the Job it keeps, counting
// that Job if it failed, or the attempt of the Job it starts.
func jobFailures(s step) int32 {
	if len(s.keep) > 0 {
		n := int32(attemptOf(s.keep[0]))
		if state, _ := stateOf(s.keep[0]); state == jobFailed {
			n++
		}
		return n
	}
	if s.job != nil {
		return int32(s.job.attempt)
	}
	return 0
}

// reportMembership puts membership as etcd answered it into st.
func (v *view) reportMembership(st *v1alpha1.EtcdClusterStatus) {
	st.Members = nil
	for _, m := range v.members {
		ms := v1alpha1.MemberStatus{
			Name: m.name, ID: fmt.Sprintf("%x", m.ID), Ordinal: int32(m.ordinal),
			IsLearner: m.IsLearner, IsLeader: m.IsLeader, Healthy: m.Healthy,
			Version: v1alpha1.NormalizeVersion(m.Version),
		}
		if m.unanswered() {
			since := metav1.NewTime(v.unansweredSince(m))
			ms.UnansweredSince = &since
		}
		v.recordClocks(&ms, m)
		if m.pod != nil {
			ms.LaunchRefused = launcherRefusal(m.pod)
		}
		ms.Volume = v.volumeStatus(m.ordinal)
		st.Members = append(st.Members, ms)
	}
	st.ReadyMembers = int32(v.healthyVoters())
	st.Leader = ""
	if v.leader != nil {
		st.Leader = v.leader.name
	}
	st.ClusterID = fmt.Sprintf("%x", v.obs.Etcd.ClusterID)
	st.CurrentVersion = v.runningVersion()
	st.V2LogIndex = v.v2LogIndexAfter()
	st.Client = v.clientStatus()
}

// setAvailable sets the Available condition: Unknown while etcd's answer cannot be trusted,
// True with a healthy quorum (voters that see no leader only while leadership moves count),
// Unknown again when only voters the hook does not reach would make one, False otherwise.
func (v *view) setAvailable(st *v1alpha1.EtcdClusterStatus, s step, h health, asked bool) {
	voters, healthy := len(v.voters()), v.healthyVoters()
	switch {
	case !asked:
		setConditionValue(st, v.obs, v.condition(v1alpha1.ConditionAvailable, metav1.ConditionUnknown, ReasonEtcdUnknown, s.action.Reason))
	case etcdstate.HasQuorum(voters, healthy+h.electing):
		msg := fmt.Sprintf("%d of %d voters healthy", healthy, voters)
		if h.electing > 0 {
			msg += fmt.Sprintf("; %d more see no leader while leadership moves", h.electing)
		}
		setCondition(st, v.obs, v.c, v1alpha1.ConditionAvailable, true, ReasonQuorumHealthy, msg)
	case etcdstate.HasQuorum(voters, healthy+len(v.unansweredVoters())):
		setConditionValue(st, v.obs, v.condition(v1alpha1.ConditionAvailable, metav1.ConditionUnknown, ReasonQuorumUnconfirmed,
			fmt.Sprintf("%d of %d voters healthy; %d more did not answer the hook but their pods are Ready", healthy, voters, len(v.unansweredVoters()))))
	default:
		setCondition(st, v.obs, v.c, v1alpha1.ConditionAvailable, false, ReasonQuorumLost, fmt.Sprintf("%d of %d voters healthy", healthy, voters))
	}
}

// progressing is the Progressing condition: True while a step is under way or waited for,
// its reason the step's type (or Wait, for a wait outside any step); False when steady, on
// hold, blocked, or past the current step's deadline.
func progressing(s step, h health, cur *v1alpha1.StepRecord) (bool, string, string) {
	switch {
	case h.blocked && isStep(s.action.Type):
		// A repair under way (remediating NOSPACE, recovering quorum) progresses, whatever
		// keeps the cluster Degraded meanwhile.
		return true, s.action.Type.String(), s.action.Reason
	case h.blocked:
		return false, ReasonBlocked, s.action.Reason
	case h.overdue && !isStep(s.action.Type):
		return false, ReasonProgressDeadlineExceeded, overdueMessage(h.current, s)
	case h.plannedHold:
		return true, cur.Type, s.action.Reason
	case s.action.Type == Hold:
		return false, Hold.String(), s.action.Reason
	case cur != nil && s.action.Type == Steady:
		// The planner has nothing left to do, but the last pod it replaced is not back yet.
		return true, cur.Type, cur.Reason
	case cur != nil:
		return true, cur.Type, s.action.Reason
	}
	return s.action.Type != Steady, s.action.Type.String(), s.action.Reason
}

func overdueMessage(r *v1alpha1.StepRecord, s step) string {
	return fmt.Sprintf("%s %s started %s and has not finished within %s: %s", r.Type, r.Member, r.Started.UTC().Format(time.RFC3339),
		stepDeadline(actionType(r.Type)), s.action.Reason)
}

// lowestVersion is the lowest etcd version the answering members report, "v"-prefixed; ""
// when none reports one. Members mostly run the same version: a string equal to the lowest
// so far is not parsed again (parsing runs a regexp).
func lowestVersion(ms []etcdstate.Member) string {
	var low *version.Version
	lowFrom := ""
	for _, m := range ms {
		if m.Version == "" || m.Version == lowFrom {
			continue
		}
		v, err := version.ParseSemantic(m.Version)
		if err == nil && (low == nil || v.LessThan(low)) {
			low, lowFrom = v, m.Version
		}
	}
	if low == nil {
		return ""
	}
	return "v" + low.String()
}

// refreshVolumes is the members status last recorded, with each volume as its claim is now:
// claims do not depend on etcd's answer, so a hold still shows which grew and which wait.
func (v *view) refreshVolumes(members []v1alpha1.MemberStatus) []v1alpha1.MemberStatus {
	out := slices.Clone(members)
	for i := range out {
		out[i].Volume = v.volumeStatus(int(out[i].Ordinal))
	}
	return out
}
