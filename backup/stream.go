package backup

import (
	"cmp"
	"context"
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
	// Take takes a full snapshot when a chain must start afresh: none stored yet, its base
	// compacted away, or a gap in what is stored. Its Store is the stream's.
	Take TakeOptions
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
	// Stored is told of each chunk stored, Watched of the last revision the watch sent, and
	// Failed of each failure; any may be nil.
	Stored  func(Delta)
	Watched func(revision int64)
	Failed  func(error)
	// Resumed is told where each chain's stream starts: every change up to stored is in the
	// destination. CaughtUp is told, at most every Interval/4, that nothing is held unstored
	// and the watch is up and has sent every change up to the cluster's revision, stored.
	// Either may be nil.
	Resumed  func(stored int64)
	CaughtUp func(revision int64)
}

// flushOnStop bounds storing the held changes once the stream is stopped.
const flushOnStop = 10 * time.Second

// errNewerSnapshot ends one chain's stream: a newer full snapshot was stored, and the chain
// after it starts.
var errNewerSnapshot = errors.New("a newer snapshot was stored")

// Stream stores every change of the cluster's key space, after the newest full snapshot, as
// a chain of chunks in the destination, until ctx ends. It keeps nothing locally: it resumes
// from the last chunk stored, so a restarted stream (or another one after it) continues the
// chain without a gap or a duplicate. When the changes it needs are compacted away, or the
// stored chain has a gap, it takes a full snapshot and starts a new chain; it never skips a
// revision.
func Stream(ctx context.Context, o StreamOptions) error {
	store := o.Take.Store
	for {
		err := streamChain(ctx, o)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errNewerSnapshot) {
			continue
		}
		// No snapshot yet is how a first stream starts, not a failure.
		if o.Failed != nil && !errors.Is(err, ErrNotFound) {
			o.Failed(err)
		}
		if errors.Is(err, membership.ErrCompacted) || errors.Is(err, ErrGap) || errors.Is(err, ErrNotFound) {
			if terr := takeBounded(ctx, o); terr != nil {
				err = fmt.Errorf("a new chain after %v needs a snapshot in %s: %w", err, store.Where(""), terr)
				if o.Failed != nil {
					o.Failed(err)
				}
			} else {
				continue
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(cmp.Or(o.Retry, time.Second)):
		}
	}
}

func takeBounded(ctx context.Context, o StreamOptions) error {
	if o.TakeTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.TakeTimeout)
		defer cancel()
	}
	_, err := Take(ctx, o.Take)
	return err
}

// resumePoint is the chain the stream continues: the newest full snapshot's revision, and
// the revision after the last chunk stored after it.
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
// fails, a store fails or a newer snapshot starts another chain. Events held and not yet
// stored are stored before it returns, when they can be.
func streamChain(ctx context.Context, o StreamOptions) error {
	base, next, err := resumePoint(ctx, o.Take.Store)
	if err != nil {
		return err
	}
	op, err := membership.Dial(o.Endpoints, o.TLS)
	if err != nil {
		return err
	}
	defer op.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if o.Resumed != nil {
		o.Resumed(next - 1)
	}
	c := &chunker{o: o, base: base, last: next - 1}
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
			if err := c.add(ctx, ch.Events); err != nil {
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
				if newest, err := Newest(ctx, o.Take.Store); err == nil && newest.Revision > base {
					return errNewerSnapshot
				}
			}
		}
	}
}

// chunker gathers the events of whole revisions into chunks of bounded size and age.
type chunker struct {
	o          StreamOptions
	base, last int64
	events     []*mvccpb.Event
	bytes      int64
	since      time.Time
}

// add appends events, storing the chunk first whenever the next revision would take it past
// the size bound. Every revision must follow the one before: a missing one is a gap, refused.
func (c *chunker) add(ctx context.Context, events []*mvccpb.Event) error {
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

// flush stores the held events as one chunk, atomically, with its checksum.
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
	sum, err := encodeDelta(f, c.events)
	if err != nil {
		return err
	}
	info, err := f.Stat()
	if err != nil {
		return err
	}
	name := DeltaName(c.base, first, last)
	if err := c.o.Take.Store.Put(ctx, name, f, info.Size(), Meta{SHA256: sum, Revision: last}); err != nil {
		return err
	}
	c.events, c.bytes = nil, 0
	if c.o.Stored != nil {
		c.o.Stored(Delta{Name: name, Base: c.base, First: first, Last: last, Size: info.Size()})
	}
	return nil
}
