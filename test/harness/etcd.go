package harness

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"runtime"
	"strings"
	gosync "sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/pkg/v3/flags"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Timing of every embedded member. Real clusters use 100ms/1000ms; the harness runs ten
// times faster so that elections and learner catch-up fit in a test, while staying far
// enough above scheduling noise on two shared cores to avoid spurious elections.
const (
	tickMs     = 20
	electionMs = 200
)

// etcdProcess is the etcd container of one pod: a real etcd server embedded in this process.
type etcdProcess struct {
	e    *embed.Etcd
	once gosync.Once
	exit chan struct{} // closed when the process has ended, for whatever reason
	// closed is closed once the server has released its files. exit may come first: an end
	// that takes longer than stopBound is not waited for, but its data dir stays locked.
	closed chan struct{}

	killed atomic.Bool // set when a hard end begins
	// stopping is the server's StoppingNotify once it has started: closed when the server
	// begins to stop on its own (removed from the cluster, a fatal error), before its backend
	// closes.
	stopping  atomic.Pointer[<-chan struct{}]
	panicOnce gosync.Once
	panicked  chan struct{} // closed when etcd panicked
	panicMsg  string
	// holds, when set, are the kubelet's HoldNextDefragment (defrag.go).
	holds *defragHolds
	// ext, when set, is a real etcd process (etcdproc.go), and e is nil.
	ext *extEtcd
}

// etcdConfig maps an etcd command line onto embed.Config the way etcd's own main does, and
// fails on any flag etcd would not accept. podIP stands in for the pod's network namespace:
// listen URLs on 0.0.0.0 or loopback bind the pod's own address instead.
func etcdConfig(args []string, podIP string) (*embed.Config, error) {
	cfg := embed.NewConfig()
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.AddFlags(fs)
	state := flags.NewSelectiveStringValue(embed.ClusterStateFlagNew, embed.ClusterStateFlagExisting)
	fs.Var(state, "initial-cluster-state", "")
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("etcd command line: %w", err)
	}
	if fs.NArg() != 0 {
		return nil, fmt.Errorf("etcd command line: %q is not a valid flag", fs.Arg(0))
	}
	cfg.ListenPeerUrls = podURLs(flags.UniqueURLsFromFlag(fs, "listen-peer-urls"), podIP)
	cfg.AdvertisePeerUrls = flags.UniqueURLsFromFlag(fs, "initial-advertise-peer-urls")
	cfg.ListenClientUrls = podURLs(flags.UniqueURLsFromFlag(fs, "listen-client-urls"), podIP)
	cfg.ListenClientHttpUrls = podURLs(flags.UniqueURLsFromFlag(fs, "listen-client-http-urls"), podIP)
	cfg.AdvertiseClientUrls = flags.UniqueURLsFromFlag(fs, "advertise-client-urls")
	cfg.ListenMetricsUrls = podURLs(flags.UniqueURLsFromFlag(fs, "listen-metrics-urls"), podIP)
	cfg.ClusterState = state.String()
	if flags.IsSet(fs, "listen-client-urls") && !flags.IsSet(fs, "advertise-client-urls") {
		cfg.AdvertiseClientUrls = nil
	}
	fs.Visit(func(f *flag.Flag) { cfg.FlagsExplicitlySet[f.Name] = true })

	// The harness owns timing and logging: see tickMs; member logs would drown test output.
	cfg.TickMs, cfg.ElectionMs = tickMs, electionMs
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	return cfg, cfg.Validate()
}

func podURLs(us []url.URL, podIP string) []url.URL {
	out := make([]url.URL, len(us))
	for i, u := range us {
		host, port, err := net.SplitHostPort(u.Host)
		if err == nil {
			if ip := net.ParseIP(host); host == "localhost" || (ip != nil && (ip.IsUnspecified() || ip.IsLoopback())) {
				u.Host = net.JoinHostPort(podIP, port)
			}
		}
		out[i] = u
	}
	return out
}

// startEtcd starts a member from its command line. It returns once the server is listening;
// joining the cluster continues in the background, as with a real process. holds, when not
// nil, are the kubelet's HoldNextDefragment (defrag.go).
func startEtcd(args []string, podIP string, holds *defragHolds) (*etcdProcess, error) {
	cfg, err := etcdConfig(args, podIP)
	if err != nil {
		return nil, err
	}
	unlock := lockDir(cfg.Dir)
	defer unlock()
	if err := awaitRelease(cfg.Dir); err != nil {
		return nil, err
	}
	p := &etcdProcess{exit: make(chan struct{}), closed: make(chan struct{}), panicked: make(chan struct{}), holds: holds}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.New(zapcore.NewNopCore(),
		zap.WithPanicHook(crashHook{p}), zap.WithFatalHook(crashHook{p})))
	cfg.GRPCAdditionalServerOptions = []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(p.unaryCrash, p.holdDefragment),
		grpc.ChainStreamInterceptor(p.streamCrash),
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	p.e = e
	stopping := e.Server.StoppingNotify()
	p.stopping.Store(&stopping)
	holders.Store(cfg.Dir, p)
	go func() {
		// etcd's main exits when the server stops on its own (removed from the cluster,
		// fatal raft error), reports a serving error, or panics; so does this process.
		select {
		case <-e.Server.StopNotify():
		case <-e.Err():
		case <-p.panicked:
		case <-p.exit:
			return
		}
		p.end(true)
	}()
	return p, nil
}

// unaryCrash and streamCrash turn a panic in an etcd request handler into the death of this
// member alone. In a pod the panic kills the container; in this shared process it would kill
// every member and the test, so it is recovered here and the member is killed instead.
//
// A killed process serves nothing: the kernel ends it and its sockets at once. Here the
// server is hard-stopped before its listeners close, so requests that arrive meanwhile are
// refused as a dead process's would be. A request already inside a server that is being
// torn down, by a kill or because it stops on its own (etcd's main then exits), may panic on
// state the stop released (a closed bbolt database: "nil pointer dereference" in
// bbolt.(*Tx).Bucket); that is the end of a process already on its way out, not a panic of
// a running etcd, and is not counted as one.
func (p *etcdProcess) unaryCrash(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	if p.killed.Load() {
		return nil, errKilled
	}
	defer p.crashOnPanic(info.FullMethod, &err)
	return h(ctx, req)
}

func (p *etcdProcess) streamCrash(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	if p.killed.Load() {
		return errKilled
	}
	defer p.crashOnPanic(info.FullMethod, &err)
	return h(srv, ss)
}

var errKilled = status.Error(codes.Unavailable, "member killed")

// exiting reports whether the process is being killed or its server has begun to stop.
func (p *etcdProcess) exiting() bool {
	if p.killed.Load() {
		return true
	}
	if c := p.stopping.Load(); c != nil {
		select {
		case <-*c:
			return true
		default:
		}
	}
	return false
}

// The message names the request and the frame that panicked: a runtime error alone ("nil
// pointer dereference") does not say which of etcd's code paths a scenario reached.
func (p *etcdProcess) crashOnPanic(method string, err *error) {
	if r := recover(); r != nil {
		if p.exiting() {
			*err = errKilled
			return
		}
		p.crashed(fmt.Sprintf("%v (serving %s, in %s)", r, method, panicFrame()))
		*err = status.Errorf(codes.Unavailable, "member crashed: %v", r)
	}
}

// panicFrame is the innermost frame outside the runtime of the panic being recovered.
func panicFrame() string {
	pcs := make([]uintptr, 32)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	for {
		f, more := frames.Next()
		if !strings.HasPrefix(f.Function, "runtime.") {
			return fmt.Sprintf("%s %s:%d", f.Function, filepath.Base(f.File), f.Line)
		}
		if !more {
			return "an unknown frame"
		}
	}
}

func (p *etcdProcess) crashed(msg string) {
	p.panicOnce.Do(func() {
		p.panicMsg = msg
		close(p.panicked)
	})
}

// crashHook stands in for zap's panic and os.Exit on etcd's Panic and Fatal logs (a raft
// invariant broken, a corrupt WAL): they would take down every member in this process, so
// the goroutine that logged ends there and the member is killed instead. One logged while a
// kill tears the server down is the emulation's, not etcd's, as in crashOnPanic.
type crashHook struct{ p *etcdProcess }

func (h crashHook) OnWrite(ce *zapcore.CheckedEntry, _ []zapcore.Field) {
	if !h.p.killed.Load() {
		h.p.crashed(ce.Message)
	}
	runtime.Goexit()
}

// end stops the process. A member whose raft loop died in a panic may never finish
// stopping; after stopBound it counts as ended anyway (its listeners are closed first), as
// the kernel would end a dead process.
func (p *etcdProcess) end(hard bool) {
	if p.ext != nil {
		p.endExternal(hard)
		return
	}
	p.once.Do(func() {
		go func() {
			select {
			case <-p.panicked:
				// Its raft loop may be gone: HardStop could wait for it forever, so the
				// listeners are closed first, by Close.
			default:
				if hard {
					p.killed.Store(true)
					p.e.Server.HardStop()
				}
			}
			p.e.Close()
			close(p.closed)
		}()
		select {
		case <-p.closed:
		case <-time.After(stopBound):
		}
		close(p.exit)
	})
}

const stopBound = 10 * time.Second

// holders maps a data dir to the last etcd started on it. On a node a volume is free once its
// process is gone; here a member that took longer than stopBound to end still holds its bbolt
// file lock, and an etcd started on the same dir would wait for that lock forever.
var holders gosync.Map

// releaseBound bounds the wait for a data dir's last etcd to release it; past it the start
// fails, and the kubelet retries after its back-off.
const releaseBound = time.Minute

// starts holds a mutex per data dir: two starts on one dir at once would both find it
// released, and the one that loses bbolt's file lock would wait for it forever. One at a
// time, the second finds the first as the dir's holder.
var starts gosync.Map

func lockDir(dir string) (unlock func()) {
	mu, _ := starts.LoadOrStore(dir, &gosync.Mutex{})
	mu.(*gosync.Mutex).Lock()
	return mu.(*gosync.Mutex).Unlock
}

func awaitRelease(dir string) error {
	prev, ok := holders.Load(dir)
	if !ok {
		return nil
	}
	select {
	case <-prev.(*etcdProcess).closed:
		return nil
	case <-time.After(releaseBound):
		return fmt.Errorf("data dir %s is still held by an etcd that has not stopped", dir)
	}
}

// Stop is SIGTERM: etcd's graceful shutdown, which hands leadership away if it leads.
func (p *etcdProcess) Stop() { p.end(false) }

// Kill is SIGKILL or a node crash: raft stops at once, without leadership transfer; what is
// in the WAL survives. Closing afterwards only releases the sockets.
func (p *etcdProcess) Kill() { p.end(true) }

// exitReason says why the process ended on its own, as a container's termination message.
func (p *etcdProcess) exitReason() string {
	if p.ext != nil {
		return p.exitReasonExternal()
	}
	if msg, ok := p.panicMessage(); ok {
		return "etcd panicked: " + msg
	}
	if p.e.Server.IsIDRemoved(uint64(p.e.Server.MemberID())) {
		return "etcd exited: the member has been permanently removed from the cluster"
	}
	return "etcd exited"
}

// panicMessage returns etcd's panic message if the process ended in a panic.
func (p *etcdProcess) panicMessage() (string, bool) {
	select {
	case <-p.panicked:
		return p.panicMsg, true
	default:
		return "", false
	}
}

// Exited reports whether the process has ended.
func (p *etcdProcess) Exited() bool {
	select {
	case <-p.exit:
		return true
	default:
		return false
	}
}
