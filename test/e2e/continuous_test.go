package e2e

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/version"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/backup"
	"etcdops.dev/etcdops/test/etcdbin"
	"etcdops.dev/etcdops/test/harness"
	"etcdops.dev/etcdops/test/s3server"
)

// Continuous backups end to end, against the real S3 server and against a volume: a cluster
// under the workload streams its changes while the stream is killed and restarts, the leader
// moves, etcd compacts its history and (on S3) a member is replaced. The chain stored has no
// gap, status reports the recovery point, and new clusters restored to the newest change and
// to a revision in the middle hold exactly the writes up to it, key by key, with their
// revisions.

func TestContinuousBackupS3(t *testing.T) {
	t.Parallel()
	dest := realS3(t)
	continuousBackup(t, dest, func() backup.Store {
		s, err := backup.NewS3(backup.S3Config{Endpoint: dest.S3.Endpoint, Bucket: dest.S3.Bucket, Prefix: dest.S3.Prefix, Region: dest.S3.Region,
			AccessKeyID: s3server.AccessKey, SecretAccessKey: s3server.SecretKey})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, true)
}

func TestContinuousBackupVolume(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dest := v1alpha1.BackupDestination{PersistentVolumeClaim: &v1alpha1.PVCDestination{ClaimName: "etcd-backups", Path: "pitr"}}
	continuousBackup(t, dest, func() backup.Store {
		s, err := backup.NewDir(filepath.Join(dir, "pitr"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, false, dir)
}

// continuousBackup runs the scenario against dest, whose content open reads; with claim, the
// destination is a claim bound to that directory in every cluster.
func continuousBackup(t *testing.T, dest v1alpha1.BackupDestination, open func() backup.Store, replace bool, claim ...string) {
	// The restores replay the stored changes with the pod's own etcd binary: the harness runs the
	// release the embedded members link (Kubelet.imageEtcd).
	if _, err := etcdbin.Path("v" + version.Version); err != nil {
		t.Skipf("etcd v%s cannot be built from the Go module proxy, so the replay cannot run: %v", version.Version, err)
	}
	bind := func(t *testing.T, env *harness.Env) {
		addCredentials(t, env)
		for _, dir := range claim {
			env.STS.BindClaim(dest.PersistentVolumeClaim.ClaimName, dir)
		}
	}
	s := spec(3)
	s.Backup = &v1alpha1.BackupSpec{Schedule: "@daily", Destination: dest,
		Continuous: &v1alpha1.ContinuousBackup{Interval: &metav1.Duration{Duration: time.Second}}}
	env := newEnv(t, false)
	bind(t, env)
	env.Create(s)
	waitSteady(t, env, 3)
	w, err := env.StartWorkload("/pitr")
	if err != nil {
		t.Fatal(err)
	}
	stream := env.Store.Parent().Name + "-backup-stream"
	more := func(n int) { w.AwaitAcked(w.Acked()+n, changeBound) }
	more(50)

	// The interruptions, one after another, with writes between them.
	if !env.KillStream() {
		t.Fatalf("no stream runs\n%s", env.Describe())
	}
	if _, err := env.WaitFor(changeBound, func() (bool, string) { return env.Streams.Starts(stream) >= 2, "the stream has not restarted" }); err != nil {
		t.Fatal(err)
	}
	more(50)
	if err := env.MoveLeader(env.Pod(2)); err != nil {
		t.Fatal(err)
	}
	more(50)
	compacted, err := w.Compact()
	if err != nil {
		t.Fatal(err)
	}
	more(50)
	if replace {
		if err := env.Wipe(env.Pod(1)); err != nil {
			t.Fatal(err)
		}
		waitSteady(t, env, 3)
		more(50)
	}
	stats := w.Stop()
	final := w.History().Final

	// Status: every change up to the final revision stored, and BackedUp on the stream alone.
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		b := lastBackup(env)
		if b == nil || b.Continuous == nil || b.Continuous.StoredRevision < final {
			return false, "status.backup.continuous not at the final revision yet"
		}
		return backedUp(env) == metav1.ConditionTrue, "BackedUp not True"
	}); err != nil {
		t.Fatalf("%v: %+v\n%s", err, lastBackup(env), env.Describe())
	}
	cs := lastBackup(env).Continuous
	if cs.StoredTime == nil || cs.BehindSince != nil {
		t.Fatalf("status.backup.continuous %+v", cs)
	}

	// The destination: in the lineage of the cluster's etcd ID, the stream's one snapshot,
	// and one chain after it without a gap that reaches the final revision, across the
	// interruptions.
	store := backup.LineageStore(open(), env.Store.Parent().Status.ClusterID)
	snaps, err := store.List(context.Background())
	if err != nil || len(snaps) != 1 {
		t.Fatalf("snapshots %+v, %v: want the stream's first", snaps, err)
	}
	deltas, err := store.ListDeltas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(deltas, func(a, b backup.Delta) int { return int(a.First - b.First) })
	next := snaps[0].Revision + 1
	for _, d := range deltas {
		if d.Base != snaps[0].Revision || d.First != next {
			t.Fatalf("chunk %s after revision %d: a gap", d.Name, next-1)
		}
		next = d.Last + 1
	}
	// The stream stores what it holds when it is stopped, so its restart leaves a chunk
	// before and one after; how many more depends on how fast the workload wrote.
	if next-1 < final || len(deltas) < 2 {
		t.Fatalf("%d chunks reach revision %d, want at least 2 reaching %d", len(deltas), next-1, final)
	}
	t.Logf("%d writes acknowledged, revisions %d to %d in %d chunks after snapshot r%d; compacted at %d",
		stats.Acked, snaps[0].Revision+1, next-1, len(deltas), snaps[0].Revision, compacted)
	// A stream stopped now stores nothing more: the restores read a destination at rest.
	env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { s.Backup.Continuous = nil })
	if _, err := env.WaitFor(changeBound, func() (bool, string) { return env.Streams.Starts(stream) == 0, "the stream still runs" }); err != nil {
		t.Fatal(err)
	}

	restore := func(t *testing.T, rev *int64) *harness.Env {
		r := newEnv(t, false)
		bind(t, r)
		rs := spec(1)
		rs.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: &v1alpha1.FromBackup{BackupDestination: dest, Name: v1alpha1.LatestBackup, Revision: rev}}
		r.Create(rs)
		if _, err := r.WaitSteady(1, createBound); err != nil {
			t.Fatalf("the restored cluster is not steady: %v\n%s", err, r.Describe())
		}
		return r
	}
	check := func(t *testing.T, r *harness.Env, rev int64) {
		t.Helper()
		diff, err := w.CheckRestoredAt(r, rev, verifyBound)
		if err != nil {
			t.Fatal(err)
		}
		if len(diff) > 0 {
			t.Fatalf("restored to revision %d: %d differences, first %v", rev, len(diff), diff[:min(5, len(diff))])
		}
		if got := r.Store.Parent().Status.RestoredRevision; got != rev {
			t.Errorf("status.restoredRevision %d, want %d", got, rev)
		}
	}
	t.Run("newest", func(t *testing.T) {
		check(t, restore(t, nil), next-1)
	})
	t.Run("middle", func(t *testing.T) {
		// Before the compaction: history etcd no longer has, the chain still does.
		mid := (snaps[0].Revision + compacted) / 2
		check(t, restore(t, &mid), mid)
	})
}

func backedUp(env *harness.Env) metav1.ConditionStatus {
	if p := env.Store.Parent(); p != nil {
		for _, c := range p.Status.Conditions {
			if c.Type == v1alpha1.ConditionBackedUp {
				return c.Status
			}
		}
	}
	return metav1.ConditionUnknown
}
