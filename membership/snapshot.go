package membership

import (
	"context"
	"io"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// SnapshotSource is what a member said of itself before its snapshot is read.
type SnapshotSource struct {
	Endpoint string
	ID       uint64
	IsLeader bool
	Version  string
	// Revision is the member's own revision: its snapshot holds at least this one.
	Revision int64
}

// SnapshotSource asks the one endpoint the Operator was dialled with about its member: a
// learner or a member reporting errors (an alarm, no leader) is refused, since its data may
// lag or be damaged.
func (o *Operator) SnapshotSource(ctx context.Context) (SnapshotSource, error) {
	eps := o.cli.Endpoints()
	if len(eps) != 1 {
		return SnapshotSource{}, refused("snapshot: dial one member's endpoint, not %d endpoints", len(eps))
	}
	st, err := o.cli.Status(ctx, eps[0])
	if err != nil {
		return SnapshotSource{}, transient("status of "+eps[0], err)
	}
	switch {
	case st.IsLearner:
		return SnapshotSource{}, refused("%s is a learner", eps[0])
	case len(st.Errors) > 0:
		return SnapshotSource{}, refused("%s reports %v", eps[0], st.Errors)
	}
	// A serializable read answers from the member's own store, which the snapshot copies.
	resp, err := o.cli.Get(ctx, "\x00", clientv3.WithSerializable(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err != nil {
		return SnapshotSource{}, transient("revision of "+eps[0], err)
	}
	return SnapshotSource{
		Endpoint: eps[0],
		ID:       st.Header.MemberId,
		IsLeader: st.Leader == st.Header.MemberId,
		Version:  st.Version,
		Revision: resp.Header.Revision,
	}, nil
}

// Snapshot streams the member's database into w, as etcd sends it (the database file, then
// its SHA-256), and returns the bytes written. The Operator must be dialled with that one
// member's endpoint.
func (o *Operator) Snapshot(ctx context.Context, w io.Writer) (int64, error) {
	if eps := o.cli.Endpoints(); len(eps) != 1 {
		return 0, refused("snapshot: dial one member's endpoint, not %d endpoints", len(eps))
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
