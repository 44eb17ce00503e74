package membership

import (
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/test/etcdtest"
)

const (
	testElectionMs = etcdtest.ElectionMs
	testDeadline   = 2 * time.Second
)

// testMember is one embedded etcd member on loopback.
type testMember struct {
	name      string
	dir       string
	peerURL   url.URL
	clientURL url.URL
	etcd      *etcdtest.Etcd
	// proxy, when set, stands in front of clientURL, and the member advertises it.
	proxy *answerProxy
}

// testCluster is a set of embedded members; tests start, stop and add members explicitly.
type testCluster struct {
	t       testing.TB
	token   string
	pki     *testPKI
	strict  bool
	quota   int64
	proxied bool
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
	// proxied puts an answerProxy in front of each member (plain HTTP only).
	proxied bool
}

var freePort = etcdtest.FreePort

// slowTest skips, under -short (the inner loop, CONTRIBUTING.md), a test that takes seconds
// more than the package's others: a member down, hung or lost, waited out.
func slowTest(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: a slow test; the default run has it")
	}
}

// newTestCluster starts n voters as a brand-new cluster, with client TLS when pki is set.
func newTestCluster(t testing.TB, n int, pki *testPKI) *testCluster {
	t.Helper()
	return startTestCluster(t, clusterOptions{members: n, pki: pki})
}

func startTestCluster(t testing.TB, opts clusterOptions) *testCluster {
	t.Helper()
	c := &testCluster{t: t, token: fmt.Sprintf("test-%d", time.Now().UnixNano()), pki: opts.pki, strict: opts.strict, quota: opts.quota, proxied: opts.proxied}
	var cfgs []*embed.Config
	for i := range opts.members {
		cfgs = append(cfgs, c.config(c.newMember(fmt.Sprintf("m-%d", i))))
	}
	es := etcdtest.StartCluster(t, c.token, cfgs...)
	c.mu.Lock()
	for i, e := range es {
		c.members[i].etcd = e
	}
	c.mu.Unlock()
	return c
}

// newMember allocates a member's ports and data dir without starting it.
func (c *testCluster) newMember(name string) *testMember {
	m := &testMember{name: name, dir: c.t.TempDir(), peerURL: etcdtest.FreeURL(c.t), clientURL: etcdtest.FreeURL(c.t)}
	if c.pki != nil {
		m.clientURL.Scheme = "https"
	}
	if c.proxied {
		m.proxy = newAnswerProxy(c.t, m.clientURL.Host)
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

// config is how m runs in this cluster.
func (c *testCluster) config(m *testMember) *embed.Config {
	cfg := etcdtest.Config(m.name, m.dir, m.peerURL, m.clientURL)
	cfg.AdvertiseClientUrls = []url.URL{m.advertisedClientURL()}
	cfg.InitialClusterToken = c.token
	cfg.StrictReconfigCheck = c.strict
	cfg.QuotaBackendBytes = c.quota
	if c.pki != nil {
		cfg.ClientTLSInfo = c.pki.serverInfo(c.t, m.name)
	}
	return cfg
}

// start runs m and waits until it has joined.
func (c *testCluster) start(m *testMember, state, initial string) {
	c.t.Helper()
	cfg := c.config(m)
	cfg.ClusterState, cfg.InitialCluster = state, initial
	e := etcdtest.Start(c.t, cfg)
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
		e.Stop()
	}
}

// stopAll stops every member at once, as an outage would.
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
// server certificate carries, because operations dial the URLs of the member list. With a
// proxy it is the proxy's, so that those dials go through it too.
func (m *testMember) advertisedClientURL() url.URL {
	u := m.clientURL
	if m.proxy != nil {
		u.Host = m.proxy.addr()
	}
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
