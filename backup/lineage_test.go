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
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"
)

// Destinations that are used already: restored clusters under one name, two writers, a
// retention that runs while the stream starts a chain, chunks of the format before times.
// Every case runs against the real S3 server and a directory, with real etcd members.

// lineageOfMember is the lineage a member's cluster writes.
func lineageOfMember(m *member) string { return LineageOf(uint64(m.etcd.Server.Cluster().ID())) }

// inLineage finds lineage id of s once it exists.
func inLineage(s Store, id string) func() (Store, bool) {
	return func() (Store, bool) {
		ids, err := s.Dirs(context.Background(), lineageDir)
		for _, have := range ids {
			if err == nil && have == id {
				return LineageStore(s, id), true
			}
		}
		return nil, false
	}
}

func sameKeys(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("%s: %d keys\n%v\nwant %d keys\n%v", what, len(got), got, len(want), want)
	}
}

// A cluster restored to an earlier revision, and restored again under the same name to a
// revision of its own history, each writes a lineage of its own; "latest" then restores the
// newest cluster's history, with none of the writes the restores undid and all of its own.
func TestRestoreTwiceUnderOneNameThenLatest(t *testing.T) {
	for kind, open := range stores(t) {
		t.Run(kind, func(t *testing.T) {
			s := open(t)
			// A: the first cluster, 200 changes streamed.
			a := startCluster(t, 1)[0]
			cliA := client(t, endpoints(a))
			stA := startStream(t, s, endpoints(a), 2<<10)
			churn(t, cliA, 200)
			endA := currentRevision(t, cliA)
			baseA, _ := waitStoredIn(t, inLineage(s, lineageOfMember(a)), endA)
			stA.stop()
			midA := (baseA + endA) / 2

			// B: A restored to the middle of its history; it writes 100 changes of its own.
			b, rb := restoreTo(t, s, midA)
			sameKeys(t, "B restored", keySpace(t, client(t, endpoints(b)), 0), keySpace(t, cliA, midA))
			if rb.Lineage != lineageOfMember(a) || rb.Revision != midA || rb.Time.IsZero() {
				t.Fatalf("B restored %+v, want lineage %s revision %d with its time", rb, lineageOfMember(a), midA)
			}
			cliB := client(t, endpoints(b))
			stB := startStreamWith(t, s, endpoints(b), 2<<10, func(o *StreamOptions) {
				o.Take.Origin = Origin{Namespace: "ns", UID: "uid-b", RestoredFrom: &Parent{Lineage: rb.Lineage, Revision: rb.Revision, Time: rb.Time}}
			})
			// Its first snapshot, before it writes: its lineage starts at the revision restored.
			waitStoredIn(t, inLineage(s, lineageOfMember(b)), midA)
			churn(t, cliB, 100)
			endB := currentRevision(t, cliB)
			baseB, _ := waitStoredIn(t, inLineage(s, lineageOfMember(b)), endB)
			stB.stop()
			if baseB != midA {
				t.Fatalf("B's chain starts after revision %d, want its own snapshot of revision %d", baseB, midA)
			}
			// A revision both histories have, each with other changes.
			midB := (midA + endB) / 2
			if midB >= endA {
				t.Fatalf("B's revision %d is not also one of A's (up to %d)", midB, endA)
			}

			// C: B restored under the same name to the middle of B's history.
			c, rc := restoreTo(t, s, midB)
			sameKeys(t, "C restored", keySpace(t, client(t, endpoints(c)), 0), keySpace(t, cliB, midB))
			if rc.Lineage != lineageOfMember(b) {
				t.Fatalf("C restored from lineage %s, want B's %s", rc.Lineage, lineageOfMember(b))
			}
			cliC := client(t, endpoints(c))
			stC := startStreamWith(t, s, endpoints(c), 2<<10, func(o *StreamOptions) {
				o.Take.Origin = Origin{RestoredFrom: &Parent{Lineage: rc.Lineage, Revision: rc.Revision, Time: rc.Time}}
			})
			waitStoredIn(t, inLineage(s, lineageOfMember(c)), midB)
			churn(t, cliC, 50)
			endC := currentRevision(t, cliC)
			waitStoredIn(t, inLineage(s, lineageOfMember(c)), endC)
			stC.stop()

			// D: latest is C's newest change, and C's key space exactly.
			d, rd := restoreTo(t, s, 0)
			sameKeys(t, "latest", keySpace(t, client(t, endpoints(d)), 0), keySpace(t, cliC, endC))
			if rd.Lineage != lineageOfMember(c) || rd.Revision != endC {
				t.Fatalf("latest restored lineage %s revision %d, want C's %s at %d", rd.Lineage, rd.Revision, lineageOfMember(c), endC)
			}

			ls, err := ListLineages(context.Background(), s)
			if err != nil {
				t.Fatal(err)
			}
			if len(ls) != 3 {
				t.Fatalf("lineages %+v, want A's, B's and C's", ls)
			}
			for i, want := range []struct {
				id     string
				parent string
				first  int64
				last   int64
			}{{lineageOfMember(a), "", baseA, endA}, {lineageOfMember(b), lineageOfMember(a), midA, endB}, {lineageOfMember(c), lineageOfMember(b), midB, endC}} {
				l := ls[i]
				parent := ""
				if l.Manifest != nil && l.Manifest.RestoredFrom != nil {
					parent = l.Manifest.RestoredFrom.Lineage
				}
				if l.ID != want.id || l.Manifest == nil || l.Manifest.ClusterID != want.id || parent != want.parent ||
					l.First.Revision != want.first || l.Last.Revision != want.last || l.Newest.IsZero() {
					t.Errorf("lineage %d: %+v (manifest %+v), want %s from %s, revisions %d to %d", i, l, l.Manifest, want.id, want.parent, want.first, want.last)
				}
			}
			// A named lineage and revision reach an older history on purpose.
			e, re := restoreWith(t, RestoreOptions{Store: s, Lineage: lineageOfMember(a), Name: LatestName, Revision: midB})
			sameKeys(t, "A at B's revision", keySpace(t, client(t, endpoints(e)), 0), keySpace(t, cliA, midB))
			if re.Lineage != lineageOfMember(a) {
				t.Fatalf("restored from lineage %s, want A's", re.Lineage)
			}
		})
	}
}

// Two streams of one cluster into one destination: the later one claims the lineage, the
// earlier one finds out before its next store, stores nothing more and stays up; the chain
// the two left restores every change.
func TestSecondWriterSupersedesTheFirst(t *testing.T) {
	for kind, open := range stores(t) {
		t.Run(kind, func(t *testing.T) {
			m := startCluster(t, 1)[0]
			eps := endpoints(m)
			s := open(t)
			cli := client(t, eps)
			var superseded atomic.Pointer[SupersededError]
			first := startStreamWith(t, s, eps, 2<<10, func(o *StreamOptions) {
				o.Writer = "stream-a"
				o.Superseded = func(e *SupersededError) { superseded.Store(e) }
			})
			churn(t, cli, 100)
			waitStored(t, s, currentRevision(t, cli))
			var replaced atomic.Pointer[Claim]
			second := startStreamWith(t, s, eps, 2<<10, func(o *StreamOptions) {
				o.Writer = "stream-b"
				o.Claimed = func(_ string, c *Claim) { replaced.Store(c) }
			})
			for i := 0; superseded.Load() == nil; i++ {
				if i == 100 {
					t.Fatal("the first stream did not find itself superseded in 20s of writes")
				}
				churn(t, cli, 5)
				time.Sleep(200 * time.Millisecond)
			}
			if e := superseded.Load(); e.By.Writer != "stream-b" || e.Me.Writer != "stream-a" || !strings.Contains(e.Error(), "stream-b") {
				t.Fatalf("superseded: %v", e)
			}
			if c := replaced.Load(); c == nil || c.Writer != "stream-a" {
				t.Fatalf("the second stream replaced claim %+v, want the first's", c)
			}
			// The superseded stream is up, idle, and stores nothing.
			select {
			case err := <-first.done:
				t.Fatalf("the superseded stream returned: %v", err)
			default:
			}
			churn(t, cli, 100)
			end := currentRevision(t, cli)
			waitStored(t, s, end)
			second.stop()
			first.stop()
			restored, r := restoreTo(t, s, 0)
			if r.Revision != end {
				t.Fatalf("restored revision %d, want %d", r.Revision, end)
			}
			sameKeys(t, "restored", keySpace(t, client(t, endpoints(restored)), 0), keySpace(t, cli, end))
		})
	}
}

// Chunks that overlap (two writers' boundaries) are one chain where their common revisions
// agree, and a restore across them is refused, naming both, where they do not.
func TestOverlappingChunksAgreeOrAreRefused(t *testing.T) {
	m := startCluster(t, 1)[0]
	eps := endpoints(m)
	s, err := NewDir(filepath.Join(t.TempDir(), "claim"))
	if err != nil {
		t.Fatal(err)
	}
	cli := client(t, eps)
	st := startStream(t, s, eps, 1<<10)
	churn(t, cli, 200)
	end := currentRevision(t, cli)
	base, c := waitStored(t, s, end)
	st.stop()
	if len(c) < 3 {
		t.Fatalf("%d chunks: want at least three", len(c))
	}
	ls := onlyLineage(t, s)
	// other stores the revisions of chunks 0 and 1 from the second of chunk 0 on, as a
	// second writer would have, with the events edit leaves.
	other := func(edit func([]*mvccpb.Event)) Delta {
		t.Helper()
		var events []*mvccpb.Event
		var times []time.Time
		for _, d := range c[:2] {
			ch, err := fetchChunk(context.Background(), ls, d)
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range ch.events {
				rev := ev.GetKv().GetModRevision()
				if rev < c[0].First+1 {
					continue
				}
				if len(events) == 0 || events[len(events)-1].GetKv().GetModRevision() != rev {
					times = append(times, ch.times[rev])
				}
				events = append(events, proto.Clone(ev).(*mvccpb.Event))
			}
		}
		edit(events)
		first, last := events[0].GetKv().GetModRevision(), events[len(events)-1].GetKv().GetModRevision()
		return putChunk(t, ls, base, first, last, events, times)
	}
	agreeing := other(func([]*mvccpb.Event) {})
	// The chain takes the overlapping chunk, which reaches as far as chunk 1 and starts first.
	if got, err := chain(mustListDeltas(t, ls), base); err != nil || len(got) < 2 || got[1].Name != agreeing.Name {
		t.Fatalf("chain %v, %v: want chunk 0, then %s", got, err, agreeing.Name)
	}
	restored, r := restoreTo(t, s, 0)
	if r.Revision != end {
		t.Fatalf("restored to %d across agreeing chunks, want %d", r.Revision, end)
	}
	sameKeys(t, "restored across an overlap", keySpace(t, client(t, endpoints(restored)), 0), keySpace(t, cli, end))
	stopMember(restored)

	// A change of chunk 0's last revision, told otherwise, in place of the agreeing chunk
	// (the same name), and chunk 1 gone, so that the chain takes it.
	disagreeing := other(func(evs []*mvccpb.Event) {
		for _, ev := range evs {
			if ev.GetKv().GetModRevision() == c[0].Last {
				ev.Kv.Value = []byte("not what happened")
			}
		}
	})
	if disagreeing.Name != agreeing.Name {
		t.Fatalf("%s does not replace %s", disagreeing.Name, agreeing.Name)
	}
	if err := ls.Delete(context.Background(), c[1].Name); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(t.TempDir(), "data")
	_, err = Restore(context.Background(), RestoreOptions{Store: s, Name: LatestName, WorkDir: t.TempDir(), DataDir: dataDir,
		Member: "etcd-0", PeerURL: "http://127.0.0.1:2380", InitialCluster: "etcd-0=http://127.0.0.1:2380", Token: "t", Etcd: replayEtcd(t)})
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), c[0].Name) || !strings.Contains(err.Error(), disagreeing.Name) ||
		!strings.Contains(err.Error(), fmt.Sprintf("revision %d", c[0].Last)) {
		t.Fatalf("restore across disagreeing chunks: %v", err)
	}
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused replay left a data dir: %v", err)
	}
}

func mustListDeltas(t *testing.T, s Store) []Delta {
	t.Helper()
	ds, err := s.ListDeltas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

// putChunk stores events as a chunk of format v2 after base.
func putChunk(t *testing.T, s Store, base, first, last int64, events []*mvccpb.Event, times []time.Time) Delta {
	t.Helper()
	var buf bytes.Buffer
	sum, err := encodeDelta(&buf, events, times)
	if err != nil {
		t.Fatal(err)
	}
	d := Delta{Name: deltaNameAt(base, first, last, times[0], times[len(times)-1]), Base: base, First: first, Last: last}
	if err := s.Put(context.Background(), d.Name, bytes.NewReader(buf.Bytes()), int64(buf.Len()), Meta{SHA256: sum, Revision: last}); err != nil {
		t.Fatal(err)
	}
	return d
}

// hookStore runs afterList once, after the first listing of snapshots through it or a store
// below it.
type hookStore struct {
	Store
	once      *sync.Once
	afterList func()
}

func (s *hookStore) List(ctx context.Context) ([]Object, error) {
	objs, err := s.Store.List(ctx)
	s.once.Do(s.afterList)
	return objs, err
}

func (s *hookStore) Sub(dir string) Store {
	return &hookStore{Store: s.Store.Sub(dir), once: s.once, afterList: s.afterList}
}

// A backup's retention lists the snapshots; before it lists the chunks, the stream stores a
// newer snapshot of its own and the first chunks after it. Those chunks stay: retention
// deletes only chains that start below the oldest snapshot it keeps.
func TestRetentionKeepsAChainStartedWhileItRuns(t *testing.T) {
	for kind, open := range stores(t) {
		t.Run(kind, func(t *testing.T) {
			m := startCluster(t, 1)[0]
			eps := endpoints(m)
			s := open(t)
			cli := client(t, eps)
			clk := newClock()
			if _, err := Take(context.Background(), takeOptions(t, s, eps, clk.Now)); err != nil {
				t.Fatal(err)
			}
			st := startStream(t, s, eps, 1<<20)
			churn(t, cli, 50)
			waitStored(t, s, currentRevision(t, cli))
			var started int64
			job := takeOptions(t, &hookStore{Store: s, once: &sync.Once{}, afterList: func() {
				// The stream's own snapshot, newer than any the retention listed, and its chain.
				churn(t, cli, 10)
				r, err := Take(context.Background(), takeOptions(t, s, eps, clk.Now))
				if err != nil {
					t.Error(err)
					return
				}
				started = r.Revision
				churn(t, cli, 20)
				waitStored(t, s, currentRevision(t, cli))
			}}, eps, clk.Now)
			job.Retention = Retention{Keep: 1}
			r, err := Take(context.Background(), job)
			if err != nil {
				t.Fatal(err)
			}
			if r.Deleted != 1 || started == 0 {
				t.Fatalf("retention deleted %d snapshots, want the first; the stream's snapshot at %d", r.Deleted, started)
			}
			ls := onlyLineage(t, s)
			kept := 0
			for _, d := range mustListDeltas(t, ls) {
				if d.Base == started {
					kept++
				}
			}
			if kept == 0 {
				t.Fatalf("the chain after the stream's snapshot of revision %d was deleted: %v", started, mustListDeltas(t, ls))
			}
			churn(t, cli, 20)
			end := currentRevision(t, cli)
			waitStored(t, s, end)
			st.stop()
			restored, rr := restoreTo(t, s, 0)
			if rr.Revision != end {
				t.Fatalf("restored revision %d, want %d", rr.Revision, end)
			}
			sameKeys(t, "restored", keySpace(t, client(t, endpoints(restored)), 0), keySpace(t, cli, end))
		})
	}
}

// The stream records when it received each revision; a restore to a time holds the last
// revision stored at or before it, reports that revision's time, and a time outside what is
// stored is refused naming the range that is.
func TestRestoreToATime(t *testing.T) {
	for kind, open := range stores(t) {
		t.Run(kind, func(t *testing.T) {
			m := startCluster(t, 1)[0]
			eps := endpoints(m)
			s := open(t)
			cli := client(t, eps)
			st := startStream(t, s, eps, 1<<20)
			waitSnapshot(t, s, currentRevision(t, cli))
			// Past the second the first snapshot's name keeps, so every write is stored after it.
			time.Sleep(time.Second)
			type write struct {
				rev            int64
				called, answer time.Time
			}
			var writes []write
			for i := range 6 {
				called := time.Now()
				resp, err := cli.Put(context.Background(), fmt.Sprintf("at-%d", i), "v")
				if err != nil {
					t.Fatal(err)
				}
				writes = append(writes, write{resp.Header.Revision, called, time.Now()})
				time.Sleep(40 * time.Millisecond)
			}
			end := currentRevision(t, cli)
			_, c := waitStored(t, s, end)
			st.stop()
			ls := onlyLineage(t, s)
			at := map[int64]time.Time{}
			for _, d := range c {
				ch, err := fetchChunk(context.Background(), ls, d)
				if err != nil {
					t.Fatal(err)
				}
				for rev, tm := range ch.times {
					at[rev] = tm
				}
			}
			for _, w := range writes {
				// Received after the write was sent, and soon after its answer.
				if tm := at[w.rev]; tm.Before(w.called.Truncate(time.Millisecond)) || tm.After(w.answer.Add(time.Second)) {
					t.Fatalf("revision %d received at %s, written %s to %s", w.rev, tm, w.called, w.answer)
				}
			}
			between := at[writes[2].rev].Add(at[writes[3].rev].Sub(at[writes[2].rev]) / 2)
			for _, tc := range []struct {
				at   time.Time
				want int64
			}{{between, writes[2].rev}, {at[writes[4].rev], writes[4].rev}, {at[writes[5].rev], writes[5].rev}} {
				restored, r := restoreWith(t, RestoreOptions{Store: s, Name: LatestName, Time: tc.at})
				if r.Revision != tc.want || !r.Time.Equal(at[tc.want]) {
					t.Fatalf("restore to %s: revision %d at %s, want %d at %s", tc.at, r.Revision, r.Time, tc.want, at[tc.want])
				}
				sameKeys(t, "restored to a time", keySpace(t, client(t, endpoints(restored)), 0), keySpace(t, cli, tc.want))
				stopMember(restored)
			}
			objs, err := ls.List(context.Background())
			if err != nil || len(objs) != 1 {
				t.Fatalf("snapshots %v, %v", objs, err)
			}
			// A snapshot taken later in the second a time names holds writes made after that
			// time: its name keeps only the second, so it is not the state at the time.
			var late Object
			for range 3 {
				time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 50*time.Millisecond)))
				second := time.Now().Truncate(time.Second)
				if _, err := cli.Put(context.Background(), "after-the-time", "v"); err != nil {
					t.Fatal(err)
				}
				if _, err := Take(context.Background(), takeOptions(t, s, eps, time.Now)); err != nil {
					t.Fatal(err)
				}
				if objs, err := ls.List(context.Background()); err != nil || len(objs) != 2 {
					t.Fatalf("snapshots %v, %v: want the stream's and the one taken", objs, err)
				} else if newestFirst(objs); objs[0].Time.Equal(second) {
					late = objs[0]
					break
				} else if err := ls.Delete(context.Background(), objs[0].Name); err != nil {
					t.Fatal(err)
				}
			}
			if late.Name == "" {
				t.Fatal("no snapshot was taken within the second it started in, three times")
			}
			restored, r := restoreWith(t, RestoreOptions{Store: s, Name: LatestName, Time: late.Time})
			if r.Revision != writes[5].rev {
				t.Fatalf("restore to %s: revision %d, the state then was revision %d (snapshot %s holds a later write)", late.Time, r.Revision, writes[5].rev, late.Name)
			}
			stopMember(restored)
			if err := ls.Delete(context.Background(), late.Name); err != nil {
				t.Fatal(err)
			}
			objs, err = ls.List(context.Background())
			if err != nil || len(objs) != 1 {
				t.Fatalf("snapshots %v, %v", objs, err)
			}
			for _, outside := range []time.Time{objs[0].Time, at[writes[5].rev].Add(time.Millisecond)} {
				_, err := Restore(context.Background(), RestoreOptions{Store: s, Name: LatestName, Time: outside, WorkDir: t.TempDir(), DataDir: filepath.Join(t.TempDir(), "data"),
					Member: "etcd-0", PeerURL: "http://127.0.0.1:2380", InitialCluster: "etcd-0=http://127.0.0.1:2380", Token: "t"})
				rng := fmt.Sprintf("%s (revision %d) to %s (revision %d)", storedBy(objs[0]).Format(time.RFC3339Nano), objs[0].Revision, at[writes[5].rev].Format(time.RFC3339Nano), writes[5].rev)
				if !errors.Is(err, ErrTimeOutside) || !strings.Contains(err.Error(), rng) {
					t.Fatalf("restore to %s, outside what is stored: %v; want the range %q named", outside, err, rng)
				}
			}
		})
	}
}

// A destination an older release wrote, snapshots and chunks of format v1 directly below the
// prefix, restores as the legacy lineage; nothing new is written there.
func TestLegacyDestinationRestores(t *testing.T) {
	m := startCluster(t, 1)[0]
	eps := endpoints(m)
	s, err := NewDir(filepath.Join(t.TempDir(), "claim"))
	if err != nil {
		t.Fatal(err)
	}
	cli := client(t, eps)
	st := startStream(t, s, eps, 2<<10)
	churn(t, cli, 100)
	end := currentRevision(t, cli)
	base, c := waitStored(t, s, end)
	st.stop()
	ls := onlyLineage(t, s)
	// The lineage copied to the root as the older release stored it.
	objs, err := ls.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	copyObject(t, ls, s, objs[0].Name, objs[0].Name)
	for _, d := range c {
		ch, err := fetchChunk(context.Background(), ls, d)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		buf.WriteString(deltaMagic)
		for _, ev := range ch.events {
			b, err := proto.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			buf.Write(uvarint(len(b)))
			buf.Write(b)
		}
		if err := s.Put(context.Background(), DeltaName(base, d.First, d.Last), bytes.NewReader(buf.Bytes()), int64(buf.Len()), Meta{Revision: d.Last}); err != nil {
			t.Fatal(err)
		}
	}
	mid := (base + end) / 2
	restored, r := restoreWith(t, RestoreOptions{Store: s, Lineage: LegacyLineage, Name: LatestName, Revision: mid})
	if r.Revision != mid || r.Lineage != LegacyLineage || !r.Time.IsZero() || !strings.HasPrefix(r.Object, s.Where(objs[0].Name)) {
		t.Fatalf("restored %+v from the legacy lineage, want revision %d of %s and no time", r, mid, s.Where(objs[0].Name))
	}
	sameKeys(t, "legacy", keySpace(t, client(t, endpoints(restored)), 0), keySpace(t, cli, mid))
	ls2, err := ListLineages(context.Background(), s)
	if err != nil || len(ls2) != 2 || ls2[0].ID != LegacyLineage || ls2[0].Last.Revision != end || ls2[0].Manifest != nil {
		t.Fatalf("lineages %+v, %v: want the legacy one, reaching %d, then the stream's", ls2, err, end)
	}
}

func uvarint(n int) []byte {
	var b []byte
	for n >= 0x80 {
		b = append(b, byte(n)|0x80)
		n >>= 7
	}
	return append(b, byte(n))
}

func copyObject(t *testing.T, from, to Store, name, as string) {
	t.Helper()
	var buf bytes.Buffer
	meta, err := from.Fetch(context.Background(), name, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if err := to.Put(context.Background(), as, bytes.NewReader(buf.Bytes()), int64(buf.Len()), meta); err != nil {
		t.Fatal(err)
	}
}

// Members that answer for another cluster than the one named are not read, and a stream
// behind such endpoints stores nothing: two clusters under one name never share a lineage.
func TestAnotherClusterIsNotWrittenIntoALineage(t *testing.T) {
	m := startCluster(t, 1)[0]
	eps := endpoints(m)
	s, err := NewDir(filepath.Join(t.TempDir(), "claim"))
	if err != nil {
		t.Fatal(err)
	}
	o := takeOptions(t, s, eps, newClock().Now)
	o.ClusterID = "abc"
	if _, err := Take(context.Background(), o); err == nil || !strings.Contains(err.Error(), "answers for etcd cluster "+lineageOfMember(m)) {
		t.Fatalf("take from another cluster: %v", err)
	}
	st := startStreamWith(t, s, eps, 1<<20, func(o *StreamOptions) { o.Take.ClusterID = "abc" })
	for i := 0; !hasErr(st.failures(), "this cluster is abc"); i++ {
		if i == 100 {
			t.Fatalf("the stream did not refuse another cluster in 10s: %v", st.failures())
		}
		time.Sleep(100 * time.Millisecond)
	}
	st.stop()
	if ids, err := s.Dirs(context.Background(), lineageDir); err != nil || len(ids) != 0 {
		t.Fatalf("lineages %v, %v: want none", ids, err)
	}
}
