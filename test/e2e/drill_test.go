package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/version"
	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/backup"
	"etcdops.dev/etcdops/internal/etcdbin"
	"etcdops.dev/etcdops/internal/s3server"
	"etcdops.dev/etcdops/test/harness"
)

// Backups proven by restoring them, end to end, on the real S3 server: restore drills that
// pass on a healthy cluster under the workload and fail, with the right message, on a stored
// chunk altered (its checksum made to match) and on a key written into the restored copy; and
// a minor upgrade and a scale-in that each start with a snapshot of their own, which a new
// cluster then restores. Tiered retention over a month is the backup package's
// TestTieredRetentionOverAMonth: a snapshot's time is the backup Job's clock, which the harness
// does not move.

// needReplayEtcd skips a test whose drills or restores run a real etcd binary: the release the
// embedded members link (Kubelet.etcdBinaryFor).
func needReplayEtcd(t *testing.T) {
	t.Helper()
	if _, err := etcdbin.Path("v" + version.Version); err != nil {
		t.Skipf("etcd v%s cannot be built from the Go module proxy, so the drills cannot run: %v", version.Version, err)
	}
}

// s3Store opens dest, a bucket of the real S3 server, as the member tool does.
func s3Store(t *testing.T, dest v1alpha1.BackupDestination) backup.Store {
	t.Helper()
	s, err := backup.NewS3(backup.S3Config{Endpoint: dest.S3.Endpoint, Bucket: dest.S3.Bucket, Prefix: dest.S3.Prefix, Region: dest.S3.Region,
		AccessKeyID: s3server.AccessKey, SecretAccessKey: s3server.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// drill asks for a drill and waits until status records it: its record, and BackupVerified.
func drill(t *testing.T, env *harness.Env, request string) (*v1alpha1.DrillRecord, metav1.Condition) {
	t.Helper()
	before := ""
	if b := lastBackup(env); b != nil && b.LastDrill != nil {
		before = b.LastDrill.Job
	}
	env.Store.AnnotateParent(v1alpha1.AnnotationDrillNow, request)
	var rec *v1alpha1.DrillRecord
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		b := lastBackup(env)
		if b == nil || b.LastDrillRequest != request || b.LastDrill == nil || b.LastDrill.Job == before {
			return false, "the drill asked for has not finished"
		}
		rec = b.LastDrill
		return true, ""
	}); err != nil {
		t.Fatalf("%v: %+v\n%s", err, lastBackup(env), env.Describe())
	}
	for _, c := range env.Store.Parent().Status.Conditions {
		if c.Type == v1alpha1.ConditionBackupVerified {
			return rec, c
		}
	}
	t.Fatalf("no %s condition: %+v", v1alpha1.ConditionBackupVerified, env.Store.Parent().Status.Conditions)
	return nil, metav1.Condition{}
}

// TestRestoreDrills: drills of a cluster backed up continuously. One under the workload
// passes; one whose chain holds a chunk altered with its checksum made to match finds the key
// whose value differs; one whose restored copy the test writes a key into finds that key.
func TestRestoreDrills(t *testing.T) {
	needReplayEtcd(t)
	t.Parallel()
	dest := realS3(t)
	s := spec(3)
	s.Backup = &v1alpha1.BackupSpec{Schedule: "@daily", Destination: dest, Verify: &v1alpha1.BackupVerify{Schedule: "@weekly"},
		Continuous: &v1alpha1.ContinuousBackup{Interval: &metav1.Duration{Duration: time.Second}}}
	env := newEnv(t, false)
	addCredentials(t, env)
	env.Create(s)
	waitSteady(t, env, 3)
	w, err := env.StartWorkload("/drill")
	if err != nil {
		t.Fatal(err)
	}
	w.AwaitAcked(100, changeBound)

	t.Run("passes-under-the-workload", func(t *testing.T) {
		acked := w.Acked()
		rec, cond := drill(t, env, "under-the-workload")
		if rec.Result != v1alpha1.DrillPassed || cond.Status != metav1.ConditionTrue || cond.Reason != "DrillPassed" ||
			rec.Keys == 0 || rec.Digest == "" || rec.RestoreDuration == nil || rec.Revision != rec.RestoredRevision ||
			rec.Lineage != env.Store.Parent().Status.ClusterID {
			t.Fatalf("drill %+v, condition %+v", rec, cond)
		}
		if w.Acked() <= acked {
			t.Fatalf("the workload wrote nothing while the drill ran (%d appends before, %d after)", acked, w.Acked())
		}
		t.Logf("%s: %s", rec.Job, rec.Message)
	})
	w.Stop()
	ls := backup.LineageStore(s3Store(t, dest), env.Store.Parent().Status.ClusterID)

	t.Run("an-altered-chunk", func(t *testing.T) {
		name, original := alterChunk(t, ls)
		defer func() {
			if err := putChunk(ls, name, original); err != nil {
				t.Fatal(err)
			}
		}()
		rec, cond := drill(t, env, "an-altered-chunk")
		if rec.Result != v1alpha1.DrillMismatch || cond.Status != metav1.ConditionFalse || cond.Reason != "DrillMismatch" ||
			!strings.Contains(rec.Message, `key "/drill/`) || !strings.Contains(rec.Message, "its value differs") {
			t.Fatalf("drill of an altered chunk %s: %+v, condition %+v", name, rec, cond)
		}
		t.Logf("%s: %s", rec.Job, rec.Message)
	})

	t.Run("a-key-written-into-the-copy", func(t *testing.T) {
		env.Jobs.SetDrillSeam(func(ctx context.Context, restored *clientv3.Client) error {
			_, err := restored.Put(ctx, "/drill-seam/never-in-the-cluster", "x")
			return err
		})
		defer env.Jobs.SetDrillSeam(nil)
		rec, cond := drill(t, env, "a-key-written-into-the-copy")
		if rec.Result != v1alpha1.DrillMismatch || cond.Status != metav1.ConditionFalse ||
			!strings.Contains(rec.Message, `key "/drill-seam/never-in-the-cluster" (modified at revision `) ||
			!strings.Contains(rec.Message, "is in the restored copy, not in the live cluster") {
			t.Fatalf("drill of a copy written into: %+v, condition %+v", rec, cond)
		}
		t.Logf("%s: %s", rec.Job, rec.Message)
	})

	t.Run("passes-again", func(t *testing.T) {
		rec, cond := drill(t, env, "passes-again")
		if rec.Result != v1alpha1.DrillPassed || cond.Status != metav1.ConditionTrue {
			t.Fatalf("drill %+v, condition %+v", rec, cond)
		}
	})
	for _, v := range env.Monitor.Violations() {
		t.Errorf("invariant: %s", v)
	}
}

// alterChunk changes one value of the newest snapshot's chain in place, keeping its length, and
// stores the chunk again with its checksum made to match; it returns the chunk's name and what
// it held.
func alterChunk(t *testing.T, ls backup.Store) (string, []byte) {
	t.Helper()
	ctx := context.Background()
	snaps, err := ls.List(ctx)
	if err != nil || len(snaps) == 0 {
		t.Fatalf("snapshots %v, %v", snaps, err)
	}
	base := slices.MaxFunc(snaps, func(a, b backup.Object) int { return int(a.Revision - b.Revision) }).Revision
	deltas, err := ls.ListDeltas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range slices.Backward(deltas) {
		if d.Base != base {
			continue
		}
		var buf bytes.Buffer
		if _, err := ls.Fetch(ctx, d.Name, &buf); err != nil {
			t.Fatal(err)
		}
		original := bytes.Clone(buf.Bytes())
		// The workload's appends write "<key>#<attempt>", each key once: a digit of one.
		data := buf.Bytes()
		i := bytes.Index(data, []byte("#0"))
		if i < 0 {
			continue
		}
		data[i+1] = '9'
		if err := putChunk(ls, d.Name, data); err != nil {
			t.Fatal(err)
		}
		return d.Name, original
	}
	t.Fatalf("no chunk after snapshot r%d holds an append of the workload", base)
	return "", nil
}

// putChunk stores data as chunk name, its SHA-256 beside it, as the stream does.
func putChunk(ls backup.Store, name string, data []byte) error {
	sum := sha256.Sum256(data)
	return ls.Put(context.Background(), name, bytes.NewReader(data), int64(len(data)), backup.Meta{SHA256: hex.EncodeToString(sum[:])})
}

// TestSnapshotsBeforeRiskySteps: a minor upgrade and then a scale-in of a cluster backed up
// daily each start with a snapshot of their own (the newest is too old for the 5 minute
// bound), named in status.backup.guard and in the history before the step's first change; a new
// cluster restored from each holds every write acknowledged before the step.
func TestSnapshotsBeforeRiskySteps(t *testing.T) {
	needReplayEtcd(t)
	t.Parallel()
	dest := realS3(t)
	s := spec(5)
	s.Version = "v3.6.16"
	s.Backup = &v1alpha1.BackupSpec{Schedule: "@daily", Destination: dest}
	env := newEnv(t, false)
	addCredentials(t, env)
	env.Create(s)
	waitSteady(t, env, 5)

	type guarded struct {
		step     string
		snapshot string
		workload *harness.Workload
		acked    int
	}
	var steps []guarded
	risky := func(t *testing.T, key, prefix string, change func(*v1alpha1.EtcdClusterSpec), size int) {
		w, err := env.StartWorkload(prefix)
		if err != nil {
			t.Fatal(err)
		}
		w.AwaitAcked(50, changeBound)
		stats := w.Stop()
		before := len(env.Store.Parent().Status.History)
		env.Store.EditParentSpec(change)
		if _, err := env.WaitFor(changeBound, func() (bool, string) {
			b := lastBackup(env)
			if b == nil || b.Guard == nil || b.Guard.Step != key || b.Guard.Snapshot == "" {
				return false, fmt.Sprintf("no snapshot guards %s: %+v", key, b)
			}
			return true, ""
		}); err != nil {
			t.Fatalf("%v\n%s", err, env.Describe())
		}
		waitSteady(t, env, size)
		g := lastBackup(env).Guard
		// The history: the snapshot for the step, then the step's first change, which names it.
		hist := env.Store.Parent().Status.History
		var took, first int = -1, -1
		for i, r := range hist {
			if took < 0 && r.Type == "Backup" && strings.Contains(r.Reason, "backup before "+key) && r.Result == v1alpha1.StepSucceeded {
				took = i
			}
			if first < 0 && took >= 0 && i > took && strings.Contains(r.Reason, "guarded by snapshot "+g.Snapshot) {
				first = i
			}
		}
		if took < 0 || first < 0 || len(hist) <= before && len(hist) < v1alpha1.MaxHistory {
			t.Fatalf("status.history does not show the snapshot before %s, then its steps guarded by %s:\n%s", key, g.Snapshot, historyText(hist))
		}
		if stats.Acked == 0 {
			t.Fatal("the workload wrote nothing")
		}
		steps = append(steps, guarded{step: key, snapshot: g.Snapshot, workload: w, acked: stats.Acked})
		t.Logf("%s guarded by %s (revision %d): %s", key, g.Snapshot, g.Revision, hist[first].Reason)
	}
	t.Run("minor-upgrade", func(t *testing.T) {
		risky(t, "upgrade-v3.7.3", "/before-upgrade", func(s *v1alpha1.EtcdClusterSpec) { s.Version = "v3.7.3" }, 5)
	})
	t.Run("scale-in", func(t *testing.T) {
		// The upgrade's snapshot is past the 5 minute bound now, for the hook.
		env.AdvanceHookClock(10 * time.Minute)
		risky(t, "scale-in-3", "/before-scale-in", func(s *v1alpha1.EtcdClusterSpec) { s.Size = ptr(int32(3)) }, 3)
	})
	if len(steps) != 2 || steps[0].snapshot == steps[1].snapshot {
		t.Fatalf("guards %+v: want a snapshot of its own for each step", steps)
	}
	for _, v := range env.Monitor.Violations() {
		t.Errorf("invariant: %s", v)
	}
	// A new cluster from each snapshot holds every write acknowledged before its step.
	id := env.Store.Parent().Status.ClusterID
	for _, g := range steps {
		t.Run("restore-"+g.step, func(t *testing.T) {
			t.Parallel()
			r := newEnv(t, false)
			addCredentials(t, r)
			rs := spec(1)
			rs.Version = "v3.7.3"
			name := g.snapshot[strings.LastIndex(g.snapshot, "/")+1:]
			rs.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: &v1alpha1.FromBackup{BackupDestination: dest, Lineage: id, Name: name}}
			r.Create(rs)
			if _, err := r.WaitSteady(1, createBound); err != nil {
				t.Fatalf("the cluster restored from %s is not steady: %v\n%s", g.snapshot, err, r.Describe())
			}
			lost, err := g.workload.VerifyOn(r, verifyBound)
			if err != nil {
				t.Fatal(err)
			}
			if len(lost) > 0 {
				t.Fatalf("%d of %d writes acknowledged before %s missing from its snapshot %s, first %s", len(lost), g.acked, g.step, g.snapshot, lost[0])
			}
			if st := r.Store.Parent().Status; st.RestoreDuration == nil {
				t.Errorf("status.restoreDuration not recorded: %+v", st)
			}
			t.Logf("%d writes acknowledged before %s restored from %s", g.acked, g.step, g.snapshot)
		})
	}
}

func historyText(hist []v1alpha1.StepRecord) string {
	var b strings.Builder
	for _, r := range hist {
		fmt.Fprintf(&b, "  %s %s %s: %s\n", r.Type, r.Member, r.Result, r.Reason)
	}
	return b.String()
}
