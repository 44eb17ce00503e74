package membership

import (
	"context"
	"slices"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// UpdatePeerURL sets the one peer URL of member id (pod name), as etcd's member update does:
// the other members then reach it there, and a member joining later lists it there. A member
// already at peerURL is done. It is refused for a member that is gone or is another pod's,
// and for a URL another member has.
func (o *Operator) UpdatePeerURL(ctx context.Context, name string, id uint64, peerURL string) (Outcome, error) {
	ms, m, err := o.member(ctx, name, id)
	if err != nil {
		return 0, err
	}
	if slices.Equal(m.PeerURLs, []string{peerURL}) {
		return AlreadyDone, nil
	}
	if other := findByPeerURL(ms, peerURL); other != nil && other.ID != id {
		return 0, refused("peer URL %s belongs to member %x (%s)", peerURL, other.ID, other.Name)
	}
	_, err = o.cli.MemberUpdate(ctx, id, []string{peerURL})
	switch {
	case err == nil:
		return Done, nil
	case isEtcdError(err, rpctypes.ErrMemberNotFound):
		return 0, refused("member %x (%s) is not in the cluster", id, name)
	case isEtcdError(err, rpctypes.ErrPeerURLExist):
		return 0, refused("update peer URL of %s: %v", name, err)
	case isEtcdError(err, rpctypes.ErrUnhealthy):
		return 0, retryable("update peer URL of %s: %v", name, err)
	}
	return 0, transient("update peer URL of "+name, err)
}
