package etcdtest

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"go.etcd.io/etcd/server/v3/embed"
)

func TestStartClusterFormsOneCluster(t *testing.T) {
	var cfgs []*embed.Config
	for i := range 3 {
		cfgs = append(cfgs, Config(fmt.Sprintf("m-%d", i), t.TempDir(), FreeURL(t), FreeURL(t)))
	}
	es := StartCluster(t, "etcdtest", cfgs...)
	id := es[0].Server.Cluster().ID()
	for _, e := range es {
		if got := e.Server.Cluster().ID(); got != id {
			t.Errorf("%s is in cluster %s, %s in %s", e.Config().Name, got, es[0].Config().Name, id)
		}
		if n := len(e.Server.Cluster().Members()); n != 3 {
			t.Errorf("%s lists %d members, want 3", e.Config().Name, n)
		}
	}
	// Stopping before the test's own cleanup stops it again must not panic.
	es[2].Stop()
	es[2].Stop()
}

func TestStartNamesTheMemberThatFails(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	client := FreeURL(t)
	client.Host = taken.Addr().String()
	e, err := start(Config("m-taken", t.TempDir(), FreeURL(t), client))
	if err == nil {
		e.Stop()
		t.Fatal("started on a client port already in use")
	}
	if !strings.Contains(err.Error(), "m-taken") {
		t.Fatalf("error %q does not name the member", err)
	}
}

// TestFreePortIsOutsideTheEphemeralRange: a port from the ephemeral range can become another
// process's client port before etcd binds it ("address already in use" under a parallel go test).
func TestFreePortIsOutsideTheEphemeralRange(t *testing.T) {
	for range 20 {
		if p := FreePort(t); p < freePortLow || p > freePortHigh {
			t.Fatalf("FreePort gave %d, want %d-%d", p, freePortLow, freePortHigh)
		}
	}
}

// TestFreePortIsClaimed: a port FreePort gave is claimed until the test ends, so that a test
// binary of another package running at once does not draw it before it is bound.
func TestFreePortIsClaimed(t *testing.T) {
	var port int
	t.Run("draw", func(t *testing.T) {
		port = FreePort(t)
		if lock, ok := claimPort(port); ok {
			lock.Close()
			t.Fatalf("port %d could be claimed again while the test that drew it runs", port)
		}
	})
	lock, ok := claimPort(port)
	if !ok {
		t.Fatalf("port %d still claimed after the test that drew it ended", port)
	}
	lock.Close()
}

// TestStartAloneMovesOffATakenPort: a lone member whose client port another process took
// starts on other ports and says which.
func TestStartAloneMovesOffATakenPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	client := FreeURL(t)
	client.Host = taken.Addr().String()
	peer := FreeURL(t)
	cfg := Config("m-moved", t.TempDir(), peer, client)
	e := StartAlone(t, cfg)
	got := cfg.ListenClientUrls[0]
	if got.Host == taken.Addr().String() || e.Clients[0].Addr().String() != got.Host {
		t.Fatalf("started with client URL %s, listening on %s; want off the taken %s", got.String(), e.Clients[0].Addr(), taken.Addr())
	}
	if cfg.AdvertisePeerUrls[0] != peer {
		t.Fatalf("advertised peer URL %s, want %s kept", cfg.AdvertisePeerUrls[0].String(), peer.String())
	}
}
