package membership

import (
	"context"
	"io"
	"slices"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// SnapshotSource is what a member said of itself before its snapshot is read.
type SnapshotSource struct {
	Endpoint string
	ID       uint64
	// ClusterID is the cluster the member answers for, as its response header says.
	ClusterID uint64
	IsLeader  bool
	Version   string
	// Revision is the member's own revision: its snapshot holds at least this one.
	Revision int64
}

// SnapshotSource asks the one endpoint the Operator was dialled with about its member: a
// learner or a member reporting errors (an alarm, no leader) is refused, since its data may
// lag or be damaged.
func (o *Operator) SnapshotSource(ctx context.Context) (SnapshotSource, error) {
	return o.snapshotSource(ctx, false)
}

// SurvivorSnapshotSource is SnapshotSource for the member a quorum recovery forces a new
// cluster from: without quorum it reports "no leader", which is accepted, since its database
// is what the new cluster will hold; an alarm is not. etcd sends a snapshot without a leader.
func (o *Operator) SurvivorSnapshotSource(ctx context.Context) (SnapshotSource, error) {
	return o.snapshotSource(ctx, true)
}

func (o *Operator) snapshotSource(ctx context.Context, withoutLeader bool) (SnapshotSource, error) {
	ep, err := o.soleEndpoint("snapshot")
	if err != nil {
		return SnapshotSource{}, err
	}
	st, err := o.cli.Status(ctx, ep)
	if err != nil {
		return SnapshotSource{}, transient("status of "+ep, err)
	}
	errs := st.Errors
	if withoutLeader {
		errs = slices.DeleteFunc(slices.Clone(errs), func(e string) bool { return e == rpctypes.ErrNoLeader.Error() })
	}
	switch {
	case st.IsLearner:
		return SnapshotSource{}, refused("%s is a learner", ep)
	case len(errs) > 0:
		return SnapshotSource{}, refused("%s reports %v", ep, errs)
	}
	// A serializable read answers from the member's own store, which the snapshot copies.
	resp, err := o.cli.Get(ctx, "\x00", clientv3.WithSerializable(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err != nil {
		return SnapshotSource{}, transient("revision of "+ep, err)
	}
	return SnapshotSource{
		Endpoint:  ep,
		ID:        st.Header.MemberId,
		ClusterID: st.Header.ClusterId,
		IsLeader:  st.Leader == st.Header.MemberId,
		Version:   st.Version,
		Revision:  resp.Header.Revision,
	}, nil
}

// Snapshot streams the member's database into w, as etcd sends it (the database file, then
// its SHA-256), and returns the bytes written. The Operator must be dialled with that one
// member's endpoint.
func (o *Operator) Snapshot(ctx context.Context, w io.Writer) (int64, error) {
	if _, err := o.soleEndpoint("snapshot"); err != nil {
		return 0, err
	}
	rc, err := o.cli.Snapshot(ctx)
	if err != nil {
		return 0, transient("snapshot", err)
	}
	defer rc.Close()
	n, err := io.Copy(w, rc)
	if err != nil {
		return n, transient("snapshot", err)
	}
	return n, nil
}
