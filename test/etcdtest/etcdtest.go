// Package etcdtest starts real embedded etcd members on 127.0.0.1 for tests: free loopback
// ports, a member's embed.Config with timings a loaded two-core machine keeps, start and wait
// until ready (bounded; the test fails with the member's name otherwise), stop when the test
// ends, and several members started together as a new cluster. Only _test.go files import it;
// callers adjust the returned *embed.Config (TLS, advertised URLs, quotas) before starting.
package etcdtest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Raft timings small enough for a fast suite and large enough that a loaded two-core machine
// holds no spurious elections.
const (
	TickMs     = 20
	ElectionMs = 200
)

// readyTimeout bounds how long a member may take to serve, generous for a loaded machine.
const readyTimeout = 30 * time.Second

// Ports FreePort picks from: below Linux's default ephemeral range (32768-60999), from which
// the kernel takes the local port of every outgoing connection and of every listen on port 0.
// A port taken from that range is free when it is asked for and may be another process's
// client port by the time etcd binds it; one below it is only taken by a listener that names
// it, so two packages' tests running at once collide only if they draw the same number.
const (
	freePortLow  = 20000
	freePortHigh = 32767
)

// portLocks is where FreePort claims a port for the test that drew it, a file per port
// locked with flock: the test binaries of several packages run at once (go test ./...), and a
// port one of them drew and has not bound yet is free to every other's draw. The kernel drops
// a lock when its process ends, so a killed test leaves none behind.
var portLocks = filepath.Join(os.TempDir(), "etcdops-test-ports")

// FreePort returns an unused port on 127.0.0.1, outside the ephemeral range where it can,
// that no other test process drew while t runs.
func FreePort(t testing.TB) int {
	t.Helper()
	if err := os.MkdirAll(portLocks, 0o777); err != nil {
		t.Fatal(err)
	}
	for range 100 {
		port := freePortLow + rand.IntN(freePortHigh-freePortLow+1)
		lock, ok := claimPort(port)
		if !ok {
			continue
		}
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			l.Close()
			t.Cleanup(func() { lock.Close() })
			return port
		}
		lock.Close()
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// claimPort locks port's file; false when another process holds it.
func claimPort(port int) (*os.File, bool) {
	f, err := os.OpenFile(filepath.Join(portLocks, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	return f, true
}

// FreeURL is an http URL on an unused port of 127.0.0.1.
func FreeURL(t testing.TB) url.URL {
	t.Helper()
	return url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", FreePort(t))}
}

// Config runs member name on dir, listening on and advertising peer and client, as a new
// one-member cluster of its own until the caller says otherwise. The logger is silent and no
// metrics listener is opened.
func Config(name, dir string, peer, client url.URL) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = dir
	cfg.TickMs = TickMs
	cfg.ElectionMs = ElectionMs
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenMetricsUrls = nil
	cfg.InitialCluster = name + "=" + peer.String()
	cfg.ClusterState = embed.ClusterStateFlagNew
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	return cfg
}

// Etcd is a started member. Stop it with Stop, never with Close: embed.Etcd's Close panics
// when called twice, and the test's cleanup stops it again.
type Etcd struct {
	*embed.Etcd
	stop sync.Once
}

// Stop hard-stops the member, skipping the leadership hand-off a graceful stop attempts, and
// closes it, keeping its data dir. Stopping a stopped member does nothing.
func (e *Etcd) Stop() {
	e.stop.Do(func() {
		e.Server.HardStop()
		e.Close()
	})
}

// Start starts cfg, waits until it serves and stops it when the test ends.
func Start(t testing.TB, cfg *embed.Config) *Etcd {
	t.Helper()
	return startAll(t, []*embed.Config{cfg})[0]
}

// StartAlone starts cfg, a member alone in its cluster (a new one, or one restored onto a
// data dir), like Start, and when a port it listens on was taken meanwhile by a process that
// drew it without FreePort (a restore's replay server draws from the same range), starts it
// again on new ports, twice at most: cfg's client URLs and peer listen URL say which it got.
// The advertised peer URL stays: a restored data dir records it, and nobody dials it.
func StartAlone(t testing.TB, cfg *embed.Config) *Etcd {
	t.Helper()
	for attempt := 1; ; attempt++ {
		e, err := start(cfg)
		if err == nil {
			t.Cleanup(e.Stop)
			return e
		}
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			t.Fatal(err)
		}
		client := FreeURL(t)
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
		cfg.ListenPeerUrls = []url.URL{FreeURL(t)}
	}
}

// StartCluster makes cfgs the members of one new cluster with token, starts them together
// (each waits for the others to elect a leader) and stops them when the test ends.
func StartCluster(t testing.TB, token string, cfgs ...*embed.Config) []*Etcd {
	t.Helper()
	var initial []string
	for _, cfg := range cfgs {
		initial = append(initial, cfg.Name+"="+cfg.AdvertisePeerUrls[0].String())
	}
	for _, cfg := range cfgs {
		cfg.InitialCluster = strings.Join(initial, ",")
		cfg.ClusterState = embed.ClusterStateFlagNew
		cfg.InitialClusterToken = token
	}
	return startAll(t, cfgs)
}

// startAll starts cfgs concurrently and fails the test, from its own goroutine, when any does
// not serve; the ones that did are stopped together when the test ends.
func startAll(t testing.TB, cfgs []*embed.Config) []*Etcd {
	t.Helper()
	es := make([]*Etcd, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i, cfg := range cfgs {
		wg.Go(func() { es[i], errs[i] = start(cfg) })
	}
	wg.Wait()
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, e := range es {
			if e != nil {
				wg.Go(e.Stop)
			}
		}
		wg.Wait()
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return es
}

func start(cfg *embed.Config) (*Etcd, error) {
	started, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start etcd member %s: %w", cfg.Name, err)
	}
	e := &Etcd{Etcd: started}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Stop()
		return nil, fmt.Errorf("etcd member %s: %w", cfg.Name, err)
	case <-time.After(readyTimeout):
		e.Stop()
		return nil, fmt.Errorf("etcd member %s not ready after %v", cfg.Name, readyTimeout)
	}
}
