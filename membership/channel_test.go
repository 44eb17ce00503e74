package membership

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/test/dialguard"
)

// TestChannelReachesTheMemberNamed: over one cluster's channel, each call is answered by the
// member it names, a member nothing listens for fails at once while the others answer, and
// an address the channel does not hold is refused, not sent to another member.
func TestChannelReachesTheMemberNamed(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.leader()
	// A loopback port that was listened on and is now closed: connections are refused.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	l.Close()
	req := c.request()
	req.Endpoints = append(req.Endpoints, etcdstate.Endpoint{Member: "down", Address: down})
	members, channels, err := newClusterClients(req, time.Second, dialguard.ForTest(t))
	if err != nil {
		t.Fatal(err)
	}
	defer channels.close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for round := range 3 {
		for i, m := range members[:3] {
			st, err := m.status(ctx)
			if err != nil {
				t.Fatalf("round %d: %s: %v", round, m.endpoint.Member, err)
			}
			if want := c.members[i].id(); st.Header.MemberId != want {
				t.Fatalf("round %d: asked %s, answered by %x, want %x", round, m.endpoint.Member, st.Header.MemberId, want)
			}
		}
	}
	start := time.Now()
	if _, err := members[3].status(ctx); status.Code(err) != codes.Unavailable {
		t.Errorf("a member nothing listens for: %v, want Unavailable", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("a member nothing listens for took %s to fail", took)
	}
	stranger := &memberClient{addr: "127.0.0.1:1", maint: members[0].maint}
	if _, err := stranger.status(ctx); err == nil || !strings.Contains(err.Error(), "no connection to member address") {
		t.Errorf("an address not on the channel: %v", err)
	}
}
