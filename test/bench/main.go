// Command bench is the load driver of the benchmark suite (see BENCHMARKS.md). It brings
// clusters of 3 and 5 members, each member a real etcd server process of the operator's
// default release, to a steady state through the test harness (the closed loop of
// test/README.md), captures the sync request Metacontroller would send, and then measures, in
// one run on this machine:
//
//   - the floor: from a process of its own that does nothing else (`bench floor`), a warm
//     clientv3 client per member asking Status of every member and the linearizable member
//     list of the leader, all at once, as one operation;
//   - the hook's calls alone: the same from another such process, with the hook's health
//     read of every member added (a serializable read), so every etcd call a sync makes;
//   - /sync over HTTP to the hook in a process of its own, sequentially and at 8 and 32
//     concurrent clients, with the hook's allocations per request;
//   - a cluster whose pods nobody listens for (unreachable), and one whose member hangs;
//   - 1,000 clusters synced round-robin, on a hook process of their own: its RSS,
//     goroutines and latency per pass, and each held cluster's share of the RSS grown over
//     the hook just started, against three member connections alone (-conn-rss); then half
//     of them only, until the others idled out, and what the hook holds then.
//
// With -tls the members serve client TLS and require a client certificate, which the hook
// and the floor present, as a cluster with spec.tls runs.
//
// The floor, the hook's calls and /sync of each size and client count are measured
// interleaved, not one phase after the other: -rounds rounds (10), each a block of n/rounds
// floor operations, one of as many calls and one of as many syncs (2n/rounds at 8 and 32
// clients), each kind first in turn. When the phases ran one after the other, a slow spell
// of a few hundred milliseconds (a member's fsync or snapshot, a collection) fell on one
// phase and not the other: the one-client p99 is the tenth slowest of 1,000, and its ratio
// to the floor moved between 1.24× and 2.71× across runs of one tree. Ten rounds make the
// one-client blocks 100 operations, a fraction of a second, short beside such a spell, and
// the 32-client blocks 200, long enough for most of a block to run at full concurrency and
// for the scrapes of /metrics around each /sync block to add under 1 % to the allocations
// per request (about one scrape a block: some 1,100 allocations and 130 KB, against some
// 3,200 and 260 KB a sync).
//
// Each block starts with one untimed operation per client: there every client sends at
// once, a burst that steady load never has, after a block of another kind; timed, such
// starts were 6 of the 10 slowest one-client syncs of a run. Percentiles are over every timed
// latency of a kind, ops/s is every operation of its blocks over their summed time, and
// the hook's allocations are those of its /sync blocks alone over every sync in them.
//
// Everything listens and dials on 127.0.0.0/8; every loop is bounded by a count. The hook
// runs as this program re-executed (`bench hook`): hookserver.New with the loopback dial
// guard, exactly as cmd/hook-server builds it, with the Go runtime settings (GOGC, GOMEMLIMIT)
// of its Deployment. -hook-bin runs a hook-server binary instead, to compare a build of
// another commit.
//
//	go run ./test/bench -out /tmp/bench.md
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	rpprof "runtime/pprof"
	"slices"
	"strconv"
	"strings"
	gosync "sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/cmd/hook-server/hookserver"
	"etcdops.dev/etcdops/gcpace"
	"etcdops.dev/etcdops/manifests"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/dialguard"
	"etcdops.dev/etcdops/test/etcdbin"
	"etcdops.dev/etcdops/test/harness"
)

// Addresses on which nothing listens (unreachable pods) and on which a listener accepts and
// never answers (a hung member). The harness hands out pod IPs from 127.1.x.y up.
const (
	unreachableNet = "127.200.0."
	hungIP         = "127.201.0.1"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "hook" {
		if err := serveHook(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench hook:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "etcd" {
		// The run script builds the members' etcd here, before its network namespace, which
		// reaches no module proxy.
		path, err := etcdbin.Path(v1alpha1.DefaultVersion)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench etcd:", err)
			os.Exit(1)
		}
		fmt.Println(path)
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "floor" {
		if err := serveFloor(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "bench floor:", err)
			os.Exit(1)
		}
		return
	}
	hookBin := flag.String("hook-bin", "", "run this hook-server binary instead of the hook of this tree")
	maxClusters := flag.Int("max-cached-clusters", 0, "the hook's --max-cached-clusters (0: its default)")
	n := flag.Int("n", 1000, "requests per sequential case; concurrent cases send 2n")
	clusters := flag.Int("clusters", 1000, "clusters in the round-robin run")
	passes := flag.Int("passes", 3, "round-robin passes over the clusters")
	rounds := flag.Int("rounds", 10, "blocks of each kind, floor and /sync in turn, into which each floor-and-/sync case is split")
	out := flag.String("out", "", "also write the results table to this file")
	profiles := flag.String("hook-profiles", "", "save in this directory the hook's CPU profile over the 3- and 5-member cases, its allocations up to the fleet, and the heap of the fleet's hook after the round-robin passes and after the half pass (this tree's hook only)")
	useTLS := flag.Bool("tls", false, "members serve client TLS and require a client certificate")
	gcHeadroom := flag.String("gc-headroom", "", "the hook's --gc-headroom (empty: its default)")
	connRSS := flag.Float64("conn-rss", 0, "the resident bytes of one held member connection alone, as BenchmarkMemberConnections measured it in the same run: the held-clusters table compares each cluster's share of the hook's RSS with three of them")
	idle := flag.Duration("idle-cluster-timeout", 30*time.Second, "the hook's --idle-cluster-timeout, Metacontroller's resync period by default; after the round-robin passes, half the clusters are synced until the others idled out (0: the hook's default, and no half pass)")
	flag.Parse()
	if *profiles != "" && *hookBin != "" {
		fmt.Fprintln(os.Stderr, "bench: -hook-profiles profiles this tree's hook, not a -hook-bin binary")
		os.Exit(2)
	}
	if largest := slices.Max(concurrency); *rounds < 1 || 2*(*n)/(*rounds) < largest {
		fmt.Fprintf(os.Stderr, "bench: -rounds %d with -n %d leaves blocks of fewer operations than the %d clients of the largest case\n", *rounds, *n, largest)
		os.Exit(2)
	}
	opts := options{hookBin: *hookBin, maxClusters: *maxClusters, n: *n, rounds: *rounds, clusters: *clusters, passes: *passes, out: *out, profiles: *profiles, tls: *useTLS, idle: *idle, gcHeadroom: *gcHeadroom, connRSS: *connRSS}
	if err := run(opts); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// serveHook is the hook process: hookserver.New as cmd/hook-server builds it with its
// defaults, logging at info as deployed, until stdin closes (the driver is gone) or SIGTERM;
// with -pprof-addr it also serves its profiles there, for -hook-profiles.
func serveHook(args []string) error {
	fs := flag.NewFlagSet("bench hook", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "")
	maxClusters := fs.Int("max-cached-clusters", 0, "")
	idle := fs.Duration("idle-cluster-timeout", 0, "")
	pprofAddr := fs.String("pprof-addr", "", "")
	gcHeadroom := fs.String("gc-headroom", "", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	headroom := uint64(gcpace.DefaultHeadroom)
	if *gcHeadroom != "" {
		q, err := resource.ParseQuantity(*gcHeadroom)
		if err != nil {
			return fmt.Errorf("-gc-headroom: %w", err)
		}
		headroom = uint64(q.Value())
	}
	if *pprofAddr != "" {
		pl, err := net.Listen("tcp", *pprofAddr)
		if err != nil {
			return err
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		// A CPU profile over exactly the cases the driver brackets with these two calls.
		var cpuMu gosync.Mutex
		var cpu *os.File
		mux.HandleFunc("POST /cpu/start", func(w http.ResponseWriter, r *http.Request) {
			cpuMu.Lock()
			defer cpuMu.Unlock()
			f, err := os.Create(r.URL.Query().Get("file"))
			if err == nil {
				err = rpprof.StartCPUProfile(f)
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			cpu = f
		})
		mux.HandleFunc("POST /cpu/stop", func(w http.ResponseWriter, r *http.Request) {
			cpuMu.Lock()
			defer cpuMu.Unlock()
			rpprof.StopCPUProfile()
			if cpu == nil {
				http.Error(w, "no CPU profile running", http.StatusConflict)
				return
			}
			if err := cpu.Close(); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
		})
		go func() { _ = http.Serve(pl, mux) }()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	srv := hookserver.New(hookserver.Options{
		Config:             sync.Config{ClusterDomain: "cluster.local", ToolImage: "etcdops.dev/etcdops:bench"},
		MaxClusters:        *maxClusters,
		IdleClusterTimeout: *idle,
		ShutdownTimeout:    time.Second,
		GCHeadroom:         headroom,
		Log:                slog.New(slog.NewJSONHandler(os.Stdout, nil)),
		Dial: dialguard.Dialer(func(addr string) {
			fmt.Fprintf(os.Stderr, "bench hook: dialled %s, outside 127.0.0.0/8\n", addr)
			os.Exit(3)
		}),
	})
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	return srv.Serve(ctx, ln)
}

// hookProcess is the hook under test, in a process of its own.
type hookProcess struct {
	cmd  *exec.Cmd
	base string
	in   io.WriteCloser
	// runtimeEnv is the Go runtime settings it was started with (deployedRuntimeEnv).
	runtimeEnv []string
}

// freeAddr is a port the kernel just handed out and took back; nothing else here binds
// ports on 127.0.0.1 by number.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func startHook(o options, pprofAddr string) (*hookProcess, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	var cmd *exec.Cmd
	if o.hookBin != "" {
		cmd = exec.Command(o.hookBin, "--log-format=json")
	} else {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		cmd = exec.Command(self, "hook")
	}
	cmd.Args = append(cmd.Args, "--addr="+addr)
	if pprofAddr != "" {
		cmd.Args = append(cmd.Args, "--pprof-addr="+pprofAddr)
	}
	env, err := deployedRuntimeEnv()
	if err != nil {
		return nil, err
	}
	cmd.Env = append(os.Environ(), env...)
	if o.maxClusters > 0 {
		cmd.Args = append(cmd.Args, fmt.Sprintf("--max-cached-clusters=%d", o.maxClusters))
	}
	if o.idle > 0 {
		cmd.Args = append(cmd.Args, "--idle-cluster-timeout="+o.idle.String())
	}
	if o.gcHeadroom != "" {
		cmd.Args = append(cmd.Args, "--gc-headroom="+o.gcHeadroom)
	}
	// The hook logs a line per sync, as deployed; the driver only drains them.
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	h := &hookProcess{cmd: cmd, base: "http://" + addr, in: in, runtimeEnv: env}
	for range 300 {
		if resp, err := http.Get(h.base + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return h, nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	h.stop()
	return nil, errors.New("the hook did not answer /healthz within 30s")
}

// deployedRuntimeEnv is the Go runtime settings (GOGC, GOMEMLIMIT) that the hook's
// Deployment gives it, so that the hook under load collects garbage as it does deployed.
func deployedRuntimeEnv() ([]string, error) {
	_, hook, err := manifests.HookServer()
	if err != nil {
		return nil, err
	}
	var env []string
	for _, e := range hook.Env {
		if strings.HasPrefix(e.Name, "GO") {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	if len(env) == 0 {
		return nil, errors.New("the hook's Deployment sets no Go runtime settings; the benchmark expects GOGC and GOMEMLIMIT")
	}
	return env, nil
}

func (h *hookProcess) stop() {
	h.in.Close()
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = h.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = h.cmd.Process.Kill()
	}
}

// procCPU is the user and system CPU time process pid has used, in the kernel's clock ticks
// (10 ms): fields 14 and 15 of /proc/PID/stat.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// rssMB is the hook process's resident set.
func (h *hookProcess) rssMB() float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", h.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// metrics reads gauges and counters of the hook's Go collector.
func (h *hookProcess) metrics(client *http.Client) (map[string]float64, error) {
	resp, err := client.Get(h.base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && strings.HasPrefix(f[0], "go_") {
			out[f[0]], _ = strconv.ParseFloat(f[1], 64)
		}
	}
	return out, sc.Err()
}

// steadyCluster is one harness loop brought to a steady state and left running without
// Metacontroller, with the request Metacontroller would send for it and the floor's view of
// its members.
type steadyCluster struct {
	env     *harness.Env
	request []byte
	podIPs  []string
	floor   floorSpec
}

// startSteady brings up size members as real etcd server processes of the operator's default
// release; with useTLS they serve client TLS and require a client certificate, as a cluster
// with spec.tls does.
func startSteady(size int32, root string, useTLS bool) (*steadyCluster, error) {
	ctrl, err := harness.LoadController(manifests.FS, "metacontroller")
	if err != nil {
		return nil, err
	}
	if _, err := etcdbin.Path(v1alpha1.DefaultVersion); err != nil {
		return nil, err
	}
	env, err := harness.Start(harness.Options{
		Namespace:  fmt.Sprintf("bench-%d", size),
		Cluster:    "etcd",
		Domain:     "cluster.local",
		TimeScale:  0.1,
		Tools:      harness.OperatorTools(),
		Hook:       harness.InProcessHook(sync.Config{ClusterDomain: "cluster.local", ToolImage: "etcdops.dev/etcdops:bench"}, nil),
		Controller: ctrl,
		Root:       root,
		EtcdBinary: func(image string) (string, error) { return etcdbin.Path(harness.ImageVersion(image)) },
	})
	if err != nil {
		return nil, err
	}
	spec := v1alpha1.EtcdClusterSpec{Size: &size, Version: v1alpha1.DefaultVersion, StorageSpec: &v1alpha1.StorageSpec{VolumeSizeRequest: resource.MustParse("1Gi")}}
	var client *corev1.Secret
	if useTLS {
		pki, err := harness.NewPKI(env.Namespace, env.Cluster, env.Domain)
		if err != nil {
			env.Close()
			return nil, err
		}
		if err := env.UseTLS(pki); err != nil {
			env.Close()
			return nil, err
		}
		spec.TLS = &v1alpha1.TLSSpec{ServerSecret: pki.Server, PeerSecret: pki.Peer, ClientSecret: pki.Client}
		for _, s := range pki.Secrets() {
			if s.Name == pki.Client {
				client = s
			}
		}
	}
	env.Create(spec)
	if _, err := env.WaitSteady(int(size), 3*time.Minute); err != nil {
		env.Close()
		return nil, fmt.Errorf("%d members not steady: %v\n%s", size, err, env.Describe())
	}
	env.StopOperator()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec := env.MC.Sync(ctx)
	if rec.Err != nil {
		env.Close()
		return nil, rec.Err
	}
	sc := &steadyCluster{env: env, request: rec.Request}
	for _, p := range env.Pods() {
		sc.podIPs = append(sc.podIPs, p.Status.PodIP)
	}
	sc.floor.Members = memberAddrs(sc)
	if client != nil {
		sc.floor.CA, sc.floor.Cert, sc.floor.Key = client.Data["ca.crt"], client.Data[corev1.TLSCertKey], client.Data[corev1.TLSPrivateKeyKey]
	}
	return sc, nil
}

// result is one measured case.
type result struct {
	name        string
	clients     int
	ops         int
	p50, p99    time.Duration
	max         time.Duration
	perSecond   float64
	cpuPerOp    time.Duration // of the process that served the case's operations
	allocs      float64       // per request, in the hook
	allocKB     float64
	rssMB       float64
	heldMB      float64 // heap and goroutine stacks in use
	goroutines  float64
	ratio50     float64 // to the floor's, same size and clients
	ratio99     float64
	ratioPerSec float64
	ratioCPU    float64
}

// timings is the latencies of one kind of operation in a case and the time its blocks took,
// over one block or several.
type timings struct {
	// leadIn is how many operations each block starts with, untimed.
	leadIn  int
	lat     []time.Duration
	calls   int // timed or not
	elapsed time.Duration
	// cpu is the CPU time the serving process used over the blocks, when it is measured.
	cpu time.Duration
}

// load runs op leadIn+total times from clients workers, timing each call, and adds all
// but the first leadIn calls and the block's elapsed time to t.
func (t *timings) load(clients, total int, op func(i int) error) error {
	calls := t.leadIn + total
	lat := make([]time.Duration, calls)
	var next atomic.Int64
	var firstErr atomic.Value
	var wg gosync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= calls {
					return
				}
				t0 := time.Now()
				if err := op(i); err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return err
	}
	t.add(lat[t.leadIn:], calls, time.Since(start))
	return nil
}

// add counts a block of calls that took elapsed, with its timed latencies lat.
func (t *timings) add(lat []time.Duration, calls int, elapsed time.Duration) {
	t.lat = append(t.lat, lat...)
	t.calls += calls
	t.elapsed += elapsed
}

// result is the percentiles over every timed call in t and the rate of all its calls over
// the summed time of its blocks.
func (t *timings) result(name string, clients int) result {
	lat := slices.Sorted(slices.Values(t.lat))
	n := len(lat)
	r := result{name: name, clients: clients, ops: n, p50: lat[n/2], p99: lat[n*99/100], max: lat[n-1], perSecond: float64(t.calls) / t.elapsed.Seconds()}
	if t.cpu > 0 {
		r.cpuPerOp = t.cpu / time.Duration(t.calls)
	}
	return r
}

// interleave runs total operations of each kind in rounds rounds of one block of each, the
// kinds in turn first, so that no kind always runs right after another. Blocks split total
// as evenly as whole operations allow.
func interleave(rounds, total int, kinds ...func(ops int) error) error {
	for round := range rounds {
		ops := (round+1)*total/rounds - round*total/rounds
		for k := range kinds {
			if err := kinds[(round+k)%len(kinds)](ops); err != nil {
				return err
			}
		}
	}
	return nil
}

// syncCase is the /sync operations of one case with the hook's allocations over exactly
// those: the sum, over its blocks, of each block's difference between the hook's counters
// before and after it.
type syncCase struct {
	timings
	mallocs, allocBytes float64
	goroutines, heldMB  float64 // after the last block
}

// result adds the hook's allocations per request, and its RSS and goroutines after the
// case, to the timings.
func (c *syncCase) result(name string, clients int, rssMB float64) result {
	r := c.timings.result(name, clients)
	r.allocs = c.mallocs / float64(c.calls)
	r.allocKB = c.allocBytes / float64(c.calls) / 1024
	r.rssMB, r.heldMB, r.goroutines = rssMB, c.heldMB, c.goroutines
	return r
}

// ofFloor sets r's ratios to f, the floor of the same size and clients.
func (r *result) ofFloor(f result) {
	r.ratio50, r.ratio99 = r.p50.Seconds()/f.p50.Seconds(), r.p99.Seconds()/f.p99.Seconds()
	r.ratioPerSec = 100 * r.perSecond / f.perSecond
	r.ratioCPU = r.cpuPerOp.Seconds() / f.cpuPerOp.Seconds()
}

// poster posts bodies to /sync and checks for a complete answer.
type poster struct {
	client *http.Client
	url    string
}

func (p poster) post(body []byte) error {
	_, err := p.answer(body)
	return err
}

// answer posts body and returns the hook's complete answer.
func (p poster) answer(body []byte) ([]byte, error) {
	resp, err := p.client.Post(p.url, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(`"children":[{`)) {
		return nil, fmt.Errorf("/sync answered %d: %.300s", resp.StatusCode, b)
	}
	return b, nil
}

// handedItsAnswer posts body once and returns it with the parent's status replaced by the
// status the hook answered, as Metacontroller hands a steady cluster's next sync the status
// it wrote from the last answer. The captured request carries the harness hook's last
// answer, which this hook, with its own clock and memory, answers differently: handed that
// one every time, each sync would be taken for a stale parent and planned from the newest
// answer (hooks/statusmemo.go), which is not the steady sync measured.
func (p poster) handedItsAnswer(body []byte) ([]byte, error) {
	raw, err := p.answer(body)
	if err != nil {
		return nil, err
	}
	var answer struct {
		Status json.RawMessage `json:"status"`
	}
	if err := json.Unmarshal(raw, &answer); err != nil || len(answer.Status) == 0 {
		return nil, fmt.Errorf("/sync answered without a status: %v", err)
	}
	var req, parent map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(req["parent"], &parent); err != nil {
		return nil, err
	}
	var handed, answered bytes.Buffer
	if json.Compact(&handed, parent["status"]) != nil || json.Compact(&answered, answer.Status) != nil || !bytes.Equal(handed.Bytes(), answered.Bytes()) {
		fmt.Fprintln(os.Stderr, "bench: the captured parent's status is not this hook's answer; its answer is handed instead")
	}
	parent["status"] = answer.Status
	if req["parent"], err = json.Marshal(parent); err != nil {
		return nil, err
	}
	return json.Marshal(req)
}

// same is a body for measureSync that is body for every request.
func same(body []byte) func(int) []byte { return func(int) []byte { return body } }

// options is the driver's flags.
type options struct {
	hookBin          string
	maxClusters      int
	n, rounds        int
	clusters, passes int
	out, profiles    string
	tls              bool
	idle             time.Duration
	gcHeadroom       string
	connRSS          float64
}

// concurrency is the client counts at which /sync is compared with the floor.
var concurrency = []int{1, 8, 32}

func run(o options) error {
	root, err := os.MkdirTemp("", "etcdops-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	var steady []*steadyCluster
	for _, size := range []int32{3, 5} {
		fmt.Fprintf(os.Stderr, "bench: bringing %d members to a steady state\n", size)
		sc, err := startSteady(size, fmt.Sprintf("%s/%d", root, size), o.tls)
		if err != nil {
			return err
		}
		defer sc.env.Close()
		steady = append(steady, sc)
	}
	var pprofAddr string
	if o.profiles != "" {
		if pprofAddr, err = freeAddr(); err != nil {
			return err
		}
	}
	hook, err := startHook(o, pprofAddr)
	if err != nil {
		return err
	}
	defer func() { hook.stop() }()
	client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	p := poster{client: client, url: hook.base + "/sync"}

	var results []result
	record := func(r result) {
		results = append(results, r)
		fmt.Fprintln(os.Stderr, "bench:", r.name, r.clients, r.p50, r.p99, int(r.perSecond))
	}
	// syncBlock posts body(i) for i < total from clients workers, adding the requests to c
	// and the hook's allocations from /metrics scraped before and after the block.
	syncBlock := func(c *syncCase, clients, total int, body func(i int) []byte) error {
		before, err := hook.metrics(client)
		if err != nil {
			return err
		}
		cpu0 := procCPU(hook.cmd.Process.Pid)
		if err := c.load(clients, total, func(i int) error { return p.post(body(i)) }); err != nil {
			return err
		}
		c.cpu += procCPU(hook.cmd.Process.Pid) - cpu0
		after, err := hook.metrics(client)
		if err != nil {
			return err
		}
		// The scrapes count too: the end of the first and the start of the second, about
		// one scrape a block (the package comment has its weight).
		c.mallocs += after["go_memstats_mallocs_total"] - before["go_memstats_mallocs_total"]
		c.allocBytes += after["go_memstats_alloc_bytes_total"] - before["go_memstats_alloc_bytes_total"]
		c.goroutines = after["go_goroutines"]
		c.heldMB = (after["go_memstats_heap_inuse_bytes"] + after["go_memstats_stack_inuse_bytes"]) / (1 << 20)
		return nil
	}
	// measureSync is a case of one block of /sync requests alone.
	measureSync := func(name string, clients, total int, body func(i int) []byte) (result, error) {
		var c syncCase
		if err := syncBlock(&c, clients, total, body); err != nil {
			return result{}, err
		}
		return c.result(name, clients, hook.rssMB()), nil
	}

	cpuProfile := func(action string) error {
		if o.profiles == "" {
			return nil
		}
		u := "http://" + pprofAddr + "/cpu/" + action + "?file=" + url.QueryEscape(filepath.Join(o.profiles, "hook-cpu.prof"))
		resp, err := client.Post(u, "", nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("hook CPU profile %s: %s", action, resp.Status)
		}
		return nil
	}
	if err := cpuProfile("start"); err != nil {
		return err
	}
	for _, sc := range steady {
		size := len(sc.podIPs)
		floor, err := startFloor(sc.floor)
		if err != nil {
			return err
		}
		withHealth := sc.floor
		withHealth.Health = true
		calls, err := startFloor(withHealth)
		if err != nil {
			floor.stop()
			return err
		}
		// The cases after this one (unreachable, hung, the fleet) start from it too.
		if sc.request, err = p.handedItsAnswer(sc.request); err != nil {
			return err
		}
		request := sc.request
		var warm timings
		for _, f := range []*floorProcess{floor, calls} {
			if err := f.load(&warm, 1, 100); err != nil {
				return fmt.Errorf("warm-up: %w", err)
			}
		}
		if err := warm.load(1, 100, func(int) error { return p.post(request) }); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
		for _, clients := range concurrency {
			total := o.n
			if clients > 1 {
				total = 2 * o.n
			}
			fl, cl := timings{leadIn: clients}, timings{leadIn: clients}
			s := syncCase{timings: timings{leadIn: clients}}
			err := interleave(o.rounds, total,
				func(ops int) error { return floor.load(&fl, clients, ops) },
				func(ops int) error { return calls.load(&cl, clients, ops) },
				func(ops int) error { return syncBlock(&s, clients, ops, same(request)) })
			if err != nil {
				return err
			}
			f := fl.result(fmt.Sprintf("floor, %d members", size), clients)
			record(f)
			c := cl.result(fmt.Sprintf("the hook's calls alone, %d members", size), clients)
			c.ofFloor(f)
			record(c)
			r := s.result(fmt.Sprintf("/sync, %d members", size), clients, hook.rssMB())
			r.ofFloor(f)
			record(r)
		}
		floor.stop()
		calls.stop()
	}
	if err := cpuProfile("stop"); err != nil {
		return err
	}

	three := steady[0]
	unreachable := three.request
	for i, ip := range three.podIPs {
		unreachable = bytes.ReplaceAll(unreachable, []byte(`"`+ip+`"`), []byte(`"`+unreachableNet+strconv.Itoa(i+1)+`"`))
	}
	if unreachable, err = p.handedItsAnswer(unreachable); err != nil {
		return err
	}
	r, err := measureSync("/sync, every pod unreachable", 1, o.n/4, same(unreachable))
	if err != nil {
		return err
	}
	record(r)

	silent, err := net.Listen("tcp", net.JoinHostPort(hungIP, "2379"))
	if err != nil {
		return err
	}
	defer silent.Close()
	var held []net.Conn
	var heldMu gosync.Mutex
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			heldMu.Lock()
			held = append(held, c)
			heldMu.Unlock()
		}
	}()
	defer func() {
		heldMu.Lock()
		for _, c := range held {
			c.Close()
		}
		heldMu.Unlock()
	}()
	hung := bytes.ReplaceAll(three.request, []byte(`"`+three.podIPs[len(three.podIPs)-1]+`"`), []byte(`"`+hungIP+`"`))
	r, err = measureSync("/sync, one member hung: first sync", 1, 1, same(hung))
	if err != nil {
		return err
	}
	record(r)
	if hung, err = p.handedItsAnswer(hung); err != nil {
		return err
	}
	r, err = measureSync("/sync, one member hung: the syncs after", 1, o.n/4, same(hung))
	if err != nil {
		return err
	}
	record(r)

	// 1,000 clusters, on a hook of their own, so that what they cost is the growth over a
	// hook that just started: the cases above leave freed pages that the runtime keeps.
	// The allocations of those cases are saved first.
	if o.profiles != "" {
		if err := saveProfile(client, "http://"+pprofAddr+"/debug/pprof/allocs", filepath.Join(o.profiles, "hook-allocs.prof")); err != nil {
			return err
		}
	}
	hook.stop()
	fleetHook, err := startHook(o, pprofAddr)
	if err != nil {
		return err
	}
	hook = fleetHook
	p.url = hook.base + "/sync"
	freshMB := hook.rssMB()
	// The steady 3-member request under as many parent UIDs, so each is a cluster of its own
	// to the hook (its own cached clients and connections).
	var parent struct {
		Parent struct {
			Metadata struct{ UID string } `json:"metadata"`
		} `json:"parent"`
	}
	if err := json.Unmarshal(three.request, &parent); err != nil || parent.Parent.Metadata.UID == "" {
		return fmt.Errorf("no parent UID in the captured request: %v", err)
	}
	bodies := make([][]byte, o.clusters)
	for i := range bodies {
		bodies[i] = bytes.ReplaceAll(three.request, []byte(parent.Parent.Metadata.UID), []byte(fmt.Sprintf("bench-%08d-0000-0000-0000-000000000000", i)))
	}
	var notes []string
	var fleet []heldClusters
	for pass := 1; pass <= o.passes; pass++ {
		t0 := time.Now()
		r, err := measureSync(fmt.Sprintf("/sync, %d clusters round-robin, pass %d", o.clusters, pass), 8, o.clusters, func(i int) []byte { return bodies[i] })
		if err != nil {
			return err
		}
		record(r)
		fleet = append(fleet, heldClusters{pass: pass, clusters: o.clusters, rssMB: r.rssMB, freshMB: freshMB, heldMB: r.heldMB, goroutines: r.goroutines})
		// A pass slower than the idle timeout lets the sweep close clusters it has not come
		// back to yet: the next pass dials them again, and connections were not all held.
		if took := time.Since(t0); o.idle > 0 && took > o.idle {
			notes = append(notes, fmt.Sprintf("round-robin pass %d took %s, longer than the idle timeout %s: the next pass found connections closed", pass, took.Round(time.Second), o.idle))
		}
	}
	if o.profiles != "" {
		// What the hook holds with every cluster's connections open.
		if err := saveProfile(client, "http://"+pprofAddr+"/debug/pprof/heap", filepath.Join(o.profiles, "hook-heap-passes.prof")); err != nil {
			return err
		}
	}
	if o.idle > 0 {
		// Half the clusters go on being synced; the others idle out once the hook's sweep,
		// every half idle timeout, finds them unused for longer than the timeout.
		half := bodies[:o.clusters/2]
		start := time.Now()
		idledOut := start.Add(o.idle*3/2 + time.Second)
		// At most one half pass a second until the others idled out; on a loaded machine
		// a half pass takes longer than a second, and the count only bounds the loop.
		for i := 0; i < 1000 && time.Now().Before(idledOut); i++ {
			if _, err := measureSync("", 8, len(half), func(i int) []byte { return half[i] }); err != nil {
				return err
			}
			time.Sleep(time.Until(start.Add(time.Duration(i+1) * time.Second)))
		}
		r, err := measureSync(fmt.Sprintf("/sync, %d of the %d clusters, the others idle for %s", len(half), o.clusters, o.idle*3/2), 8, len(half), func(i int) []byte { return half[i] })
		if err != nil {
			return err
		}
		record(r)
	}

	if o.profiles != "" {
		// What the fleet's hook holds after the half pass.
		if err := saveProfile(client, "http://"+pprofAddr+"/debug/pprof/heap", filepath.Join(o.profiles, "hook-fleet-heap.prof")); err != nil {
			return err
		}
	}
	table := format(results, o, hook.runtimeEnv) + formatHeld(fleet, o.connRSS)
	for _, n := range notes {
		table += "\n- " + n
	}
	if len(notes) > 0 {
		table += "\n"
	}
	fmt.Print(table)
	if o.out != "" {
		return os.WriteFile(o.out, []byte(table), 0o644)
	}
	return nil
}

// heldClusters is what the hook of the round-robin passes held after one.
type heldClusters struct {
	pass, clusters int
	rssMB, freshMB float64 // after the pass; of the hook just started, before any sync
	heldMB         float64
	goroutines     float64
}

// formatHeld tables each pass's resident set per held cluster, over the fresh hook's, against
// three member connections alone (connRSS bytes each, when known).
func formatHeld(held []heldClusters, connRSS float64) string {
	if len(held) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n| held clusters | pass | hook RSS MB | fresh hook RSS MB | RSS over the fresh hook, KB per cluster | 3 connections alone, KB | per cluster / 3 connections | heap+stacks MB | goroutines per cluster |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, h := range held {
		per := (h.rssMB - h.freshMB) * 1024 / float64(h.clusters)
		conns, ratio := "", ""
		if connRSS > 0 {
			conns = fmt.Sprintf("%.1f", 3*connRSS/1024)
			ratio = fmt.Sprintf("%.2f×", per*1024/(3*connRSS))
		}
		fmt.Fprintf(&b, "| %d | %d | %.0f | %.0f | %.1f | %s | %s | %.0f | %.1f |\n",
			h.clusters, h.pass, h.rssMB, h.freshMB, per, conns, ratio, h.heldMB, h.goroutines/float64(h.clusters))
	}
	return b.String()
}

func saveProfile(client *http.Client, url, file string) error {
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %d %v", url, resp.StatusCode, err)
	}
	return os.WriteFile(file, b, 0o644)
}

func format(results []result, o options, runtimeEnv []string) string {
	var b strings.Builder
	hook := "this tree's hook (hookserver.New)"
	if o.hookBin != "" {
		hook = "hook binary " + o.hookBin
	}
	if o.maxClusters > 0 {
		hook += fmt.Sprintf(" --max-cached-clusters=%d", o.maxClusters)
	}
	if o.idle > 0 {
		hook += " --idle-cluster-timeout=" + o.idle.String()
	}
	hook += " with " + strings.Join(runtimeEnv, " ")
	members := "etcd " + v1alpha1.DefaultVersion + " members, plain HTTP"
	if o.tls {
		members = "etcd " + v1alpha1.DefaultVersion + " members, client TLS with client certificates"
	}
	fmt.Fprintf(&b, "%s; %s; %d CPUs; %s\n\n", hook, members, runtime.NumCPU(), time.Now().UTC().Format(time.RFC3339))
	b.WriteString("| case | clients | ops | p50 | p99 | max | ops/s | CPU ms/op | p50 / floor | p99 / floor | ops/s / floor | CPU / floor | allocs/req | KB/req | hook RSS MB | heap+stacks MB | goroutines |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }
	opt := func(v float64, f string) string {
		if v == 0 {
			return ""
		}
		return fmt.Sprintf(f, v)
	}
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			r.name, r.clients, r.ops, ms(r.p50), ms(r.p99), ms(r.max), r.perSecond, opt(float64(r.cpuPerOp.Microseconds())/1000, "%.2f"),
			opt(r.ratio50, "%.2f×"), opt(r.ratio99, "%.2f×"), opt(r.ratioPerSec, "%.0f%%"), opt(r.ratioCPU, "%.2f×"),
			opt(r.allocs, "%.0f"), opt(r.allocKB, "%.0f"), opt(r.rssMB, "%.0f"), opt(r.heldMB, "%.0f"), opt(r.goroutines, "%.0f"))
	}
	return b.String()
}
