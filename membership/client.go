package membership

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"etcdops.dev/etcdops/etcdstate"
)

// memberClient is one client per member endpoint: each member needs its own TLS server name,
// and Status must reach exactly that member over a connection that outlives the call.
type memberClient struct {
	endpoint etcdstate.Endpoint
	cli      *clientv3.Client
	maint    clientv3.Maintenance

	mu     sync.Mutex
	missed int       // observations in a row this endpoint did not answer
	until  time.Time // till then it is not waited for
}

// Back-off of an endpoint that missed observations: it is still asked every time, but
// hardly waited for, for 1s after the first miss, doubling up to 30s; then it gets one full
// wait again.
const (
	firstBackOff = time.Second
	maxBackOff   = 30 * time.Second
)

// backingOff reports whether the endpoint is not to be waited for at now, and after how many
// observations it missed.
func (m *memberClient) backingOff(now time.Time) (missed int, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.missed, now.Before(m.until)
}

// record notes whether the endpoint answered the observation that ended at now, and whether
// it was given the full wait: only a miss despite that backs it off further.
func (m *memberClient) record(answered, waited bool, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case answered:
		m.missed, m.until = 0, time.Time{}
		return
	case !waited:
		return
	}
	m.missed++
	m.until = now.Add(min(maxBackOff, firstBackOff<<min(m.missed-1, 5)))
}

// newMemberClient builds a client for one endpoint. Creation does not dial; retries are few
// because every call runs under the observer's single deadline, and the reconnect backoff is
// short so a member that comes back is seen on the next observation. The endpoint says
// whether its member is asked over TLS; with no TLS material for it, the server is still
// verified (against the system's roots), so the member is reported unreachable, not trusted.
func newMemberClient(ep etcdstate.Endpoint, t *etcdstate.TLS, connectTimeout time.Duration, dial dialFunc) (*memberClient, error) {
	cfg, err := memberConfig(ep, t, connectTimeout, dial)
	if err != nil {
		return nil, err
	}
	return memberClientOf(ep, cfg)
}

// memberConfig is the client configuration of one endpoint, for newMemberClient.
func memberConfig(ep etcdstate.Endpoint, t *etcdstate.TLS, connectTimeout time.Duration, dial dialFunc) (clientv3.Config, error) {
	addr, serverName := dialTarget(ep)
	cfg := clientv3.Config{
		Endpoints:            []string{"http://" + addr},
		Logger:               zap.NewNop(),
		MaxUnaryRetries:      1,
		BackoffWaitBetween:   10 * time.Millisecond,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{
			grpc.WithChainUnaryInterceptor(failFast),
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
				MinConnectTimeout: connectTimeout,
			}),
		},
	}
	if dial != nil {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithContextDialer(dial))
	}
	if ep.TLS {
		if t == nil {
			t = &etcdstate.TLS{}
		}
		tc, err := tlsConfig(t, serverName)
		if err != nil {
			return cfg, err
		}
		cfg.Endpoints = []string{"https://" + addr}
		cfg.TLS = tc
	}
	return cfg, nil
}

// memberClientOf builds the client of cfg for ep.
func memberClientOf(ep etcdstate.Endpoint, cfg clientv3.Config) (*memberClient, error) {
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", cfg.Endpoints[0], err)
	}
	maint := clientv3.NewMaintenanceFromMaintenanceClient(clientv3.RetryMaintenanceClient(cli, cli.ActiveConnection()), cli)
	return &memberClient{endpoint: ep, cli: cli, maint: maint}, nil
}

// dialFunc connects to host:port, as grpc.WithContextDialer takes it.
type dialFunc = func(ctx context.Context, addr string) (net.Conn, error)

// failFast overrides the client's wait-for-ready default, under which a call to a member that
// is down blocks until the deadline: a down member should be reported at once.
func failFast(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(ctx, method, req, reply, cc, append(opts, grpc.WaitForReady(false))...)
}

// clusterClients are the clients of one etcdstate.Request, shared by concurrent observations.
type clusterClients struct {
	key      string
	members  []*memberClient
	lastUsed time.Time
	users    int
	evicted  bool

	mu       sync.Mutex
	leader   string          // member that led at the last observation
	learners map[string]bool // members that were learners then
}

// listTarget is the endpoint to read the member list from: the last leader, which serves a
// linearizable read without forwarding it, else the first endpoint not known as a learner
// (learners refuse the member list).
func (c *clusterClients) listTarget() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := -1
	for i, m := range c.members {
		switch {
		case m.endpoint.Member == c.leader:
			return i
		case first < 0 && !c.learners[m.endpoint.Member]:
			first = i
		}
	}
	return max(first, 0)
}

// remember keeps who led and who was a learner for the next observation.
func (c *clusterClients) remember(snap etcdstate.Snapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leader = ""
	if l, ok := snap.Leader(); ok {
		c.leader = l.Name
	}
	c.learners = map[string]bool{}
	for _, m := range snap.Learners() {
		c.learners[m.Name] = true
	}
}

func (c *clusterClients) close() {
	for _, m := range c.members {
		m.cli.Close()
	}
}

// clientCache holds clients per cluster, least recently used first out, closing idle ones.
// An evicted entry still in use is closed by its last user.
type clientCache struct {
	mu             sync.Mutex
	max            int
	idle           time.Duration
	connectTimeout time.Duration
	dial           dialFunc
	entries        map[string]*clusterClients
	closed         bool
}

var errClosed = errors.New("observer closed")

// cacheKey covers everything a client is built from, so any change yields new clients.
func cacheKey(req etcdstate.Request) string {
	h := sha256.New()
	fmt.Fprintf(h, "%q\n", req.Key)
	for _, ep := range req.Endpoints {
		fmt.Fprintf(h, "%q %q %q %t\n", ep.Member, ep.Address, ep.ServerName, ep.TLS)
	}
	if req.TLS != nil {
		fmt.Fprintf(h, "tls %x %x %x\n", sha256.Sum256(req.TLS.CA), sha256.Sum256(req.TLS.Cert), sha256.Sum256(req.TLS.Key))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// acquire returns the clients for req, creating them when needed; pair with release.
func (c *clientCache) acquire(req etcdstate.Request, now time.Time) (*clusterClients, error) {
	key := cacheKey(req)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errClosed
	}
	if e, ok := c.entries[key]; ok {
		e.users++
		e.lastUsed = now
		c.mu.Unlock()
		return e, nil
	}
	c.mu.Unlock()

	fresh := &clusterClients{key: key, lastUsed: now, users: 1}
	for _, ep := range req.Endpoints {
		m, err := newMemberClient(ep, req.TLS, c.connectTimeout, c.dial)
		if err != nil {
			fresh.close()
			return nil, err
		}
		fresh.members = append(fresh.members, m)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		fresh.close()
		return nil, errClosed
	}
	if e, ok := c.entries[key]; ok {
		// Another observation built the same clients meanwhile; keep one set.
		fresh.close()
		e.users++
		e.lastUsed = now
		return e, nil
	}
	c.entries[key] = fresh
	c.evictOverflow()
	return fresh, nil
}

// release marks one use of e done at now.
func (c *clientCache) release(e *clusterClients, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.users--
	e.lastUsed = now
	if e.evicted && e.users == 0 {
		e.close()
	}
}

// evictOverflow drops least recently used entries beyond max. Caller holds mu.
func (c *clientCache) evictOverflow() {
	if len(c.entries) <= c.max {
		return
	}
	byAge := make([]*clusterClients, 0, len(c.entries))
	for _, e := range c.entries {
		byAge = append(byAge, e)
	}
	sort.Slice(byAge, func(i, j int) bool { return byAge[i].lastUsed.Before(byAge[j].lastUsed) })
	for _, e := range byAge[:len(byAge)-c.max] {
		c.evict(e)
	}
}

// evict removes e from the cache and closes it unless someone still uses it. Caller holds mu.
func (c *clientCache) evict(e *clusterClients) {
	delete(c.entries, e.key)
	e.evicted = true
	if e.users == 0 {
		e.close()
	}
}

// sweep evicts entries unused for longer than the idle timeout.
func (c *clientCache) sweep(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		if e.users == 0 && now.Sub(e.lastUsed) > c.idle {
			c.evict(e)
		}
	}
}

// closeAll evicts every entry and refuses new ones.
func (c *clientCache) closeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for _, e := range c.entries {
		c.evict(e)
	}
}

// size is the number of cached clusters.
func (c *clientCache) size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
