package sync

import (
	"math/rand"
	"testing"
	"time"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// TestBackupOutcomesSurviveStaleParents: Metacontroller may hand a sync the EtcdCluster as its
// cache held it before the last status write, and then writes that sync's status over the
// newer one. A finished backup or drill Job is the only other record of its outcome: it stays
// until the status handed in holds the outcome, so no backup or drill is lost from status,
// and none stays for good.
func TestBackupOutcomesSurviveStaleParents(t *testing.T) {
	for seed := int64(1); seed <= 6; seed++ {
		w := backupWorld(t)
		w.cluster.Spec.Backup.Verify = &v1alpha1.BackupVerify{Schedule: "@hourly"}
		w.staleParent = rand.New(rand.NewSource(seed))
		var backedUp, drilled time.Time
		for round := range 6 {
			for range 40 {
				w.step()
				for _, j := range w.jobs {
					if j.state != jobSucceeded && j.state != jobFailed {
						continue
					}
					switch j.verb {
					case verbBackup:
						backedUp = j.at
					case verbDrill:
						drilled = j.at
					}
				}
			}
			b := w.cluster.Status.Backup
			switch {
			case b == nil:
				t.Fatalf("seed %d, round %d: no status.backup", seed, round)
			case !backedUp.IsZero() && (b.LastSuccessfulTime == nil || b.LastSuccessfulTime.Unix() < backedUp.Unix()):
				t.Errorf("seed %d, round %d: the backup that finished at %s is not in status: lastSuccessfulTime %v", seed, round, backedUp, b.LastSuccessfulTime)
			case !drilled.IsZero() && (b.LastDrill == nil || b.LastDrill.Time.Unix() < drilled.Unix()):
				t.Errorf("seed %d, round %d: the drill that finished at %s is not in status: %+v", seed, round, drilled, b.LastDrill)
			case len(w.jobs) > 0:
				t.Errorf("seed %d, round %d: Jobs left once their outcomes are in status: %v", seed, round, sortedKeysOf(w.jobs))
			}
			w.now = w.now.Add(time.Hour)
		}
		if backedUp.IsZero() || drilled.IsZero() {
			t.Errorf("seed %d: no backup (%v) or no drill (%v) finished", seed, backedUp, drilled)
		}
	}
}
