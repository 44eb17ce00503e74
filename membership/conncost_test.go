package membership

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"etcdops.dev/etcdops/etcdstate"
)

// connCostEnv, when set, makes this test binary the process whose connections
// BenchmarkMemberConnections measures: "<kind> <per endpoint> <endpoint>,<endpoint>,...".
const connCostEnv = "ETCDOPS_CONNCOST"

// connTLSEnv is, for the kind tlsKind, the directory holding the client's TLS material as
// PEM files: ca.crt, client.crt and client.key.
const connTLSEnv = "ETCDOPS_CONNCOST_TLS"

// tlsKind is the observer's clients over client TLS, with a client certificate.
const tlsKind = "observer+tls"

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
// own (this test binary again) opens the connections of b.N 3-member clusters, makes one
// Status call to each member, and reports, after a GC, the live heap, the goroutine stacks,
// the goroutines and the resident set it grew by, per member connection; then the median
// time of one Status on a held connection and the process's CPU time per Status, over up to
// 300 of them: "observer" with the observer's own clients (a channel per cluster),
// "observer+NAME" with the dial options of connVariants[NAME] added, one at a time,
// "observer+tls" with the observer's own clients over client TLS, as the hook asks a cluster
// whose members require client certificates (a cluster of that kind, started for it),
// "clientv3" with a clientv3 client per member and the same keep-alive (what the observer
// held before it shared a channel per cluster), and "grpc" with a bare gRPC connection per
// member, for comparison.
//
//	go test ./membership -run '^$' -bench BenchmarkMemberConnections -benchtime 1000x
func BenchmarkMemberConnections(b *testing.B) {
	c := newTestCluster(b, 3, nil)
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.clientURL.Host)
	}
	kinds := []string{"observer"}
	for _, v := range connVariants {
		kinds = append(kinds, "observer+"+v.name)
	}
	for _, kind := range append(kinds, tlsKind, "clientv3", "grpc") {
		b.Run(kind, func(b *testing.B) {
			runEps, env := eps, os.Environ()
			if kind == tlsKind {
				var dir string
				runEps, dir = tlsCluster(b)
				env = append(env, connTLSEnv+"="+dir)
				b.ResetTimer()
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(env, fmt.Sprintf("%s=%s %d %s", connCostEnv, kind, b.N, strings.Join(runEps, ",")))
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			if err != nil {
				b.Fatalf("%s connections: %v", kind, err)
			}
			var heap, stack, goroutines, rss, conns, status, cpu float64
			if _, err := fmt.Sscanf(string(out), "heap=%g stack=%g goroutines=%g rss=%g conns=%g status=%g cpu=%g", &heap, &stack, &goroutines, &rss, &conns, &status, &cpu); err != nil {
				b.Fatalf("%s connections: %q: %v", kind, out, err)
			}
			b.ReportMetric(heap/conns, "heap-B/conn")
			b.ReportMetric(stack/conns, "stack-B/conn")
			b.ReportMetric(rss/conns, "rss-B/conn")
			b.ReportMetric(goroutines/conns, "goroutines/conn")
			b.ReportMetric(status, "status-µs")
			b.ReportMetric(cpu, "cpu-µs/status")
		})
	}
}

// tlsCluster starts a 3-member cluster that requires client certificates, for one run of
// the kind tlsKind, and writes the client's TLS material to a directory for the measured
// process: the members' client addresses, and that directory.
func tlsCluster(b *testing.B) ([]string, string) {
	pki := newTestPKI(b)
	c := newTestCluster(b, 3, pki)
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.clientURL.Host)
	}
	dir := b.TempDir()
	for name, data := range map[string][]byte{"ca.crt": pki.clientTLS.CA, "client.crt": pki.clientTLS.Cert, "client.key": pki.clientTLS.Key} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	return eps, dir
}

// readClientTLS is the client TLS material in dir (connTLSEnv).
func readClientTLS(dir string) (*etcdstate.TLS, error) {
	if dir == "" {
		return nil, fmt.Errorf("%s needs %s", tlsKind, connTLSEnv)
	}
	var t etcdstate.TLS
	for name, into := range map[string]*[]byte{"ca.crt": &t.CA, "client.crt": &t.Cert, "client.key": &t.Key} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		*into = data
	}
	return &t, nil
}

// connCost is the measured process: it opens the connections spec names, keeps them open,
// and prints what they cost it.
func connCost(spec string) error {
	var kind, list string
	var perEndpoint int
	if _, err := fmt.Sscanf(spec, "%s %d %s", &kind, &perEndpoint, &list); err != nil {
		return fmt.Errorf("%s=%q: %v", connCostEnv, spec, err)
	}
	var clientTLS *etcdstate.TLS
	if kind == tlsKind {
		var err error
		if clientTLS, err = readClientTLS(os.Getenv(connTLSEnv)); err != nil {
			return err
		}
	}
	before := memory()
	var open []conn
	eps := strings.Split(list, ",")
	for range perEndpoint {
		cluster, err := openCluster(kind, eps, clientTLS)
		if err != nil {
			return err
		}
		open = append(open, cluster...)
	}
	conns := len(open)
	after := memory()
	if path := os.Getenv(connHeapEnv); path != "" {
		if err := writeHeap(path); err != nil {
			return err
		}
	}
	status, cpu, err := statusMicros(open)
	if err != nil {
		return err
	}
	fmt.Printf("heap=%d stack=%d goroutines=%d rss=%d conns=%d status=%.0f cpu=%.0f\n",
		after.heap-before.heap, after.stack-before.stack, after.goroutines-before.goroutines, after.rss-before.rss, conns, status, cpu)
	for _, c := range open {
		_ = c.close()
	}
	return nil
}

// connHeapEnv, when set, is where the measured process writes its heap profile, taken when
// every connection is open: what holds a connection's memory.
//
//	ETCDOPS_CONNCOST_HEAP=/tmp/conn.heap go test ./membership -run '^$' -bench 'BenchmarkMemberConnections/observer$' -benchtime 1000x
const connHeapEnv = "ETCDOPS_CONNCOST_HEAP"

func writeHeap(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// conn is one held member connection: a Status over it, and its close.
type conn struct {
	status func(context.Context) error
	close  func() error
}

// statusMicros is the median time of one Status on a held connection, and the process's CPU
// time per Status, over up to 300 of them spread across all: what a sync pays per member on
// the connections it holds.
func statusMicros(open []conn) (wall, cpu float64, err error) {
	step := max(1, len(open)/300)
	var took []time.Duration
	cpu0 := cpuTime()
	for i := 0; i < len(open); i += step {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		t0 := time.Now()
		err := open[i].status(ctx)
		took = append(took, time.Since(t0))
		cancel()
		if err != nil {
			return 0, 0, err
		}
	}
	cpu = float64((cpuTime() - cpu0).Nanoseconds()) / 1e3 / float64(len(took))
	slices.Sort(took)
	return float64(took[len(took)/2].Nanoseconds()) / 1e3, cpu, nil
}

// cpuTime is the user and system CPU time the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// connVariants are dial options tried on top of the observer's own, one at a time.
var connVariants = []struct {
	name string
	opts []grpc.DialOption
}{
	// Windows set to HTTP/2's default: the same flow control, without the BDP estimator that
	// pings after data and grows the windows.
	{"window", []grpc.DialOption{grpc.WithInitialWindowSize(65535), grpc.WithInitialConnWindowSize(65535)}},
	{"buffers", []grpc.DialOption{grpc.WithReadBufferSize(8 << 10), grpc.WithWriteBufferSize(8 << 10), grpc.WithSharedWriteBuffer(true)}},
	{"no-idle", []grpc.DialOption{grpc.WithIdleTimeout(0)}},
}

// openCluster opens the connections of kind to the members at eps, one conn per member,
// each having answered a Status; over TLS with clientTLS when set.
func openCluster(kind string, eps []string, clientTLS *etcdstate.TLS) ([]conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var open []conn
	if variant, ok := strings.CutPrefix(kind, "observer"); ok {
		var extra []grpc.DialOption
		for _, v := range connVariants {
			if variant == "+"+v.name {
				extra = v.opts
			}
		}
		req := etcdstate.Request{Key: "c", TLS: clientTLS}
		for i, ep := range eps {
			e := etcdstate.Endpoint{Member: fmt.Sprint("m", i), Address: ep}
			if clientTLS != nil {
				// Every member's certificate names localhost (testPKI); the hook names
				// each member's DNS name, which costs the same.
				e.ServerName, e.TLS = "localhost", true
			}
			req.Endpoints = append(req.Endpoints, e)
		}
		members, channels, err := newClusterClients(req, time.Second, nil, extra...)
		if err != nil {
			return nil, err
		}
		for i, m := range members {
			c := conn{status: func(ctx context.Context) error { _, err := m.status(ctx); return err }, close: func() error { return nil }}
			if i == 0 {
				c.close = func() error { channels.close(); return nil }
			}
			open = append(open, c)
		}
		return open, statusOfAll(ctx, open)
	}
	for _, ep := range eps {
		var c conn
		switch kind {
		case "clientv3":
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, Logger: zap.NewNop(), DialKeepAliveTime: 10 * time.Second, DialKeepAliveTimeout: 5 * time.Second})
			if err != nil {
				return nil, err
			}
			c = conn{status: func(ctx context.Context) error {
				_, err := pb.NewMaintenanceClient(cli.ActiveConnection()).Status(ctx, &pb.StatusRequest{})
				return err
			}, close: cli.Close}
		case "grpc":
			cc, err := grpc.NewClient(ep, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}))
			if err != nil {
				return nil, err
			}
			c = conn{status: func(ctx context.Context) error {
				_, err := pb.NewMaintenanceClient(cc).Status(ctx, &pb.StatusRequest{})
				return err
			}, close: cc.Close}
		default:
			return nil, fmt.Errorf("unknown connection kind %q", kind)
		}
		open = append(open, c)
	}
	return open, statusOfAll(ctx, open)
}

// statusOfAll asks every connection for a Status, so that each is connected.
func statusOfAll(ctx context.Context, open []conn) error {
	for _, c := range open {
		if err := c.status(ctx); err != nil {
			return err
		}
	}
	return nil
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
