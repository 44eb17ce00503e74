package e2e

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/backup"
	"etcdops.dev/etcdops/test/etcdbin"
	"etcdops.dev/etcdops/test/harness"
)

// TestVersionMatrixRestores restores on real servers of every supported minor release, as a
// user of that release would: a cluster streams its changes (spec.backup.continuous), puts
// keys on a lease, takes a snapshot on request, puts another on the lease while the workload
// writes, takes one more snapshot after the writes, and is deleted; then new clusters on the
// same release start from what it stored: the last snapshot as it is, and the key space at a
// revision in the middle of the change window (the snapshot with the lease and the changes
// after it, replayed by the seed with the pod's own etcd). Each restored cluster must start and
// hold exactly the workload's keys at its revision, key by key with their modification
// revisions, and the leased keys on the lease, which keeps its TTL.
func TestVersionMatrixRestores(t *testing.T) {
	needVersions(t)
	t.Parallel()
	for _, v := range etcdbin.Versions() {
		t.Run(v, func(t *testing.T) { restoresOn(t, v) })
	}
}

func restoresOn(t *testing.T, v string) {
	claim := t.TempDir()
	dest := v1alpha1.BackupDestination{PersistentVolumeClaim: &v1alpha1.PVCDestination{ClaimName: "etcd-backups", Path: "matrix"}}
	start := func(t *testing.T) *harness.Env {
		env := startEnv(t, realEtcdOptions(t, v))
		env.STS.BindClaim(dest.PersistentVolumeClaim.ClaimName, claim)
		return env
	}
	store, err := backup.NewDir(filepath.Join(claim, "matrix"))
	must(t, err)

	env := start(t)
	s := spec(1)
	s.Version = v
	s.Backup = &v1alpha1.BackupSpec{Schedule: "0 0 1 1 *", Destination: dest,
		Continuous: &v1alpha1.ContinuousBackup{Interval: &metav1.Duration{Duration: time.Second}}}
	env.Create(s)
	steadyOrRefused(t, env, 1)
	// The stream's first snapshot comes before the writes, so that they are all changes after it.
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		b := lastBackup(env)
		return b != nil && b.Continuous != nil && b.Continuous.StoredRevision > 0, "the stream has stored nothing yet"
	}); err != nil {
		t.Fatalf("%v\n%s", err, env.Describe())
	}
	cli, err := env.Client()
	must(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), changeBound)
	defer cancel()
	l, err := cli.Grant(ctx, leaseTTL)
	must(t, err)
	_, err = cli.Put(ctx, "/leased/in-the-snapshot", v, clientv3.WithLease(l.ID))
	must(t, err)
	requestBackup(t, env, "with-the-lease")
	_, err = cli.Put(ctx, "/leased/in-the-changes", v, clientv3.WithLease(l.ID))
	must(t, err)
	w, err := env.StartWorkload("/matrix")
	must(t, err)
	// A time in the middle of the writes, on the second (what the spec keeps): the changes
	// before it were stored with times before it, those after with times after, but for those
	// within the stream's delay of it (docs/backup-continuous.md): r0 is read a second or more
	// before the time, which a loaded machine's delay stays well within.
	w.AwaitAcked(75, changeBound)
	r0 := currentRevision(t, cli)
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(2100 * time.Millisecond)))
	at := time.Now().Truncate(time.Second)
	r1 := currentRevision(t, cli)
	w.AwaitAcked(150, changeBound)
	stats := w.Stop()
	final := w.History().Final
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		b := lastBackup(env)
		return b != nil && b.Continuous != nil && b.Continuous.StoredRevision >= final, "the stream has not stored the final revision"
	}); err != nil {
		t.Fatalf("%v\n%s", err, env.Describe())
	}
	requestBackup(t, env, "after-the-writes")
	env.Close()

	// The cluster wrote one lineage, its etcd cluster ID's.
	lineages, err := backup.ListLineages(context.Background(), store)
	must(t, err)
	if len(lineages) != 1 {
		t.Fatalf("lineages %+v: want the cluster's one", lineages)
	}
	lineage := lineages[0].ID
	snaps, err := backup.LineageStore(store, lineage).List(context.Background())
	must(t, err)
	if len(snaps) != 3 {
		t.Fatalf("snapshots %+v: want the stream's first and the two requested", snaps)
	}
	slices.SortFunc(snaps, func(a, b backup.Object) int { return int(a.Revision - b.Revision) })
	leased, last := snaps[1], snaps[2]
	if last.Revision != final {
		t.Fatalf("the last snapshot holds revision %d, the workload ended at %d", last.Revision, final)
	}
	mid := (leased.Revision + final) / 2
	t.Logf("etcd %s: %d writes acknowledged, revisions %d to %d after snapshot %s; restoring %s and revision %d",
		v, stats.Acked, leased.Revision+1, final, leased.Name, last.Name, mid)

	// restore starts a cluster on v from the backup and checks it holds, key by key, what
	// the workload's history says the cluster held at the revision it restored, which want
	// accepts.
	restore := func(t *testing.T, from v1alpha1.FromBackup, want func(rev int64) bool) {
		t.Parallel()
		r := start(t)
		rs := spec(1)
		rs.Version = v
		from.BackupDestination = dest
		rs.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: &from}
		r.Create(rs)
		steadyOrRefused(t, r, 1)
		checkServes(t, r, v)
		st := r.Store.Parent().Status
		rev := st.RestoredRevision
		if !want(rev) || st.RestoredLineage != lineage {
			t.Fatalf("status.restoredRevision %d of lineage %s: not the revision asked for of %s", rev, st.RestoredLineage, lineage)
		}
		diff, err := w.CheckRestoredAt(r, rev, verifyBound)
		must(t, err)
		if len(diff) > 0 {
			t.Fatalf("etcd %s restored to revision %d: %d differences, first %v", v, rev, len(diff), diff[:min(5, len(diff))])
		}
		checkLeased(t, r, l.ID)
	}
	is := func(want int64) func(int64) bool { return func(rev int64) bool { return rev == want } }
	t.Run("snapshot", func(t *testing.T) {
		restore(t, v1alpha1.FromBackup{Name: last.Name, Lineage: lineage}, is(last.Revision))
	})
	t.Run("revision", func(t *testing.T) {
		restore(t, v1alpha1.FromBackup{Name: v1alpha1.LatestBackup, Revision: &mid}, is(mid))
	})
	t.Run("time", func(t *testing.T) {
		restore(t, v1alpha1.FromBackup{Name: v1alpha1.LatestBackup, Time: &metav1.Time{Time: at}},
			func(rev int64) bool { return rev >= r0 && rev <= r1 })
	})
}

// currentRevision is the cluster's revision now.
func currentRevision(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), verifyBound)
	defer cancel()
	resp, err := cli.Get(ctx, "\x00", clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	must(t, err)
	return resp.Header.Revision
}

// leaseTTL is the TTL of the lease whose keys TestVersionMatrixRestores restores: long enough
// that it does not expire while a restored cluster is checked.
const leaseTTL = 600

// checkLeased checks that both leased keys came back on lease id, and that the lease holds its
// own TTL again (the replay pins it to etcd's largest while it runs).
func checkLeased(t *testing.T, env *harness.Env, id clientv3.LeaseID) {
	t.Helper()
	cli, err := env.Client()
	must(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), verifyBound)
	defer cancel()
	resp, err := cli.Get(ctx, "/leased/", clientv3.WithPrefix())
	must(t, err)
	if len(resp.Kvs) != 2 {
		t.Fatalf("restored leased keys %v, want two", resp.Kvs)
	}
	for _, kv := range resp.Kvs {
		if clientv3.LeaseID(kv.Lease) != id {
			t.Errorf("%s restored on lease %x, want %x", kv.Key, kv.Lease, id)
		}
	}
	ttl, err := cli.TimeToLive(ctx, id)
	must(t, err)
	if ttl.GrantedTTL != leaseTTL || ttl.TTL <= 0 || ttl.TTL > leaseTTL {
		t.Errorf("restored lease %x: granted TTL %d, remaining %d; want %d, counting down", id, ttl.GrantedTTL, ttl.TTL, leaseTTL)
	}
}
