package membership

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"etcdops.dev/etcdops/etcdstate"
)

// errNoEndpoints is returned by operations given nothing to dial.
var errNoEndpoints = errors.New("no endpoints")

// Outcome says whether an operation changed the membership or found it already changed.
type Outcome int

const (
	// Done means the operation changed the membership.
	Done Outcome = iota
	// AlreadyDone means the live state already was what the operation asks for.
	AlreadyDone
)

func (o Outcome) String() string {
	switch o {
	case Done:
		return "done"
	case AlreadyDone:
		return "already done"
	default:
		return fmt.Sprintf("Outcome(%d)", int(o))
	}
}

// Operator performs idempotent membership changes. Each one reads the live membership
// first, so running it again, or after a crash half-way, does no harm.
type Operator struct {
	cli *clientv3.Client
}

// Dial prepares an Operator for the cluster at endpoints (client URLs of voters). It does not
// wait for a connection: the first operation does, under its caller's context.
// With a login, every call is made as that user (etcd ignores it while auth is off).
func Dial(endpoints []string, t *etcdstate.TLS, login Login) (*Operator, error) {
	if len(endpoints) == 0 {
		return nil, errNoEndpoints
	}
	cfg := clientv3.Config{
		Endpoints:          endpoints,
		Logger:             zap.NewNop(),
		MaxUnaryRetries:    3,
		BackoffWaitBetween: 50 * time.Millisecond,
		DialOptions:        []grpc.DialOption{grpc.WithChainUnaryInterceptor(failFast)},
		Username:           login.User,
		Password:           login.Password,
	}
	if t != nil {
		// The server name comes from each endpoint's URL, so it is left empty here.
		tc, err := tlsConfig(t)
		if err != nil {
			return nil, err
		}
		cfg.TLS = tc
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, err
	}
	return &Operator{cli: cli}, nil
}

// failFast overrides the client's wait-for-ready default, under which a call to a member that
// is down blocks until the deadline: a down member should be reported at once.
func failFast(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(ctx, method, req, reply, cc, append(opts, grpc.WaitForReady(false))...)
}

// Close releases the Operator's connections.
func (o *Operator) Close() error { return o.cli.Close() }

// soleEndpoint is the one endpoint of an Operator that acts on one member: dialled with
// several, any of them could answer.
func (o *Operator) soleEndpoint(what string) (string, error) {
	eps := o.cli.Endpoints()
	if len(eps) != 1 {
		return "", refused("%s: dial one member's endpoint alone, not %d endpoints", what, len(eps))
	}
	return eps[0], nil
}

// members reads the membership linearizably, so no decision rests on a stale list.
func (o *Operator) members(ctx context.Context) ([]etcdstate.Member, error) {
	resp, err := o.cli.MemberList(ctx)
	if err != nil {
		return nil, transient("member list", err)
	}
	out := make([]etcdstate.Member, 0, len(resp.Members))
	for _, m := range resp.Members {
		out = append(out, etcdstate.Member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, IsLearner: m.IsLearner})
	}
	return out, nil
}

func findByID(ms []etcdstate.Member, id uint64) *etcdstate.Member {
	i := slices.IndexFunc(ms, func(m etcdstate.Member) bool { return m.ID == id })
	if i < 0 {
		return nil
	}
	return &ms[i]
}

// transient marks network failures and timeouts retryable; etcd's answers pass unchanged.
func transient(what string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return retryable("%s: %v", what, err)
	}
	if c := errorCode(err); c == codes.Unavailable || c == codes.DeadlineExceeded || c == codes.Canceled {
		return retryable("%s: %v", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// errorCode is the gRPC code of err. The client turns etcd's own errors into
// rpctypes.EtcdError values, which carry their code without being gRPC statuses: "server
// stopped" from a member that is being removed, "no leader" and "request timed out" are all
// Unavailable, so worth another try.
func errorCode(err error) codes.Code {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code()
	}
	return status.Code(err)
}

// member reads the membership and finds member id (pod name) in it: a member that is gone or
// is another pod's is refused.
func (o *Operator) member(ctx context.Context, name string, id uint64) ([]etcdstate.Member, *etcdstate.Member, error) {
	ms, err := o.members(ctx)
	if err != nil {
		return nil, nil, err
	}
	m := findByID(ms, id)
	if m == nil {
		return nil, nil, refused("member %x (%s) is not in the cluster", id, name)
	}
	if err := checkIdentity(m, name); err != nil {
		return nil, nil, err
	}
	return ms, m, nil
}

// checkIdentity refuses to act on member id when it has started under another name: the
// caller's view of the cluster is wrong, and acting on it could hit the wrong member.
func checkIdentity(m *etcdstate.Member, name string) error {
	if m.Started() && m.Name != name {
		return refused("member %x is %s, not %s", m.ID, m.Name, name)
	}
	return nil
}

// AddLearner adds name as a learner at peerURL and returns it. A member with that peer URL
// already there is the result of an earlier run; another learner present is refused, since
// etcd allows one and a second would mean two changes in flight.
func (o *Operator) AddLearner(ctx context.Context, name, peerURL string) (etcdstate.Member, Outcome, error) {
	ms, err := o.members(ctx)
	if err != nil {
		return etcdstate.Member{}, 0, err
	}
	if m := findByPeerURL(ms, peerURL); m != nil {
		return existingLearner(m, name)
	}
	for _, m := range ms {
		if m.IsLearner {
			return etcdstate.Member{}, 0, refused("learner %x (%s) is already in the cluster", m.ID, m.Name)
		}
	}
	resp, err := o.cli.MemberAddAsLearner(ctx, []string{peerURL})
	switch {
	case err == nil:
		return etcdstate.Member{ID: resp.Member.ID, PeerURLs: resp.Member.PeerURLs, IsLearner: true}, Done, nil
	case isEtcdError(err, rpctypes.ErrPeerURLExist), isEtcdError(err, rpctypes.ErrMemberExist):
		// An earlier request whose answer was lost added it after our read: look once more.
		// etcd derives a new member's ID from its peer URLs and the second it was asked, so
		// within the same second it refuses the ID before it would refuse the URL.
		if ms, err := o.members(ctx); err == nil {
			if m := findByPeerURL(ms, peerURL); m != nil {
				return existingLearner(m, name)
			}
		}
		return etcdstate.Member{}, 0, retryable("add learner %s: %v", name, err)
	case isEtcdError(err, rpctypes.ErrTooManyLearners):
		return etcdstate.Member{}, 0, refused("add learner %s: %v", name, err)
	case isEtcdError(err, rpctypes.ErrUnhealthy):
		// etcd wants its members connected for a while before a change; that passes.
		return etcdstate.Member{}, 0, retryable("add learner %s: %v", name, err)
	}
	return etcdstate.Member{}, 0, transient("add learner "+name, err)
}

// existingLearner is the outcome of adding a member whose peer URL m already has: done when
// it is the same member, whether or not it has started or been promoted since.
func existingLearner(m *etcdstate.Member, name string) (etcdstate.Member, Outcome, error) {
	if err := checkIdentity(m, name); err != nil {
		return etcdstate.Member{}, 0, err
	}
	return *m, AlreadyDone, nil
}

func findByPeerURL(ms []etcdstate.Member, peerURL string) *etcdstate.Member {
	i := slices.IndexFunc(ms, func(m etcdstate.Member) bool { return slices.Contains(m.PeerURLs, peerURL) })
	if i < 0 {
		return nil
	}
	return &ms[i]
}

// Promote makes learner id (pod name) a voter. A voter is already done; a learner that has
// not caught up with the leader is a retryable error.
func (o *Operator) Promote(ctx context.Context, name string, id uint64) (Outcome, error) {
	_, m, err := o.member(ctx, name, id)
	if err != nil {
		return 0, err
	}
	if !m.IsLearner {
		return AlreadyDone, nil
	}
	_, err = o.cli.MemberPromote(ctx, id)
	switch {
	case err == nil:
		return Done, nil
	case isEtcdError(err, rpctypes.ErrMemberNotLearner):
		return AlreadyDone, nil
	case isEtcdError(err, rpctypes.ErrMemberLearnerNotReady):
		return 0, retryable("learner %s has not caught up with the leader", name)
	case isEtcdError(err, rpctypes.ErrMemberNotEnoughStarted):
		return 0, retryable("promote %s: %v", name, err)
	}
	return 0, transient("promote "+name, err)
}

// Remove removes member id (pod name). A member already gone is done. Removing a voter is
// refused unless the voters left, counting only those that answer, keep quorum.
func (o *Operator) Remove(ctx context.Context, name string, id uint64) (Outcome, error) {
	ms, err := o.members(ctx)
	if err != nil {
		return 0, err
	}
	m := findByID(ms, id)
	if m == nil {
		return AlreadyDone, nil
	}
	if err := checkIdentity(m, name); err != nil {
		return 0, err
	}
	if !m.IsLearner {
		var rest []etcdstate.Member
		for _, v := range ms {
			if !v.IsLearner && v.ID != id {
				rest = append(rest, v)
			}
		}
		up := o.countUp(ctx, rest)
		if !etcdstate.QuorumAfterRemoval(len(rest)+1, up) {
			return 0, refused("removing voter %s leaves %d voters of which %d answer, below quorum %d", name, len(rest), up, etcdstate.Quorum(len(rest)))
		}
	}
	_, err = o.cli.MemberRemove(ctx, id)
	switch {
	case err == nil:
		return Done, nil
	case isEtcdError(err, rpctypes.ErrMemberNotFound):
		return AlreadyDone, nil
	case isEtcdError(err, rpctypes.ErrUnhealthy), isEtcdError(err, rpctypes.ErrMemberNotEnoughStarted):
		// Our own count saw quorum kept; etcd also wants the survivors connected for a
		// while, which passes.
		return 0, retryable("remove %s: %v", name, err)
	}
	return 0, transient("remove "+name, err)
}

// CheckRestart says whether member id (pod name) may be taken down now, asked of etcd at the
// moment of acting rather than when the step was decided: nil when it is no longer a member (a
// removed member's pod holds nothing the cluster needs), or when it does not lead and every
// other voter answers without errors of its own. A leader, or another voter down, is a
// retryable refusal: the member's pod is deleted only while taking it down leaves the others a
// healthy quorum and no election.
func (o *Operator) CheckRestart(ctx context.Context, name string, id uint64) error {
	ms, err := o.members(ctx)
	if err != nil {
		return err
	}
	m := findByID(ms, id)
	if m == nil {
		return nil
	}
	if err := checkIdentity(m, name); err != nil {
		return err
	}
	var others []etcdstate.Member
	for _, v := range ms {
		if !v.IsLearner && v.ID != id {
			others = append(others, v)
		}
	}
	if up := o.countUp(ctx, others); up < len(others) {
		return retryable("%d of the %d other voters answer healthy: %s is not taken down while another voter is down", up, len(others), name)
	}
	if m.Started() && len(m.ClientURLs) > 0 {
		st, err := o.cli.Status(ctx, m.ClientURLs[0])
		if err != nil {
			return transient("status of "+name, err)
		}
		if st.Leader == id {
			return retryable("%s leads: leadership must move first", name)
		}
	}
	return nil
}

// countUp counts the started members that answer Status without errors of their own, asking
// in parallel. The cluster's alarms, which every member's Status lists, are not a member's
// own: counted, a NOSPACE or CORRUPT alarm anywhere would make every member look down and
// forbid the very removal that replaces a corrupt member.
func (o *Operator) countUp(ctx context.Context, ms []etcdstate.Member) int {
	var mu sync.Mutex
	up := 0
	var wg sync.WaitGroup
	for _, m := range ms {
		if !m.Started() || len(m.ClientURLs) == 0 {
			continue
		}
		wg.Go(func() {
			st, err := o.cli.Status(ctx, m.ClientURLs[0])
			if err == nil && !hasOwnErrors(st.Errors, m.ID) {
				mu.Lock()
				up++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return up
}

// hasOwnErrors: a Status reply of member id lists an error other than another member's alarm;
// a CORRUPT alarm of its own counts.
func hasOwnErrors(errs []string, id uint64) bool {
	for _, e := range errs {
		if alarmed, alarm, ok := parseAlarm(e); !ok || alarmed == id && alarm == "CORRUPT" {
			return true
		}
	}
	return false
}

// MoveLeader hands leadership to voter id (pod name). The request goes to the current
// leader's own endpoint, as etcd requires. The transferee must be a started voter that
// answers; it already leading is done.
func (o *Operator) MoveLeader(ctx context.Context, name string, id uint64) (Outcome, error) {
	ms, m, err := o.member(ctx, name, id)
	if err != nil {
		return 0, err
	}
	switch {
	case m.IsLearner:
		return 0, refused("member %s is a learner and cannot lead", name)
	case !m.Started() || len(m.ClientURLs) == 0:
		return 0, refused("member %s has not started", name)
	}
	st, err := o.cli.Status(ctx, m.ClientURLs[0])
	if err != nil {
		return 0, transient("status of "+name, err)
	}
	if st.Leader == id {
		return AlreadyDone, nil
	}
	leader := findByID(ms, st.Leader)
	if leader == nil || len(leader.ClientURLs) == 0 {
		return 0, retryable("%s knows no leader to hand over from", name)
	}
	conn, err := o.cli.Dial(leader.ClientURLs[0])
	if err != nil {
		return 0, transient("dial leader "+leader.Name, err)
	}
	defer conn.Close()
	maint := clientv3.NewMaintenanceFromMaintenanceClient(clientv3.RetryMaintenanceClient(o.cli, conn), o.cli)
	_, err = maint.MoveLeader(ctx, id)
	switch {
	case err == nil:
		return Done, nil
	case isEtcdError(err, rpctypes.ErrNotLeader):
		return 0, retryable("leadership moved while handing it to %s", name)
	case isEtcdError(err, rpctypes.ErrBadLeaderTransferee):
		return 0, refused("move leader to %s: %v", name, err)
	}
	return 0, transient("move leader to "+name, err)
}
