package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

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
	var prev *Delta
	var prevEvents []*mvccpb.Event
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
		if err := agree(s, prev, prevEvents, d, events); err != nil {
			return err
		}
		prev, prevEvents = &d, events
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
