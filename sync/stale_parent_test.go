package sync

import (
	"fmt"
	"math/rand"
	"slices"
	"strings"
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

// TestSwitchoverSurvivesStaleParents: a switchover request is served by a move-leader Job, and
// status.lastSwitchover is the only record that it was. A stale parent handed to a sync after
// the Job started lacks that record; were the request read as not yet served, the target,
// leading by then, would be recorded as leading already (moved false, from itself). The Job
// stays until the status handed in holds the request, and is its record meanwhile: the record
// says who led before, and that leadership moved.
func TestSwitchoverSurvivesStaleParents(t *testing.T) {
	for seed := int64(1); seed <= 12; seed++ {
		w := newSimWorld(t, 3, true)
		w.run(100)
		from := w.memberByID(w.leader)
		if from == nil || from.ord == 2 {
			t.Fatalf("seed %d: the leader is %v; the story asks etcd-2, a follower, to lead", seed, from)
		}
		w.staleParent = rand.New(rand.NewSource(seed))
		w.cluster.Annotations = map[string]string{v1alpha1.AnnotationSwitchoverTo: "etcd-2"}
		for range 30 {
			w.step()
		}
		want := v1alpha1.SwitchoverRecord{Request: "etcd-2", Member: PodName("etcd", from.ord), Moved: true}
		switch r := w.cluster.Status.LastSwitchover; {
		case r == nil || r.Request != want.Request || r.Member != want.Member || r.Moved != want.Moved:
			t.Errorf("seed %d: status.lastSwitchover %+v, want %+v", seed, r, want)
		case w.memberByID(w.leader) == nil || w.memberByID(w.leader).ord != 2:
			t.Errorf("seed %d: etcd-2 does not lead", seed)
		case len(w.jobs) > 0:
			t.Errorf("seed %d: Jobs left once the switchover is in status: %v", seed, sortedKeysOf(w.jobs))
		}
	}
}

// TestGuardSurvivesStaleParents: a roll of every member waits for a snapshot of its own, and
// status.backup.guard says it was taken for the roll (requested, since the roll first asked).
// A stale parent handed to the sync that records the snapshot may lack the guard; the guard's
// backup Job carries the guard as asked, so that its record is not made again as a fresh
// snapshot found, with neither.
func TestGuardSurvivesStaleParents(t *testing.T) {
	for seed := int64(1); seed <= 12; seed++ {
		w := newSimWorld(t, 3, true)
		w.cluster.Spec.Backup = simBackupSpec("@daily")
		w.run(100)
		w.staleParent = rand.New(rand.NewSource(seed))
		w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=5000"}
		w.run(200)
		g := w.cluster.Status.Backup.Guard
		if g == nil || !strings.HasPrefix(g.Step, "roll-") || g.Requested == nil || g.Snapshot == "" || g.Done == nil {
			t.Errorf("seed %d: status.backup.guard %+v, want the roll's, its snapshot asked for it, done", seed, g)
		}
	}
}

// TestStepRecordsSurviveStaleParents: a step that runs a Job is recorded in status.history
// when it starts. A sync handed a stale parent, whose status predates that record, writes its
// status over it all the same; the Job is then the step's only record, and the history is
// given it back, so that every step a Job took is in the history, finished, once the cluster
// is steady: the Jobs of a scale-out, and of a roll guarded by a snapshot of its own.
func TestStepRecordsSurviveStaleParents(t *testing.T) {
	stories := []struct {
		name   string
		backup bool
		change func(*v1alpha1.EtcdClusterSpec)
	}{
		{"scale-out", false, func(s *v1alpha1.EtcdClusterSpec) { s.Size = ptrTo(int32(4)) }},
		{"guarded-roll", true, func(s *v1alpha1.EtcdClusterSpec) { s.EtcdOptions = []string{"--snapshot-count=5000"} }},
	}
	for _, story := range stories {
		for seed := int64(1); seed <= 60; seed++ {
			w := newSimWorld(t, 3, true)
			if story.backup {
				w.cluster.Spec.Backup = simBackupSpec("@daily")
			}
			w.run(100)
			w.staleParent = rand.New(rand.NewSource(seed))
			story.change(&w.cluster.Spec)
			ran := map[string]bool{}
			for range 200 {
				w.step()
				for name := range w.jobs {
					ran[name] = true
				}
			}
			hist := w.cluster.Status.History
			if len(ran) == 0 {
				t.Fatalf("%s, seed %d: no Job ran", story.name, seed)
			}
			for name := range ran {
				i := slices.IndexFunc(hist, func(r v1alpha1.StepRecord) bool { return r.Job == name })
				switch {
				case i < 0:
					t.Errorf("%s, seed %d: Job %s ran, and no step of status.history names it:\n%s", story.name, seed, name, historyLines(hist))
				case hist[i].Result == v1alpha1.StepRunning:
					t.Errorf("%s, seed %d: the step of Job %s is still Running once the cluster is steady:\n%s", story.name, seed, name, historyLines(hist))
				}
			}
			if story.backup {
				guardedAfterBackup(t, fmt.Sprintf("%s, seed %d", story.name, seed), w.cluster.Status)
			}
		}
	}
}

// guardedAfterBackup: the history shows the roll's snapshot, taken for it and succeeded, then
// a step of the roll guarded by it.
func guardedAfterBackup(t *testing.T, story string, st v1alpha1.EtcdClusterStatus) {
	t.Helper()
	g := st.Backup.Guard
	if g == nil || g.Snapshot == "" {
		t.Errorf("%s: no guard snapshot in status.backup: %+v", story, st.Backup)
		return
	}
	hist := st.History
	took := slices.IndexFunc(hist, func(r v1alpha1.StepRecord) bool {
		return r.Type == TakeBackup.String() && strings.Contains(r.Reason, "backup before "+g.Step) && r.Result == v1alpha1.StepSucceeded
	})
	if took < 0 || !slices.ContainsFunc(hist[took:], func(r v1alpha1.StepRecord) bool { return strings.Contains(r.Reason, "guarded by snapshot "+g.Snapshot) }) {
		t.Errorf("%s: status.history does not show the snapshot before %s, then a step guarded by %s:\n%s", story, g.Step, g.Snapshot, historyLines(hist))
	}
}

func historyLines(hist []v1alpha1.StepRecord) string {
	var b strings.Builder
	for _, r := range hist {
		fmt.Fprintf(&b, "  %s %s %s job=%s %s: %s\n", r.Started.UTC().Format(time.RFC3339), r.Type, r.Member, r.Job, r.Result, r.Reason)
	}
	return b.String()
}
