package backup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"etcdops.dev/etcdops/backupresult"
)

// A drill restores with the real etcd binary (replayEtcd) and compares with embedded members.

// drilled is a cluster with a snapshot and, with chunks, a chain of changes after it stored.
type drilled struct {
	s       Store
	eps     []string
	cli     *clientv3.Client
	lineage string
	end     int64 // the cluster's revision when the chain was stored
	base    int64 // the snapshot's revision
	chain   []Delta
	ms      []*member
}

// drilledCluster writes keys (with a lease of the snapshot among them), takes a snapshot,
// and with chunks streams more changes (keys put on that lease and on a lease granted after
// the snapshot among them) until stored.
func drilledCluster(t *testing.T, members int, chunks bool) drilled {
	t.Helper()
	ms := startCluster(t, members)
	d := drilled{eps: endpoints(ms...), ms: ms}
	var err error
	if d.s, err = NewDir(filepath.Join(t.TempDir(), "claim")); err != nil {
		t.Fatal(err)
	}
	d.cli = client(t, d.eps)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := d.cli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.cli.Put(ctx, "leased/before", "x", clientv3.WithLease(l.ID)); err != nil {
		t.Fatal(err)
	}
	churn(t, d.cli, 40)
	r, err := Take(ctx, takeOptions(t, d.s, d.eps, time.Now))
	if err != nil {
		t.Fatal(err)
	}
	d.lineage, d.base, d.end = r.Lineage, r.Revision, r.Revision
	if !chunks {
		return d
	}
	st := startStream(t, d.s, d.eps, 1<<10)
	churn(t, d.cli, 60)
	fresh, err := d.cli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	for key, lease := range map[string]clientv3.LeaseID{"leased/after-on-old": l.ID, "leased/after-on-new": fresh.ID} {
		if _, err := d.cli.Put(ctx, key, "y", clientv3.WithLease(lease)); err != nil {
			t.Fatal(err)
		}
	}
	d.end = currentRevision(t, d.cli)
	d.base, d.chain = waitStored(t, d.s, d.end)
	st.stop()
	return d
}

func (d drilled) options(t *testing.T) DrillOptions {
	return DrillOptions{Store: d.s, Lineage: d.lineage, Endpoints: d.eps, WorkDir: t.TempDir(), Etcd: replayEtcd(t), BytesPerSecond: 1 << 20, PageKeys: 7, Now: time.Now}
}

// raftIndexes are the members' raft indexes: any write, lease, compaction or alarm change
// goes through raft and moves them; reads, linearizable ones too, do not.
func (d drilled) raftIndexes(t *testing.T) string {
	t.Helper()
	var out []string
	for _, ep := range d.eps {
		st, err := d.cli.Status(context.Background(), ep)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprint(st.RaftIndex))
	}
	return strings.Join(out, ",")
}

// TestDrillPassesAndOnlyReads: a backup of snapshot and chunks, with keys on leases of the
// snapshot and of after it, restores to the cluster's revision and matches it key by key,
// with the live cluster's very digest; and the drill changes nothing on the live cluster.
func TestDrillPassesAndOnlyReads(t *testing.T) {
	d := drilledCluster(t, 3, true)
	before := d.raftIndexes(t)
	r := Drill(context.Background(), d.options(t))
	if r.Outcome != backupresult.DrillPassed {
		t.Fatalf("drill: %+v", r)
	}
	if after := d.raftIndexes(t); after != before {
		t.Fatalf("the drill moved the live members' raft indexes from %s to %s: it wrote", before, after)
	}
	if r.Revision != d.end || r.RestoredRevision != d.end || r.Digest != r.LiveDigest || r.Chunks != len(d.chain) || r.Keys == 0 || r.RestoreSeconds <= 0 {
		t.Fatalf("drill of a chain to %d (%d chunks): %+v", d.end, len(d.chain), r)
	}
	want := int64(len(keySpace(t, d.cli, d.end)))
	if r.Keys != want {
		t.Fatalf("drill counted %d keys, the cluster holds %d", r.Keys, want)
	}
	t.Logf("%s", r.Message)
}

// TestDrillCatchesAnAlteredChunk: a stored chunk whose value is changed, its checksum made to
// match, restores without complaint; the drill finds the key whose value differs.
func TestDrillCatchesAnAlteredChunk(t *testing.T) {
	d := drilledCluster(t, 1, true)
	ls := LineageStore(d.s, d.lineage)
	c := d.chain[len(d.chain)-1]
	var buf bytes.Buffer
	if _, err := ls.Fetch(context.Background(), c.Name, &buf); err != nil {
		t.Fatal(err)
	}
	// The last change put "y" on leased/after-on-new; a byte of the same length keeps the
	// chunk's encoding whole.
	data := buf.Bytes()
	i := bytes.LastIndex(data, []byte("leased/after-on"))
	j := i + bytes.Index(data[i:], []byte("y"))
	if i < 0 || j < i {
		t.Fatalf("no leased/after-on key in chunk %s", c.Name)
	}
	data[j] = 'z'
	sum := sha256.Sum256(data)
	if err := ls.Put(context.Background(), c.Name, bytes.NewReader(data), int64(len(data)), Meta{SHA256: hex.EncodeToString(sum[:])}); err != nil {
		t.Fatal(err)
	}
	r := Drill(context.Background(), d.options(t))
	if r.Outcome != backupresult.DrillMismatch || !strings.Contains(r.Message, `key "leased/after-on`) || !strings.Contains(r.Message, "its value differs") ||
		r.Digest == r.LiveDigest {
		t.Fatalf("drill of an altered chunk: %+v", r)
	}
	t.Logf("%s", r.Message)
}

// TestDrillCatchesAKeyWrittenIntoTheCopy: a key the backup never held, written into the
// restored copy before the comparison (the drill's test seam), is a difference.
func TestDrillCatchesAKeyWrittenIntoTheCopy(t *testing.T) {
	d := drilledCluster(t, 1, false)
	ctx := WithDrillSeam(context.Background(), func(ctx context.Context, restored *clientv3.Client) error {
		_, err := restored.Put(ctx, "k-07x", "never in the cluster")
		return err
	})
	r := Drill(ctx, d.options(t))
	if r.Outcome != backupresult.DrillMismatch || !strings.Contains(r.Message, `key "k-07x"`) || !strings.Contains(r.Message, "is in the restored copy, not in the live cluster") {
		t.Fatalf("drill of a copy written into: %+v", r)
	}
	t.Logf("%s", r.Message)
}

// TestDrillRestoreFailure: a chunk that fails its checksum fails the restore, and the drill
// says so.
func TestDrillRestoreFailure(t *testing.T) {
	d := drilledCluster(t, 1, true)
	ls := LineageStore(d.s, d.lineage)
	c := d.chain[0]
	var buf bytes.Buffer
	if _, err := ls.Fetch(context.Background(), c.Name, &buf); err != nil {
		t.Fatal(err)
	}
	data := flip(buf.Bytes(), buf.Len()/2)
	if err := ls.Put(context.Background(), c.Name, bytes.NewReader(data), int64(len(data)), Meta{SHA256: strings.Repeat("0", 64)}); err != nil {
		t.Fatal(err)
	}
	r := Drill(context.Background(), d.options(t))
	if r.Outcome != backupresult.DrillRestoreFailed || !strings.Contains(r.Message, "SHA-256") {
		t.Fatalf("drill of a chunk that fails its checksum: %+v", r)
	}
}

// TestDrillBringsTheCopyForward: the live cluster compacts the restored revision away while
// the copy is restored (here, in the test seam) and the stream stores more changes; the drill
// replays them onto the copy and compares at a revision the cluster serves.
func TestDrillBringsTheCopyForward(t *testing.T) {
	d := drilledCluster(t, 1, true)
	st := startStream(t, d.s, d.eps, 1<<10)
	var end int64
	ctx := WithDrillSeam(context.Background(), func(ctx context.Context, _ *clientv3.Client) error {
		churn(t, d.cli, 30)
		end = currentRevision(t, d.cli)
		waitStored(t, d.s, end)
		_, err := d.cli.Compact(ctx, end-5)
		return err
	})
	r := Drill(ctx, d.options(t))
	st.stop()
	if r.Outcome != backupresult.DrillPassed || r.RestoredRevision != d.end || r.Revision != end || r.Digest != r.LiveDigest ||
		!strings.Contains(r.Message, fmt.Sprintf("brought forward to revision %d", end)) {
		t.Fatalf("drill with the restored revision %d compacted, changes stored to %d: %+v", d.end, end, r)
	}
	t.Logf("%s", r.Message)
}

// TestDrillPartlyWhenNothingReachesARevisionServed: a snapshot alone, the live cluster
// changed and compacted since: the keys unchanged since are compared, and the drill says how
// many could not be.
func TestDrillPartlyWhenNothingReachesARevisionServed(t *testing.T) {
	d := drilledCluster(t, 1, false)
	churn(t, d.cli, 25)
	now := currentRevision(t, d.cli)
	if _, err := d.cli.Compact(context.Background(), now); err != nil {
		t.Fatal(err)
	}
	r := Drill(context.Background(), d.options(t))
	if r.Outcome != backupresult.DrillPassed || r.Revision != now || r.RestoredRevision != d.end ||
		!strings.Contains(r.Message, "which the live cluster no longer serves") || !strings.Contains(r.Message, "cannot be compared") {
		t.Fatalf("drill of a snapshot compacted on the live cluster: %+v", r)
	}
	t.Logf("%s", r.Message)
}

// TestDrillReadsTheLiveClusterAtItsBound: the live side is read at BytesPerSecond, as a backup
// reads its snapshot: 400 KiB of values at 100 KiB a second take at least three seconds beyond
// the first second's burst.
func TestDrillReadsTheLiveClusterAtItsBound(t *testing.T) {
	d := drilledCluster(t, 1, false)
	value := strings.Repeat("v", 4<<10)
	for i := range 100 {
		if _, err := d.cli.Put(context.Background(), fmt.Sprintf("big/%03d", i), value); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Take(context.Background(), takeOptions(t, d.s, d.eps, time.Now)); err != nil {
		t.Fatal(err)
	}
	o := d.options(t)
	o.BytesPerSecond, o.PageKeys = 100<<10, 10
	start := time.Now()
	r := Drill(context.Background(), o)
	took := time.Since(start) - time.Duration(r.RestoreSeconds*float64(time.Second))
	if r.Outcome != backupresult.DrillPassed || took < 3*time.Second {
		t.Fatalf("drill of 400 KiB at 100 KiB/s compared in %s: %+v", took, r)
	}
	t.Logf("compared in %s", took)
}
