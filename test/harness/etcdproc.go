package harness

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/api/v3/version"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver"
	"go.etcd.io/etcd/server/v3/etcdserver/api/membership"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"etcdops.dev/etcdops/test/etcdbin"
)

// Real etcd processes. With Options.EtcdBinary set, the kubelet runs each etcd container as
// a real etcd server process of the version its image names, with the argv the launcher
// decided, as it is, with one exception: the listen URLs on 0.0.0.0 or loopback bind the
// pod's own address (127.x.y.z) instead, the stand-in for the pod's network namespace.
// etcd's own timing (100ms heartbeat, 1s election) applies unless the spec's options set it.

// etcdServer is what the harness reads of a running member: the embedded server itself, or
// what a real process last answered on its client port.
type etcdServer interface {
	MemberID() types.ID
	AppliedIndex() uint64
	Term() uint64
	Lead() uint64
	members() []*membership.Member
}

// embeddedServer is an embedded member's server.
type embeddedServer struct{ *etcdserver.EtcdServer }

func (s embeddedServer) members() []*membership.Member { return s.Cluster().Members() }

// server is the process's etcdServer; nil while a real process has not answered yet.
func (p *etcdProcess) server() etcdServer {
	if p.ext == nil {
		return embeddedServer{p.e.Server}
	}
	st := p.ext.state.Load()
	if st == nil {
		return nil
	}
	return st
}

// dataDir is the member's --data-dir.
func (p *etcdProcess) dataDir() string {
	if p.ext == nil {
		return p.e.Config().Dir
	}
	return p.ext.dataDir
}

// EtcdBinaryForImage maps an etcd image onto the binary that runs it; see Options.EtcdBinary.
type EtcdBinaryForImage func(image string) (string, error)

// ImageVersion is the tag of an image reference: "registry/etcd:v3.6.16" is "v3.6.16".
func ImageVersion(image string) string {
	i := strings.LastIndex(image, ":")
	if i < 0 || strings.Contains(image[i:], "/") {
		return ""
	}
	return image[i+1:]
}

// startContainerEtcd starts the etcd of a pod's container: embedded, or the real binary of
// the image's version when the kubelet has EtcdBinary.
func (k *Kubelet) startContainerEtcd(image string, args []string, rt *podRuntime) (*etcdProcess, error) {
	if k.EtcdBinary == nil {
		return startEtcd(args, rt.ip, &k.defragHolds)
	}
	bin, err := k.EtcdBinary(image)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", image, err)
	}
	if err := os.MkdirAll(rt.dir, 0o755); err != nil {
		return nil, err
	}
	return startExternal(bin, args, rt.ip, filepath.Join(rt.dir, fmt.Sprintf("etcd-%d.log", time.Now().UnixNano())), k.Login,
		etcdbin.DNSEnv+"="+k.DNS.conn.LocalAddr().String())
}

// extEtcd is a real etcd process.
type extEtcd struct {
	cmd      *exec.Cmd
	dataDir  string
	log      string
	endpoint string
	tls      *tls.Config
	login    func() (user, password string)
	state    atomic.Pointer[extState]
	status   error // cmd.Wait's answer, set before closed
}

// extState is what the process last answered: its status and the members it knows.
type extState struct {
	id, applied, term, lead uint64
	dbSize, dbInUse         int64
	version                 string
	list                    []*membership.Member
}

func (s *extState) MemberID() types.ID            { return types.ID(s.id) }
func (s *extState) members() []*membership.Member { return s.list }

// AppliedIndex is 0 for a learner, which does not serve its membership: the harness takes the
// membership from the member that applied the most, and a learner's state has none.
func (s *extState) AppliedIndex() uint64 {
	if s.list == nil {
		return 0
	}
	return s.applied
}
func (s *extState) Term() uint64 { return s.term }
func (s *extState) Lead() uint64 { return s.lead }

// listenFlags bind the pod's address: see the comment at the top.
var listenFlags = map[string]bool{"listen-peer-urls": true, "listen-client-urls": true, "listen-client-http-urls": true, "listen-metrics-urls": true}

// podArgv returns args with the listen URLs on the pod's address, and the flags' values.
func podArgv(args []string, podIP string) ([]string, map[string]string) {
	out := append([]string(nil), args...)
	vals := map[string]string{}
	for i := 0; i < len(out); i++ {
		name, val, hasVal := strings.Cut(strings.TrimLeft(out[i], "-"), "=")
		if !strings.HasPrefix(out[i], "-") {
			continue
		}
		if !hasVal {
			if i+1 >= len(out) || strings.HasPrefix(out[i+1], "-") {
				vals[name] = "true"
				continue
			}
			i++
			val = out[i]
		}
		if listenFlags[name] {
			us := strings.Split(val, ",")
			for j, s := range us {
				us[j] = podURL(s, podIP)
			}
			val = strings.Join(us, ",")
			if hasVal {
				out[i] = "--" + name + "=" + val
			} else {
				out[i] = val
			}
		}
		vals[name] = val
	}
	return out, vals
}

func podURL(s, podIP string) string {
	u, err := url.Parse(s)
	if err != nil {
		return s
	}
	return podURLs([]url.URL{*u}, podIP)[0].String()
}

// startExternal starts a real etcd process; it returns once the process runs. It counts
// among the kubelet's servers once it has answered on its client port, or at once when it
// restarts on a data dir whose last process was seen.
func startExternal(bin string, args []string, podIP, logPath string, login func() (string, string), env ...string) (*etcdProcess, error) {
	if err := loopbackOnly(podIP); err != nil {
		return nil, err
	}
	argv, vals := podArgv(args, podIP)
	for name := range listenFlags {
		for _, s := range strings.Split(vals[name], ",") {
			if u, err := url.Parse(s); s != "" && (err != nil || loopbackOnly(u.Hostname()) != nil) {
				return nil, fmt.Errorf("--%s=%s would listen outside 127.0.0.0/8", name, vals[name])
			}
		}
	}
	dir := vals["data-dir"]
	if dir == "" {
		return nil, fmt.Errorf("etcd command line without --data-dir: %q", args)
	}
	unlock := lockDir(dir)
	defer unlock()
	if err := awaitRelease(dir); err != nil {
		return nil, err
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	x := &extEtcd{dataDir: dir, log: logPath, login: login}
	for _, s := range strings.Split(vals["listen-client-urls"], ",") {
		// Plain first: while the client port serves both, the observer needs no certificate.
		if strings.HasPrefix(s, "http://") || x.endpoint == "" {
			x.endpoint = s
		}
	}
	if strings.HasPrefix(x.endpoint, "https://") {
		certFile, keyFile := vals["cert-file"], vals["key-file"]
		// The harness's own observer: it reads the member's state and checks nothing about
		// its certificate, which the scenarios check on their own (tls_test.go).
		x.tls = &tls.Config{InsecureSkipVerify: true, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(certFile, keyFile)
			return &c, err
		}}
	}
	cmd := exec.Command(bin, argv...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// No environment of the test's (etcd reads ETCD_* variables as flags), but the cluster
	// DNS, as a pod's resolv.conf would name it.
	cmd.Env = append([]string{}, env...)
	// The process dies with the test process, whatever ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	x.cmd = cmd
	p := &etcdProcess{ext: x, exit: make(chan struct{}), closed: make(chan struct{}), panicked: make(chan struct{})}
	// A member that restarts on its data is the member it was from its first instant, as an
	// embedded one is once started; until it answers, it is seen as its last process left it.
	if prev, ok := holders.Load(dir); ok && prev.(*etcdProcess).ext != nil {
		if _, err := os.Stat(filepath.Join(dir, "member", "wal")); err == nil {
			x.state.Store(prev.(*etcdProcess).ext.state.Load())
		}
	}
	holders.Store(dir, p)
	go func() {
		x.status = cmd.Wait()
		if msg, ok := logPanic(logPath); ok && !p.killed.Load() {
			p.crashed(msg)
		}
		close(p.closed)
		p.once.Do(func() { close(p.exit) })
	}()
	go x.poll(p)
	return p, nil
}

// poll keeps the process's state as it answers, every 25ms, until it exits. Its client
// redials within 200ms: the process may not listen yet when the poll starts, and gRPC's
// default back-off would leave the member unseen for seconds. Once the member refuses it for
// want of a login (its auth is on) and Kubelet.Login gives one, a client that logs in takes
// over; it is made only then, as a client that logs in does so when it is made.
func (x *extEtcd) poll(p *etcdProcess) {
	cli, err := x.pollClient("", "")
	if err != nil {
		return
	}
	defer func() { cli.Close() }()
	t := time.NewTicker(25 * time.Millisecond)
	defer t.Stop()
	loggedIn := false
	for {
		select {
		case <-p.exit:
			return
		case <-t.C:
		}
		s, err := x.sample(cli)
		if user, password := x.credentials(); err != nil && !loggedIn && user != "" &&
			(errors.Is(err, rpctypes.ErrUserEmpty) || errors.Is(err, rpctypes.ErrGRPCUserEmpty)) {
			if c, err := x.pollClient(user, password); err == nil {
				cli.Close()
				cli, loggedIn = c, true
			}
			continue
		}
		if s != nil {
			x.state.Store(s)
		}
	}
}

func (x *extEtcd) pollClient(user, password string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: []string{x.endpoint}, TLS: x.tls, DialTimeout: time.Second,
		Logger: zap.NewNop(), DialKeepAliveTime: time.Second, Username: user, Password: password,
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})}})
}

// sample asks the member for its membership, then its status: nil when it did not answer
// both (with the error when one failed). A member that no longer finds
// itself in the membership has applied its own removal and stops within a second; a Status
// then makes etcd panic ("failed to find local ID in cluster members"), so the observer,
// which a real cluster does not have, leaves it alone and keeps what it last saw.
func (x *extEtcd) sample(cli *clientv3.Client) (*extState, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	s := &extState{}
	ml, err := cli.MemberList(ctx, clientv3.WithSerializable())
	if err != nil {
		// A learner serves only its status (and serializable reads).
		if !strings.Contains(err.Error(), "not supported for learner") {
			return nil, err
		}
		ml = &clientv3.MemberListResponse{Header: &pb.ResponseHeader{}}
	}
	self := ml.Header.MemberId == 0
	for _, m := range ml.Members {
		self = self || m.ID == ml.Header.MemberId
		s.list = append(s.list, &membership.Member{ID: types.ID(m.ID),
			RaftAttributes: membership.RaftAttributes{PeerURLs: m.PeerURLs, IsLearner: m.IsLearner},
			Attributes:     membership.Attributes{Name: m.Name, ClientURLs: m.ClientURLs}})
	}
	if !self {
		return nil, nil
	}
	st, err := cli.Status(ctx, x.endpoint)
	if err != nil {
		return nil, err
	}
	s.id, s.applied, s.term, s.lead = st.Header.MemberId, st.RaftAppliedIndex, st.RaftTerm, st.Leader
	s.dbSize, s.dbInUse, s.version = st.DbSize, st.DbSizeInUse, st.Version
	return s, nil
}

// client is a client of this member alone, for the day-2 calls.
func (x *extEtcd) client() (*clientv3.Client, error) {
	user, password := x.credentials()
	return clientv3.New(clientv3.Config{Endpoints: []string{x.endpoint}, TLS: x.tls, DialTimeout: time.Second, Logger: zap.NewNop(), Username: user, Password: password})
}

// credentials are the login of the harness's clients; none unless Kubelet.Login is set.
func (x *extEtcd) credentials() (user, password string) {
	if x.login == nil {
		return "", ""
	}
	return x.login()
}

// endExternal is SIGTERM (etcd's graceful stop, which hands leadership away) or SIGKILL; a
// process that has not stopped after stopBound is killed.
func (p *etcdProcess) endExternal(hard bool) {
	p.once.Do(func() {
		sig := syscall.SIGTERM
		if hard {
			p.killed.Store(true)
			sig = syscall.SIGKILL
		}
		p.ext.cmd.Process.Signal(sig)
		select {
		case <-p.closed:
		case <-time.After(stopBound):
			p.killed.Store(true)
			p.ext.cmd.Process.Kill()
			<-p.closed
		}
		close(p.exit)
	})
}

// removedMessage is what etcd says when it stops because it was removed from the cluster.
const removedMessage = "the member has been permanently removed from the cluster"

// exitReasonExternal says why the process ended, from its exit status and its log.
func (p *etcdProcess) exitReasonExternal() string {
	if msg, ok := p.panicMessage(); ok {
		return "etcd panicked: " + msg
	}
	data, _ := os.ReadFile(p.ext.log)
	if strings.Contains(string(data), removedMessage) {
		return "etcd exited: " + removedMessage
	}
	reason := "etcd exited"
	if p.ext.status != nil {
		reason += " (" + p.ext.status.Error() + ")"
	}
	if msg := lastFatal(string(data)); msg != "" {
		reason += ": " + msg
	}
	return reason
}

// logPanic finds a Go panic or a zap Panic entry in an etcd log. Fatal entries (a flag
// refused, a data dir of another cluster) end the process without a panic: the exit reason
// gives them. A removed member stops a second after it applied its own removal, and a
// request meanwhile panics ("failed to find local ID in cluster members"): that is a process
// on its way out, as the embedded members' exiting rule says (etcd.go), not counted.
func logPanic(path string) (string, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", false
	}
	log := string(data)
	for _, line := range strings.Split(log, "\n") {
		msg, ok := "", false
		switch {
		case strings.HasPrefix(line, "panic: "):
			msg, ok = strings.TrimPrefix(line, "panic: "), true
		case strings.Contains(line, `"level":"panic"`):
			msg, ok = logMessage(line), true
		}
		if !ok {
			continue
		}
		if id := logField(line, "local-member-id"); id != "" && strings.Contains(line, "failed to find local ID in cluster members") &&
			removedSelf(log, id) {
			return "", false
		}
		return msg, true
	}
	return "", false
}

// removedSelf reports whether the log shows the member applying its own removal.
func removedSelf(log, id string) bool {
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, `"msg":"removed member"`) && logField(line, "removed-remote-peer-id") == id {
			return true
		}
	}
	return false
}

// logField is the string value of a zap entry's field, or "".
func logField(line, name string) string {
	_, v, ok := strings.Cut(line, `"`+name+`":"`)
	if !ok {
		return ""
	}
	val, _, _ := strings.Cut(v, `"`)
	return val
}

// lastFatal is what etcd said when it gave up: its last fatal entry, or a flag it refused
// (printed before its usage text), or the log's first line.
func lastFatal(log string) string {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], `"level":"fatal"`) {
			return logMessage(lines[i])
		}
	}
	for _, l := range lines {
		for _, p := range []string{"flag provided but not defined", "invalid value", "error verifying flags", "etcd: "} {
			if strings.Contains(l, p) {
				return strings.TrimSpace(l)
			}
		}
	}
	return strings.TrimSpace(lines[0])
}

// logMessage is a zap entry's message with the fields that say what failed.
func logMessage(line string) string {
	_, rest, ok := strings.Cut(line, `"msg":"`)
	if !ok {
		return line
	}
	msg, _, _ := strings.Cut(rest, `"`)
	for _, f := range []string{"error", "job", "panic"} {
		if val := logField(rest, f); val != "" {
			msg += ", " + f + ": " + val
		}
	}
	return msg
}

// The day-2 reads and calls, on either kind of member.

func serverDBSize(p *etcdProcess) DBSize {
	if p.ext == nil {
		be := p.e.Server.Backend()
		return DBSize{File: be.Size(), InUse: be.SizeInUse()}
	}
	if st := p.ext.state.Load(); st != nil {
		return DBSize{File: st.dbSize, InUse: st.dbInUse}
	}
	return DBSize{}
}

func serverAlarms(p *etcdProcess) ([]*pb.AlarmMember, error) {
	if p.ext == nil {
		return p.e.Server.Alarms(), nil
	}
	cli, err := p.ext.client()
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := cli.AlarmList(ctx)
	if err != nil {
		return nil, err
	}
	return r.Alarms, nil
}

func serverAlarm(ctx context.Context, p *etcdProcess, req *pb.AlarmRequest) error {
	if p.ext == nil {
		_, err := p.e.Server.Alarm(ctx, req)
		return err
	}
	cli, err := p.ext.client()
	if err != nil {
		return err
	}
	defer cli.Close()
	_, err = pb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(ctx, req)
	return err
}

var errRealProcess = errors.New("not available with real etcd processes")

// loopbackOnly refuses an address outside 127.0.0.0/8 for a real process's listen URLs.
func loopbackOnly(podIP string) error {
	if ip := net.ParseIP(podIP); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("pod address %s is not on loopback", podIP)
	}
	return nil
}

// embeddedServers are the embedded servers among servers; Partition needs etcd's rafthttp
// pause, which only an embedded member offers.
func embeddedServers(servers map[string]etcdServer) (map[string]embeddedServer, error) {
	out := map[string]embeddedServer{}
	for name, s := range servers {
		es, ok := s.(embeddedServer)
		if !ok {
			return nil, fmt.Errorf("partitioning %s: %w", name, errRealProcess)
		}
		out[name] = es
	}
	return out, nil
}

// EtcdVersions are the versions the running members report on their client port, by pod:
// a real process's own release, or for an embedded member the one linked into the test,
// whatever the image says.
func (e *Env) EtcdVersions() map[string]string {
	out := map[string]string{}
	for pod, p := range e.Kubelet.procs() {
		if p.ext == nil {
			out[pod] = "v" + version.Version
		} else if st := p.ext.state.Load(); st != nil {
			out[pod] = "v" + st.version
		}
	}
	return out
}
