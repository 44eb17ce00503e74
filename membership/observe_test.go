package membership

import (
	"context"
	"testing"
	"time"

	"etcdops.dev/etcdops/etcdstate"
)

func newTestObserver(t testing.TB) *Observer {
	o := NewObserver(ObserverOptions{Deadline: testDeadline})
	t.Cleanup(o.Close)
	return o
}

// observeTimed observes and fails the test if the deadline was not kept.
func observeTimed(t *testing.T, o *Observer, req Request) etcdstate.Snapshot {
	t.Helper()
	start := time.Now()
	snap := o.Observe(context.Background(), req)
	if took := time.Since(start); took > testDeadline+500*time.Millisecond {
		t.Fatalf("observe took %v, deadline %v", took, testDeadline)
	}
	return snap
}

func TestObserveHealthyCluster(t *testing.T) {
	for _, n := range []int{1, 3} {
		c := newTestCluster(t, n, nil)
		leader := c.leader()
		snap := observeTimed(t, newTestObserver(t), c.request())
		if !snap.Asked || !snap.Complete || snap.Inconsistent != "" || snap.Err != "" {
			t.Fatalf("%d members: want a complete consistent snapshot, got %+v", n, snap)
		}
		if len(snap.Members) != n {
			t.Fatalf("%d members: got %d", n, len(snap.Members))
		}
		for _, m := range snap.Members {
			if !m.Reachable || !m.Healthy || m.IsLearner || m.Version == "" || m.RaftTerm == 0 {
				t.Errorf("%d members: member %+v not a healthy reachable voter", n, m)
			}
		}
		if l, ok := snap.Leader(); !ok || l.Name != leader.name || l.ID != leader.id() {
			t.Errorf("%d members: leader %+v, want %s", n, l, leader.name)
		}
	}
}
