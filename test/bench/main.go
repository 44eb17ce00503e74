// Command bench is the load driver of the benchmark suite (see BENCHMARKS.md). It brings real
// embedded etcd clusters of 3 and 5 members to a steady state through the test harness (the
// closed loop of test/README.md), captures the sync request Metacontroller would send, and
// then measures, in one run on this machine:
//
//   - the floor: a warm clientv3 client per member asking Status of every member and the
//     linearizable member list, all at once, as one operation;
//   - /sync over HTTP to the hook in a process of its own, sequentially and at 8 and 32
//     concurrent clients, with the hook's allocations per request;
//   - a cluster whose pods nobody listens for (unreachable), and one whose member hangs;
//   - 1,000 clusters synced round-robin: the hook's RSS, goroutines and latency per pass.
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
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	gosync "sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/api/resource"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/cmd/hook-server/hookserver"
	"etcdops.dev/etcdops/manifests"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/dialguard"
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
	hookBin := flag.String("hook-bin", "", "run this hook-server binary instead of the hook of this tree")
	maxClusters := flag.Int("max-cached-clusters", 0, "the hook's --max-cached-clusters (0: its default)")
	n := flag.Int("n", 1000, "requests per sequential case; concurrent cases send 2n")
	clusters := flag.Int("clusters", 1000, "clusters in the round-robin run")
	passes := flag.Int("passes", 3, "round-robin passes over the clusters")
	out := flag.String("out", "", "also write the results table to this file")
	profiles := flag.String("hook-profiles", "", "save the hook's allocation profile over the run and its heap at the end in this directory (this tree's hook only)")
	flag.Parse()
	if *profiles != "" && *hookBin != "" {
		fmt.Fprintln(os.Stderr, "bench: -hook-profiles profiles this tree's hook, not a -hook-bin binary")
		os.Exit(2)
	}
	if err := run(*hookBin, *maxClusters, *n, *clusters, *passes, *out, *profiles); err != nil {
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
	pprofAddr := fs.String("pprof-addr", "", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *pprofAddr != "" {
		pl, err := net.Listen("tcp", *pprofAddr)
		if err != nil {
			return err
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		go func() { _ = http.Serve(pl, mux) }()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	srv := hookserver.New(hookserver.Options{
		Config:          sync.Config{ClusterDomain: "cluster.local", ToolImage: "etcdops.dev/etcdops:bench"},
		MaxClusters:     *maxClusters,
		ShutdownTimeout: time.Second,
		Log:             slog.New(slog.NewJSONHandler(os.Stdout, nil)),
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

func startHook(bin string, maxClusters int, pprofAddr string) (*hookProcess, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	var cmd *exec.Cmd
	if bin != "" {
		cmd = exec.Command(bin, "--log-format=json")
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
	if maxClusters > 0 {
		cmd.Args = append(cmd.Args, fmt.Sprintf("--max-cached-clusters=%d", maxClusters))
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
		if len(f) == 2 && (f[0] == "go_goroutines" || f[0] == "go_memstats_mallocs_total" || f[0] == "go_memstats_alloc_bytes_total") {
			out[f[0]], _ = strconv.ParseFloat(f[1], 64)
		}
	}
	return out, sc.Err()
}

// steadyCluster is one harness loop brought to a steady state and left running without
// Metacontroller, with the request Metacontroller would send for it.
type steadyCluster struct {
	env     *harness.Env
	request []byte
	podIPs  []string
}

func startSteady(size int32, root string) (*steadyCluster, error) {
	ctrl, err := harness.LoadController(manifests.FS, "metacontroller")
	if err != nil {
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
	})
	if err != nil {
		return nil, err
	}
	env.Create(v1alpha1.EtcdClusterSpec{Size: &size, Version: "v3.7.3", StorageSpec: &v1alpha1.StorageSpec{VolumeSizeRequest: resource.MustParse("1Gi")}})
	if _, err := env.WaitSteady(int(size), 2*time.Minute); err != nil {
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
	return sc, nil
}

// floorClient asks what an observation needs at the least, from the driver's process over
// its own connections: Status of every member and the linearizable member list, at once.
type floorClient struct {
	members []*clientv3.Client
}

func newFloor(podIPs []string) (*floorClient, error) {
	f := &floorClient{}
	for _, ip := range podIPs {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + net.JoinHostPort(ip, "2379")}, Logger: zap.NewNop(), DialTimeout: 5 * time.Second})
		if err != nil {
			return nil, err
		}
		f.members = append(f.members, cli)
	}
	return f, nil
}

func (f *floorClient) op() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errs := make([]error, len(f.members)+1)
	var wg gosync.WaitGroup
	for i, cli := range f.members {
		wg.Go(func() { _, errs[i] = cli.Status(ctx, cli.Endpoints()[0]) })
	}
	wg.Go(func() { _, errs[len(f.members)] = f.members[0].MemberList(ctx) })
	wg.Wait()
	return errors.Join(errs...)
}

func (f *floorClient) close() {
	for _, c := range f.members {
		c.Close()
	}
}

// result is one measured case.
type result struct {
	name        string
	clients     int
	ops         int
	p50, p99    time.Duration
	max         time.Duration
	perSecond   float64
	allocs      float64 // per request, in the hook
	allocKB     float64
	rssMB       float64
	goroutines  float64
	ratio50     float64 // to the floor's, same size and clients
	ratio99     float64
	ratioPerSec float64
}

// load runs op total times from clients workers and times each call.
func load(clients, total int, op func(i int) error) (result, error) {
	lat := make([]time.Duration, total)
	var next atomic.Int64
	var firstErr atomic.Value
	var wg gosync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= total {
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
	elapsed := time.Since(start)
	if err, _ := firstErr.Load().(error); err != nil {
		return result{}, err
	}
	slices.Sort(lat)
	return result{clients: clients, ops: total, p50: lat[total/2], p99: lat[total*99/100], max: lat[total-1], perSecond: float64(total) / elapsed.Seconds()}, nil
}

// poster posts bodies to /sync and checks for a complete answer.
type poster struct {
	client *http.Client
	url    string
}

func (p poster) post(body []byte) error {
	resp, err := p.client.Post(p.url, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(`"children":[{`)) {
		return fmt.Errorf("/sync answered %d: %.300s", resp.StatusCode, b)
	}
	return nil
}

// same is a body for measureSync that is body for every request.
func same(body []byte) func(int) []byte { return func(int) []byte { return body } }

func run(hookBin string, maxClusters, n, clusters, passes int, out, profiles string) error {
	root, err := os.MkdirTemp("", "etcdops-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	var steady []*steadyCluster
	for _, size := range []int32{3, 5} {
		fmt.Fprintf(os.Stderr, "bench: bringing %d members to a steady state\n", size)
		sc, err := startSteady(size, fmt.Sprintf("%s/%d", root, size))
		if err != nil {
			return err
		}
		defer sc.env.Close()
		steady = append(steady, sc)
	}
	var pprofAddr string
	if profiles != "" {
		if pprofAddr, err = freeAddr(); err != nil {
			return err
		}
	}
	hook, err := startHook(hookBin, maxClusters, pprofAddr)
	if err != nil {
		return err
	}
	defer hook.stop()
	client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	p := poster{client: client, url: hook.base + "/sync"}

	var results []result
	record := func(r result) {
		results = append(results, r)
		fmt.Fprintln(os.Stderr, "bench:", r.name, r.clients, r.p50, r.p99, int(r.perSecond))
	}
	// measureSync posts body(i) for i < total from clients workers, with the hook's
	// allocations per request and its RSS and goroutines after.
	measureSync := func(name string, clients, total int, body func(i int) []byte) (result, error) {
		before, err := hook.metrics(client)
		if err != nil {
			return result{}, err
		}
		r, err := load(clients, total, func(i int) error { return p.post(body(i)) })
		if err != nil {
			return result{}, err
		}
		after, err := hook.metrics(client)
		if err != nil {
			return result{}, err
		}
		// The two scrapes of /metrics allocate too; they are a few hundred allocations
		// against thousands per sync, over n syncs.
		r.allocs = (after["go_memstats_mallocs_total"] - before["go_memstats_mallocs_total"]) / float64(total)
		r.allocKB = (after["go_memstats_alloc_bytes_total"] - before["go_memstats_alloc_bytes_total"]) / float64(total) / 1024
		r.rssMB, r.goroutines, r.name = hook.rssMB(), after["go_goroutines"], name
		return r, nil
	}

	for _, sc := range steady {
		size := len(sc.podIPs)
		floor, err := newFloor(sc.podIPs)
		if err != nil {
			return err
		}
		if _, err := load(1, 100, func(int) error { return floor.op() }); err != nil {
			return fmt.Errorf("floor warm-up: %w", err)
		}
		if _, err := load(1, 100, func(int) error { return p.post(sc.request) }); err != nil {
			return fmt.Errorf("sync warm-up: %w", err)
		}
		for _, clients := range []int{1, 8, 32} {
			total := n
			if clients > 1 {
				total = 2 * n
			}
			fl, err := load(clients, total, func(int) error { return floor.op() })
			if err != nil {
				return fmt.Errorf("floor: %w", err)
			}
			fl.name = fmt.Sprintf("floor, %d members", size)
			record(fl)
			s, err := measureSync(fmt.Sprintf("/sync, %d members", size), clients, total, same(sc.request))
			if err != nil {
				return err
			}
			s.ratio50, s.ratio99 = s.p50.Seconds()/fl.p50.Seconds(), s.p99.Seconds()/fl.p99.Seconds()
			s.ratioPerSec = 100 * s.perSecond / fl.perSecond
			record(s)
		}
		floor.close()
	}

	three := steady[0]
	unreachable := three.request
	for i, ip := range three.podIPs {
		unreachable = bytes.ReplaceAll(unreachable, []byte(`"`+ip+`"`), []byte(`"`+unreachableNet+strconv.Itoa(i+1)+`"`))
	}
	r, err := measureSync("/sync, every pod unreachable", 1, n/4, same(unreachable))
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
	r, err = measureSync("/sync, one member hung: the syncs after", 1, n/4, same(hung))
	if err != nil {
		return err
	}
	record(r)

	// 1,000 clusters: the steady 3-member request under as many parent UIDs, so each is a
	// cluster of its own to the hook (its own cached clients and connections).
	var parent struct {
		Parent struct {
			Metadata struct{ UID string } `json:"metadata"`
		} `json:"parent"`
	}
	if err := json.Unmarshal(three.request, &parent); err != nil || parent.Parent.Metadata.UID == "" {
		return fmt.Errorf("no parent UID in the captured request: %v", err)
	}
	bodies := make([][]byte, clusters)
	for i := range bodies {
		bodies[i] = bytes.ReplaceAll(three.request, []byte(parent.Parent.Metadata.UID), []byte(fmt.Sprintf("bench-%08d-0000-0000-0000-000000000000", i)))
	}
	for pass := 1; pass <= passes; pass++ {
		r, err := measureSync(fmt.Sprintf("/sync, %d clusters round-robin, pass %d", clusters, pass), 8, clusters, func(i int) []byte { return bodies[i] })
		if err != nil {
			return err
		}
		record(r)
	}

	if profiles != "" {
		// allocs: everything the hook allocated over the run; heap: what it holds after the
		// round-robin passes.
		for _, name := range []string{"allocs", "heap"} {
			if err := saveProfile(client, "http://"+pprofAddr+"/debug/pprof/"+name, filepath.Join(profiles, "hook-"+name+".prof")); err != nil {
				return err
			}
		}
	}
	table := format(results, hookBin, maxClusters, hook.runtimeEnv)
	fmt.Print(table)
	if out != "" {
		return os.WriteFile(out, []byte(table), 0o644)
	}
	return nil
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

func format(results []result, hookBin string, maxClusters int, runtimeEnv []string) string {
	var b strings.Builder
	hook := "this tree's hook (hookserver.New)"
	if hookBin != "" {
		hook = "hook binary " + hookBin
	}
	if maxClusters > 0 {
		hook += fmt.Sprintf(" --max-cached-clusters=%d", maxClusters)
	}
	hook += " with " + strings.Join(runtimeEnv, " ")
	fmt.Fprintf(&b, "%s; %d CPUs; %s\n\n", hook, runtime.NumCPU(), time.Now().UTC().Format(time.RFC3339))
	b.WriteString("| case | clients | ops | p50 | p99 | max | ops/s | p50 / floor | p99 / floor | ops/s / floor | allocs/req | KB/req | hook RSS MB | goroutines |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }
	opt := func(v float64, f string) string {
		if v == 0 {
			return ""
		}
		return fmt.Sprintf(f, v)
	}
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s |\n",
			r.name, r.clients, r.ops, ms(r.p50), ms(r.p99), ms(r.max), r.perSecond,
			opt(r.ratio50, "%.2f×"), opt(r.ratio99, "%.2f×"), opt(r.ratioPerSec, "%.0f%%"),
			opt(r.allocs, "%.0f"), opt(r.allocKB, "%.0f"), opt(r.rssMB, "%.0f"), opt(r.goroutines, "%.0f"))
	}
	return b.String()
}
