package membership

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrFutureRevision: a revision asked for is newer than the member has applied.
var ErrFutureRevision = errors.New("revision not applied yet")

// KeyPage is one page of the key space at a revision.
type KeyPage struct {
	KVs []*mvccpb.KeyValue
	// More: keys after the last one remain.
	More bool
	// Revision is the member's revision when it answered.
	Revision int64
	// ClusterID is the cluster the member answers for.
	ClusterID uint64
}

// ReadPage reads up to limit keys, in key order, from key from on, as they were at revision
// rev, from the one member the Operator was dialled with, without asking the leader
// (serializable): a read that loads that member alone. A revision compacted away is an error
// wrapping ErrCompacted; one the member has not applied yet, ErrFutureRevision.
func (o *Operator) ReadPage(ctx context.Context, from string, rev, limit int64) (KeyPage, error) {
	if _, err := o.soleEndpoint("read a page"); err != nil {
		return KeyPage{}, err
	}
	resp, err := o.cli.Get(ctx, from, clientv3.WithFromKey(), clientv3.WithRev(rev), clientv3.WithLimit(limit), clientv3.WithSerializable())
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return KeyPage{}, fmt.Errorf("%w: revision %d", ErrCompacted, rev)
	case errors.Is(err, rpctypes.ErrFutureRev):
		return KeyPage{}, fmt.Errorf("%w: revision %d", ErrFutureRevision, rev)
	case err != nil:
		return KeyPage{}, transient("read keys", err)
	}
	return KeyPage{KVs: resp.Kvs, More: resp.More, Revision: resp.Header.Revision, ClusterID: resp.Header.ClusterId}, nil
}

// CaughtUpRevision is the cluster's revision as the one member the Operator was dialled with
// serves it once it has applied everything the leader had committed when asked (a
// linearizable read through that member): every revision up to it can then be read from it
// without the leader.
func (o *Operator) CaughtUpRevision(ctx context.Context) (int64, error) {
	if _, err := o.soleEndpoint("revision"); err != nil {
		return 0, err
	}
	resp, err := o.cli.Get(ctx, "\x00", clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err != nil {
		return 0, transient("revision", err)
	}
	return resp.Header.Revision, nil
}
