package membership

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrCompacted: the revision a watch was to start from was compacted away, so the changes
// since it can no longer be read.
var ErrCompacted = errors.New("revision compacted")

// Changes is one answer of a watch of the whole key space: the events of whole revisions in
// revision order, the cluster's revision when it was sent and the cluster it answers for. The
// last answer of a watch that ends carries its error instead.
type Changes struct {
	Events    []*mvccpb.Event
	Revision  int64
	ClusterID uint64
	Err       error
}

// WatchAll watches every key from revision from on, until ctx ends or the watch fails. It
// requires a leader: a member cut off from the others ends the watch with an error rather
// than wait silently, and the client reconnects to another member on a lost connection by
// itself. Progress notifications come as answers without events, and so does the first answer,
// once the watch is set up, with the cluster's revision. The caller ends ctx when it stops
// reading.
func (o *Operator) WatchAll(ctx context.Context, from int64) <-chan Changes {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	wch := o.cli.Watch(ctx, "", clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithProgressNotify(), clientv3.WithCreatedNotify())
	out := make(chan Changes)
	go func() {
		defer close(out)
		defer cancel()
		for resp := range wch {
			c := Changes{Events: resp.Events, Revision: resp.Header.Revision, ClusterID: resp.Header.ClusterId}
			if err := resp.Err(); err != nil {
				c = Changes{Err: transient("watch", err)}
				if resp.CompactRevision != 0 {
					c.Err = fmt.Errorf("%w: watch from %d: compacted up to %d", ErrCompacted, from, resp.CompactRevision)
				}
			}
			select {
			case out <- c:
			case <-ctx.Done():
				return
			}
			if c.Err != nil {
				return
			}
		}
		select {
		case out <- Changes{Err: retryable("watch: closed")}:
		case <-ctx.Done():
		}
	}()
	return out
}

// ClusterID is the ID of the cluster the members answer for, as the header of a serializable
// read says: any member answers it, with or without a leader.
func (o *Operator) ClusterID(ctx context.Context) (uint64, error) {
	resp, err := o.cli.Get(ctx, "\x00", clientv3.WithSerializable(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err != nil {
		return 0, transient("cluster ID", err)
	}
	return resp.Header.ClusterId, nil
}
