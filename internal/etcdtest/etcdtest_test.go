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
