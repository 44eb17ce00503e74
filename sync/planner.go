package sync

import (
	"fmt"
	"slices"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
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
	// closesBudget: the budget allows no disruption, for a step held back until it is
	// closed (view.fenced).
	closesBudget bool
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
	// switchover, when set, is status.lastSwitchover: a switchover request served.
	switchover *v1alpha1.SwitchoverRecord
	// auth, when set, is status.auth: what an auth Job that succeeded applied.
	auth *v1alpha1.AuthStatus
	// forkSeen is status.forkSeenSince after this sync: nil unless it saw a fork.
	forkSeen *metav1.Time
	// phase, when set, is the cluster's phase whatever the view says: a sync that must change
	// nothing says why (an invalid spec, a pause).
	phase v1alpha1.Phase
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
	if s.switchover == nil {
		s.switchover = from.switchover
	}
	if s.auth == nil {
		s.auth = from.auth
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
	s.records(step{recovery: progress, backup: p.stage.backup, switchover: p.stage.switchover, auth: p.stage.auth})
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
	if j := p.stage.exhausted; j != nil && (s.job != nil && s.job.key() == keyOf(j) || slices.Contains(s.keep, j)) {
		s = p.exhaustedHold(j)
		s.keep = []*batchv1.Job{j}
	}
	s.keep = append(s.keep, p.stage.keep...)
	s.records(recorded)
	return s
}

// change runs the phases from 7 on, in the order of this table, the one list of them (phases
// 1 to 5 are Plan's, 6 is memberJobs in jobs.go); the first that decides wins. The fixes come
// first, in the order in which one can depend on another; a backup Job still outstanding
// defers the normal phases, never a fix. recorded are the status records of phases that
// decided nothing.
func (p *planner) change() (decided, recorded step) {
	fixes := []func() (step, bool){
		p.quorumLost,       //  7 members.go: quorum lost or unconfirmed: hold, or a recovery's next step
		p.unplacedAlarm,    //  8 maintenance.go: an alarm of member 0: hold, never disarmed
		p.staleAlarm,       //  9 maintenance.go: an alarm of a removed member: disarm it
		p.noSpace,          // 10 maintenance.go: NOSPACE: compact, defragment, disarm
		p.memberWithoutPod, // 11 members.go: a member beyond the StatefulSet: grow it
		p.peerURLs,         // 12 tls.go: a peer URL the pod does not listen on: update it
		p.learner,          // 13 members.go: a learner: remove beyond the size or stuck, or promote
		p.podWithoutMember, // 14 members.go: a pod without its member: add it back, or shrink
		p.backupDue,        // 15 backup.go: a backup that is due, or taken again with more scratch space
		p.failedMember,     // 16 members.go: a failed voter: remove it to replace it
	}
	normal := []func() (step, bool){
		p.stepSnapshot,  // 17 guard.go: a risky step ahead (a roll, a scale-in, a minor upgrade): a fresh snapshot first
		p.configDrift,   // 18 roll.go: a pod on an outdated template: roll it
		p.scaleOut,      // 19 roll.go: fewer members than the size: add a learner
		p.scaleIn,       // 20 roll.go: more members than the size: remove the highest
		p.upgrade,       // 21 roll.go: an etcd version to roll out
		p.expandVolumes, // 22 volumes.go: a claim smaller than volumeSizeRequest: expand it; then restart pods for offline resizes
		p.defragment,    // 23 maintenance.go: scheduled defragmentation
		p.drillDue,      // 24 drill.go: a restore drill that is due
		p.tlsWaiting,    // 25 tls.go: a TLS change waiting for its Secrets or its pods
		p.authChange,    // 26 auth.go: etcd's users, roles or auth switch to change (spec.auth)
		p.switchover,    // 27 switchover.go: leadership asked for on a member (etcdops.dev/switchover-to)
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
