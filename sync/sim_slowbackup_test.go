package sync

import (
	"testing"
	"time"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// Slow backups: a large database read at the bandwidth bound and uploaded takes minutes,
// during which anything may fail. With backupTicks set, a backup Job runs that many ticks
// before it finishes; what it checks of the world it checks at its first tick.

// backupStillRuns: j is a backup or drill Job that has not run its ticks yet; it counts one.
func (w *simWorld) backupStillRuns(j *simJob) bool {
	if !readsOnly(j.verb) || j.ticks >= w.backupTicks {
		return false
	}
	if j.ticks == 0 {
		w.checkBackupStart()
	}
	j.ticks++
	return true
}

// TestSecondBackupRefused: a fix may start beside a backup that runs, a second backup not.
func TestSecondBackupRefused(t *testing.T) {
	w, _ := created(t, 3, true)
	w.cluster.Spec.Backup = &v1alpha1.BackupSpec{Schedule: "@hourly", Destination: v1alpha1.BackupDestination{
		S3: &v1alpha1.S3Destination{Endpoint: "https://s3.example.test", Bucket: "backups", CredentialsSecret: "s3-credentials"}}}
	w.backupTicks = 10
	w.now = w.now.Add(time.Hour)
	if d := w.step(); d.Action.Type != TakeBackup {
		t.Fatalf("want a backup started, got %v", d.Action)
	}
	wantRefused(t, w, func(p *planner) step {
		s := p.base(Action{Type: TakeBackup, Member: "etcd-1"}, resyncSoon)
		s.job = &memberJob{verb: verbBackup, member: "etcd-1", backupFor: "request-again"}
		s.keep = p.jobs
		return s
	}, "new backup Job while Job")
}
