package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// pointInTime is what a restore to a revision applies: the newest snapshot at or before the
// target, and the chunks after it that reach the target.
type pointInTime struct {
	snapshot Object
	deltas   []Delta
	target   int64
}

// planPointInTime chooses the snapshot and chunks that restore target, or, for target 0, the
// newest change stored. A target the chunks do not reach without a gap is refused with an
// error wrapping ErrGap that names where each candidate chain stops.
func planPointInTime(ctx context.Context, s Store, target int64) (pointInTime, error) {
	objs, err := s.List(ctx)
	if err != nil {
		return pointInTime{}, err
	}
	if len(objs) == 0 {
		return pointInTime{}, fmt.Errorf("%w: no snapshot in %s", ErrNotFound, s.Where(""))
	}
	deltas, err := s.ListDeltas(ctx)
	if err != nil {
		return pointInTime{}, err
	}
	// Newest snapshot first by revision; among equal revisions, the newest by time.
	newestFirst(objs)
	slices.SortStableFunc(objs, func(a, b Object) int { return int(b.Revision - a.Revision) })
	if target == 0 {
		for _, o := range objs {
			target = max(target, o.Revision, wholeEnd(deltas, o.Revision))
		}
	}
	var stops []string
	for _, o := range objs {
		if o.Revision > target {
			continue
		}
		c, _ := chain(deltas, o.Revision) // a gap only bounds what this snapshot reaches
		end := o.Revision
		if len(c) > 0 {
			end = c[len(c)-1].Last
		}
		if end >= target {
			var use []Delta
			for _, d := range c {
				if d.First <= target {
					use = append(use, d)
				}
			}
			return pointInTime{snapshot: o, deltas: use, target: target}, nil
		}
		stops = append(stops, fmt.Sprintf("after snapshot %s (revision %d) the stored changes stop at revision %d", o.Name, o.Revision, end))
	}
	if len(stops) == 0 {
		return pointInTime{}, fmt.Errorf("%w: no snapshot at or before revision %d in %s", ErrNotFound, target, s.Where(""))
	}
	return pointInTime{}, fmt.Errorf("%w: revision %d cannot be reached: %s", ErrGap, target, stops[0])
}

// wholeEnd is the last revision the whole part of the chain after base reaches; base when
// there is none.
func wholeEnd(deltas []Delta, base int64) int64 {
	c, _ := chain(deltas, base)
	if len(c) == 0 {
		return base
	}
	return c[len(c)-1].Last
}

// replayTimeout bounds the replay member's start and its election.
const replayTimeout = time.Minute

// replay applies the chunks' events after from up to target to the data dir restored from the
// snapshot: an etcd member of its own runs on it, on loopback ports, and each original
// revision becomes one transaction, so that every key keeps the revision it had. A revision
// that comes out different (the data dir is not at from, or a chunk is not what it claims) is
// refused. Leases are not carried over: the changes record a key's lease, not the lease's
// grant, so a key put under a lease after the snapshot comes back without one.
func replay(ctx context.Context, s Store, dataDir, member string, from int64, p pointInTime) error {
	cfg := embed.NewConfig()
	cfg.Name = member
	cfg.Dir = dataDir
	local := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenPeerUrls, cfg.ListenClientUrls = []url.URL{local}, []url.URL{local}
	cfg.AdvertiseClientUrls = []url.URL{local}
	cfg.ListenMetricsUrls = nil
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("replay: start etcd on the restored data dir: %w", err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return fmt.Errorf("replay: etcd on the restored data dir: %w", err)
	case <-time.After(replayTimeout):
		return fmt.Errorf("replay: etcd on the restored data dir did not serve within %s", replayTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
	next := from + 1
	for _, d := range p.deltas {
		var buf bytes.Buffer
		meta, err := s.Fetch(ctx, d.Name, &buf)
		if err != nil {
			return err
		}
		events, err := decodeDelta(buf.Bytes(), d, meta.SHA256)
		if err != nil {
			return fmt.Errorf("changes %s refused: %w", s.Where(d.Name), err)
		}
		for i := 0; i < len(events); {
			rev := events[i].GetKv().GetModRevision()
			j := i
			for j < len(events) && events[j].GetKv().GetModRevision() == rev {
				j++
			}
			if rev > p.target {
				return nil
			}
			if rev >= next {
				if rev != next {
					return fmt.Errorf("%w: revision %d follows %d in %s", ErrGap, rev, next-1, s.Where(d.Name))
				}
				if err := applyRevision(ctx, e, events[i:j]); err != nil {
					return fmt.Errorf("replay %s: %w", s.Where(d.Name), err)
				}
				next++
			}
			i = j
		}
	}
	if next <= p.target {
		return fmt.Errorf("%w: the stored changes end at revision %d, before %d", ErrGap, next-1, p.target)
	}
	return nil
}

// errRevisionMismatch: a replayed revision came out at another number.
var errRevisionMismatch = errors.New("replayed revision differs")

// applyRevision applies the events of one original revision as one transaction.
func applyRevision(ctx context.Context, e *embed.Etcd, events []*mvccpb.Event) error {
	rev := events[0].GetKv().GetModRevision()
	ops := make([]*pb.RequestOp, 0, len(events))
	for _, ev := range events {
		kv := ev.GetKv()
		switch ev.GetType() {
		case mvccpb.Event_PUT:
			ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: kv.GetKey(), Value: kv.GetValue()}}})
		case mvccpb.Event_DELETE:
			ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: kv.GetKey()}}})
		}
	}
	ctx, cancel := context.WithTimeout(ctx, replayTimeout)
	defer cancel()
	resp, err := e.Server.Txn(ctx, &pb.TxnRequest{Success: ops})
	if err != nil {
		return fmt.Errorf("revision %d: %w", rev, err)
	}
	if got := resp.GetHeader().GetRevision(); got != rev {
		return fmt.Errorf("%w: revision %d applied as %d", errRevisionMismatch, rev, got)
	}
	return nil
}
