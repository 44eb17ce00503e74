package membership

import (
	"context"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Maintenance operations, idempotent like the membership changes: each finds out first
// whether there is anything to do.

// Compact compacts the key space at the current revision and waits until the compaction is
// applied, so that the space it frees is visible to a defragmentation that follows. A key
// space already compacted at that revision is done.
func (o *Operator) Compact(ctx context.Context) (Outcome, int64, error) {
	// Any key will do: the response header carries the current revision.
	resp, err := o.cli.Get(ctx, "\x00", clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err != nil {
		return 0, 0, transient("read the current revision", err)
	}
	rev := resp.Header.Revision
	_, err = o.cli.Compact(ctx, rev, clientv3.WithCompactPhysical())
	switch {
	case err == nil:
		return Done, rev, nil
	case isEtcdError(err, rpctypes.ErrCompacted):
		return AlreadyDone, rev, nil
	}
	return 0, rev, transient("compact", err)
}

// Defragment defragments the database of member id (pod name), through that member's own
// endpoint: the Operator must be dialled with that endpoint alone. The member answering is
// checked to be the one meant, so a stale endpoint never defragments another member.
func (o *Operator) Defragment(ctx context.Context, name string, id uint64) (Outcome, error) {
	ep, err := o.soleEndpoint("defragment " + name)
	if err != nil {
		return 0, err
	}
	st, err := o.cli.Status(ctx, ep)
	if err != nil {
		return 0, transient("status of "+name, err)
	}
	if st.Header.MemberId != id {
		return 0, refused("%s answers as member %x, not %x", ep, st.Header.MemberId, id)
	}
	if _, err := o.cli.Defragment(ctx, ep); err != nil {
		return 0, transient("defragment "+name, err)
	}
	return Done, nil
}

// Disarm disarms alarm (NOSPACE, CORRUPT) of member id. No such alarm active is done. An
// alarm is disarmed only for a member named: member ID 0 is refused, because etcd raises a
// CORRUPT alarm of member 0 when the members' hashes disagree without a majority, and
// clearing it would hide a corruption nobody has placed yet.
func (o *Operator) Disarm(ctx context.Context, alarm string, id uint64) (Outcome, error) {
	typ, ok := etcdserverpb.AlarmType_value[alarm]
	if !ok || typ == int32(etcdserverpb.AlarmType_NONE) {
		return 0, refused("unknown alarm %q", alarm)
	}
	if id == 0 {
		return 0, refused("disarm %s without a member: an alarm of member 0 is etcd saying it cannot tell which member is at fault; find that member first (docs/runbooks.md)", alarm)
	}
	resp, err := o.cli.AlarmList(ctx)
	if err != nil {
		return 0, transient("alarm list", err)
	}
	out := AlreadyDone
	for _, a := range resp.Alarms {
		if a.Alarm != etcdserverpb.AlarmType(typ) || a.MemberID != id {
			continue
		}
		if _, err := o.cli.AlarmDisarm(ctx, (*clientv3.AlarmMember)(a)); err != nil {
			return 0, transient("disarm "+alarm, err)
		}
		out = Done
	}
	return out, nil
}
