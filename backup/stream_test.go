package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The stream runs against real embedded members and stores to the real S3 server and to a
// directory, as the backups do.

type stream struct {
	cancel context.CancelFunc
	done   chan error
	mu     sync.Mutex
	fails  []error
}

// startStream streams the cluster's changes into s until stopped or the test ends.
func startStream(t *testing.T, s Store, eps []string, maxChunk int64) *stream {
	t.Helper()
	return startStreamWith(t, s, eps, maxChunk, func(*StreamOptions) {})
}

// startStreamWith is startStream with the options as edit leaves them.
func startStreamWith(t *testing.T, s Store, eps []string, maxChunk int64, edit func(*StreamOptions)) *stream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st := &stream{cancel: cancel, done: make(chan error, 1)}
	o := StreamOptions{Endpoints: eps, Take: takeOptions(t, s, eps, time.Now), Interval: 100 * time.Millisecond,
		MaxChunkBytes: maxChunk, Retry: 100 * time.Millisecond,
		Failed: func(err error) { st.mu.Lock(); st.fails = append(st.fails, err); st.mu.Unlock() }}
	edit(&o)
	go func() { st.done <- Stream(ctx, o) }()
	t.Cleanup(func() { st.stop() })
	return st
}

func (s *stream) stop() {
	s.cancel()
	<-s.done
	s.done <- context.Canceled
}

func (s *stream) failures() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.fails...)
}

func client(t *testing.T, eps []string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, Logger: zap.NewNop(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// currentRevision is the cluster's revision now.
func currentRevision(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "\x00", clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// lineageIn is the one lineage of destination s and its ID; false while there is none.
func lineageIn(t testing.TB, s Store) (Store, string, bool) {
	t.Helper()
	ids, err := s.Dirs(context.Background(), lineageDir)
	if err != nil {
		t.Fatal(err)
	}
	switch len(ids) {
	case 0:
		return nil, "", false
	case 1:
		return LineageStore(s, ids[0]), ids[0], true
	}
	t.Fatalf("lineages %v in %s, want one", ids, s.Where(""))
	return nil, "", false
}

// onlyLineage is the one lineage of destination s.
func onlyLineage(t testing.TB, s Store) Store {
	t.Helper()
	ls, _, ok := lineageIn(t, s)
	if !ok {
		t.Fatalf("no lineage in %s", s.Where(""))
	}
	return ls
}

// waitStored waits until the newest snapshot's chain in the one lineage of s reaches revision
// rev and returns the snapshot's revision and the chain, checked whole.
func waitStored(t *testing.T, s Store, rev int64) (int64, []Delta) {
	t.Helper()
	return waitStoredIn(t, func() (Store, bool) { ls, _, ok := lineageIn(t, s); return ls, ok }, rev)
}

// waitStoredIn is waitStored in the lineage lineage finds, once it exists.
func waitStoredIn(t *testing.T, lineage func() (Store, bool), rev int64) (int64, []Delta) {
	t.Helper()
	var last string
	for range 300 {
		ls, ok := lineage()
		if !ok {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		base, next, err := resumePoint(context.Background(), ls)
		if err == nil && next > rev {
			deltas, err := ls.ListDeltas(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			c, err := chain(deltas, base)
			if err != nil {
				t.Fatal(err)
			}
			return base, c
		}
		last = fmt.Sprintf("resume point %d (base %d), %v", next, base, err)
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("revision %d not stored in 30s: %s", rev, last)
	return 0, nil
}

// readChain fetches and decodes every chunk, checked against its checksum and name.
func readChain(t *testing.T, s Store, c []Delta) []*mvccpb.Event {
	t.Helper()
	s = onlyLineage(t, s)
	var out []*mvccpb.Event
	for _, d := range c {
		var buf bytes.Buffer
		meta, err := s.Fetch(context.Background(), d.Name, &buf)
		if err != nil {
			t.Fatal(err)
		}
		if meta.SHA256 == "" || meta.Revision != d.Last {
			t.Fatalf("%s stored with %+v: want its checksum and last revision", d.Name, meta)
		}
		evs, err := decodeDelta(buf.Bytes(), d, meta.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, evs...)
	}
	return out
}

func TestStreamStoresEveryChangeInBoundedChunks(t *testing.T) {
	for kind, open := range stores(t) {
		t.Run(kind, func(t *testing.T) {
			ms := startCluster(t, 1)
			eps := endpoints(ms...)
			s := open(t)
			const maxChunk = 4 << 10
			st := startStream(t, s, eps, maxChunk)
			w := startWriter(t, eps)
			w.waitAcked(t, 300)
			cli := client(t, eps)
			// A transaction of several keys is one revision of several events: never split.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			txn, err := cli.Txn(ctx).Then(clientv3.OpPut("txn-a", "1"), clientv3.OpPut("txn-b", "2"), clientv3.OpDelete("k-000000")).Commit()
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			acked := w.halt()
			end := currentRevision(t, cli)
			base, c := waitStored(t, s, end)
			events := readChain(t, s, c)
			st.stop()
			if len(c) < 3 {
				t.Fatalf("%d chunks for %d changes of 4 KiB bounds: want several", len(c), end-base)
			}
			for _, d := range c {
				if d.Size > maxChunk+512 && d.First != d.Last {
					t.Errorf("%s is %d bytes, above the bound of %d with more than one revision", d.Name, d.Size, maxChunk)
				}
			}
			byRev := map[int64][]*mvccpb.Event{}
			for _, ev := range events {
				byRev[ev.Kv.ModRevision] = append(byRev[ev.Kv.ModRevision], ev)
			}
			for key, rev := range acked {
				if rev <= base {
					continue
				}
				evs := byRev[rev]
				if len(evs) != 1 || string(evs[0].Kv.Key) != key || evs[0].Type != mvccpb.PUT || string(evs[0].Kv.Value) != strings.Repeat("v", 100) {
					t.Fatalf("revision %d of %s holds %v", rev, key, evs)
				}
			}
			if evs := byRev[txn.Header.Revision]; len(evs) != 3 || evs[2].Type != mvccpb.DELETE {
				t.Fatalf("the transaction's revision %d holds %v, want its three changes", txn.Header.Revision, evs)
			}
			if fails := st.failures(); len(fails) > 0 {
				t.Fatalf("the stream failed without a fault: %v", fails)
			}
		})
	}
}

func TestStreamResumesFromTheDestinationWithoutGapOrDuplicate(t *testing.T) {
	ms := startCluster(t, 1)
	eps := endpoints(ms...)
	s := realStore(t)
	cli := client(t, eps)
	put := func(n int, prefix string) {
		for i := range n {
			if _, err := cli.Put(context.Background(), fmt.Sprintf("%s-%03d", prefix, i), "v"); err != nil {
				t.Fatal(err)
			}
		}
	}
	st := startStream(t, s, eps, 1<<20)
	put(50, "a")
	waitStored(t, s, currentRevision(t, cli))
	st.stop()
	// Changes while no stream runs are read from etcd by the next one.
	put(50, "b")
	st = startStream(t, s, eps, 1<<20)
	put(50, "c")
	end := currentRevision(t, cli)
	base, c := waitStored(t, s, end)
	events := readChain(t, s, c)
	if n := int64(len(events)); n != end-base {
		t.Fatalf("%d events stored for revisions %d to %d", n, base+1, end)
	}
	if len(st.failures()) > 0 {
		t.Fatal(st.failures())
	}
}

func TestStreamStartsANewChainWhenItsChangesAreCompacted(t *testing.T) {
	for kind, open := range stores(t) {
		t.Run(kind, func(t *testing.T) {
			ms := startCluster(t, 1)
			eps := endpoints(ms...)
			s := open(t)
			cli := client(t, eps)
			st := startStream(t, s, eps, 1<<20)
			if _, err := cli.Put(context.Background(), "before", "1"); err != nil {
				t.Fatal(err)
			}
			oldBase, oldChain := waitStored(t, s, currentRevision(t, cli))
			st.stop()
			for i := range 20 {
				if _, err := cli.Put(context.Background(), fmt.Sprintf("gone-%d", i), "1"); err != nil {
					t.Fatal(err)
				}
			}
			compacted := currentRevision(t, cli)
			if _, err := cli.Compact(context.Background(), compacted); err != nil {
				t.Fatal(err)
			}
			st = startStream(t, s, eps, 1<<20)
			waitSnapshot(t, s, compacted)
			if _, err := cli.Put(context.Background(), "after", "1"); err != nil {
				t.Fatal(err)
			}
			base, c := waitStored(t, s, currentRevision(t, cli))
			if base < compacted || base == oldBase {
				t.Fatalf("new chain after revision %d, want a new snapshot at or after the compaction's %d", base, compacted)
			}
			if events := readChain(t, s, c); len(events) == 0 || string(events[len(events)-1].Kv.Key) != "after" {
				t.Fatalf("new chain holds %v", events)
			}
			if !hasErr(st.failures(), "compacted") {
				t.Fatalf("the stream did not report the compaction: %v", st.failures())
			}
			deltas, err := onlyLineage(t, s).ListDeltas(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if kept, err := chain(deltas, oldBase); err != nil || len(kept) != len(oldChain) {
				t.Fatalf("the old chain changed: %v, %v", kept, err)
			}
		})
	}
}

// waitSnapshot waits for a snapshot holding at least revision rev.
func waitSnapshot(t *testing.T, s Store, rev int64) {
	t.Helper()
	for range 300 {
		if ls, _, ok := lineageIn(t, s); !ok {
		} else if o, err := Newest(context.Background(), ls); err == nil && o.Revision >= rev {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no snapshot at or after revision %d in 30s", rev)
}

func hasErr(errs []error, text string) bool {
	for _, err := range errs {
		if strings.Contains(err.Error(), text) {
			return true
		}
	}
	return false
}

func TestStreamKeepsTheChainWholeAcrossALeaderLoss(t *testing.T) {
	ms := startCluster(t, 3)
	eps := endpoints(ms...)
	s := realStore(t)
	st := startStream(t, s, eps, 8<<10)
	w := startWriter(t, eps)
	w.waitAcked(t, 200)
	l := leader(t, ms)
	stopMember(l)
	var up []*member
	for _, m := range ms {
		if m != l {
			up = append(up, m)
		}
	}
	leader(t, up)
	w.waitAcked(t, len(w.acked)+200)
	acked := w.halt()
	cli := client(t, endpoints(up...))
	base, c := waitStored(t, s, currentRevision(t, cli))
	events := readChain(t, s, c)
	stored := map[string]int64{}
	for _, ev := range events {
		stored[string(ev.Kv.Key)] = ev.Kv.ModRevision
	}
	for key, rev := range acked {
		if rev > base && stored[key] != rev {
			t.Fatalf("%s acknowledged at revision %d, stored at %d", key, rev, stored[key])
		}
	}
	t.Logf("%d chunks after revision %d; the stream reported %d failures", len(c), base, len(st.failures()))
}

func TestRetentionDeletesChunksWithTheirSnapshot(t *testing.T) {
	ms := startCluster(t, 1)
	eps := endpoints(ms...)
	for kind, open := range stores(t) {
		t.Run(kind, func(t *testing.T) {
			s := open(t)
			cli := client(t, eps)
			clk := newClock()
			o := takeOptions(t, s, eps, clk.Now)
			var bases []int64
			for i := range 3 {
				r, err := Take(context.Background(), o)
				if err != nil {
					t.Fatal(err)
				}
				bases = append(bases, r.Revision)
				st := startStream(t, s, eps, 1<<20)
				if _, err := cli.Put(context.Background(), fmt.Sprintf("k%d", i), "v"); err != nil {
					t.Fatal(err)
				}
				waitStored(t, s, currentRevision(t, cli))
				st.stop()
			}
			o.Retention = Retention{Keep: 2}
			if _, err := Take(context.Background(), o); err != nil {
				t.Fatal(err)
			}
			deltas, err := onlyLineage(t, s).ListDeltas(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			chains := map[int64]bool{}
			for _, d := range deltas {
				chains[d.Base] = true
			}
			if chains[bases[0]] || chains[bases[1]] || !chains[bases[2]] {
				t.Fatalf("chains after %v kept: %v; want only the one after %d, whose snapshot is kept", bases, chains, bases[2])
			}
		})
	}
}

func TestGapInTheStoredChainIsNamed(t *testing.T) {
	ds := []Delta{{Name: DeltaName(10, 11, 20), Base: 10, First: 11, Last: 20}, {Name: DeltaName(10, 22, 30), Base: 10, First: 22, Last: 30}}
	_, err := chain(ds, 10)
	if !errors.Is(err, ErrGap) || !strings.Contains(err.Error(), "needs revision 21") {
		t.Fatalf("chain with revision 21 missing: %v", err)
	}
}

// realStore is the real S3 server's bucket.
func realStore(t *testing.T) Store {
	s, err := NewS3(realS3(t))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// refusingStore refuses to store chunks while refuse is set: storage that cannot be reached.
type refusingStore struct {
	Store
	refuse *atomic.Bool
}

func (s *refusingStore) Put(ctx context.Context, name string, r io.ReadSeeker, size int64, meta Meta) error {
	if strings.HasPrefix(name, deltaDir) && s.refuse.Load() {
		return errors.New("storage unreachable")
	}
	return s.Store.Put(ctx, name, r, size, meta)
}

// Sub refuses as its parent does: a lineage is a store of its own.
func (s *refusingStore) Sub(dir string) Store {
	return &refusingStore{Store: s.Store.Sub(dir), refuse: s.refuse}
}

// The stream says it is caught up while nothing waits, an idle cluster included, and stops
// saying so while a change waits that it cannot store; it resumes where it stored last.
func TestStreamIsCaughtUpOnlyWithNothingWaiting(t *testing.T) {
	ms := startCluster(t, 1)
	eps := endpoints(ms...)
	s := &refusingStore{Store: realStore(t), refuse: new(atomic.Bool)}
	cli := client(t, eps)
	var mu sync.Mutex
	var caughtUp []int64
	var resumed int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	o := StreamOptions{Endpoints: eps, Take: takeOptions(t, s, eps, time.Now), Interval: 100 * time.Millisecond,
		MaxChunkBytes: 1 << 20, Retry: 100 * time.Millisecond,
		Resumed:  func(stored int64) { mu.Lock(); resumed = stored; mu.Unlock() },
		CaughtUp: func(rev int64) { mu.Lock(); caughtUp = append(caughtUp, rev); mu.Unlock() }}
	go func() { done <- Stream(ctx, o) }()
	defer func() { cancel(); <-done }()
	since := func(n int) []int64 {
		mu.Lock()
		defer mu.Unlock()
		return append([]int64(nil), caughtUp[min(n, len(caughtUp)):]...)
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(caughtUp) }
	waitCaughtUp := func(rev int64) {
		t.Helper()
		for i := 0; ; i++ {
			if c := since(0); len(c) > 0 && c[len(c)-1] >= rev {
				return
			}
			if i == 200 {
				t.Fatalf("not caught up to revision %d in 20s: %v", rev, since(0))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// Idle: the first snapshot holds everything, nothing is written, and it is caught up.
	waitCaughtUp(currentRevision(t, cli))
	mu.Lock()
	first := resumed
	mu.Unlock()
	if first != currentRevision(t, cli) {
		t.Fatalf("resumed after revision %d, want the snapshot's %d", first, currentRevision(t, cli))
	}
	s.refuse.Store(true)
	resp, err := cli.Put(context.Background(), "waits", "v")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	n := count()
	time.Sleep(time.Second)
	if c := since(n); len(c) > 0 {
		t.Fatalf("caught up at %v while revision %d could not be stored", c, resp.Header.Revision)
	}
	s.refuse.Store(false)
	waitCaughtUp(resp.Header.Revision)
	if _, c := waitStored(t, s, resp.Header.Revision); c[len(c)-1].Last != resp.Header.Revision {
		t.Fatalf("chain ends at %d, want %d", c[len(c)-1].Last, resp.Header.Revision)
	}
}
