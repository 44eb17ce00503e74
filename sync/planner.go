package sync

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/joinstate"
)

// planner runs the phases from 6 on over one view. Its fields are set before the phases run
// and only read by them: what the Job stage found, and the recovery as it stands.
type planner struct {
	*view
	stage jobStage
	// recovery is the quorum recovery as the phases find it: the last status's, moved on by
	// recoveryProgress; nil when there is none.
	recovery *v1alpha1.RecoveryStatus
}

// jobStage is what phase 6 found among the observed Jobs, for the phases after it.
type jobStage struct {
	// waiting, when set, is a Job outstanding: the sync waits for it and decides nothing else.
	waiting *step
	// keep are observed Jobs returned unchanged: the one in flight, or one whose outcome is
	// still to be seen or waited out.
	keep []*batchv1.Job
	// failures counts failed Jobs of the step named retry, dropped after their backoff; the
	// same step, planned again, runs as the next attempt.
	failures int
	retry    string
	// exhausted is a failed Job at its attempt limit. It blocks only its own step: when the
	// phases decide anything else (its member is gone, the spec changed), it is dropped.
	exhausted *batchv1.Job
	// done are the steps (verb/member) whose Jobs succeeded and are dropped in this sync:
	// maintenance that leaves nothing in the membership to show for it reads them here.
	done []string
	// backup is status.backup with the outcomes of finished backup Jobs recorded; nil when
	// none finished.
	backup *v1alpha1.BackupStatus
	// backupWait, when set, waits for a backup Job still outstanding: it defers the normal
	// phases, never a fix (backup.go).
	backupWait *step
	// backupRetry is what a failed backup Job whose database outgrew its scratch volume was
	// for (its backupFor): taken again now (backup.go, outgrewScratch).
	backupRetry string
}

// step is what a phase from 6 on decided.
type step struct {
	action    Action
	replicas  int
	partition int
	job       *memberJob
	// keep are observed Jobs returned unchanged.
	keep []*batchv1.Job
	// hold returns the observed children unchanged instead of rendering them (missing ones
	// are rendered again).
	hold bool
	// rollForward, on a hold, lowers the StatefulSet's partition to partition (see
	// view.rollForward).
	rollForward bool
	resync      float64
	degraded    string // why the cluster is Degraded, beyond unhealthy members
	// degradedBy is the Degraded condition's reason when degraded is set; Blocked if empty.
	degradedBy string
	// maintenance, recovery and backup, when set, replace what status records of them. A
	// phase that decides nothing may still return them, to be recorded whatever decides.
	maintenance *v1alpha1.MaintenanceStatus
	recovery    *v1alpha1.RecoveryStatus
	backup      *v1alpha1.BackupStatus
	// forkSeen is status.forkSeenSince after this sync: nil unless it saw a fork.
	forkSeen *metav1.Time
}

// records takes the status records of from where s has none.
func (s *step) records(from step) {
	if s.maintenance == nil {
		s.maintenance = from.maintenance
	}
	if s.recovery == nil {
		s.recovery = from.recovery
	}
	if s.backup == nil {
		s.backup = from.backup
	}
}

// plan runs the Job stage (phase 6), then the later phases with what it found.
func plan(v *view) step {
	p := &planner{view: v}
	progress := p.recoveryProgress()
	p.recovery = progress
	if progress == nil {
		p.recovery = v.safe.recovery
	}
	// 6. The Job stage: a member Job outstanding is waited for.
	p.stage = p.memberJobs()
	s := p.decideStep()
	s.records(step{recovery: progress, backup: p.stage.backup})
	return s
}

func (p *planner) decideStep() step {
	if p.stage.waiting != nil {
		s := *p.stage.waiting
		s.keep = p.stage.keep
		return s
	}
	// Nothing is outstanding here but a backup, which p.stage.keep holds.
	s, recorded := p.change()
	s = p.guardNote(s, recorded)
	if j := p.stage.exhausted; j != nil && (s.job != nil && s.job.verb == j.Labels[LabelAction] && s.job.member == j.Labels[LabelMember] || slices.Contains(s.keep, j)) {
		s = p.exhaustedHold(j)
		s.keep = []*batchv1.Job{j}
	}
	s.keep = append(s.keep, p.stage.keep...)
	s.records(recorded)
	return s
}

// change runs the phases from 7 on, in the order of this table, the one list of them (phases
// 1 to 5 are Plan's, 6 is memberJobs); the first that decides wins. The fixes come first, in
// the order in which one can depend on another; a backup Job still outstanding defers the
// normal phases, never a fix. recorded are the status records of phases that decided nothing.
func (p *planner) change() (decided, recorded step) {
	fixes := []func() (step, bool){
		p.quorumLost,       //  7 planner.go: quorum lost or unconfirmed: hold, or a recovery's next step
		p.unplacedAlarm,    //  8 maintenance.go: an alarm of member 0: hold, never disarmed
		p.staleAlarm,       //  9 maintenance.go: an alarm of a removed member: disarm it
		p.noSpace,          // 10 maintenance.go: NOSPACE: compact, defragment, disarm
		p.memberWithoutPod, // 11 planner.go: a member beyond the StatefulSet: grow it
		p.peerURLs,         // 12 tls.go: a peer URL the pod does not listen on: update it
		p.learner,          // 13 planner.go: a learner: remove beyond the size or stuck, or promote
		p.podWithoutMember, // 14 planner.go: a pod without its member: add it back, or shrink
		p.backupDue,        // 15 backup.go: a backup that is due, or taken again with more scratch space
		p.failedMember,     // 16 planner.go: a failed voter: remove it to replace it
	}
	normal := []func() (step, bool){
		p.stepSnapshot,  // 17 guard.go: a risky step ahead (a roll, a scale-in, a minor upgrade): a fresh snapshot first
		p.configDrift,   // 18 planner.go: a pod on an outdated template: roll it
		p.scaleOut,      // 19 planner.go: fewer members than the size: add a learner
		p.scaleIn,       // 20 planner.go: more members than the size: remove the highest
		p.upgrade,       // 21 planner.go: an etcd version to roll out
		p.expandVolumes, // 22 volumes.go: a claim smaller than volumeSizeRequest: expand it; then restart pods for offline resizes
		p.defragment,    // 23 maintenance.go: scheduled defragmentation
		p.drillDue,      // 24 drill.go: a restore drill that is due
		p.tlsWaiting,    // 25 tls.go: a TLS change waiting for its Secrets or its pods
	}
	for _, phase := range fixes {
		s, ok := phase()
		if ok {
			return s, recorded
		}
		recorded.records(s)
	}
	if w := p.stage.backupWait; w != nil {
		return *w, recorded
	}
	for _, phase := range normal {
		s, ok := phase()
		if ok {
			return s, recorded
		}
		recorded.records(s)
	}
	reason := fmt.Sprintf("%d healthy members, spec applied", len(p.members))
	if why := p.expansionRefused(); why != "" {
		reason = fmt.Sprintf("%d healthy members, spec applied but for volumeSizeRequest: %s", len(p.members), why)
	}
	return p.base(Action{Type: Steady, Reason: reason}, resyncSteady), recorded
}

// memberJobs is the Job stage: it reads the observed Jobs. A member Job in flight is returned unchanged and
// waited for; one that succeeded is dropped once membership shows its effect; one that failed
// is kept through its backoff, then dropped so that the step is planned again as the next
// attempt. One that failed as often as allowed waits for a person, but only if its step is
// still wanted (see decideStep).
func (p *planner) memberJobs() jobStage {
	var js jobStage
	backup := &backupRecord{prev: p.obs.Cluster.Status.Backup}
	for _, j := range p.foreignJobs {
		// Not a Job this hook names, so what it does is unknown: one that may still run may be
		// changing membership and is waited for like any member Job; a finished one goes.
		if state, _ := stateOf(j); state == jobRunning {
			js.keep = append(js.keep, j)
			if js.waiting == nil {
				s := p.wait("", "Job "+j.Name+" was not started by this hook's naming and may still act on the cluster: waiting for it to finish", resyncSoon)
				js.waiting = &s
			}
		}
	}
	for _, j := range p.jobs {
		verb, who := j.Labels[LabelAction], j.Labels[LabelMember]
		if verb == verbBackup || verb == verbDrill {
			// A backup's or a drill's outcome goes into status.backup, not into a retry
			// (backup.go, drill.go). One outstanding is kept, and waited for only by what a fix
			// does not need.
			jobOf := p.backupJob
			if verb == verbDrill {
				jobOf = p.drillJob
			}
			switch s, keep := jobOf(j, backup); {
			case keep:
				js.keep = append(js.keep, j)
				if js.backupWait == nil {
					js.backupWait = &s
				}
			case verb == verbBackup && p.outgrewScratch(j):
				js.backupRetry = j.Labels[LabelBackupFor]
			case !p.outcomeHandedIn(j):
				// Its outcome is in this answer's status, but Metacontroller may hand the
				// next sync the EtcdCluster as its cache held it before that status was
				// written, and write that sync's status over it: the finished Job, the
				// outcome's only other record, stays (not waited for) until a sync is
				// handed the outcome in status, which every later status carries.
				js.keep = append(js.keep, j)
			}
			continue
		}
		state, at := stateOf(j)
		var s step
		switch state {
		case jobRunning:
			s = p.wait(who, fmt.Sprintf("%s %s: Job %s running", verb, who, j.Name), resyncSoon)
		case jobSucceeded:
			if p.effectShows(j) {
				js.done = append(js.done, verb+"/"+who)
				continue
			}
			s = p.wait(who, fmt.Sprintf("%s %s: Job %s done, membership does not show it yet", verb, who, j.Name), resyncSoon)
		case jobFailed:
			failures := attemptOf(j) + 1
			if failures >= maxJobAttempts {
				js.exhausted = j
				continue
			}
			// The reason names the retry time, not the time left, so status stays the same
			// from sync to sync while waiting.
			// The resync is rounded up to whole seconds: never before the retry time (that sync
			// would only wait again), and never 0, which Metacontroller reads as its default.
			if retryAt := at.Add(jobBackoff(failures - 1)); retryAt.After(p.obs.Now) {
				resync := math.Ceil(retryAt.Sub(p.obs.Now).Seconds())
				s = p.wait(who, fmt.Sprintf("%s %s: Job %s failed (%d of %d), retrying at %s", verb, who, j.Name, failures, maxJobAttempts, retryAt.UTC().Format(time.RFC3339)), resync)
				s.degraded, s.degradedBy = s.action.Reason, ReasonJobFailing
				break
			}
			js.failures, js.retry = failures, verb+"/"+who
			continue
		}
		js.keep = append(js.keep, j)
		if js.waiting == nil {
			js.waiting = &s
		}
	}
	js.backup = backup.st
	if js.waiting != nil && js.exhausted != nil {
		// Whether it is still wanted is decided once nothing else is outstanding.
		js.keep = append(js.keep, js.exhausted)
	}
	// One membership change at a time: nothing else starts while a Job is outstanding.
	return js
}

// exhaustedHold reports a Job that failed as often as allowed and whose step is still wanted.
func (p *planner) exhaustedHold(j *batchv1.Job) step {
	verb, who := j.Labels[LabelAction], j.Labels[LabelMember]
	s := p.wait(who, fmt.Sprintf("%s %s failed %d times; delete Job %s to try once more", verb, who, attemptOf(j)+1, j.Name), resyncHold)
	s.action.Type = Hold
	s.degraded, s.degradedBy = s.action.Reason, ReasonJobAttemptsExhausted
	return s
}

// effectShows reports whether membership reflects a succeeded Job.
func (p *planner) effectShows(j *batchv1.Job) bool {
	who := j.Labels[LabelMember]
	ord, _ := Ordinal(p.c.Name, who)
	m := p.byOrd[ord]
	switch j.Labels[LabelAction] {
	case verbAddLearner:
		return m != nil
	case verbPromote:
		return m == nil || !m.IsLearner
	case verbUpdatePeerURL:
		url, ok := "", false
		if m != nil {
			url, ok = p.listenedPeerURL(m)
		}
		return !ok || slices.Equal(m.PeerURLs, []string{url})
	case verbRemove:
		id := j.Annotations[AnnotationMemberID]
		for _, m := range p.members {
			if fmt.Sprintf("%x", m.ID) == id {
				return false
			}
		}
		return true
	case verbExpandClaim:
		return p.expandedClaim(ClaimName(p.c.Name, ord), j.Annotations[AnnotationClaimSize])
	case verbRestartPod:
		return p.podRestarted(ord, j.Annotations[AnnotationPodUID])
	case verbDisarm:
		alarm, id := j.Labels[LabelAlarm], j.Annotations[AnnotationMemberID]
		for _, a := range p.obs.Etcd.Alarms {
			if a.Type == alarm && (id == "" || fmt.Sprintf("%x", a.MemberID) == id) {
				return false
			}
		}
		return true
	}
	// A leader move has no lasting effect to check: leadership may move again on its own. If
	// it moved back, the move is planned again as the next attempt (attemptFor). Compaction
	// and defragmentation are read from done, and from the members' database sizes.
	return true
}

// quorumLost: with quorum lost no membership change can commit, and guessing is how data is lost. Only a
// person restores from a snapshot or forces a new cluster from the most up-to-date member.
// Voters only the hook cannot reach may be what is missing: then quorum is unconfirmed, not
// lost, and said so.
func (p *planner) quorumLost() (step, bool) {
	// A member with a CORRUPT alarm that answers still takes part in raft: the alarm stops
	// reads and writes, not membership changes, which is how it is replaced (failedMember).
	corrupt := p.filter(func(m *member) bool { return !m.IsLearner && m.Reachable && hasAlarm(m.Member, "CORRUPT") })
	voters, healthy := len(p.voters()), p.healthyVoters()+len(corrupt)
	if etcdstate.HasQuorum(voters, healthy) {
		return step{}, false
	}
	if silent := p.unansweredVoters(); etcdstate.HasQuorum(voters, healthy+len(silent)) {
		pods := "their pods are Ready"
		if slices.ContainsFunc(silent, func(m *member) bool { return nodeNotReporting(m.pod) }) {
			pods = "their pods are Ready or marked not Ready only by the node controller"
		}
		reason := fmt.Sprintf("quorum not confirmed: %d of %d voters answered healthy; %s did not answer the hook, but %s; nothing is changed until they answer",
			healthy, voters, memberNames(silent), pods)
		s := p.hold(reason, reason)
		s.degradedBy = ReasonQuorumUnconfirmed
		return s, true
	}
	if s, ok := p.recoverQuorum(); ok {
		return s, true
	}
	reason := fmt.Sprintf("quorum lost: %d of %d voters healthy; no membership change can commit: restore from a snapshot, or recover from the most up-to-date member (annotation %s=<member>, or spec.recovery.quorumLoss: ForceNewCluster)",
		healthy, voters, v1alpha1.AnnotationForceNewClusterFrom)
	if types := p.unplacedAlarms(); len(types) > 0 {
		// The most up-to-date member may be the corrupt one: forced, its data would stay.
		reason = fmt.Sprintf("quorum lost: %d of %d voters healthy, under a %s alarm of member 0 (etcd cannot tell which member is at fault); no membership change can commit: find the member whose hash differs before anything is recovered (docs/runbooks.md)",
			healthy, voters, strings.Join(types, ", "))
	}
	s := p.hold(reason, reason)
	s.degradedBy = ReasonQuorumLost
	return s, true
}

// memberWithoutPod: a member whose ordinal the StatefulSet does not reach has no pod: a scale-out was
// interrupted between adding the member and growing the StatefulSet. Finish it.
func (p *planner) memberWithoutPod() (step, bool) {
	if going := p.oldPodsGoing(); len(going) > 0 {
		// Not rendered meanwhile (view.oldPodsGoing says why): growing it is all there is to do.
		return p.wait("", "the StatefulSet was deleted with its pods ("+strings.Join(going, ", ")+
			"): it is created again once they are gone, so that it creates every pod at once", resyncSoon), true
	}
	top := p.maxMemberOrdinal()
	if top < p.replicas {
		return step{}, false
	}
	return p.scaleTo(top+1, PodName(p.c.Name, top), fmt.Sprintf("member %s has no pod: growing the StatefulSet to %d", PodName(p.c.Name, top), top+1)), true
}

// learner: a learner is removed when the cluster no longer wants it (a scale-in met it joining),
// promoted once caught up, removed when stuck, waited for otherwise. It is handled before
// anything else can add a member: etcd allows one learner. A learner is stuck only when its
// pod runs and it still does not catch up: one the hook cannot reach while its pod is Ready,
// or whose pod cannot start, is reported and kept; replacing it would change nothing.
func (p *planner) learner() (step, bool) {
	ls := p.learners()
	if len(ls) == 0 {
		return step{}, false
	}
	l := ls[0]
	if l.ordinal >= p.target {
		return p.runJob(memberJob{verb: verbRemove, member: l.name, id: l.ID}, RemoveMember,
			fmt.Sprintf("learner %s is beyond the size of %d: removing it before it is promoted", l.name, p.size)), true
	}
	if l.pod != nil && !isTerminating(l.pod) && p.outdated(l.pod) && (p.c.Spec.StorageSpec != nil || !l.Started()) && !l.unanswered() && p.canReplace(l.ordinal) {
		// Config update early: the joining member starts from the current spec rather than
		// being replaced again right after it joined. A learner does not vote: safe. A learner
		// that started without a volume would lose its data with the pod (see podWithoutMember): it is rolled
		// once promoted. One only the hook cannot reach is not recreated on that view (below).
		return p.replacePod(l.ordinal, l.name, "learner "+l.name+" runs an outdated pod: recreating it from the current spec"), true
	}
	if id, ok := p.removedRunning(l.ordinal); ok && l.pod != nil && !isTerminating(l.pod) {
		// The pod still runs the member it had before: the learner cannot start there.
		return p.restartRemoved(l.ordinal, id, "learner "+l.name+" can start there"), true
	}
	if s, ok := p.joinVolume(l.ordinal, "learner "+l.name); ok && !l.unanswered() {
		// Added before its claim was (an older hook, a claim lost since): the snapshot may not
		// fit, so the claim grows while it waits.
		return s, true
	}
	if p.leader != nil && isCaughtUp(l.Member, p.leader.Member) {
		if !etcdstate.QuorumAfterPromotion(len(p.voters()), p.healthyVoters()) {
			return p.wait(l.name, "learner "+l.name+" caught up, but promoting it now would leave the larger cluster without a healthy quorum", resyncHold), true
		}
		return p.runJob(memberJob{verb: verbPromote, member: l.name, id: l.ID}, PromoteLearner, "learner "+l.name+" caught up with the leader"), true
	}
	if l.unanswered() {
		why, by := l.unansweredWhy()
		view := "the hook's"
		if by == ReasonNodeNotReporting {
			view = "the node controller's"
		}
		reason := fmt.Sprintf("learner %s has not answered the hook since %s, though %s: it is kept, not removed on %s view alone",
			l.name, p.unansweredSince(l).UTC().Format(time.RFC3339), why, view)
		return p.blocked(l.name, reason, by), true
	}
	if l.pod != nil {
		if why := p.cannotStart(l.pod); why != "" {
			reason := "learner " + l.name + " cannot start (" + why + "): it is kept until its pod can start; fix the spec or the nodes"
			return p.blocked(l.name, reason, ReasonPodCannotStart), true
		}
	}
	if why := p.stuckReason(l); why != "" {
		return p.runJob(memberJob{verb: verbRemove, member: l.name, id: l.ID}, RemoveMember, "learner "+l.name+" is stuck ("+why+"): removing it"), true
	}
	// No raft indexes in the reason: they move on every sync and status would churn.
	progress := "not started"
	switch {
	case l.pod != nil && l.pod.Status.Phase == corev1.PodPending:
		progress = "its pod is Pending"
	case l.Started():
		progress = "started, behind the leader"
	}
	return p.wait(l.name, "learner "+l.name+" catching up ("+progress+")", resyncSoon), true
}

// stuckReason says why a learner is beyond waiting for, or "". Only time counts, and only
// from when its etcd runs (runningSince): a pod still Pending (scheduling, attaching its
// volume, pulling its image) is not the learner's failure. A learner that keeps applying
// entries (a large database takes long) is not stuck either: the wait runs from its last
// progress.
func (p *planner) stuckReason(l *member) string {
	if idle, ok := p.learnerIdle(l); ok && idle >= stuckAfter {
		return "nothing applied for " + stuckAfter.String() + " while running"
	}
	return ""
}

// podWithoutMember: a pod without a member: a member was removed to be replaced or rolled (finish it: the
// member is added back as a learner, with a new incarnation), or a scale-in between the
// removal and the shrink, or a learner was given up (undo: shrink to the members; a missing
// member within the StatefulSet's size is added back first).
//
// A member's data may be started only once per incarnation: without a volume, a pod
// recreated after its member started comes back empty, and the member would start again with
// none of the log the cluster already sent it. So the pod comes first: one going away is
// waited for, an outdated one is recreated from the current spec (its launcher waits, as the
// join state does not list it), and only then is the member added back, once, on the pod it
// keeps. An outdated pod that cannot be recreated yet gets its learner all the same; it is
// rolled later like any member.
func (p *planner) podWithoutMember() (step, bool) {
	free, missing := p.freeOrdinal()
	if missing && free < p.replicas {
		name := PodName(p.c.Name, free)
		pod := p.pods[free]
		switch {
		case pod == nil || isTerminating(pod):
			return p.wait(name, "pod "+name+" has no member and is being recreated: adding it back once the pod is there", resyncSoon), true
		case p.outdated(pod) && p.canReplace(free):
			return p.replacePod(free, name, "pod "+name+" has no member: recreating it from the current spec before adding it back"), true
		}
		if id, ok := p.removedRunning(free); ok {
			return p.restartRemoved(free, id, "its member can be added back there"), true
		}
		return p.addLearner(free, fmt.Sprintf("pod %s has no member: adding it back as a learner", name)), true
	}
	// Every ordinal below free has a member, so keep is at least free: the shrink never
	// drops the slot a missing member is added back into.
	keep := p.maxMemberOrdinal() + 1
	if p.replicas <= keep {
		return step{}, false
	}
	return p.scaleTo(keep, PodName(p.c.Name, keep), fmt.Sprintf("pods from %s on hold no member: shrinking the StatefulSet to %d", PodName(p.c.Name, keep), keep)), true
}

// restartRemoved restarts the pod at ord, on which member id, removed from the cluster, still
// runs (removedRunning): cut off from its peers, its etcd never heard of its removal, and the
// member the pod is for can start only once that etcd stops. The pod is deleted by the UID
// observed, through a restart-pod Job; no member of the cluster runs there, so no quorum is
// touched and etcd is not asked first. Without a volume the Job's account is not rendered: a
// person deletes the pod, which loses nothing either.
func (p *planner) restartRemoved(ord int, id uint64, then string) step {
	name := PodName(p.c.Name, ord)
	why := fmt.Sprintf("pod %s still runs member %x, removed from the cluster: that etcd has not heard of its removal (cut off from its peers)", name, id)
	if p.c.Spec.StorageSpec == nil {
		return p.blocked(name, why+"; delete the pod (kubectl delete pod "+name+") so that "+then, ReasonRemovedMemberRunning)
	}
	return p.runJob(memberJob{verb: verbRestartPod, member: name, podUID: string(p.pods[ord].UID)}, RestartPod, why+": restarting the pod so that "+then)
}

// failedMember: a voter only the hook cannot reach, while its pod is Ready, is unknown, not failed: it
// is reported and never replaced, however long it lasts. An unhealthy voter on an outdated pod
// is first recreated from the current spec (that alone may fix it, and its volume keeps the
// data), leadership moved away first. A failed voter is replaced while quorum holds:
// leadership is moved away and the member removed. Its pod then has no member and is added
// back as a learner (podWithoutMember) with a new incarnation, so it starts from an empty data dir. An
// unhealthy member that may still recover is waited for.
func (p *planner) failedMember() (step, bool) {
	var waiting *step
	voters := p.voters()
	for i := len(voters) - 1; i >= 0; i-- {
		m := voters[i]
		if m.Healthy {
			continue
		}
		if m.unanswered() && !hasAlarm(m.Member, "CORRUPT") {
			if waiting == nil {
				why, by := m.unansweredWhy()
				reason := fmt.Sprintf("member %s has not answered the hook since %s, though %s: it is not replaced on the hook's view alone; check the network between the hook and the pod",
					m.name, p.unansweredSince(m).UTC().Format(time.RFC3339), why)
				if by == ReasonNodeNotReporting {
					reason = fmt.Sprintf("member %s has not answered the hook since %s, though %s: it is not replaced on the node controller's view alone; check the node",
						m.name, p.unansweredSince(m).UTC().Format(time.RFC3339), why)
				}
				s := p.blocked(m.name, reason, by)
				waiting = &s
			}
			continue
		}
		if p.c.Spec.StorageSpec != nil && m.pod != nil && !isTerminating(m.pod) && p.outdated(m.pod) && p.canReplace(m.ordinal) {
			// Config update early: it is down anyway, and the current spec may be its fix.
			if m == p.leader {
				if s, ok := p.moveLeader(m, "unhealthy member "+m.name+" leads and is to be recreated"); ok {
					return s, true
				}
			}
			return p.replacePod(m.ordinal, m.name, "member "+m.name+" unhealthy on an outdated pod: recreating it from the current spec"), true
		}
		why := p.failureReason(m)
		if why == "" {
			if waiting == nil {
				reason := "member " + m.name + " unhealthy: waiting for it to recover"
				s := p.wait(m.name, reason, resyncHold)
				switch {
				case m.pod == nil || isTerminating(m.pod):
					s.action.Reason = "member " + m.name + " unhealthy: its pod is being recreated"
				case p.cannotStart(m.pod) != "":
					// A replacement would fail the same way: the spec, the nodes or the volume
					// must change.
					s = p.blocked(m.name, "member "+m.name+" unhealthy: its pod cannot start ("+p.cannotStart(m.pod)+")", ReasonPodCannotStart)
				}
				waiting = &s
			}
			continue
		}
		if m == p.leader {
			if s, ok := p.moveLeader(m, "failed member "+m.name+" leads"); ok {
				return s, true
			}
		}
		if !etcdstate.QuorumAfterRemoval(len(voters), p.healthyVoters()) {
			return p.wait(m.name, "member "+m.name+" failed ("+why+"), but removing it would leave no healthy quorum", resyncHold), true
		}
		return p.runJob(memberJob{verb: verbRemove, member: m.name, id: m.ID}, RemoveMember, "member "+m.name+" failed ("+why+"): removing it to replace it"), true
	}
	if waiting != nil {
		return *waiting, true
	}
	return step{}, false
}

// failureReason says why an unhealthy member is beyond waiting for, or "". Only etcd's own
// evidence counts: a CORRUPT alarm, a pod that keeps crashing, or a member unhealthy for the
// grace period while its pod is not Ready or it answered with errors. The grace period runs
// from the member's own record (unhealthySince), not from the current action, which any other
// step restarts. It is also the age of its current pod: the wait began when the member went
// unhealthy, perhaps on a pod since recreated (a node gone, its pod deleted), and a new pod
// whose volume is still attaching gets the whole period before its member's data is given up
// on. That age is read from the API server's clock, so it has the skew margin.
func (p *planner) failureReason(m *member) string {
	switch {
	case hasAlarm(m.Member, "CORRUPT"):
		return "CORRUPT alarm"
	case m.pod == nil || isTerminating(m.pod) || p.cannotStart(m.pod) != "":
		// Its pod is being (re)created, with the same volume and identity; or it cannot start,
		// and neither could a replacement on the same claim: its data there is intact.
		return ""
	case strings.HasPrefix(launcherRefusal(m.pod), joinstate.DataLost):
		// Its pod's own report: its claim no longer holds its data, and no wait brings it back.
		return "its launcher refuses: " + launcherRefusal(m.pod)
	case isCrashLooping(m.pod):
		return "its pod keeps crashing"
	case p.defragmenting(m):
		// etcd holds a member's backend for a whole defragmentation, minutes on a large
		// database: unhealthy then is the operator's own maintenance, not a failure. A
		// defragmentation that never ends exhausts its Job's attempts and waits for a person.
		return ""
	}
	if since, ok := p.unhealthySince(m); ok && p.obs.Now.Sub(since) >= stuckAfter && p.elapsedSince(m.pod.CreationTimestamp.Time) >= stuckAfter {
		return "unhealthy for " + stuckAfter.String()
	}
	return ""
}

// defragmenting: the maintenance in progress is defragmenting m (status.maintenance).
func (p *planner) defragmenting(m *member) bool {
	r := p.obs.Cluster.Status.Maintenance
	return r != nil && r.Phase == phaseDefragmenting && r.Member == m.name
}

// configDrift: a pod whose configuration differs from the spec is rolled, highest
// outdated ordinal first. Everything is healthy here: the fix phase waited otherwise.
func (p *planner) configDrift() (step, bool) {
	if !p.anyDrifted() {
		return step{}, false
	}
	return p.roll(p.tlsChange("config drift"))
}

// roll replaces the highest-ordinal outdated pod, once the pods above it are replaced and
// up: one pod at a time, each decided here with quorum and leadership checked, never left to
// the StatefulSet controller. A cluster of two first grows its temporary third member (see
// view.surging). Leadership is moved away first; with a volume the pod is recreated and the
// member restarts on its data; without one the member is removed and added back through a
// learner on a pod recreated in between (podWithoutMember), because its data would not survive the pod.
func (p *planner) roll(why string) (step, bool) {
	target := p.highestOutdated()
	if target < 0 {
		return step{}, false
	}
	name := PodName(p.c.Name, target)
	if busy, state := p.replacementBlocker(target); state != "" {
		return p.wait(busy, why+": "+name+" is next, waiting while "+state, resyncSoon), true
	}
	m := p.byOrd[target]
	if m == nil {
		// No member lives there: recreating the pod disturbs nobody.
		return p.replacePod(target, name, why+": recreating "+name+", which holds no member"), true
	}
	if len(p.members) < p.target {
		return p.scaleOut()
	}
	if m == p.leader && len(p.voters()) > 1 {
		if s, ok := p.moveLeader(m, why+": "+name+" is next and leads"); ok {
			return s, true
		}
	}
	voters, others := len(p.voters()), p.healthyVoters()-1
	if p.c.Spec.StorageSpec == nil {
		if voters == 1 {
			reason := why + ": " + name + " is the only member and has no volume; recreating it would lose the data (scale to 3 first)"
			s := p.wait(name, reason, resyncSteady)
			s.degraded, s.degradedBy = reason, ReasonNoVolumeToRoll
			return s, true
		}
		if !etcdstate.QuorumAfterRemoval(voters, others) {
			return p.wait(name, why+": removing "+name+" would leave no healthy quorum", resyncHold), true
		}
		return p.runJob(memberJob{verb: verbRemove, member: name, id: m.ID}, RemoveMember, why+": "+name+" has no volume, so it is removed and added back from the current spec"), true
	}
	if !etcdstate.QuorumWhileOneIsDown(voters, others) {
		return p.wait(name, why+": recreating "+name+" would leave no healthy quorum", resyncHold), true
	}
	return p.replacePod(target, name, why+": recreating "+name+" from the current spec"), true
}

// scaleOut: a learner for the lowest free ordinal below the target; the StatefulSet grows
// once etcd has it (memberWithoutPod), and it is promoted once caught up (learner). A free ordinal below the
// size with enough members means one sits beyond the size (a replacement met a scale-in):
// its slot is filled first and the member beyond is removed after (scaleIn), so redundancy never
// drops, and no pod is left over without a member, failing and counting against the
// disruption budget.
func (p *planner) scaleOut() (step, bool) {
	ord, missing := p.freeOrdinal()
	if !missing {
		return step{}, false
	}
	name := PodName(p.c.Name, ord)
	reason := fmt.Sprintf("%d of %d members: adding %s as a learner", len(p.members), p.size, name)
	switch {
	case p.target > p.size:
		reason = fmt.Sprintf("a cluster of %d cannot lose a member to a roll without losing quorum: adding %s as a temporary member, removed once the roll is done", p.size, name)
	case len(p.members) >= p.size:
		reason = fmt.Sprintf("ordinal %d is free below the size: adding %s before removing the member beyond the size", ord, name)
	}
	return p.addLearner(ord, reason), true
}

// addLearner adds the member at ord as a learner, once its claim holds the data (joinVolume).
func (p *planner) addLearner(ord int, reason string) step {
	name := PodName(p.c.Name, ord)
	if s, ok := p.joinVolume(ord, name+" (to be added)"); ok {
		return s
	}
	return p.runJob(memberJob{verb: verbAddLearner, member: name, peerURL: p.newMemberPeerURL(ord)}, AddLearner, reason)
}

// scaleIn: a member beyond the target goes, the highest first, leadership moved away
// first; the StatefulSet then shrinks (podWithoutMember).
func (p *planner) scaleIn() (step, bool) {
	voters := p.voters()
	if len(voters) == 0 || voters[len(voters)-1].ordinal < p.target {
		return step{}, false
	}
	m := voters[len(voters)-1]
	why := fmt.Sprintf("%d of %d members", len(voters), p.size)
	if p.size == 2 && len(voters) == 3 && m.ordinal == 2 {
		why = "the roll is done"
	}
	if m == p.leader {
		if s, ok := p.moveLeader(m, why+": "+m.name+" goes next and leads"); ok {
			return s, true
		}
	}
	if !etcdstate.QuorumAfterRemoval(len(voters), p.healthyVoters()-1) {
		return p.wait(m.name, why+": removing "+m.name+" would leave no healthy quorum", resyncHold), true
	}
	return p.runJob(memberJob{verb: verbRemove, member: m.name, id: m.ID}, RemoveMember, why+": removing "+m.name), true
}

// upgrade: only the etcd version differs (Validate allowed the path); rolled like drift.
func (p *planner) upgrade() (step, bool) {
	if p.versionWait != "" {
		return p.wait("", "upgrade to "+p.c.Spec.Version+" waits: "+p.versionWait, resyncSteady), true
	}
	return p.roll("upgrade to " + p.c.Spec.Version)
}

// moveLeader hands leadership to the lowest-ordinal healthy voter before the leader's pod or
// membership is disrupted; false when no voter can take it.
func (p *planner) moveLeader(from *member, why string) (step, bool) {
	to := p.leaderTarget(from)
	if to == nil {
		return step{}, false
	}
	return p.runJob(memberJob{verb: verbMoveLeader, member: to.name, id: to.ID}, MoveLeader, why+": moving leadership to "+to.name), true
}

// base keeps the StatefulSet as it is, except that outdated pods stay protected.
func (p *planner) base(a Action, resync float64) step {
	replicas := p.replicas
	if p.sts == nil {
		replicas = p.maxMemberOrdinal() + 1
	}
	return step{action: a, replicas: replicas, partition: p.protectivePartition(), resync: resync}
}

func (p *planner) wait(member, reason string, resync float64) step {
	return p.base(Action{Type: Wait, Member: member, Reason: reason}, resync)
}

// blocked is a hold on one member that only the world outside the cluster can end (its pod
// cannot start, the hook cannot reach it): Degraded, and not a Wait, so the grace period
// after which a member is given up on starts only once it can be waited for.
func (p *planner) blocked(member, reason, degradedBy string) step {
	s := p.base(Action{Type: Hold, Member: member, Reason: reason}, resyncHold)
	s.degraded, s.degradedBy = reason, degradedBy
	return s
}

func (p *planner) scaleTo(replicas int, member, reason string) step {
	s := p.base(Action{Type: ScaleStatefulSet, Member: member, Reason: reason}, resyncSoon)
	s.replicas = replicas
	return s
}

// replacePod lowers the partition to ord, so the StatefulSet recreates that pod, and only
// that one, from the current template.
func (p *planner) replacePod(ord int, member, reason string) step {
	s := p.base(Action{Type: ReplacePod, Member: member, Reason: reason}, resyncSoon)
	s.partition = ord
	return s
}

// runJob starts a member Job. Its endpoints are every voter's client URL: stable while the
// membership is, so a replayed sync renders the same Job under the same name. A step that ran
// as often as allowed without a lasting effect (leadership that keeps moving back) waits for
// a person instead, keeping its last Job so that the count survives.
func (p *planner) runJob(j memberJob, t ActionType, reason string) step {
	secure := p.jobTLS()
	for _, m := range p.voters() {
		j.endpoints = append(j.endpoints, clientURLOf(p.c, m.name, p.cfg.ClusterDomain, secure))
	}
	j.clientSecret = p.tls.clientSecret
	j.attempt = p.attemptFor(j)
	if j.attempt >= maxJobAttempts {
		s := p.wait(j.member, fmt.Sprintf("%s %s ran %d times without a lasting effect (%s); delete its Jobs to try again", j.verb, j.member, j.attempt, reason), resyncHold)
		s.degraded, s.degradedBy = s.action.Reason, ReasonJobAttemptsExhausted
		s.keep = p.jobsOf(j)
		return s
	}
	s := p.base(Action{Type: t, Member: j.member, Reason: reason}, resyncSoon)
	s.job = &j
	return s
}

// attemptFor numbers a Job among the earlier attempts at the same step: after a failed Job
// dropped in this sync, after the last status when it reported the same step, and after every
// observed Job of the step, so that a step whose effect was undone (leadership moved back)
// runs again under a new name rather than being answered by the completed Job forever.
func (p *planner) attemptFor(j memberJob) int {
	n := 0
	if p.stage.retry == j.verb+"/"+j.member {
		n = p.stage.failures
	} else if a := p.obs.Cluster.Status.Action; a != nil && a.Member == j.member && a.Type == actionOfVerb(j.verb).String() {
		n = int(p.obs.Cluster.Status.JobFailures)
	}
	for _, o := range p.jobsOf(j) {
		n = max(n, attemptOf(o)+1)
	}
	return n
}

// jobsOf are the observed Jobs of the same step as j.
func (p *planner) jobsOf(j memberJob) []*batchv1.Job {
	var out []*batchv1.Job
	for _, o := range p.jobs {
		if o.Labels[LabelAction] == j.verb && o.Labels[LabelMember] == j.member {
			out = append(out, o)
		}
	}
	return out
}

func actionOfVerb(verb string) ActionType {
	switch verb {
	case verbAddLearner:
		return AddLearner
	case verbPromote:
		return PromoteLearner
	case verbRemove:
		return RemoveMember
	case verbCompact:
		return Compact
	case verbDefragment:
		return Defragment
	case verbDisarm:
		return DisarmAlarm
	case verbUpdatePeerURL:
		return UpdatePeerURL
	case verbExpandClaim:
		return ExpandVolume
	case verbRestartPod:
		return RestartPod
	}
	return MoveLeader
}

func memberNames(ms []*member) string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.name
	}
	return strings.Join(names, ", ")
}
