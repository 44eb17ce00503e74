package backup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// churn writes n changes of every kind: puts that create and overwrite, deletes, and
// transactions of several keys in one revision.
func churn(t *testing.T, cli *clientv3.Client, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range n {
		key := fmt.Sprintf("k-%02d", i%40)
		var err error
		switch {
		case i%7 == 3:
			_, err = cli.Delete(ctx, key)
		case i%11 == 5:
			_, err = cli.Txn(ctx).Then(clientv3.OpPut(key, fmt.Sprint(i)), clientv3.OpPut("t-"+key, fmt.Sprint(i))).Commit()
		default:
			_, err = cli.Put(ctx, key, fmt.Sprint(i))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// keySpace is every key with its value and revisions, as "key=value@create/mod/version".
func keySpace(t *testing.T, cli *clientv3.Client, rev int64) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := cli.Get(ctx, "", opts...)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, fmt.Sprintf("%s=%s@%d/%d/%d", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version))
	}
	return out
}

func restoreTo(t *testing.T, s Store, rev int64) (*member, Restored) {
	t.Helper()
	return restoreWith(t, RestoreOptions{Store: s, Name: LatestName, Revision: rev})
}

// restoreWith restores what o names (its store, lineage, name, revision or time) into a new
// one-member cluster and starts it.
func restoreWith(t *testing.T, o RestoreOptions) (*member, Restored) {
	t.Helper()
	m := newMember(t, "etcd-0")
	m.dir = filepath.Join(t.TempDir(), "data")
	initial := m.name + "=" + m.peerURL.String()
	o.WorkDir, o.DataDir, o.Member, o.PeerURL, o.InitialCluster, o.Token = t.TempDir(), m.dir, m.name, m.peerURL.String(), initial, "restored"
	if o.Etcd == "" {
		o.Etcd = replayEtcd(t)
	}
	r, err := Restore(context.Background(), o)
	if err != nil {
		t.Fatalf("restore of %s (lineage %q) to revision %d, time %v: %v", o.Name, o.Lineage, o.Revision, o.Time, err)
	}
	startMember(t, m, "new", initial, "restored")
	return m, r
}

func TestPointInTimeRestoreHoldsExactlyTheKeySpaceAtTheRevision(t *testing.T) {
	for kind, open := range stores(t) {
		t.Run(kind, func(t *testing.T) {
			ms := startCluster(t, 1)
			eps := endpoints(ms...)
			s := open(t)
			cli := client(t, eps)
			churn(t, cli, 60)
			if _, err := Take(context.Background(), takeOptions(t, s, eps, time.Now)); err != nil {
				t.Fatal(err)
			}
			st := startStream(t, s, eps, 2<<10)
			churn(t, cli, 300)
			end := currentRevision(t, cli)
			base, c := waitStored(t, s, end)
			st.stop()
			if len(c) < 2 {
				t.Fatalf("%d chunks after revision %d: want several to replay across", len(c), base)
			}
			for _, rev := range []int64{0, (base + end) / 2, c[0].Last, base} {
				want := rev
				if rev == 0 {
					want = end
				}
				m, r := restoreTo(t, s, rev)
				if r.Revision != want {
					t.Fatalf("restore to %d reports revision %d, want %d", rev, r.Revision, want)
				}
				rcli := client(t, endpoints(m))
				got, exp := keySpace(t, rcli, 0), keySpace(t, cli, want)
				if strings.Join(got, "\n") != strings.Join(exp, "\n") {
					t.Fatalf("restored to %d: %d keys\n%v\nwant %d keys as at revision %d\n%v", rev, len(got), got, len(exp), want, exp)
				}
				if now := currentRevision(t, rcli); now != want {
					t.Fatalf("restored to %d, the cluster is at revision %d", want, now)
				}
				stopMember(m)
			}
		})
	}
}

func TestPointInTimeRestoreRefusesAGapOrACorruptChunk(t *testing.T) {
	ms := startCluster(t, 1)
	eps := endpoints(ms...)
	dir := filepath.Join(t.TempDir(), "claim")
	s, err := NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	cli := client(t, eps)
	st := startStream(t, s, eps, 1<<10)
	churn(t, cli, 200)
	end := currentRevision(t, cli)
	_, c := waitStored(t, s, end)
	st.stop()
	if len(c) < 3 {
		t.Fatalf("%d chunks: want at least three", len(c))
	}
	restore := func(rev int64) (string, error) {
		dataDir := filepath.Join(t.TempDir(), "data")
		_, err := Restore(context.Background(), RestoreOptions{Store: s, Name: LatestName, Revision: rev, WorkDir: t.TempDir(), DataDir: dataDir, Etcd: replayEtcd(t),
			Member: "etcd-0", PeerURL: "http://127.0.0.1:2380", InitialCluster: "etcd-0=http://127.0.0.1:2380", Token: "t"})
		return dataDir, err
	}
	middle := c[1]
	_, id, _ := lineageIn(t, s)
	path := filepath.Join(dir, lineageDir, id, middle.Name)
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	if err := os.WriteFile(path, flip(good, len(good)-3), 0o600); err != nil {
		t.Fatal(err)
	}
	dataDir, err := restore(0)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), middle.Name) {
		t.Fatalf("restore across a corrupt chunk: %v", err)
	}
	if _, serr := os.Stat(dataDir); !errors.Is(serr, os.ErrNotExist) {
		t.Fatalf("a refused replay left a data dir: %v", serr)
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	_, err = restore(end)
	want := fmt.Sprintf("revision %d cannot be reached", end)
	stop := fmt.Sprintf("stop at revision %d", c[0].Last)
	if !errors.Is(err, ErrGap) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), stop) {
		t.Fatalf("restore across a missing chunk: %v; want %q and %q", err, want, stop)
	}
	// Before the gap, the chain still serves.
	if _, err := restore(c[0].Last); err != nil {
		t.Fatalf("restore before the gap: %v", err)
	}
}
