package membership

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"etcdops.dev/etcdops/etcdstate"
)

// Timings small enough for a fast suite and large enough for a loaded two-core machine.
const (
	testTickMs     = 20
	testElectionMs = 200
	testDeadline   = 2 * time.Second
)

// testMember is one embedded etcd member on loopback.
type testMember struct {
	name      string
	dir       string
	peerURL   url.URL
	clientURL url.URL
	etcd      *embed.Etcd
}

// testCluster is a set of embedded members; tests start, stop and add members explicitly.
type testCluster struct {
	t       testing.TB
	token   string
	pki     *testPKI
	strict  bool
	quota   int64
	mu      sync.Mutex
	members []*testMember
}

// clusterOptions shape a test cluster. Strict turns on etcd's own reconfiguration checks
// (its default), which refuse changes until members have been connected for five seconds;
// most tests leave it off to stay fast and test the operator's own checks.
type clusterOptions struct {
	members int
	pki     *testPKI
	strict  bool
	// quota is --quota-backend-bytes; etcd's default when 0.
	quota int64
}

// freePort asks the kernel for an unused loopback port.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// newTestCluster starts n voters as a brand-new cluster, with client TLS when pki is set.
func newTestCluster(t testing.TB, n int, pki *testPKI) *testCluster {
	t.Helper()
	return startTestCluster(t, clusterOptions{members: n, pki: pki})
}

func startTestCluster(t testing.TB, opts clusterOptions) *testCluster {
	t.Helper()
	c := &testCluster{t: t, token: fmt.Sprintf("test-%d", time.Now().UnixNano()), pki: opts.pki, strict: opts.strict, quota: opts.quota}
	t.Cleanup(c.stopAll)
	for i := range opts.members {
		c.newMember(fmt.Sprintf("m-%d", i))
	}
	initial := c.initialCluster()
	var wg sync.WaitGroup
	for _, m := range c.members {
		wg.Go(func() { c.start(m, embed.ClusterStateFlagNew, initial) })
	}
	wg.Wait()
	return c
}

// newMember allocates a member's ports and data dir without starting it.
func (c *testCluster) newMember(name string) *testMember {
	scheme := "http"
	if c.pki != nil {
		scheme = "https"
	}
	m := &testMember{
		name:      name,
		dir:       c.t.TempDir(),
		peerURL:   url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", freePort(c.t))},
		clientURL: url.URL{Scheme: scheme, Host: fmt.Sprintf("127.0.0.1:%d", freePort(c.t))},
	}
	c.mu.Lock()
	c.members = append(c.members, m)
	c.mu.Unlock()
	return m
}

// initialCluster lists every member allocated so far as name=peerURL.
func (c *testCluster) initialCluster() string {
	var parts []string
	for _, m := range c.members {
		parts = append(parts, m.name+"="+m.peerURL.String())
	}
	return strings.Join(parts, ",")
}

// start runs m and waits until it has joined.
func (c *testCluster) start(m *testMember, state, initial string) {
	c.t.Helper()
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = m.dir
	cfg.TickMs = testTickMs
	cfg.ElectionMs = testElectionMs
	cfg.ListenPeerUrls = []url.URL{m.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{m.peerURL}
	cfg.ListenClientUrls = []url.URL{m.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{m.advertisedClientURL()}
	cfg.ListenMetricsUrls = nil
	cfg.InitialCluster = initial
	cfg.ClusterState = state
	cfg.InitialClusterToken = c.token
	cfg.StrictReconfigCheck = c.strict
	cfg.QuotaBackendBytes = c.quota
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	if c.pki != nil {
		cfg.ClientTLSInfo = c.pki.serverInfo(c.t, m.name)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		c.t.Fatalf("start %s: %v", m.name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		c.t.Fatalf("start %s: %v", m.name, err)
	case <-time.After(20 * time.Second):
		e.Close()
		c.t.Fatalf("start %s: not ready after 20s", m.name)
	}
	c.mu.Lock()
	m.etcd = e
	c.mu.Unlock()
}

// stop closes m's etcd, keeping its data dir.
func (c *testCluster) stop(m *testMember) {
	c.mu.Lock()
	e := m.etcd
	m.etcd = nil
	c.mu.Unlock()
	if e != nil {
		// A hard stop skips the leadership hand-off a graceful stop attempts.
		e.Server.HardStop()
		e.Close()
	}
}

func (c *testCluster) stopAll() {
	var wg sync.WaitGroup
	for _, m := range c.members {
		wg.Go(func() { c.stop(m) })
	}
	wg.Wait()
}

// endpoint is how the hook would describe m: the address to dial and the name to verify.
func (c *testCluster) endpoint(m *testMember) etcdstate.Endpoint {
	return etcdstate.Endpoint{Member: m.name, Address: m.clientURL.Host, ServerName: m.name + ".etcd.test", TLS: c.pki != nil}
}

// request describes the given members (all when none are given) for Observe.
func (c *testCluster) request(ms ...*testMember) etcdstate.Request {
	if len(ms) == 0 {
		ms = c.members
	}
	req := etcdstate.Request{Key: c.token}
	for _, m := range ms {
		req.Endpoints = append(req.Endpoints, c.endpoint(m))
	}
	if c.pki != nil {
		req.TLS = c.pki.clientTLS
	}
	return req
}

// leader is the member whose server says it leads, waiting through an election.
func (c *testCluster) leader() *testMember {
	c.t.Helper()
	for range 200 {
		for _, m := range c.members {
			if m.etcd != nil && m.etcd.Server.Leader() == m.etcd.Server.MemberID() {
				return m
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatal("no leader after 4s")
	return nil
}

// advertisedClientURL is what the member list shows. With TLS it names localhost, which the
// server certificate carries, because operations dial the URLs of the member list.
func (m *testMember) advertisedClientURL() url.URL {
	u := m.clientURL
	if u.Scheme == "https" {
		u.Host = "localhost:" + u.Port()
	}
	return u
}

// clientURLs are the advertised client URLs of ms, as the member tool gets them.
func clientURLs(ms ...*testMember) []string {
	var out []string
	for _, m := range ms {
		u := m.advertisedClientURL()
		out = append(out, u.String())
	}
	return out
}

// id is m's member ID; m must be running.
func (m *testMember) id() uint64 { return uint64(m.etcd.Server.MemberID()) }
