package membership

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/server/v3/embed"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"etcdops.dev/etcdops/etcdstate"
)

func dialTest(t *testing.T, c *testCluster, ms ...*testMember) *Operator {
	t.Helper()
	var tlsMaterial *etcdstate.TLS
	if c.pki != nil {
		tlsMaterial = c.pki.clientTLS
	}
	op, err := Dial(clientURLs(ms...), tlsMaterial, Login{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { op.Close() })
	return op
}

func opContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// wantOutcome fails unless the operation returned want without error.
func wantOutcome(t *testing.T, what string, got Outcome, err error, want Outcome) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if got != want {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
}

// joinLearner adds m as a learner through op, checks the add is idempotent, and starts it.
func joinLearner(t *testing.T, c *testCluster, op *Operator, m *testMember) uint64 {
	t.Helper()
	ctx := opContext(t)
	added, out, err := op.AddLearner(ctx, m.name, m.peerURL.String())
	wantOutcome(t, "add learner", out, err, Done)
	again, out, err := op.AddLearner(ctx, m.name, m.peerURL.String())
	wantOutcome(t, "add learner again", out, err, AlreadyDone)
	if again.ID != added.ID || !again.IsLearner {
		t.Fatalf("add learner again: got %+v, want learner %x", again, added.ID)
	}
	c.start(m, embed.ClusterStateFlagExisting, c.initialCluster())
	return added.ID
}

// eventually repeats op while it fails retryably, as a member Job's retries do, for at most
// ten seconds, and returns its last result.
func eventually(t *testing.T, op func() (Outcome, error)) (Outcome, error) {
	t.Helper()
	var out Outcome
	var err error
	for range 100 {
		out, err = op()
		if !errors.Is(err, ErrRetryable) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return out, err
}

// promoteWhenReady promotes the learner once it has caught up, and checks the second
// promote is a no-op.
func promoteWhenReady(t *testing.T, op *Operator, m *testMember, id uint64) {
	t.Helper()
	ctx := opContext(t)
	out, err := eventually(t, func() (Outcome, error) { return op.Promote(ctx, m.name, id) })
	wantOutcome(t, "promote", out, err, Done)
	out, err = op.Promote(ctx, m.name, id)
	wantOutcome(t, "promote again", out, err, AlreadyDone)
}

// The whole grow-and-shrink loop under etcd's default strict checks, which make the
// removal wait until the new member has been connected long enough: retryable, not refused.
func TestGrowAndShrinkOneMemberCluster(t *testing.T) {
	slowTest(t)
	c := startTestCluster(t, clusterOptions{members: 1, strict: true})
	seed := c.members[0]
	op := dialTest(t, c, seed)
	ctx := opContext(t)

	second := c.newMember("m-1")
	id := joinLearner(t, c, op, second)
	promoteWhenReady(t, op, second, id)

	out, err := eventually(t, func() (Outcome, error) { return op.Remove(ctx, second.name, id) })
	wantOutcome(t, "remove", out, err, Done)
	out, err = op.Remove(ctx, second.name, id)
	wantOutcome(t, "remove again", out, err, AlreadyDone)

	out, err = op.Remove(ctx, seed.name, seed.id())
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("removing the last voter: got %v, %v; want refused", out, err)
	}
}

func TestLearnerRules(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	op := dialTest(t, c, c.members...)
	ctx := opContext(t)

	lagging := c.newMember("m-3")
	added, out, err := op.AddLearner(ctx, lagging.name, lagging.peerURL.String())
	wantOutcome(t, "add learner", out, err, Done)

	// The learner never started, so it has no raft progress at all.
	if _, err := op.Promote(ctx, lagging.name, added.ID); !errors.Is(err, ErrRetryable) {
		t.Fatalf("promote before catch-up: got %v, want retryable", err)
	}
	other := c.newMember("m-4")
	if _, _, err := op.AddLearner(ctx, other.name, other.peerURL.String()); !errors.Is(err, ErrRefused) {
		t.Fatalf("second learner: got %v, want refused", err)
	}
	if _, _, err := op.AddLearner(ctx, other.name, lagging.peerURL.String()); err != nil {
		t.Fatalf("peer URL of an unstarted member under another name: got %v, want the member", err)
	}
	if _, err := op.MoveLeader(ctx, lagging.name, added.ID); !errors.Is(err, ErrRefused) {
		t.Fatalf("move leader to a learner: got %v, want refused", err)
	}

	out, err = op.Remove(ctx, lagging.name, added.ID)
	wantOutcome(t, "remove learner", out, err, Done)
	out, err = op.Remove(ctx, lagging.name, added.ID)
	wantOutcome(t, "remove learner again", out, err, AlreadyDone)
}

func TestRemoveKeepsQuorum(t *testing.T) {
	slowTest(t)
	c := newTestCluster(t, 3, nil)
	up, down := c.members[0], c.members[2]
	op := dialTest(t, c, c.members[:2]...)
	ctx := opContext(t)
	downID := down.id()
	c.stop(down)

	// Two voters would remain, one of them down: no quorum.
	if _, err := op.Remove(ctx, c.members[1].name, c.members[1].id()); !errors.Is(err, ErrRefused) {
		t.Fatalf("remove a healthy voter while another is down: got %v, want refused", err)
	}
	out, err := op.Remove(ctx, down.name, downID)
	wantOutcome(t, "remove the down voter", out, err, Done)
	out, err = op.Remove(ctx, down.name, downID)
	wantOutcome(t, "remove the down voter again", out, err, AlreadyDone)
	if _, err := op.Remove(ctx, "someone-else", up.id()); !errors.Is(err, ErrRefused) {
		t.Fatalf("remove under the wrong name: got %v, want refused", err)
	}
}

func TestMoveLeaderThroughFollower(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	leader := c.leader()
	var followers []*testMember
	for _, m := range c.members {
		if m != leader {
			followers = append(followers, m)
		}
	}
	// The operator knows only a follower that is not the transferee; the request must
	// still reach the leader.
	transferee, via := followers[0], followers[1]
	op := dialTest(t, c, via)
	ctx := opContext(t)

	out, err := op.MoveLeader(ctx, transferee.name, transferee.id())
	wantOutcome(t, "move leader", out, err, Done)
	if got := c.leader(); got != transferee {
		t.Fatalf("leader is %s, want %s", got.name, transferee.name)
	}
	out, err = op.MoveLeader(ctx, transferee.name, transferee.id())
	wantOutcome(t, "move leader again", out, err, AlreadyDone)
}

// TestTransientErrors: etcd's errors come back from the client as rpctypes values, not gRPC
// statuses; those etcd marks Unavailable (a member stopping because it is being removed, no
// leader, a timeout) are worth another try, the others are not.
func TestTransientErrors(t *testing.T) {
	tests := []struct {
		err       error
		retryable bool
	}{
		{rpctypes.Error(rpctypes.ErrGRPCStopped), true},
		{rpctypes.Error(rpctypes.ErrGRPCNoLeader), true},
		{rpctypes.Error(rpctypes.ErrGRPCTimeout), true},
		{status.Error(codes.Unavailable, "connection refused"), true},
		{context.DeadlineExceeded, true},
		{rpctypes.Error(rpctypes.ErrGRPCPermissionDenied), false},
		{rpctypes.Error(rpctypes.ErrGRPCMemberNotFound), false},
		{errors.New("something else"), false},
	}
	for _, tt := range tests {
		if got := errors.Is(transient("remove m-2", tt.err), ErrRetryable); got != tt.retryable {
			t.Errorf("transient(%v) retryable = %v, want %v", tt.err, got, tt.retryable)
		}
	}
}

// TestCheckRestart: a member may be taken down only while it does not lead and every other
// voter answers; a member no longer in the cluster may always be.
func TestCheckRestart(t *testing.T) {
	slowTest(t)
	c := newTestCluster(t, 3, nil)
	leader := c.leader()
	var followers []*testMember
	for _, m := range c.members {
		if m != leader {
			followers = append(followers, m)
		}
	}
	op := dialTest(t, c, c.members...)
	ctx := opContext(t)
	if err := op.CheckRestart(ctx, followers[0].name, followers[0].id()); err != nil {
		t.Fatalf("a follower with every other voter up: %v", err)
	}
	if err := op.CheckRestart(ctx, leader.name, leader.id()); !errors.Is(err, ErrRetryable) {
		t.Fatalf("the leader: got %v, want retryable", err)
	}
	if err := op.CheckRestart(ctx, "someone-else", followers[0].id()); !errors.Is(err, ErrRefused) {
		t.Fatalf("under the wrong name: got %v, want refused", err)
	}
	if err := op.CheckRestart(ctx, "etcd-9", 0x9999); err != nil {
		t.Fatalf("a member not in the cluster: %v", err)
	}
	c.stop(followers[1])
	if err := op.CheckRestart(ctx, followers[0].name, followers[0].id()); !errors.Is(err, ErrRetryable) {
		t.Fatalf("a follower while another voter is down: got %v, want retryable", err)
	}
}
