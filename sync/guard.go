package sync

import (
	"cmp"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// A snapshot before every risky step. With spec.backup, a minor-version upgrade, a scale-in, a
// roll of every member and a forced quorum recovery each start only once a snapshot guards
// them: the newest, when it is younger than spec.backup.beforeRiskySteps.maxAge, else one
// taken for the step (a backup Job, the recovery's from its survivor). The step waits for it;
// a snapshot that fails holds the step, Degraded (StepSnapshotFailed), and is taken again
// after guardRetry, until one succeeds or a person lets the step go on without
// (etcdops.dev/proceed-without-snapshot=<step>). status.backup.guard records which snapshot
// guards which step, and each step taken under it names that snapshot in status.history.
//
// It is a normal phase, first of them: the fixes come before it and are never delayed by it,
// but for the forced recovery (recovery.go), where the snapshot is the point: the survivor's
// data is what the new cluster will hold, and a snapshot of it is the way back if the
// recovery goes wrong.

// guardRetry is how long after a failed snapshot the step's snapshot is taken again.
const guardRetry = 5 * time.Minute

// guardLabel is the backup Job label of the snapshot asked for g: its step and when it was
// asked, so that each attempt is a Job of its own.
func guardLabel(g *v1alpha1.StepGuard) string {
	at := ""
	if g.Requested != nil {
		at = g.Requested.UTC().Format(time.RFC3339)
	}
	return "guard-" + shortHash(g.Step+"@"+at)
}

// AnnotationGuard on a backup Job taken for a risky step is status.backup.guard as it was
// when the snapshot was asked for, in JSON.
const AnnotationGuard = "etcdops.dev/guard"

// guarded records, in status.backup b, the outcome of backup Job j in its guard when j is the
// snapshot the guard asked for: the snapshot b.LastSuccessful, or the failure f. Metacontroller
// may hand the sync that records it the EtcdCluster as its cache held it before the status
// that opened the guard: then the guard is the one j carries (AnnotationGuard), rather than
// none, or an older step's, which would have the snapshot recorded as found fresh, not taken
// for the step.
func guarded(b *v1alpha1.BackupStatus, j *batchv1.Job, f *v1alpha1.BackupFailure) {
	g := b.Guard
	if asked := guardOf(j); asked != nil && (g == nil || g.Since.Before(&asked.Since)) {
		g = asked
	}
	if g == nil || g.Done != nil || g.Requested == nil || j.Labels[LabelBackupFor] != guardLabel(g) {
		return
	}
	ng := *g
	if f != nil {
		ng.Failure, ng.FailureTime = f.Reason, &f.Time
	} else if l := b.LastSuccessful; l != nil {
		ng.Snapshot, ng.Revision, ng.SnapshotTime, ng.Failure, ng.FailureTime = l.Object, l.Revision, &l.Time, "", nil
	}
	b.Guard = &ng
}

// guardOf is the guard backup Job j carries (AnnotationGuard), nil for none.
func guardOf(j *batchv1.Job) *v1alpha1.StepGuard {
	var g v1alpha1.StepGuard
	if raw := j.Annotations[AnnotationGuard]; raw == "" || json.Unmarshal([]byte(raw), &g) != nil {
		return nil
	}
	return &g
}

// stepSnapshot: a risky step ahead (riskyStep) is guarded by a snapshot before it starts: one
// fresh enough is recorded, else one is taken and waited for. With nothing risky ahead, a
// guard still open is closed.
func (p *planner) stepSnapshot() (step, bool) {
	rec := p.backupRecord()
	g := currentGuard(rec)
	key, what := "", ""
	if p.c.Spec.Backup != nil {
		key, what = p.riskyStep()
	}
	if key != "" && p.obs.RollWait != "" && !strings.HasPrefix(key, "scale-in-") {
		// The roll waits for the hook's bound (roll.go): its snapshot is taken when it may begin.
		return step{}, false
	}
	if key == "" {
		if g != nil && g.Done == nil {
			closed := *g
			at := metav1.NewTime(p.obs.Now)
			closed.Done = &at
			rec.changed().Guard = &closed
			return step{backup: rec.st}, false
		}
		return step{}, false
	}
	return p.guard(rec, key, what, nil)
}

// riskyStep names the risky step the normal phases are about to take, in their order, and
// says what it is; "" when none is ahead.
func (v *view) riskyStep() (key, what string) {
	voters := v.voters()
	switch {
	case v.anyDrifted():
		return "roll-" + v.spec.configHash, "the roll of every member onto the new configuration"
	case len(voters) > 0 && voters[len(voters)-1].ordinal >= v.target:
		return "scale-in-" + strconv.Itoa(v.size), fmt.Sprintf("the scale-in to %d", v.size)
	case v.highestOutdated() >= 0 && minorOf(lowestOf(podVersions(v.obs)...)) < minorOf(v.c.Spec.Version):
		return "upgrade-" + v.c.Spec.Version, "the upgrade to " + v.c.Spec.Version
	}
	return "", ""
}

// guardedBy: status.backup b records a snapshot, or a person's go-ahead, for step key.
func guardedBy(b *v1alpha1.BackupStatus, key string) bool {
	if b == nil || b.Guard == nil {
		return false
	}
	g := b.Guard
	return g.Step == key && g.Done == nil && (g.Snapshot != "" || g.Skipped)
}

// currentGuard is status.backup.guard as rec holds it so far.
func currentGuard(rec *backupRecord) *v1alpha1.StepGuard {
	for _, b := range []*v1alpha1.BackupStatus{rec.st, rec.prev} {
		if b != nil {
			return b.Guard
		}
	}
	return nil
}

// guard settles the snapshot of step key (what, in words) with g the guard recorded so far:
// decided false once the step may go on (the guard recorded in the step), true with the step
// to take first: a backup Job (from survivor, for a quorum recovery, else from a follower),
// or a hold while a failed snapshot waits to be taken again.
func (p *planner) guard(rec *backupRecord, key, what string, survivor *member) (step, bool) {
	now := metav1.NewTime(p.obs.Now)
	skip := p.c.Annotations[v1alpha1.AnnotationProceedWithoutSnapshot] == key
	if g := currentGuard(rec); g != nil && g.Step == key && g.Done == nil {
		if g.Snapshot != "" || g.Skipped {
			return step{}, false
		}
		ng := *g
		switch {
		case skip:
			ng.Skipped = true
			rec.changed().Guard = &ng
			return step{backup: rec.st}, false
		case g.FailureTime != nil:
			if retry := g.FailureTime.Add(guardRetry); p.obs.Now.Before(retry) {
				reason := fmt.Sprintf("%s waits for a snapshot of its own, and it failed (%s); it is taken again at %s; to go on without it, annotate %s=%s (docs/runbooks.md)",
					what, g.Failure, retry.UTC().Format(time.RFC3339), v1alpha1.AnnotationProceedWithoutSnapshot, key)
				name := ""
				if survivor != nil {
					name = survivor.name
				}
				s := p.blocked(name, reason, ReasonStepSnapshotFailed)
				s.resync = p.resyncAt(retry)
				return s, true
			}
			ng.Requested, ng.Failure, ng.FailureTime = &now, "", nil
		}
		// Asked for and not done: the same Job again (its name follows from the request), or a
		// new one after a failure.
		return p.guardBackup(rec, &ng, survivor), true
	}
	ng := &v1alpha1.StepGuard{Step: key, Since: now}
	b := rec.st
	if b == nil {
		b = rec.prev
	}
	maxAge := v1alpha1.DefaultRiskyStepMaxAge
	if g := p.c.Spec.Backup.BeforeRiskySteps; g != nil && g.MaxAge != nil {
		maxAge = g.MaxAge.Duration
	}
	switch {
	case b != nil && b.LastSuccessful != nil && p.obs.Now.Sub(b.LastSuccessful.Time.Time) <= maxAge:
		l := b.LastSuccessful
		ng.Snapshot, ng.Revision, ng.SnapshotTime = l.Object, l.Revision, &l.Time
	case skip:
		ng.Skipped = true
	default:
		ng.Requested = &now
		return p.guardBackup(rec, ng, survivor), true
	}
	rec.changed().Guard = ng
	return step{backup: rec.st}, false
}

// guardBackup is the backup Job that takes g's snapshot: from the survivor of a quorum
// recovery, which sees no leader, or like any backup.
func (p *planner) guardBackup(rec *backupRecord, g *v1alpha1.StepGuard, survivor *member) step {
	t := backupTrigger{guard: g}
	var s step
	if survivor != nil {
		reason := fmt.Sprintf("backup %s: snapshot from %s, the survivor, before it forces a new cluster", t, survivor.name)
		s = p.base(Action{Type: TakeBackup, Member: survivor.name, Reason: reason}, resyncSoon)
		s.job = &memberJob{verb: verbBackup, member: survivor.name, endpoints: []string{clientURLOf(p.c, survivor.name, p.cfg.ClusterDomain, p.jobTLS())},
			backupFor: t.label(), lineage: p.lineageArgs(), clientSecret: p.tls.clientSecret, survivor: true, scratch: scratchLimit(p.largestDB())}
		s.backup = rec.changed()
	} else {
		s = p.backupStep(t)
	}
	asked := *g
	s.job.guard = &asked
	s.backup.Guard = g
	return s
}

// guardNote names, in the reason of decided step s, when it is a step of the risky step a
// guard is open for (the one riskyStep names ahead; a quorum recovery's own steps), the
// snapshot that guards it, so that status.history says it too. recorded holds what the phases
// that decided nothing recorded.
func (p *planner) guardNote(s, recorded step) step {
	b := cmp.Or(s.backup, recorded.backup, p.stage.backup, p.obs.Cluster.Status.Backup)
	if p.c.Spec.Backup == nil || b == nil || b.Guard == nil || b.Guard.Done != nil || !isStep(s.action.Type) || s.action.Type == TakeBackup || s.action.Type == RestoreDrill {
		return s
	}
	g := b.Guard
	recovery := strings.HasPrefix(g.Step, "recovery-")
	if ahead, _ := p.riskyStep(); recovery && s.action.Type != RecoverQuorum || !recovery && g.Step != ahead {
		return s
	}
	switch {
	case g.Snapshot != "":
		s.action.Reason += fmt.Sprintf("; guarded by snapshot %s (revision %d)", g.Snapshot, g.Revision)
	case g.Skipped:
		s.action.Reason += fmt.Sprintf("; guarded by no snapshot (%s=%s)", v1alpha1.AnnotationProceedWithoutSnapshot, g.Step)
	}
	return s
}

// recoveryGuard: before the survivor of quorum recovery r is told to force a new cluster, a
// snapshot guards it, from the survivor; decided false once one does.
func (p *planner) recoveryGuard(r *v1alpha1.RecoveryStatus) (step, bool) {
	if p.c.Spec.Backup == nil {
		return step{}, false
	}
	var survivor *member
	for _, m := range p.voters() {
		if m.name == r.Survivor {
			survivor = m
		}
	}
	key := "recovery-" + r.Token
	rec := p.backupRecord()
	if g := currentGuard(rec); p.stage.backupWait != nil && (g == nil || g.Step != key || g.Done != nil || g.Snapshot == "" && !g.Skipped) {
		// A backup Job runs: its outcome is recorded before anything is decided on it.
		s := p.wait(r.Survivor, fmt.Sprintf("recovering quorum from %s: waiting for the backup Job that runs to finish before the snapshot that guards it", r.Survivor), resyncSoon)
		s.action.Type = RecoverQuorum
		return s, true
	}
	return p.guard(rec, key, "the quorum recovery from "+r.Survivor, survivor)
}
