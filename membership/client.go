package membership

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"etcdops.dev/etcdops/etcdstate"
)

// memberClient asks one member endpoint, over its cluster's channel: every call carries the
// endpoint's address, and the channel's balancer sends it to exactly that member.
type memberClient struct {
	endpoint etcdstate.Endpoint
	addr     string
	kv       pb.KVClient
	cluster  pb.ClusterClient
	maint    pb.MaintenanceClient
	auth     pb.AuthClient
	// token is the cluster's auth token, shared by its members' clients.
	token *authToken

	mu     sync.Mutex
	missed int       // observations in a row this endpoint did not answer
	until  time.Time // till then it is not waited for
}

// status asks the member for its Status.
func (m *memberClient) status(ctx context.Context) (st *clientv3.StatusResponse, err error) {
	err = m.call(ctx, func(ctx context.Context) error {
		resp, err := m.maint.Status(ctx, &pb.StatusRequest{})
		st = (*clientv3.StatusResponse)(resp)
		return err
	})
	return st, err
}

// readLocally reads a key serializably, from the member's own store, without logging in:
// while etcd's auth is on the member refuses it (authOn), which still shows that it serves.
// It refuses it for want of a user, or, over client TLS, as the user its certificate's
// common name names, which has no permission on the key (etcd takes that name for the user
// of a call without a token). Read so, it needs no permission on any key.
func (m *memberClient) readLocally(ctx context.Context) (authOn bool, err error) {
	err = m.callAnonymous(ctx, func(ctx context.Context) error {
		_, err := m.kv.Range(ctx, &pb.RangeRequest{Key: []byte("health"), Serializable: true})
		return err
	})
	if errors.Is(err, rpctypes.ErrUserEmpty) || errors.Is(err, rpctypes.ErrPermissionDenied) {
		return true, nil
	}
	return false, err
}

// authenticate logs in as login at this member: its token, or "" when auth is off.
func (m *memberClient) authenticate(ctx context.Context, login etcdstate.Login) (string, error) {
	var token string
	err := m.callAnonymous(ctx, func(ctx context.Context) error {
		resp, err := m.auth.Authenticate(ctx, &pb.AuthenticateRequest{Name: login.User, Password: login.Password})
		if err == nil {
			token = resp.Token
		}
		return err
	})
	if errors.Is(err, rpctypes.ErrAuthNotEnabled) {
		return "", nil
	}
	return token, err
}

// authToken is a cluster's auth token: set by a login, dropped when a member refuses it.
type authToken struct {
	mu    sync.Mutex
	token string
}

func (t *authToken) get() string {
	if t == nil {
		return ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.token
}

func (t *authToken) set(token string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.token = token
}

// memberList reads the member list, linearizably unless serializable.
func (m *memberClient) memberList(ctx context.Context, serializable bool) (list *clientv3.MemberListResponse, err error) {
	err = m.call(ctx, func(ctx context.Context) error {
		resp, err := m.cluster.MemberList(ctx, &pb.MemberListRequest{Linearizable: !serializable})
		list = (*clientv3.MemberListResponse)(resp)
		return err
	})
	return list, err
}

// call makes one call to the member under ctx, which ends it as usual, but without sending
// ctx's deadline along: a deadline goes on the wire as a grpc-timeout header whose value
// differs on every call, and HTTP/2's header compression keeps each new value in the tables
// of both ends of a held connection, up to 4 KB each, for values never sent again (about
// 3 KB a connection less, measured). The member learns that the hook stopped waiting from
// the stream's cancellation instead.
// With a token and not anonymous, the call is made as its user; a token the member refuses
// (expired, or auth turned off and on again) is dropped, for the next observation to log in
// again.
func (m *memberClient) call(ctx context.Context, do func(context.Context) error) error {
	return m.callAs(ctx, m.token.get(), do)
}

// callAnonymous makes the call without the token.
func (m *memberClient) callAnonymous(ctx context.Context, do func(context.Context) error) error {
	return m.callAs(ctx, "", do)
}

func (m *memberClient) callAs(ctx context.Context, tok string, do func(context.Context) error) error {
	callCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	callCtx = toMember(callCtx, m.addr)
	if tok != "" {
		callCtx = metadata.AppendToOutgoingContext(callCtx, rpctypes.TokenFieldNameGRPC, tok)
	}
	err := callError(ctx, do(callCtx))
	if tok != "" && (errors.Is(err, rpctypes.ErrInvalidAuthToken) || errors.Is(err, rpctypes.ErrAuthOldRevision)) {
		m.token.set("")
	}
	return err
}

// callError gives etcd's errors as clientv3 does: the server's by their etcd text, and a call
// ended by its context as the context's error.
func callError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		if code := status.Code(err); code == codes.Canceled || code == codes.DeadlineExceeded {
			return ctx.Err()
		}
	}
	return rpctypes.Error(err)
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

// clusterChannels are the channels of one cluster's members: one for those asked over TLS,
// one for the others (a cluster moving to TLS has both).
type clusterChannels []*grpc.ClientConn

// newClusterClients builds the clients of req's endpoints. Creation does not dial; a
// channel's first call connects it to every member, and it reconnects with a short back-off so a member that comes back is seen on the next observation. An endpoint says
// whether its member is asked over TLS; with no TLS material for it, the server is still
// verified (against the system's roots), so the member is reported unreachable, not trusted.
func newClusterClients(req etcdstate.Request, connectTimeout time.Duration, dial dialFunc, extra ...grpc.DialOption) ([]*memberClient, clusterChannels, error) {
	var plain, secure []resolver.Address
	for _, ep := range req.Endpoints {
		addr, serverName := dialTarget(ep)
		if serverName == "" {
			// The certificate is checked for the dialled host, as for a client of its own.
			serverName, _, _ = net.SplitHostPort(addr)
		}
		if ep.TLS {
			secure = append(secure, resolver.Address{Addr: addr, ServerName: serverName})
		} else {
			plain = append(plain, resolver.Address{Addr: addr})
		}
	}
	var channels clusterChannels
	open := func(addrs []resolver.Address, creds credentials.TransportCredentials, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
		if len(addrs) == 0 {
			return nil, nil
		}
		cc, err := newChannel(addrs, creds, connectTimeout, dial, slices.Concat(opts, extra))
		if err == nil {
			channels = append(channels, cc)
		}
		return cc, err
	}
	plainCC, err := open(plain, insecure.NewCredentials())
	if err != nil {
		return nil, nil, err
	}
	var secureCC *grpc.ClientConn
	if len(secure) > 0 {
		t := req.TLS
		if t == nil {
			t = &etcdstate.TLS{}
		}
		tc, err := tlsConfig(t)
		if err != nil {
			channels.close()
			return nil, nil, err
		}
		if secureCC, err = open(secure, credentials.NewTLS(tc), grpc.WithReadBufferSize(tlsReadBuffer)); err != nil {
			channels.close()
			return nil, nil, err
		}
	}
	token := &authToken{}
	members := make([]*memberClient, 0, len(req.Endpoints))
	for _, ep := range req.Endpoints {
		cc := plainCC
		if ep.TLS {
			cc = secureCC
		}
		addr, _ := dialTarget(ep)
		members = append(members, &memberClient{endpoint: ep, addr: addr, token: token,
			kv: pb.NewKVClient(cc), cluster: pb.NewClusterClient(cc), maint: pb.NewMaintenanceClient(cc), auth: pb.NewAuthClient(cc)})
	}
	return members, channels, nil
}

// tlsReadBuffer is the read buffer of a connection over TLS. grpc-go shares pooled read
// buffers between connections only on raw sockets; over TLS each connection keeps its own,
// 32 KiB by default, for answers to an observation that are a few hundred bytes. At 8 KiB a
// held TLS connection costs about 65 KB of RSS instead of 85 KB
// (BenchmarkMemberConnections/observer+tls).
const tlsReadBuffer = 8 << 10

// newChannel is a channel to every address, each call going to the member its context names.
// Keep-alive pings every 10 s, unanswered for 5 s, notice a member gone silent between
// observations.
func newChannel(addrs []resolver.Address, creds credentials.TransportCredentials, connectTimeout time.Duration, dial dialFunc, extra []grpc.DialOption) (*grpc.ClientConn, error) {
	r := manual.NewBuilderWithScheme("etcdops-members")
	r.InitialState(resolver.State{Addresses: addrs})
	opts := []grpc.DialOption{
		grpc.WithResolvers(r),
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"` + memberBalancerName + `":{}}]}`),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: connectTimeout,
		}),
	}
	if dial != nil {
		opts = append(opts, grpc.WithContextDialer(dial))
	}
	opts = append(opts, extra...)
	cc, err := grpc.NewClient(r.Scheme()+":///members", opts...)
	if err != nil {
		return nil, fmt.Errorf("channel to %s: %w", addrs[0].Addr, err)
	}
	return cc, nil
}

func (cs clusterChannels) close() {
	for _, cc := range cs {
		cc.Close()
	}
}

// dialFunc connects to host:port, as grpc.WithContextDialer takes it.
type dialFunc = func(ctx context.Context, addr string) (net.Conn, error)

// clusterClients are the clients of one etcdstate.Request, shared by concurrent observations.
type clusterClients struct {
	key      string
	members  []*memberClient
	channels clusterChannels
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

func (c *clusterClients) close() { c.channels.close() }

// logIn gets the cluster a token when it has none, from the first member that answers; while
// auth is off there is none to get, and each observation asks again (a login without raft's
// log: etcd answers that auth is off from its own state).
// Each member is given perTry: one that hangs must not use up the observation's deadline.
func (c *clusterClients) logIn(ctx context.Context, login etcdstate.Login, perTry time.Duration) {
	if len(c.members) == 0 || c.members[0].token.get() != "" {
		return
	}
	for _, m := range c.members {
		tryCtx, cancel := context.WithTimeout(ctx, perTry)
		tok, err := m.authenticate(tryCtx, login)
		cancel()
		if err == nil {
			m.token.set(tok)
			return
		}
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
	if req.Login != nil {
		fmt.Fprintf(h, "login %q %x\n", req.Login.User, sha256.Sum256([]byte(req.Login.Password)))
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

	members, channels, err := newClusterClients(req, c.connectTimeout, c.dial)
	if err != nil {
		return nil, err
	}
	fresh := &clusterClients{key: key, lastUsed: now, users: 1, members: members, channels: channels}

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
