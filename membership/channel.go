package membership

import (
	"context"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"
)

// A cluster's members are observed over one gRPC channel, not a channel each: the channel's
// resolver and balancer goroutines and state are shared, and a held member connection costs
// a third less memory (BENCHMARKS.md). Each call must still reach exactly the member it asks
// about, so the channel's balancer, memberBalancer, connects to every member and picks the
// one the call's context names (toMember), failing at once when that member cannot be
// reached, as a channel of its own would with a fail-fast call.

// memberBalancerName is the load-balancing policy the observer's channels name.
const memberBalancerName = "etcdops_member"

func init() { balancer.Register(memberBalancerBuilder{}) }

// memberKey is the context key of the member address a call is for.
type memberKey struct{}

// toMember directs the calls made with ctx to the member at addr.
func toMember(ctx context.Context, addr string) context.Context {
	return context.WithValue(ctx, memberKey{}, addr)
}

type memberBalancerBuilder struct{}

func (memberBalancerBuilder) Name() string { return memberBalancerName }

func (memberBalancerBuilder) Build(cc balancer.ClientConn, _ balancer.BuildOptions) balancer.Balancer {
	return &memberBalancer{cc: cc, subConns: map[string]*memberSubConn{}}
}

// memberBalancer keeps one SubConn per member address, each connected and reconnected on its
// own. gRPC calls its methods and the SubConns' state listeners one at a time.
type memberBalancer struct {
	cc       balancer.ClientConn
	subConns map[string]*memberSubConn
}

// memberSubConn is one member's SubConn and the state it last reported.
type memberSubConn struct {
	sc    balancer.SubConn
	state connectivity.State
	err   error
}

func (b *memberBalancer) UpdateClientConnState(s balancer.ClientConnState) error {
	seen := map[string]bool{}
	for _, a := range s.ResolverState.Addresses {
		seen[a.Addr] = true
		if _, ok := b.subConns[a.Addr]; ok {
			continue
		}
		m := &memberSubConn{state: connectivity.Idle}
		sc, err := b.cc.NewSubConn([]resolver.Address{a}, balancer.NewSubConnOptions{
			StateListener: func(st balancer.SubConnState) { b.updateState(m, st) },
		})
		if err != nil {
			return err
		}
		m.sc = sc
		b.subConns[a.Addr] = m
		sc.Connect()
	}
	for addr, m := range b.subConns {
		if !seen[addr] {
			m.sc.Shutdown()
			delete(b.subConns, addr)
		}
	}
	b.publish()
	return nil
}

// updateState records a SubConn's new state. One gone idle (after a lost connection and its
// back-off) is connected again at once: its member is asked on every observation.
func (b *memberBalancer) updateState(m *memberSubConn, st balancer.SubConnState) {
	if st.ConnectivityState == connectivity.Shutdown {
		return
	}
	m.state, m.err = st.ConnectivityState, st.ConnectionError
	if m.state == connectivity.Idle {
		m.sc.Connect()
	}
	b.publish()
}

// publish hands gRPC a picker over the SubConns' current states, and the channel's state:
// ready while any member is.
func (b *memberBalancer) publish() {
	p := memberPicker{}
	state := connectivity.TransientFailure
	for addr, m := range b.subConns {
		p[addr] = *m
		switch {
		case m.state == connectivity.Ready:
			state = connectivity.Ready
		case state != connectivity.Ready && (m.state == connectivity.Connecting || m.state == connectivity.Idle):
			state = connectivity.Connecting
		}
	}
	b.cc.UpdateState(balancer.State{ConnectivityState: state, Picker: p})
}

func (b *memberBalancer) ResolverError(error) {}

// UpdateSubConnState is not called: every SubConn has a state listener.
func (b *memberBalancer) UpdateSubConnState(balancer.SubConn, balancer.SubConnState) {}

func (b *memberBalancer) Close() {
	for _, m := range b.subConns {
		m.sc.Shutdown()
	}
}

func (b *memberBalancer) ExitIdle() {
	for _, m := range b.subConns {
		if m.state == connectivity.Idle {
			m.sc.Connect()
		}
	}
}

// memberPicker sends each call to the SubConn of the member its context names. A member
// still connecting makes the call wait for the next picker; one that failed to connect fails
// the call with why.
type memberPicker map[string]memberSubConn

func (p memberPicker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	addr, _ := info.Ctx.Value(memberKey{}).(string)
	m, ok := p[addr]
	switch {
	case !ok:
		return balancer.PickResult{}, status.Errorf(codes.Internal, "no connection to member address %q on this channel", addr)
	case m.state == connectivity.Ready:
		return balancer.PickResult{SubConn: m.sc}, nil
	case m.state == connectivity.TransientFailure:
		return balancer.PickResult{}, status.Error(codes.Unavailable, connectionError(m.err))
	}
	return balancer.PickResult{}, balancer.ErrNoSubConnAvailable
}

func connectionError(err error) string {
	if err == nil {
		return "connection failed"
	}
	return err.Error()
}
