package membership

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/embed"

	"etcdops.dev/etcdops/etcdstate"
)

// A member Job's request can be applied by etcd while its answer is lost (a closed
// connection, a timeout, a leader change); the Job then retries. These tests lose the answer
// with an answerProxy in front of each member, so each retry meets exactly the state the lost
// request left.

// loseAnswer arms p to lose the answer to method (after skip calls of it), runs call, and
// fails unless the answer was lost and call failed retryably, which is what the member tool
// retries.
func loseAnswer(t *testing.T, p *answerProxy, method string, skip int, call func() error) {
	t.Helper()
	caught := p.lose(method, skip)
	err := call()
	select {
	case <-caught:
	default:
		t.Fatalf("%s: the answer was not lost (the call returned %v)", method, err)
	}
	if !errors.Is(err, ErrRetryable) {
		t.Fatalf("%s with its answer lost: %v, want a retryable error", method, err)
	}
}

// dialAround is an Operator at m's own client port, around its proxy, to read and change the
// cluster as the tests' other actors.
func dialAround(t *testing.T, m *testMember) *Operator {
	t.Helper()
	op, err := Dial([]string{m.clientURL.String()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { op.Close() })
	return op
}

// withPeerURL lists the members that have peerURL.
func withPeerURL(ms []etcdstate.Member, peerURL string) []etcdstate.Member {
	var out []etcdstate.Member
	for _, m := range ms {
		if slices.Contains(m.PeerURLs, peerURL) {
			out = append(out, m)
		}
	}
	return out
}

// TestLostAnswers runs each membership change and maintenance operation with its answer lost
// after etcd applied it, then again as the Job's retry does: the retry finds the work done.
// The Operator knows m-0 alone, as its proxy; the member list advertises the proxies, so the
// calls to other members (the leader for a leader move) go through theirs.
func TestLostAnswers(t *testing.T) {
	c := startTestCluster(t, clusterOptions{members: 3, proxied: true})
	via := c.members[0]
	op := dialTest(t, c, via)
	direct := dialAround(t, via)
	ctx := opContext(t)
	list := func() []etcdstate.Member {
		t.Helper()
		ms, err := direct.members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ms
	}
	learner := c.newMember("m-3")
	peerURL := learner.peerURL.String()
	var id uint64

	t.Run("add-learner", func(t *testing.T) {
		loseAnswer(t, via.proxy, pb.Cluster_MemberAdd_FullMethodName, 0, func() error {
			_, _, err := op.AddLearner(ctx, learner.name, peerURL)
			return err
		})
		added := withPeerURL(list(), peerURL)
		if len(added) != 1 || !added[0].IsLearner {
			t.Fatalf("members at %s after the lost answer: %+v, want one learner", peerURL, added)
		}
		id = added[0].ID
		m, out, err := op.AddLearner(ctx, learner.name, peerURL)
		wantOutcome(t, "add learner again", out, err, AlreadyDone)
		if m.ID != id {
			t.Fatalf("add learner again: member %x, want %x", m.ID, id)
		}
		if n := len(withPeerURL(list(), peerURL)); n != 1 {
			t.Fatalf("%d members at %s after the retry, want 1", n, peerURL)
		}
	})
	if t.Failed() {
		return
	}

	t.Run("promote", func(t *testing.T) {
		c.start(learner, embed.ClusterStateFlagExisting, c.initialCluster())
		// Until the learner has caught up etcd refuses the promotion, and that answer may be
		// the one lost: lose answers until one is lost to an applied promotion.
		for i := 0; ; i++ {
			loseAnswer(t, via.proxy, pb.Cluster_MemberPromote_FullMethodName, 0, func() error {
				_, err := op.Promote(ctx, learner.name, id)
				return err
			})
			if m := findByID(list(), id); m != nil && !m.IsLearner {
				break
			}
			if i == 50 {
				t.Fatal("learner not promoted after 50 attempts")
			}
			time.Sleep(100 * time.Millisecond)
		}
		out, err := op.Promote(ctx, learner.name, id)
		wantOutcome(t, "promote again", out, err, AlreadyDone)
	})
	if t.Failed() {
		return
	}

	t.Run("move-leader", func(t *testing.T) {
		leader := c.leader()
		var to *testMember
		for _, m := range c.members[:3] {
			if m != leader {
				to = m
				break
			}
		}
		// The request goes to the leader, through the leader's proxy.
		loseAnswer(t, leader.proxy, pb.Maintenance_MoveLeader_FullMethodName, 0, func() error {
			_, err := op.MoveLeader(ctx, to.name, to.id())
			return err
		})
		if got := c.leader(); got != to {
			t.Fatalf("leader after the lost answer: %s, want %s", got.name, to.name)
		}
		out, err := eventually(t, func() (Outcome, error) { return op.MoveLeader(ctx, to.name, to.id()) })
		wantOutcome(t, "move leader again", out, err, AlreadyDone)
	})
	if t.Failed() {
		return
	}

	t.Run("update-peer-url", func(t *testing.T) {
		moved := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		loseAnswer(t, via.proxy, pb.Cluster_MemberUpdate_FullMethodName, 0, func() error {
			_, err := op.UpdatePeerURL(ctx, learner.name, id, moved)
			return err
		})
		if m := findByID(list(), id); m == nil || !slices.Equal(m.PeerURLs, []string{moved}) {
			t.Fatalf("member %x after the lost answer: %+v, want peer URL %s", id, m, moved)
		}
		out, err := op.UpdatePeerURL(ctx, learner.name, id, moved)
		wantOutcome(t, "update peer URL again", out, err, AlreadyDone)
	})
	if t.Failed() {
		return
	}

	t.Run("remove", func(t *testing.T) {
		loseAnswer(t, via.proxy, pb.Cluster_MemberRemove_FullMethodName, 0, func() error {
			_, err := op.Remove(ctx, learner.name, id)
			return err
		})
		if ms := list(); findByID(ms, id) != nil || len(ms) != 3 {
			t.Fatalf("members after the lost answer: %+v, want the three without %x", ms, id)
		}
		out, err := op.Remove(ctx, learner.name, id)
		wantOutcome(t, "remove again", out, err, AlreadyDone)
		c.stop(learner)
	})
	if t.Failed() {
		return
	}

	t.Run("compact", func(t *testing.T) {
		if _, err := direct.cli.Put(ctx, "k", "v"); err != nil {
			t.Fatal(err)
		}
		loseAnswer(t, via.proxy, pb.KV_Compact_FullMethodName, 0, func() error {
			_, _, err := op.Compact(ctx)
			return err
		})
		resp, err := direct.cli.Get(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		out, rev, err := op.Compact(ctx)
		wantOutcome(t, "compact again", out, err, AlreadyDone)
		if rev != resp.Header.Revision {
			t.Fatalf("compact again: revision %d, want %d", rev, resp.Header.Revision)
		}
	})

	t.Run("defragment", func(t *testing.T) {
		// Nothing tells a defragmented file from another: the retry defragments again, which
		// costs the member a pause and nothing else.
		loseAnswer(t, via.proxy, pb.Maintenance_Defragment_FullMethodName, 0, func() error {
			_, err := op.Defragment(ctx, via.name, via.id())
			return err
		})
		out, err := op.Defragment(ctx, via.name, via.id())
		wantOutcome(t, "defragment again", out, err, Done)
	})

	t.Run("disarm", func(t *testing.T) {
		victim := c.members[1]
		mc := pb.NewMaintenanceClient(direct.cli.ActiveConnection())
		if _, err := mc.Alarm(ctx, &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: victim.id(), Alarm: pb.AlarmType_NOSPACE}); err != nil {
			t.Fatal(err)
		}
		// Disarm lists the alarms first, with the same method: the disarm is the second call.
		caught := via.proxy.lose(pb.Maintenance_Alarm_FullMethodName, 1)
		_, err := op.Disarm(ctx, "NOSPACE", victim.id())
		select {
		case <-caught:
		default:
			t.Fatalf("the disarm's answer was not lost (it returned %v)", err)
		}
		// The client resends alarm requests by itself, so the lost answer may not show.
		if err != nil && !errors.Is(err, ErrRetryable) {
			t.Fatalf("disarm with its answer lost: %v, want done or a retryable error", err)
		}
		alarms, err := direct.cli.AlarmList(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(alarms.Alarms) != 0 {
			t.Fatalf("alarms after the lost answer: %v", alarms.Alarms)
		}
		out, err := op.Disarm(ctx, "NOSPACE", victim.id())
		wantOutcome(t, "disarm again", out, err, AlreadyDone)
	})
}
