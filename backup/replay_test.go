package backup

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/lease/leasepb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"etcdops.dev/etcdops/test/etcdbin"
)

// The replay runs a real etcd server binary, as the pod's own would: the release the embedded
// members link (test/etcdbin builds it from the Go module proxy on first use).

// replayEtcd is the etcd binary the tests replay with; the test skips when it cannot be built.
func replayEtcd(t testing.TB) string {
	t.Helper()
	bin, err := etcdbin.Path(etcdbin.Pinned["v3.7"])
	if err != nil {
		t.Skipf("etcd %s cannot be built from the Go module proxy, so the replay cannot run: %v", etcdbin.Pinned["v3.7"], err)
	}
	return bin
}

// restoreOnly restores s to rev into a new data dir without starting it, with o's test seams.
func restoreOnly(t *testing.T, s Store, rev int64, seam func(*RestoreOptions)) (*member, Restored, error) {
	t.Helper()
	m := newMember(t, "etcd-0")
	m.dir = filepath.Join(t.TempDir(), "data")
	o := RestoreOptions{Store: s, Name: LatestName, Revision: rev, WorkDir: t.TempDir(), DataDir: m.dir, Etcd: replayEtcd(t),
		Member: m.name, PeerURL: m.peerURL.String(), InitialCluster: m.name + "=" + m.peerURL.String(), Token: "restored"}
	if seam != nil {
		seam(&o)
	}
	r, err := Restore(context.Background(), o)
	return m, r, err
}

// dbPath is the backend database of a data dir.
func dbPath(dataDir string) string { return filepath.Join(dataDir, "member", "snap", "db") }

// dbRevision is the revision a stopped data dir holds, as etcdutl snapshot status reads it.
func dbRevision(t *testing.T, dataDir string) int64 {
	t.Helper()
	st, err := snapshot.NewV3(zap.NewNop()).Status(dbPath(dataDir))
	if err != nil {
		t.Fatal(err)
	}
	return st.Revision
}

// leaseRecords are the lease bucket's records of a database file, as "id ttl remaining".
func leaseRecords(t *testing.T, path string) []string {
	t.Helper()
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var out []string
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("lease"))
		if b == nil {
			return nil
		}
		return b.ForEach(func(_, v []byte) error {
			l := &leasepb.Lease{}
			if err := proto.Unmarshal(v, l); err != nil {
				return err
			}
			out = append(out, fmt.Sprintf("%x ttl=%d remaining=%d", l.GetID(), l.GetTTL(), l.GetRemainingTTL()))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// snapshotLeases are the lease records of the snapshot a chain starts from.
func snapshotLeases(t *testing.T, s Store, base int64) []string {
	t.Helper()
	// The stream stores its chains in the lineage of the one cluster it watched.
	if ids, err := s.Dirs(context.Background(), lineageDir); err == nil && len(ids) == 1 {
		s = LineageStore(s, ids[0])
	}
	objs, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.Revision != base {
			continue
		}
		f, err := os.Create(filepath.Join(t.TempDir(), "snapshot.db"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Fetch(context.Background(), o.Name, f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
		return leaseRecords(t, f.Name())
	}
	t.Fatalf("no snapshot of revision %d", base)
	return nil
}

// keySpaceLeased is keySpace at rev with each key's lease, as "key=value@create/mod/version
// lease"; a lease not in known reads 0, as a restore brings the key back.
func keySpaceLeased(t *testing.T, cli *clientv3.Client, rev int64, known map[clientv3.LeaseID]bool) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "", clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		l := clientv3.LeaseID(kv.Lease)
		if known != nil && !known[l] {
			l = clientv3.NoLease
		}
		out = append(out, fmt.Sprintf("%s=%s@%d/%d/%d lease %x", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, l))
	}
	return out
}

// leasedHistory is a chain of changes in which leases matter.
type leasedHistory struct {
	s   Store
	cli *clientv3.Client
	// base is the snapshot's revision; end the last change stored.
	base, end int64
	// expired is the revision at which etcd deleted the keys of the lease left to expire.
	expired int64
	// known are the leases the snapshot holds: short, left to expire in the change window,
	// and kept, kept alive through it with keys put on it before and in the window.
	known       map[clientv3.LeaseID]bool
	short, kept clientv3.LeaseID
}

// TTLs of the lease left to expire in the change window and of the one kept alive through it:
// long enough that a loaded machine takes the snapshot before the first expires and renews the
// second in time.
const (
	shortTTL = 3
	keptTTL  = 5
)

// writeLeasedHistory writes, on a one-member cluster: keys on a lease left to expire in the
// change window, which etcd deletes at one revision; keys on a lease kept alive throughout,
// one of them overwritten and one put on it in the window; a key put in the window on a lease
// granted there; and other changes before, between and after. One key on the kept lease is
// never written again: a replay that let its lease expire would delete it.
func writeLeasedHistory(t *testing.T) leasedHistory {
	t.Helper()
	ms := startCluster(t, 1)
	eps := endpoints(ms...)
	s, err := NewDir(filepath.Join(t.TempDir(), "claim"))
	if err != nil {
		t.Fatal(err)
	}
	cli := client(t, eps)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	grant := func(ttl int64) clientv3.LeaseID {
		l, err := cli.Grant(ctx, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return l.ID
	}
	put := func(key string, l clientv3.LeaseID) {
		if _, err := cli.Put(ctx, key, fmt.Sprintf("%s on %x", key, l), clientv3.WithLease(l)); err != nil {
			t.Fatal(err)
		}
	}
	h := leasedHistory{s: s, cli: cli, short: grant(shortTTL), kept: grant(keptTTL)}
	h.known = map[clientv3.LeaseID]bool{h.short: true, h.kept: true}
	alive, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	if _, err := cli.KeepAlive(alive, h.kept); err != nil {
		t.Fatal(err)
	}
	put("lease/short-1", h.short)
	put("lease/short-2", h.short)
	put("lease/kept-0", h.kept)
	put("lease/kept-1", h.kept)
	churn(t, cli, 20)
	deletions := cli.Watch(alive, "lease/short-", clientv3.WithPrefix())
	if _, err := Take(ctx, takeOptions(t, s, eps, time.Now)); err != nil {
		t.Fatal(err)
	}
	st := startStream(t, s, eps, 1<<10)
	churn(t, cli, 20)
	put("lease/kept-1", h.kept)
	put("lease/kept-2", h.kept)
	put("lease/fresh", grant(60))
	for h.expired == 0 {
		select {
		case w := <-deletions:
			for _, ev := range w.Events {
				if ev.Type != clientv3.EventTypeDelete {
					t.Fatalf("watch of the expiring lease's keys: %v", ev)
				}
				if h.expired != 0 && h.expired != ev.Kv.ModRevision {
					t.Fatalf("the expired lease's keys deleted at revisions %d and %d", h.expired, ev.Kv.ModRevision)
				}
				h.expired = ev.Kv.ModRevision
			}
		case <-ctx.Done():
			t.Fatal("the short lease did not expire")
		}
	}
	churn(t, cli, 20)
	h.end = currentRevision(t, cli)
	var c []Delta
	h.base, c = waitStored(t, s, h.end)
	st.stop()
	if len(c) < 2 || h.expired <= h.base+1 || h.expired >= h.end {
		t.Fatalf("%d chunks after revision %d, the lease expired at %d, the last change %d: want several chunks and the expiry inside", len(c), h.base, h.expired, h.end)
	}
	return h
}

// check compares a restored data dir, stopped, with the history at rev: its revision, its
// leases (the snapshot's records, as they were) and, started, its key space with each key's
// lease.
func (h leasedHistory) check(t *testing.T, m *member, r Restored, rev int64) {
	t.Helper()
	if r.Revision != rev {
		t.Fatalf("restore to %d reports revision %d", rev, r.Revision)
	}
	if got := dbRevision(t, m.dir); got != rev {
		t.Fatalf("restored to %d, the data dir holds revision %d", rev, got)
	}
	if got, want := leaseRecords(t, dbPath(m.dir)), snapshotLeases(t, h.s, h.base); !slices.Equal(got, want) {
		t.Fatalf("restored leases %v, want the snapshot's %v", got, want)
	}
	initial := m.name + "=" + m.peerURL.String()
	startMember(t, m, "new", initial, "restored")
	defer stopMember(m)
	// At rev: the restored cluster's own leases expire a TTL after it starts, at later revisions.
	got, want := keySpaceLeased(t, client(t, endpoints(m)), rev, nil), keySpaceLeased(t, h.cli, rev, h.known)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("restored to %d:\n%s\nwant as at revision %d:\n%s", rev, strings.Join(got, "\n"), rev, strings.Join(want, "\n"))
	}
}

// TestReplayKeepsLeasedKeysAsTheyWere: keys on a lease that expired in the change window go at
// the revision etcd deleted them, and keys put on a lease of the snapshot keep it; the
// restored leases are the snapshot's, as they were. Around the expiry, each target is reached
// exactly.
func TestReplayKeepsLeasedKeysAsTheyWere(t *testing.T) {
	h := writeLeasedHistory(t)
	for _, rev := range []int64{h.expired - 1, h.expired, h.expired + 1, h.end} {
		t.Run(fmt.Sprint(rev-h.expired), func(t *testing.T) {
			m, r, err := restoreOnly(t, h.s, rev, nil)
			if err != nil {
				t.Fatalf("restore to %d: %v", rev, err)
			}
			h.check(t, m, r, rev)
		})
	}
}

// TestReplaySlowerThanTheLeasesTTL: a replay that stops for longer than the TTL of a lease the
// snapshot holds, right after the first revision or after the last, still restores exactly
// the stored revisions: no lease expires in the replay, so none of its keys is deleted there.
func TestReplaySlowerThanTheLeasesTTL(t *testing.T) {
	h := writeLeasedHistory(t)
	// The replay server's leader would revoke the lease its TTL plus an election timeout (1s)
	// after it is elected, before the first revision is applied.
	pause := keptTTL*time.Second + 3*time.Second
	for name, at := range map[string]int64{"after-the-first": h.base + 1, "after-the-last": h.end} {
		t.Run(name, func(t *testing.T) {
			var paused []int64
			m, r, err := restoreOnly(t, h.s, h.end, func(o *RestoreOptions) {
				o.replayed = func(rev int64) {
					if rev == at {
						paused = append(paused, rev)
						time.Sleep(pause)
					}
				}
			})
			if err != nil {
				t.Fatalf("restore to %d, the replay paused %s after revision %d: %v", h.end, pause, at, err)
			}
			if !slices.Equal(paused, []int64{at}) {
				t.Fatalf("the replay paused after %v, want after %d", paused, at)
			}
			h.check(t, m, r, h.end)
		})
	}
}

// TestReplayStopsExactlyAtTheTarget restores to the first revision after the snapshot, to the
// last of a chunk and the first of the next, and to the revision before the last: each is
// reached, and nothing after it is applied.
func TestReplayStopsExactlyAtTheTarget(t *testing.T) {
	ms := startCluster(t, 1)
	eps := endpoints(ms...)
	s, err := NewDir(filepath.Join(t.TempDir(), "claim"))
	if err != nil {
		t.Fatal(err)
	}
	cli := client(t, eps)
	churn(t, cli, 30)
	if _, err := Take(context.Background(), takeOptions(t, s, eps, time.Now)); err != nil {
		t.Fatal(err)
	}
	st := startStream(t, s, eps, 1<<10)
	churn(t, cli, 120)
	end := currentRevision(t, cli)
	base, c := waitStored(t, s, end)
	st.stop()
	if len(c) < 2 {
		t.Fatalf("%d chunks: want at least two", len(c))
	}
	targets := map[string]int64{"first-after-the-snapshot": base + 1, "last-of-a-chunk": c[0].Last, "first-of-the-next": c[1].First, "before-the-last": end - 1}
	for _, name := range slices.Sorted(maps.Keys(targets)) {
		rev := targets[name]
		t.Run(name, func(t *testing.T) {
			var applied []int64
			m, r, err := restoreOnly(t, s, rev, func(o *RestoreOptions) { o.replayed = func(rev int64) { applied = append(applied, rev) } })
			if err != nil {
				t.Fatalf("restore to %d: %v", rev, err)
			}
			if len(applied) != int(rev-base) || applied[0] != base+1 || applied[len(applied)-1] != rev {
				t.Fatalf("restore to %d after snapshot %d applied %d revisions, %v", rev, base, len(applied), applied)
			}
			if got := dbRevision(t, m.dir); r.Revision != rev || got != rev {
				t.Fatalf("restore to %d reports %d, the data dir holds %d", rev, r.Revision, got)
			}
			startMember(t, m, "new", m.name+"="+m.peerURL.String(), "restored")
			defer stopMember(m)
			rcli := client(t, endpoints(m))
			if now := currentRevision(t, rcli); now != rev {
				t.Fatalf("restored to %d, the cluster is at revision %d", rev, now)
			}
			got, want := keySpace(t, rcli, 0), keySpace(t, cli, rev)
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Fatalf("restored to %d:\n%v\nwant\n%v", rev, got, want)
			}
		})
	}
}

// TestReplayNamesWhyItsEtcdDidNotServe: an etcd that exits instead of serving fails the restore
// with etcd's own reason, and the data dir goes. Here it is v3.6 asked to replay onto the
// snapshot of a v3.7 cluster (the embedded members), which it refuses to start on.
func TestReplayNamesWhyItsEtcdDidNotServe(t *testing.T) {
	v36, err := etcdbin.Path(etcdbin.Pinned["v3.6"])
	if err != nil {
		t.Skipf("etcd %s cannot be built from the Go module proxy: %v", etcdbin.Pinned["v3.6"], err)
	}
	ms := startCluster(t, 1)
	eps := endpoints(ms...)
	s, err := NewDir(filepath.Join(t.TempDir(), "claim"))
	if err != nil {
		t.Fatal(err)
	}
	cli := client(t, eps)
	st := startStream(t, s, eps, 1<<10)
	// The churn must come after the stream's snapshot, so that the restore replays it: on a
	// loaded machine the snapshot could come after, leaving nothing for v3.6 to replay.
	waitSnapshot(t, s, currentRevision(t, cli))
	churn(t, cli, 10)
	end := currentRevision(t, cli)
	waitStored(t, s, end)
	st.stop()
	m, _, err := restoreOnly(t, s, end, func(o *RestoreOptions) { o.Etcd = v36 })
	// v3.6 refuses the newer storage schema, or, when the snapshot was taken before the v3.7
	// cluster wrote its schema, the newer cluster version.
	if err == nil || !strings.Contains(err.Error(), "exited before serving") ||
		!strings.Contains(err.Error(), `version "3.7.0" is not supported`) && !strings.Contains(err.Error(), "invalid downgrade") {
		t.Fatalf("restore replaying with etcd %s: %v", etcdbin.Pinned["v3.6"], err)
	}
	t.Logf("refused: %v", err)
	if _, serr := os.Stat(m.dir); !os.IsNotExist(serr) {
		t.Fatalf("a refused replay left its data dir: %v", serr)
	}
}
