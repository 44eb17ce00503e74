package backup

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"

	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/membership"
)

// StreamOptions say what the continuous backup watches and where its chunks go.
type StreamOptions struct {
	// Endpoints are the members' client URLs; the watch moves between them by itself.
	Endpoints []string
	TLS       *etcdstate.TLS
	// Login is the etcd user it reads as while auth is on.
	Login membership.Login
	// Take takes a full snapshot when a chain must start afresh: none stored yet, its base
	// compacted away, or a gap in what is stored. Its Store is the stream's destination, its
	// ClusterID (when set) the cluster the stream must find behind the endpoints, and its
	// Origin what the lineage's manifest says.
	Take TakeOptions
	// Writer names this stream in its lineage's writer claim, for people: its pod.
	Writer string
	// TakeTimeout bounds one full snapshot; 0: no bound but ctx.
	TakeTimeout time.Duration
	// Interval bounds how long a change waits before it is stored: the recovery point.
	Interval time.Duration
	// MaxChunkBytes bounds a chunk's events; a chunk holds whole revisions, so one revision
	// larger than the bound is a chunk of its own.
	MaxChunkBytes int64
	// Retry is the pause after a failure (a lost leader, the storage unreachable) before the
	// stream resumes from what the destination holds; 0: a second.
	Retry time.Duration
	// Stored is told of each chunk stored (and where it is, for people), Watched of the last
	// revision the watch sent, and Failed of each failure; any may be nil.
	Stored  func(d Delta, where string)
	Watched func(revision int64)
	Failed  func(error)
	// Resumed is told where each chain's stream starts: every change up to stored is in the
	// destination. CaughtUp is told, at most every Interval/4, that nothing is held unstored
	// and the watch is up and has sent every change up to the cluster's revision, stored.
	// Either may be nil.
	Resumed  func(stored int64)
	CaughtUp func(revision int64)
	// Claimed is told the lineage the stream claimed and the claim it replaced (nil when
	// none); Superseded, once, that another writer claimed the lineage after it: the stream
	// then stores nothing more and stays up, idle, until ctx ends. Either may be nil.
	Claimed    func(lineage string, replaced *Claim)
	Superseded func(*SupersededError)
}

// flushOnStop bounds storing the held changes once the stream is stopped.
const flushOnStop = 10 * time.Second

// errNewerSnapshot ends one chain's stream: a newer full snapshot was stored, and the chain
// after it starts.
var errNewerSnapshot = errors.New("a newer snapshot was stored")

// Stream stores every change of the cluster's key space, after the newest full snapshot of
// its lineage, as a chain of chunks in the destination, until ctx ends. The lineage is the
// cluster ID etcd answers with; the stream claims it as its one writer, and checks the claim
// before every store. It keeps nothing locally: it resumes from the last chunk stored, so a
// restarted stream (or another one after it) continues the chain without a gap. When the
// changes it needs are compacted away, or the stored chain has a gap, it takes a full
// snapshot and starts a new chain; it never skips a revision. Superseded by another writer,
// it stores nothing more and returns only when ctx ends: a stream that exited would be
// started again, claim again, and take the lineage back and forth.
func Stream(ctx context.Context, o StreamOptions) error {
	w := &streamWriter{o: o, me: Claim{Writer: cmp.Or(o.Writer, "stream-backup"), ID: randomID(), Since: o.Take.Now().UTC()}}
	for {
		err := w.streamChain(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errNewerSnapshot) {
			continue
		}
		// No snapshot yet is how a first stream starts, not a failure.
		if !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrSuperseded) && o.Failed != nil {
			o.Failed(err)
		}
		if errors.Is(err, membership.ErrCompacted) || errors.Is(err, ErrGap) || errors.Is(err, ErrNotFound) {
			terr := w.takeBounded(ctx)
			if terr == nil {
				continue
			}
			err = fmt.Errorf("a new chain after %v needs a snapshot in %s: %w", err, w.where(), terr)
			if !errors.Is(err, ErrSuperseded) && o.Failed != nil {
				o.Failed(err)
			}
		}
		if sup := (*SupersededError)(nil); errors.As(err, &sup) {
			if o.Superseded != nil {
				o.Superseded(sup)
			}
			<-ctx.Done()
			return ctx.Err()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(cmp.Or(o.Retry, time.Second)):
		}
	}
}

// streamWriter is one stream's writing: the lineage it claimed and its claim.
type streamWriter struct {
	o  StreamOptions
	me Claim
	// lineage and ls are the lineage claimed, "" and nil before the first.
	lineage string
	ls      Store
}

// where names the lineage claimed, or the destination before one is.
func (w *streamWriter) where() string {
	if w.ls == nil {
		return w.o.Take.Store.Where("")
	}
	return w.ls.Where("")
}

func randomID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// errForeignCluster: the endpoints answer for another cluster than the one the stream is for.
var errForeignCluster = errors.New("another etcd cluster answers")

// open finds the lineage of the cluster behind the endpoints and claims it the first time,
// writing its manifest when it starts; after that it checks the claim.
func (w *streamWriter) open(ctx context.Context, op *membership.Operator) (uint64, error) {
	id, err := op.ClusterID(ctx)
	if err != nil {
		return 0, err
	}
	lineage := LineageOf(id)
	if want := w.o.Take.ClusterID; want != "" && lineage != want {
		return 0, fmt.Errorf("%w: the endpoints answer for etcd cluster %s, but this cluster is %s: nothing is stored", errForeignCluster, lineage, want)
	}
	if lineage == w.lineage {
		return id, checkClaim(ctx, w.ls, w.me)
	}
	ls := LineageStore(w.o.Take.Store, lineage)
	if err := ensureManifest(ctx, ls, w.o.Take.manifest(lineage, w.o.Take.Now())); err != nil {
		return 0, err
	}
	replaced, err := claim(ctx, ls, w.me)
	if err != nil {
		return 0, err
	}
	w.lineage, w.ls = lineage, ls
	if w.o.Claimed != nil {
		w.o.Claimed(lineage, replaced)
	}
	return id, nil
}

// beforeStore checks, before anything is stored into ls, that it is the claimed lineage and
// that the claim is still this stream's.
func (w *streamWriter) beforeStore(ctx context.Context, ls Store) error {
	if ls.Where("") != w.ls.Where("") {
		return fmt.Errorf("%w: a snapshot for %s, but this stream writes %s", errForeignCluster, ls.Where(""), w.ls.Where(""))
	}
	return checkClaim(ctx, ls, w.me)
}

func (w *streamWriter) takeBounded(ctx context.Context) error {
	if w.ls == nil {
		return errors.New("no lineage claimed yet")
	}
	if w.o.TakeTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, w.o.TakeTimeout)
		defer cancel()
	}
	o := w.o.Take
	o.ClusterID, o.BeforeStore = w.lineage, w.beforeStore
	_, err := Take(ctx, o)
	return err
}

// resumePoint is the chain the stream continues: the newest full snapshot's revision, and
// the revision after the last chunk stored after it (the furthest its chunks reach).
func resumePoint(ctx context.Context, s Store) (base, next int64, err error) {
	newest, err := Newest(ctx, s)
	if err != nil {
		return 0, 0, err
	}
	deltas, err := s.ListDeltas(ctx)
	if err != nil {
		return 0, 0, err
	}
	c, err := chain(deltas, newest.Revision)
	if err != nil {
		return 0, 0, err
	}
	next = newest.Revision + 1
	if len(c) > 0 {
		next = c[len(c)-1].Last + 1
	}
	return newest.Revision, next, nil
}

// streamChain watches from the chain's resume point and stores chunks until the watch
// fails, a store fails, the claim is lost or a newer snapshot starts another chain. Events
// held and not yet stored are stored before it returns, when they can be.
func (w *streamWriter) streamChain(ctx context.Context) error {
	o := w.o
	op, err := membership.Dial(o.Endpoints, o.TLS, o.Login)
	if err != nil {
		return err
	}
	defer op.Close()
	id, err := w.open(ctx, op)
	if err != nil {
		return err
	}
	base, next, err := resumePoint(ctx, w.ls)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if o.Resumed != nil {
		o.Resumed(next - 1)
	}
	c := &chunker{o: o, w: w, base: base, last: next - 1}
	changes := op.WatchAll(ctx, next)
	// current is the cluster's revision as the watch last said, once it answered (its first
	// answer comes when it is set up): caught up is never claimed on a watch not yet up.
	var current int64
	answered := false
	tick := time.NewTicker(max(o.Interval/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case ch, ok := <-changes:
			if !ok {
				// Stopped: what is held is stored if it can be in a short while, else the
				// next stream reads it again.
				stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushOnStop)
				defer cancel()
				return errors.Join(ctx.Err(), c.flush(stop))
			}
			if ch.Err != nil {
				return errors.Join(ch.Err, c.flush(ctx))
			}
			if ch.ClusterID != 0 && ch.ClusterID != id {
				// Nothing of another cluster goes into this lineage, not even what is held.
				return fmt.Errorf("%w: the watch answers for etcd cluster %x, the lineage is %s", errForeignCluster, ch.ClusterID, w.lineage)
			}
			if err := c.add(ctx, ch.Events, o.Take.Now()); err != nil {
				return err
			}
			answered, current = true, max(current, ch.Revision)
			if o.Watched != nil && len(ch.Events) > 0 {
				o.Watched(c.last)
			}
		case <-tick.C:
			if o.CaughtUp != nil && answered && len(c.events) == 0 && c.last >= current {
				o.CaughtUp(c.last)
			}
			if c.due(o.Take.Now()) {
				if err := c.flush(ctx); err != nil {
					return err
				}
				// Once a chunk is stored is a moment to look for a newer snapshot: at most
				// one listing per interval, and only while changes come.
				if newest, err := Newest(ctx, w.ls); err == nil && newest.Revision > base {
					return errNewerSnapshot
				}
			}
		}
	}
}

// chunker gathers the events of whole revisions into chunks of bounded size and age.
type chunker struct {
	o          StreamOptions
	w          *streamWriter
	base, last int64
	events     []*mvccpb.Event
	// times holds when each revision held was received, one per revision.
	times []time.Time
	bytes int64
	since time.Time
}

// add appends events received at at, storing the chunk first whenever the next revision
// would take it past the size bound. Every revision must follow the one before: a missing
// one is a gap, refused.
func (c *chunker) add(ctx context.Context, events []*mvccpb.Event, at time.Time) error {
	// Chunks keep milliseconds: what a name says of a time is then exact.
	at = at.UTC().Truncate(time.Millisecond)
	for i := 0; i < len(events); {
		rev := events[i].GetKv().GetModRevision()
		if rev != c.last+1 {
			return fmt.Errorf("%w: the watch sent revision %d after %d", ErrGap, rev, c.last)
		}
		j, size := i, int64(0)
		for ; j < len(events) && events[j].GetKv().GetModRevision() == rev; j++ {
			size += int64(proto.Size(events[j]))
		}
		if len(c.events) > 0 && c.bytes+size > c.o.MaxChunkBytes {
			if err := c.flush(ctx); err != nil {
				return err
			}
		}
		if len(c.events) == 0 {
			c.since = c.o.Take.Now()
		}
		c.events = append(c.events, events[i:j]...)
		c.times = append(c.times, at)
		c.bytes += size
		c.last = rev
		i = j
	}
	return nil
}

// due reports whether the oldest held change has waited the interval.
func (c *chunker) due(now time.Time) bool {
	return len(c.events) > 0 && now.Sub(c.since) >= c.o.Interval
}

// flush stores the held events as one chunk, atomically, with its checksum, once the claim
// says this stream is still the lineage's writer.
func (c *chunker) flush(ctx context.Context) error {
	if len(c.events) == 0 {
		return nil
	}
	first, last := c.events[0].GetKv().GetModRevision(), c.last
	f, err := os.CreateTemp(c.o.Take.WorkDir, "delta-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	sum, err := encodeDelta(f, c.events, c.times)
	if err != nil {
		return err
	}
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if err := c.w.beforeStore(ctx, c.w.ls); err != nil {
		return err
	}
	d := Delta{Name: deltaNameAt(c.base, first, last, c.times[0], c.times[len(c.times)-1]), Base: c.base, First: first, Last: last,
		FirstTime: c.times[0], LastTime: c.times[len(c.times)-1], Size: info.Size()}
	if err := c.w.ls.Put(ctx, d.Name, f, info.Size(), Meta{SHA256: sum, Revision: last}); err != nil {
		return err
	}
	c.events, c.times, c.bytes = nil, nil, 0
	if c.o.Stored != nil {
		c.o.Stored(d, c.w.ls.Where(d.Name))
	}
	return nil
}
