package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The replay runs the pod's own etcd binary (launch's --etcd) on the restored data dir, as a
// process of its own on loopback ports: the release that will run the data dir is the one that
// writes it, so its storage schema and cluster version stay that release's.

// Bounds on the replay server's life: its start up to the first answer, and its stop.
const (
	replayStartTimeout = time.Minute
	replayStopTimeout  = 30 * time.Second
)

// Limits the replay server is started with. One original revision is one transaction, however
// many changes it holds (a lease's expiry deletes all its keys in one revision), so the
// transaction limits are lifted; a revision larger than replayMaxRequestBytes is refused by
// the server, and the restore with it.
const (
	replayMaxTxnOps       = math.MaxInt32
	replayMaxRequestBytes = 64 << 20
	// grpcOverhead is what etcd allows a request beyond --max-request-bytes for gRPC's framing.
	grpcOverhead = 512 << 10
	// replayQuotaBytes is etcd's largest recommended backend quota (8 GiB): the replay must not
	// raise a NOSPACE alarm below the quota the cluster itself runs with.
	replayQuotaBytes = 8 << 30
)

// Ports the replay server listens on are drawn below Linux's ephemeral range (32768-60999),
// from which the kernel takes the local port of outgoing connections: a port free when drawn
// stays free until etcd binds it unless another listener names it. A collision anyway ends the
// server at once with "address already in use", and it starts again on other ports.
const (
	replayPortLow   = 20000
	replayPortHigh  = 32767
	replayBindTries = 3
)

// replayServer is the pod's etcd running on the restored data dir for the replay.
type replayServer struct {
	cmd      *exec.Cmd
	out      *tailBuffer
	endpoint string
	cli      *clientv3.Client
	exited   chan struct{} // closed once the process has ended; waitErr is then set
	waitErr  error
}

// startReplayServer starts etcd binary bin on dataDir as member, listening on loopback only,
// and waits until it serves. Its output is kept for the errors.
func startReplayServer(ctx context.Context, bin, dataDir, member string) (*replayServer, error) {
	if bin == "" {
		return nil, errors.New("no etcd binary to replay the stored changes with (launch's --etcd)")
	}
	for try := 1; ; try++ {
		s, err := tryReplayServer(ctx, bin, dataDir, member)
		if err == nil {
			return s, nil
		}
		if try == replayBindTries || !strings.Contains(s.out.String(), "address already in use") {
			return nil, err
		}
	}
}

// tryReplayServer is one start; on failure the server returned is stopped and holds the
// output.
func tryReplayServer(ctx context.Context, bin, dataDir, member string) (*replayServer, error) {
	ports, err := loopbackPorts(2)
	s := &replayServer{out: &tailBuffer{max: 64 << 10}, exited: make(chan struct{})}
	if err != nil {
		return s, fmt.Errorf("replay: no free loopback port: %w", err)
	}
	client := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	s.endpoint = client
	s.cmd = exec.Command(bin,
		"--name="+member,
		"--data-dir="+dataDir,
		"--listen-client-urls="+client,
		"--advertise-client-urls="+client,
		"--listen-peer-urls=http://127.0.0.1:"+strconv.Itoa(ports[1]),
		"--max-txn-ops="+strconv.Itoa(replayMaxTxnOps),
		"--max-request-bytes="+strconv.Itoa(replayMaxRequestBytes),
		"--quota-backend-bytes="+strconv.Itoa(replayQuotaBytes))
	s.cmd.Env = withoutEtcdEnv(os.Environ())
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	endWithParent(s.cmd)
	if err := s.cmd.Start(); err != nil {
		close(s.exited)
		return s, fmt.Errorf("replay: start %s: %w", bin, err)
	}
	go func() {
		s.waitErr = s.cmd.Wait()
		close(s.exited)
	}()
	s.cli, err = clientv3.New(clientv3.Config{Endpoints: []string{client}, Logger: zap.NewNop(), DialTimeout: 5 * time.Second,
		MaxCallSendMsgSize: replayMaxRequestBytes + grpcOverhead})
	if err == nil {
		err = s.waitServing(ctx)
	}
	if err != nil {
		s.kill()
		return s, err
	}
	return s, nil
}

// waitServing polls the server with linearizable reads until one answers (it has elected
// itself), the process ends, or the start bound passes.
func (s *replayServer) waitServing(ctx context.Context) error {
	deadline := time.Now().Add(replayStartTimeout)
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := s.cli.Get(rctx, "\x00", clientv3.WithKeysOnly(), clientv3.WithLimit(1))
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("replay: etcd on the restored data dir exited before serving (%v): %s", s.waitErr, s.out.reason())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replay: etcd on the restored data dir did not serve within %s (last: %v): %s", replayStartTimeout, err, s.out.reason())
		}
	}
}

// stop ends the server as its interrupt does (etcd closes its backend, writing everything
// applied, and exits), within replayStopTimeout; past it the process is killed and the stop is
// an error, since the data dir may then lack what was applied last.
func (s *replayServer) stop() error {
	s.cli.Close()
	select {
	case <-s.exited:
		return fmt.Errorf("replay: etcd on the restored data dir exited during the replay (%v): %s", s.waitErr, s.out.reason())
	default:
	}
	if err := s.cmd.Process.Signal(os.Interrupt); err != nil {
		s.kill()
		return fmt.Errorf("replay: stop etcd: %w", err)
	}
	select {
	case <-s.exited:
		return nil
	case <-time.After(replayStopTimeout):
		s.kill()
		return fmt.Errorf("replay: etcd on the restored data dir did not stop within %s: %s", replayStopTimeout, s.out.reason())
	}
}

// kill ends the server at once and waits for it; for a replay that failed anyway.
func (s *replayServer) kill() {
	if s.cli != nil {
		s.cli.Close()
	}
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
	}
	<-s.exited
}

// loopbackPorts draws n distinct free ports on 127.0.0.1 (see replayPortLow), holding each
// until all are drawn.
func loopbackPorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range 100 {
		port := replayPortLow + rand.IntN(replayPortHigh-replayPortLow+1)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		ls = append(ls, l)
		if ports = append(ports, port); len(ports) == n {
			return ports, nil
		}
	}
	return nil, fmt.Errorf("%d of %d ports found free in 100 draws from %d-%d", len(ports), n, replayPortLow, replayPortHigh)
}

// withoutEtcdEnv drops etcd's own ETCD_* variables: etcd reads each as a flag, and the
// container's (an auto-compaction, a listen URL) must not reach the replay server.
func withoutEtcdEnv(env []string) []string {
	out := env[:0:0]
	for _, e := range env {
		if !strings.HasPrefix(e, "ETCD_") {
			out = append(out, e)
		}
	}
	return out
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// reason is what the server's output says went wrong: a Go panic's message, else its last
// fatal or panic log entry, else its last error entry, else its last lines.
func (b *tailBuffer) reason() string {
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	var fatal, failed string
	for _, l := range lines {
		if strings.HasPrefix(l, "panic: ") {
			return l
		}
		var e struct{ Level, Msg, Error string }
		if json.Unmarshal([]byte(l), &e) != nil {
			continue
		}
		entry := strings.TrimSuffix(e.Msg+": "+e.Error, ": ")
		switch e.Level {
		case "fatal", "panic", "dpanic":
			fatal = entry
		case "error":
			failed = entry
		}
	}
	switch {
	case fatal != "":
		return fatal
	case failed != "":
		return failed
	case len(lines) == 1 && lines[0] == "":
		return "no output"
	}
	return strings.Join(lines[max(0, len(lines)-3):], " | ")
}
