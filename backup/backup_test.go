package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"etcdops.dev/etcdops/internal/s3server"
)

// Object storage is versitygw, a real S3 server, over a temporary directory on 127.0.0.1
// (internal/s3server); the claim of the PVC case is a directory. etcd is real.

const testBucket = "etcd-backups"

// realS3 serves a bucket on loopback and returns the store's configuration.
func realS3(t testing.TB) S3Config {
	t.Helper()
	srv := s3server.Start(t, testBucket)
	return S3Config{Endpoint: srv.Endpoint, Bucket: testBucket, Prefix: "ns/etcd", Region: s3server.Region, AccessKeyID: s3server.AccessKey, SecretAccessKey: s3server.SecretKey}
}

// stores are the two kinds of destination, each fresh.
func stores(t *testing.T) map[string]func(t *testing.T) Store {
	return map[string]func(t *testing.T) Store{
		"s3": func(t *testing.T) Store {
			cfg := realS3(t)
			s, err := NewS3(cfg)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"pvc": func(t *testing.T) Store {
			s, err := NewDir(filepath.Join(t.TempDir(), "claim", "ns", "etcd"))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
}

// clock hands out times a minute apart, so that each snapshot has its own name.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Minute)
	return c.t
}

func newClock() *clock { return &clock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)} }

func takeOptions(t *testing.T, s Store, eps []string, now func() time.Time) TakeOptions {
	return TakeOptions{Endpoints: eps, Cluster: "etcd", Store: s, WorkDir: t.TempDir(), Now: now, BytesPerSecond: 64 << 20}
}

// writer puts keys until stopped and records the revision at which each was acknowledged.
type writer struct {
	mu    sync.Mutex
	acked map[string]int64
	stop  chan struct{}
	done  chan struct{}
}

func startWriter(t *testing.T, eps []string) *writer {
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, Logger: zap.NewNop(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w := &writer{acked: map[string]int64{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer cli.Close()
		for i := 0; i < 100000; i++ {
			select {
			case <-w.stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			key := fmt.Sprintf("k-%06d", i)
			resp, err := cli.Put(ctx, key, strings.Repeat("v", 100))
			cancel()
			if err == nil {
				w.mu.Lock()
				w.acked[key] = resp.Header.Revision
				w.mu.Unlock()
			}
		}
	}()
	return w
}

func (w *writer) halt() map[string]int64 {
	close(w.stop)
	<-w.done
	return w.acked
}

// waitAcked waits until the writer has n acknowledged keys.
func (w *writer) waitAcked(t *testing.T, n int) {
	for range 1000 {
		w.mu.Lock()
		got := len(w.acked)
		w.mu.Unlock()
		if got >= n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("writer acknowledged fewer than %d keys in 10s", n)
}

// restoreAndStart restores the snapshot into a new one-member cluster and starts it.
func restoreAndStart(t *testing.T, s Store, name string) (*member, Restored) {
	t.Helper()
	m := newMember(t, "etcd-0")
	m.dir = filepath.Join(t.TempDir(), "data")
	initial := m.name + "=" + m.peerURL.String()
	r, err := Restore(context.Background(), RestoreOptions{Store: s, Name: name, WorkDir: t.TempDir(), DataDir: m.dir,
		Member: m.name, PeerURL: m.peerURL.String(), InitialCluster: initial, Token: "restored"})
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	startMember(t, m, embed.ClusterStateFlagNew, initial, "restored")
	if m.etcd == nil {
		t.FailNow()
	}
	return m, r
}

func TestBackupWhileWritingRestoresEveryAcknowledgedKey(t *testing.T) {
	for kind, open := range stores(t) {
		t.Run(kind, func(t *testing.T) {
			ms := startCluster(t, 3)
			oldID := ms[0].etcd.Server.Cluster().ID()
			w := startWriter(t, endpoints(ms...))
			w.waitAcked(t, 200)
			s := open(t)
			res, err := Take(context.Background(), takeOptions(t, s, endpoints(ms...), newClock().Now))
			w.waitAcked(t, len(w.acked)+100)
			acked := w.halt()
			if err != nil {
				t.Fatalf("take: %v", err)
			}
			if res.Revision <= 1 || res.Size == 0 || res.SHA256 == "" || !strings.Contains(res.Object, "etcd-20261201T090100Z-r") {
				t.Fatalf("result %+v", res)
			}

			m, restored := restoreAndStart(t, s, LatestName)
			if restored.Revision != res.Revision {
				t.Fatalf("restored revision %d, backed up %d", restored.Revision, res.Revision)
			}
			if id := m.etcd.Server.Cluster().ID(); id == oldID {
				t.Fatalf("restored cluster kept the old cluster ID %s", id)
			}
			if n := len(m.etcd.Server.Cluster().Members()); n != 1 {
				t.Fatalf("restored cluster has %d members, want 1", n)
			}
			cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints(m), Logger: zap.NewNop()})
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			got, err := cli.Get(ctx, "k-", clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				t.Fatal(err)
			}
			present := map[string]bool{}
			for _, kv := range got.Kvs {
				present[string(kv.Key)] = true
			}
			before, after := 0, 0
			for key, rev := range acked {
				switch {
				case rev <= res.Revision && !present[key]:
					t.Errorf("%s acknowledged at revision %d, before the snapshot's %d, is missing", key, rev, res.Revision)
				case rev <= res.Revision:
					before++
				default:
					after++
				}
			}
			if before == 0 || after == 0 {
				t.Fatalf("the writer did not run across the snapshot: %d keys before its revision, %d after", before, after)
			}
			t.Logf("%d keys acknowledged before revision %d all restored; %d written after it", before, res.Revision, after)
		})
	}
}

func TestRetentionKeepsExactlyN(t *testing.T) {
	ms := startCluster(t, 1)
	for kind, open := range stores(t) {
		t.Run(kind, func(t *testing.T) {
			s := open(t)
			clk := newClock()
			o := takeOptions(t, s, endpoints(ms...), clk.Now)
			o.Retention = Retention{Keep: 3}
			var names []string
			for i := range 6 {
				r, err := Take(context.Background(), o)
				if err != nil {
					t.Fatal(err)
				}
				names = append(names, r.Object)
				if want := max(0, i+1-3); i >= 3 && r.Deleted != 1 || i < 3 && r.Deleted != 0 {
					t.Fatalf("backup %d deleted %d, want %d", i, r.Deleted, min(want, 1))
				}
			}
			ls := onlyLineage(t, s)
			objs, err := ls.List(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(objs) != 3 {
				t.Fatalf("%d snapshots kept, want 3: %+v", len(objs), objs)
			}
			newestFirst(objs)
			for i, o := range objs {
				if want := names[5-i]; ls.Where(o.Name) != want {
					t.Errorf("kept %s, want the newest: %s", ls.Where(o.Name), want)
				}
			}
		})
	}
}

func TestRetentionExpired(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	objs := []Object{}
	for i := range 5 {
		// one snapshot an hour, the newest at 11:00
		objs = append(objs, Object{Name: fmt.Sprintf("s%d", i), Time: now.Add(-time.Duration(5-i) * time.Hour)})
	}
	for _, tt := range []struct {
		name string
		r    Retention
		want []string
	}{
		{"no bound keeps everything", Retention{}, nil},
		{"keep 2 deletes the three oldest", Retention{Keep: 2}, []string{"s0", "s1", "s2"}},
		{"keep more than there are deletes nothing", Retention{Keep: 9}, nil},
		{"keepFor 3h deletes those older", Retention{KeepFor: 3*time.Hour + time.Minute}, []string{"s0", "s1"}},
		{"both: beyond either bound goes", Retention{Keep: 4, KeepFor: 2*time.Hour + time.Minute}, []string{"s0", "s1", "s2"}},
		{"the newest stays, however old", Retention{KeepFor: time.Minute}, []string{"s0", "s1", "s2", "s3"}},
	} {
		var got []string
		for _, o := range tt.r.Expired(objs, now) {
			got = append(got, o.Name)
		}
		if fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("%s: expired %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestCorruptOrTruncatedSnapshotIsRefused(t *testing.T) {
	ms := startCluster(t, 1)
	s, err := NewDir(filepath.Join(t.TempDir(), "claim"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := Take(context.Background(), takeOptions(t, s, endpoints(ms...), newClock().Now))
	if err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(r.Object)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name  string
		bytes []byte
		says  string
	}{
		{"truncated", good[:len(good)/2], "truncated"},
		{"one byte flipped", flip(good, len(good)/3), "SHA-256"},
		{"the trailer lost", good[:len(good)-32], "truncated"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := os.WriteFile(r.Object, tt.bytes, 0o600); err != nil {
				t.Fatal(err)
			}
			dataDir := filepath.Join(t.TempDir(), "data")
			_, err := Restore(context.Background(), RestoreOptions{Store: s, Name: filepath.Base(r.Object), WorkDir: t.TempDir(), DataDir: dataDir,
				Member: "etcd-0", PeerURL: "http://127.0.0.1:2380", InitialCluster: "etcd-0=http://127.0.0.1:2380", Token: "t"})
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tt.says) || !strings.Contains(err.Error(), "refused") {
				t.Fatalf("restore of a %s snapshot: %v; want a refusal that says %q", tt.name, err, tt.says)
			}
			if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a refused restore left a data dir: %v", err)
			}
		})
	}
	t.Run("stored checksum differs", func(t *testing.T) {
		if err := os.WriteFile(r.Object, good, 0o600); err != nil {
			t.Fatal(err)
		}
		meta := r.Object + ".json"
		if err := os.WriteFile(meta, []byte(`{"SHA256":"00ff","Revision":1}`), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Restore(context.Background(), RestoreOptions{Store: s, Name: filepath.Base(r.Object), WorkDir: t.TempDir(), DataDir: filepath.Join(t.TempDir(), "data"),
			Member: "etcd-0", PeerURL: "http://127.0.0.1:2380", InitialCluster: "etcd-0=http://127.0.0.1:2380", Token: "t"})
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "stored as 00ff") {
			t.Fatalf("restore against another checksum: %v", err)
		}
	})
}

func TestCorruptObjectInS3IsRefused(t *testing.T) {
	cfg := realS3(t)
	s, err := NewS3(cfg)
	if err != nil {
		t.Fatal(err)
	}
	name := SnapshotName("etcd", time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC), 7)
	junk := filepath.Join(t.TempDir(), "junk")
	if err := os.WriteFile(junk, bytes.Repeat([]byte{1}, 4096+32), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(junk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := s.Put(context.Background(), name, f, 4096+32, Meta{}); err != nil {
		t.Fatal(err)
	}
	_, err = Restore(context.Background(), RestoreOptions{Store: s, Name: LatestName, WorkDir: t.TempDir(), DataDir: filepath.Join(t.TempDir(), "data"),
		Member: "etcd-0", PeerURL: "http://127.0.0.1:2380", InitialCluster: "etcd-0=http://127.0.0.1:2380", Token: "t"})
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "s3://"+testBucket+"/ns/etcd/"+name) {
		t.Fatalf("restore of junk from S3: %v", err)
	}
}

func flip(b []byte, i int) []byte {
	out := bytes.Clone(b)
	out[i] ^= 0xff
	return out
}

func TestBackupWhileAMemberIsDownSucceedsFromAnother(t *testing.T) {
	ms := startCluster(t, 3)
	l := leader(t, ms)
	var followers []*member
	for _, m := range ms {
		if m != l {
			followers = append(followers, m)
		}
	}
	down := followers[0]
	downID := fmt.Sprintf("%x", uint64(down.etcd.Server.MemberID()))
	stopMember(down)
	s, _ := NewDir(t.TempDir())
	// The member that is down comes first, as the planner's preferred follower would.
	r, err := Take(context.Background(), takeOptions(t, s, endpoints(down, l, followers[1]), newClock().Now))
	if err != nil {
		t.Fatalf("take with %s down: %v", down.name, err)
	}
	if want := fmt.Sprintf("%x", uint64(followers[1].etcd.Server.MemberID())); r.MemberID != want {
		t.Fatalf("snapshot read from %s, want the follower still up (%s), not the leader nor %s", r.MemberID, want, downID)
	}
}

func TestBackupPrefersAFollower(t *testing.T) {
	ms := startCluster(t, 3)
	l := leader(t, ms)
	s, _ := NewDir(t.TempDir())
	r, err := Take(context.Background(), takeOptions(t, s, endpoints(l), newClock().Now))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%x", uint64(l.etcd.Server.MemberID())); r.MemberID != want {
		t.Fatalf("with only the leader given, read from %s, want %s", r.MemberID, want)
	}
	var eps []string
	eps = append(eps, endpoints(l)...)
	for _, m := range ms {
		if m != l {
			eps = append(eps, m.clientURL.String())
		}
	}
	r, err = Take(context.Background(), takeOptions(t, s, eps, newClock().Now))
	if err != nil {
		t.Fatal(err)
	}
	if r.MemberID == fmt.Sprintf("%x", uint64(l.etcd.Server.MemberID())) {
		t.Fatal("the snapshot was read from the leader although followers answered")
	}
}

func TestNoMemberAnswersFails(t *testing.T) {
	s, _ := NewDir(t.TempDir())
	o := takeOptions(t, s, []string{fmt.Sprintf("http://127.0.0.1:%d", freePort(t))}, newClock().Now)
	o.SourceTimeout = 500 * time.Millisecond
	_, err := Take(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "no member can give a snapshot") {
		t.Fatalf("take with nobody listening: %v", err)
	}
	if objs, _ := s.List(context.Background()); len(objs) != 0 {
		t.Fatalf("a failed backup stored %v", objs)
	}
}

// TestSnapshotFromASurvivor: with quorum lost, the member that remains reports "no leader" and
// is refused as a source; taken as the survivor of a quorum recovery, it gives its snapshot.
func TestSnapshotFromASurvivor(t *testing.T) {
	ms := startCluster(t, 3)
	cli := client(t, endpoints(ms...))
	churn(t, cli, 20)
	want := currentRevision(t, cli)
	stopMember(ms[1])
	stopMember(ms[2])
	s, err := NewDir(filepath.Join(t.TempDir(), "claim"))
	if err != nil {
		t.Fatal(err)
	}
	o := takeOptions(t, s, endpoints(ms[0]), newClock().Now)
	o.SourceTimeout = 20 * time.Second // the survivor's status waits out its election timeout
	var quorumless error
	for range 50 {
		// Until it has noticed the others are gone it still has a leader.
		if _, quorumless = Take(context.Background(), o); quorumless != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if quorumless == nil || !strings.Contains(quorumless.Error(), "no leader") {
		t.Fatalf("a backup from a member without quorum: %v, want refused for no leader", quorumless)
	}
	o.Survivor = true
	r, err := Take(context.Background(), o)
	if err != nil {
		t.Fatalf("the survivor's snapshot: %v", err)
	}
	if r.Revision != want {
		t.Fatalf("the survivor's snapshot holds revision %d, the cluster was at %d", r.Revision, want)
	}
}
