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
// connection, a timeout, a leader change); the Job then retries. These tests lose or hold the
// answer with an answerProxy in front of each member, so each retry meets exactly the state
// the lost request left.

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

// withAnswerHeld holds the answer to the Operator's next call of method while during runs,
// as if the request were read before an earlier one whose answer was lost took effect.
func withAnswerHeld(t *testing.T, p *answerProxy, method string, call func() (Outcome, error), during func()) (Outcome, error) {
	t.Helper()
	caught, release := p.hold(method)
	defer release()
	type result struct {
		out Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := call()
		done <- result{out, err}
	}()
	select {
	case <-caught:
	case r := <-done:
		t.Fatalf("%s: returned %v, %v before its answer was held", method, r.out, r.err)
	}
	during()
	release()
	r := <-done
	return r.out, r.err
}

// proxiedCluster starts n voters, each behind an answerProxy, with an Operator that knows m-0
// alone, as its proxy, and one around that proxy, for the tests' other actors.
func proxiedCluster(t *testing.T, n int) (c *testCluster, op, direct *Operator) {
	t.Helper()
	c = startTestCluster(t, clusterOptions{members: n, proxied: true})
	direct, err := Dial([]string{c.members[0].clientURL.String()}, nil, Login{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	return c, dialTest(t, c, c.members[0]), direct
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
	slowTest(t)
	c, op, direct := proxiedCluster(t, 3)
	via := c.members[0]
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

// TestLateApply: a request whose answer was lost may take effect only after its retry has read
// the membership, so the retry's own request meets etcd's refusal of the same change. That
// refusal means done, not a failed step. The Operator's membership read is held while the
// earlier request's change is made.
func TestLateApply(t *testing.T) {
	c, op, direct := proxiedCluster(t, 1)
	via := c.members[0]
	ctx := opContext(t)

	// etcd derives a new member's ID from its peer URLs and the second it is asked in: two
	// requests in one second for one URL get one ID, and etcd refuses the later for its ID;
	// a second apart, for its URL. Each case adds a learner of its own.
	var added uint64
	for _, tc := range []struct {
		story      string
		nextSecond bool
	}{{"in the same second", false}, {"a second later", true}} {
		learner := c.newMember(fmt.Sprintf("m-%d", len(c.members)))
		peerURL := learner.peerURL.String()
		if !tc.nextSecond {
			// Start early in a second, so that both requests fall within it.
			if start := time.Now(); start.Nanosecond() > 5e8 {
				for time.Now().Unix() == start.Unix() {
					time.Sleep(10 * time.Millisecond)
				}
			}
		}
		var got etcdstate.Member
		var earlier uint64
		out, err := withAnswerHeld(t, via.proxy, pb.Cluster_MemberList_FullMethodName,
			func() (Outcome, error) {
				m, out, err := op.AddLearner(ctx, learner.name, peerURL)
				got = m
				return out, err
			},
			func() {
				asked := time.Now().Unix()
				resp, err := direct.cli.MemberAddAsLearner(ctx, []string{peerURL})
				if err != nil {
					t.Fatal(err)
				}
				earlier = resp.Member.ID
				for tc.nextSecond && time.Now().Unix() <= asked {
					time.Sleep(10 * time.Millisecond)
				}
			})
		wantOutcome(t, "add learner applied late, "+tc.story, out, err, AlreadyDone)
		ms, err := direct.members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if added := withPeerURL(ms, peerURL); len(added) != 1 || added[0].ID != earlier || got.ID != earlier {
			t.Fatalf("%s: members at %s: %+v, returned %x, want only the one added earlier (%x)", tc.story, peerURL, added, got.ID, earlier)
		}
		added = earlier
		if tc.nextSecond {
			break
		}
		// One learner at a time.
		if _, err := direct.cli.MemberRemove(ctx, earlier); err != nil {
			t.Fatal(err)
		}
	}

	last := c.members[len(c.members)-1]
	out, err := withAnswerHeld(t, via.proxy, pb.Cluster_MemberList_FullMethodName,
		func() (Outcome, error) { return op.Remove(ctx, last.name, added) },
		func() {
			if _, err := direct.cli.MemberRemove(ctx, added); err != nil {
				t.Fatal(err)
			}
		})
	wantOutcome(t, "remove applied late", out, err, AlreadyDone)
}
