package membership

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"etcdops.dev/etcdops/etcdstate"
)

// connCostEnv, when set, makes this test binary the process whose connections
// BenchmarkMemberConnections measures: "<kind> <per endpoint> <endpoint>,<endpoint>,...".
const connCostEnv = "ETCDOPS_CONNCOST"

func TestMain(m *testing.M) {
	if spec := os.Getenv(connCostEnv); spec != "" {
		if err := connCost(spec); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// BenchmarkMemberConnections measures what it costs the hook to keep member connections
// open, which is what its client cache does for every cluster it serves. A process of its
// own (this test binary again) opens b.N connections to each member of a 3-member cluster,
// makes one Status call on each, and reports, after a GC, the live heap, the goroutine
// stacks, the goroutines and the resident set it grew by, per connection: "observer" with
// the observer's own member clients, "grpc" with bare gRPC connections and the same
// keep-alive, for comparison, and "channel" with one gRPC channel per cluster that balances
// over its three members (what a client that picks the member per call would hold).
//
//	go test ./membership -run '^$' -bench BenchmarkMemberConnections -benchtime 1000x
func BenchmarkMemberConnections(b *testing.B) {
	c := newTestCluster(b, 3, nil)
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.clientURL.Host)
	}
	for _, kind := range []string{"observer", "grpc", "channel"} {
		b.Run(kind, func(b *testing.B) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %s", connCostEnv, kind, b.N, strings.Join(eps, ",")))
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			if err != nil {
				b.Fatalf("%s connections: %v", kind, err)
			}
			var heap, stack, goroutines, rss, conns float64
			if _, err := fmt.Sscanf(string(out), "heap=%g stack=%g goroutines=%g rss=%g conns=%g", &heap, &stack, &goroutines, &rss, &conns); err != nil {
				b.Fatalf("%s connections: %q: %v", kind, out, err)
			}
			b.ReportMetric(heap/conns, "heap-B/conn")
			b.ReportMetric(stack/conns, "stack-B/conn")
			b.ReportMetric(rss/conns, "rss-B/conn")
			b.ReportMetric(goroutines/conns, "goroutines/conn")
		})
	}
}

// connCost is the measured process: it opens the connections spec names, keeps them open,
// and prints what they cost it.
func connCost(spec string) error {
	var kind, list string
	var perEndpoint int
	if _, err := fmt.Sscanf(spec, "%s %d %s", &kind, &perEndpoint, &list); err != nil {
		return fmt.Errorf("%s=%q: %v", connCostEnv, spec, err)
	}
	before := memory()
	var open []func() error
	eps := strings.Split(list, ",")
	for range perEndpoint {
		if kind == "channel" {
			closer, err := openChannel(eps)
			if err != nil {
				return err
			}
			open = append(open, closer)
			continue
		}
		for _, ep := range eps {
			closer, err := openConn(kind, ep)
			if err != nil {
				return err
			}
			open = append(open, closer)
		}
	}
	conns := len(open)
	if kind == "channel" {
		conns *= len(eps)
	}
	after := memory()
	fmt.Printf("heap=%d stack=%d goroutines=%d rss=%d conns=%d\n",
		after.heap-before.heap, after.stack-before.stack, after.goroutines-before.goroutines, after.rss-before.rss, conns)
	for _, c := range open {
		_ = c()
	}
	return nil
}

func openConn(kind, ep string) (func() error, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	switch kind {
	case "observer":
		m, err := newMemberClient(etcdstate.Endpoint{Member: "m", Address: ep}, nil, time.Second, nil)
		if err != nil {
			return nil, err
		}
		if _, err := m.maint.Status(ctx, ""); err != nil {
			return nil, err
		}
		return m.cli.Close, nil
	case "grpc":
		conn, err := grpc.NewClient(ep, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}))
		if err != nil {
			return nil, err
		}
		if _, err := pb.NewMaintenanceClient(conn).Status(ctx, &pb.StatusRequest{}); err != nil {
			return nil, err
		}
		return conn.Close, nil
	}
	return nil, fmt.Errorf("unknown connection kind %q", kind)
}

// openChannel opens one channel to every endpoint, round-robin over them, and waits until
// each has answered a Status.
func openChannel(eps []string) (func() error, error) {
	r := manual.NewBuilderWithScheme("conncost")
	var addrs []resolver.Address
	for _, ep := range eps {
		addrs = append(addrs, resolver.Address{Addr: ep})
	}
	r.InitialState(resolver.State{Addresses: addrs})
	conn, err := grpc.NewClient(r.Scheme()+":///cluster", grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	answered := map[string]bool{}
	for len(answered) < len(eps) {
		var p peer.Peer
		if _, err := pb.NewMaintenanceClient(conn).Status(ctx, &pb.StatusRequest{}, grpc.Peer(&p), grpc.WaitForReady(true)); err != nil {
			conn.Close()
			return nil, err
		}
		answered[p.Addr.String()] = true
	}
	return conn.Close, nil
}

type usage struct{ heap, stack, goroutines, rss int64 }

// memory is the process's live heap and stacks after a GC, its goroutines and its resident set.
func memory() usage {
	time.Sleep(500 * time.Millisecond) // connections' goroutines settle
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	u := usage{heap: int64(ms.HeapAlloc), stack: int64(ms.StackInuse), goroutines: int64(runtime.NumGoroutine())}
	status, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			u.rss = kb << 10
		}
	}
	return u
}
