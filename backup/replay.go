package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// replayTxnTimeout bounds one replayed revision's transaction.
const replayTxnTimeout = time.Minute

// replay applies the chunks' events after from up to p.target to the data dir restored from
// the snapshot. The pod's own etcd (o.Etcd) runs on it as a server of its own on loopback
// ports (replayserver.go), with every lease of the snapshot pinned so that none expires while
// it runs (replaydb.go); each original revision becomes one transaction through a client, so
// that every key keeps the revisions and version it had, and a key put on a lease the
// snapshot holds keeps that lease. The server must start at revision from, each revision must
// come out at its original number, and the stopped data dir must end at the target with the
// snapshot's leases; anything else is refused with an error wrapping errReplayDiverged.
// A key put on a lease granted after the snapshot comes back without one: the changes record a
// key's lease, not the lease's grant.
func replay(ctx context.Context, o RestoreOptions, from int64, p pointInTime) error {
	leases, err := pinLeases(o.DataDir)
	if err != nil {
		return err
	}
	srv, err := startReplayServer(ctx, o.Etcd, o.DataDir, o.Member)
	if err != nil {
		return err
	}
	if err := applyChanges(ctx, srv.cli, o, leases.ids(), from, p); err != nil {
		srv.kill()
		return err
	}
	if err := srv.stop(); err != nil {
		return err
	}
	return leases.unpin(o.DataDir, p.target)
}

// applyChanges replays revisions from+1 to p.target, each checked, and checks that the server
// is at the target once they are applied.
func applyChanges(ctx context.Context, cli *clientv3.Client, o RestoreOptions, leases map[int64]bool, from int64, p pointInTime) error {
	if rev, err := servedRevision(ctx, cli); err != nil {
		return fmt.Errorf("replay: %w", err)
	} else if rev != from {
		return fmt.Errorf("%w: the restored data dir serves revision %d, the snapshot holds %d", errReplayDiverged, rev, from)
	}
	next := from + 1
	var prev *Delta
	var prevEvents []*mvccpb.Event
	for _, d := range p.deltas {
		var buf bytes.Buffer
		meta, err := o.Store.Fetch(ctx, d.Name, &buf)
		if err != nil {
			return err
		}
		events, err := decodeDelta(buf.Bytes(), d, meta.SHA256)
		if err != nil {
			return fmt.Errorf("changes %s refused: %w", o.Store.Where(d.Name), err)
		}
		// Chunks of two writers may overlap (one writer per lineage,
		// docs/backup-continuous.md): the revisions they share must be the same changes.
		if err := agree(o.Store, prev, prevEvents, d, events); err != nil {
			return err
		}
		prev, prevEvents = &d, events
		for i := 0; i < len(events) && next <= p.target; {
			rev := events[i].GetKv().GetModRevision()
			j := i
			for j < len(events) && events[j].GetKv().GetModRevision() == rev {
				j++
			}
			if rev >= next {
				if rev != next {
					return fmt.Errorf("%w: revision %d follows %d in %s", ErrGap, rev, next-1, o.Store.Where(d.Name))
				}
				if err := applyRevision(ctx, cli, leases, events[i:j]); err != nil {
					return fmt.Errorf("replay %s: %w", o.Store.Where(d.Name), err)
				}
				if o.replayed != nil {
					o.replayed(rev)
				}
				next++
			}
			i = j
		}
	}
	if next <= p.target {
		return fmt.Errorf("%w: the stored changes end at revision %d, before %d", ErrGap, next-1, p.target)
	}
	if rev, err := servedRevision(ctx, cli); err != nil {
		return fmt.Errorf("replay: %w", err)
	} else if rev != p.target {
		return fmt.Errorf("%w: after the last stored change the replay is at revision %d, not %d", errReplayDiverged, rev, p.target)
	}
	return nil
}

// errReplayDiverged: the replay came out other than the stored changes say (a revision at
// another number, a lease gone).
var errReplayDiverged = errors.New("the replay diverged from the stored changes")

// applyRevision applies the events of one original revision as one transaction, and checks
// that it comes out at that revision. A put keeps its lease when the replay server holds it.
func applyRevision(ctx context.Context, cli *clientv3.Client, leases map[int64]bool, events []*mvccpb.Event) error {
	rev := events[0].GetKv().GetModRevision()
	ops := make([]clientv3.Op, 0, len(events))
	for _, ev := range events {
		kv := ev.GetKv()
		switch ev.GetType() {
		case mvccpb.Event_PUT:
			var opts []clientv3.OpOption
			if leases[kv.GetLease()] {
				opts = append(opts, clientv3.WithLease(clientv3.LeaseID(kv.GetLease())))
			}
			ops = append(ops, clientv3.OpPut(string(kv.GetKey()), string(kv.GetValue()), opts...))
		case mvccpb.Event_DELETE:
			ops = append(ops, clientv3.OpDelete(string(kv.GetKey())))
		}
	}
	ctx, cancel := context.WithTimeout(ctx, replayTxnTimeout)
	defer cancel()
	resp, err := cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("revision %d: %w", rev, err)
	}
	if got := resp.Header.GetRevision(); got != rev {
		return fmt.Errorf("%w: revision %d applied as %d", errReplayDiverged, rev, got)
	}
	return nil
}

// servedRevision is the replay server's revision, read linearizably.
func servedRevision(ctx context.Context, cli *clientv3.Client) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, replayTxnTimeout)
	defer cancel()
	resp, err := cli.Get(ctx, "\x00", clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err != nil {
		return 0, err
	}
	return resp.Header.GetRevision(), nil
}
