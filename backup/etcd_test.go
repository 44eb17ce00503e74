package backup

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// A small cluster of real embedded etcd members on 127.0.0.1, with timings a loaded
// two-core machine keeps.

type member struct {
	name      string
	dir       string
	peerURL   url.URL
	clientURL url.URL
	etcd      *embed.Etcd
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func newMember(t testing.TB, name string) *member {
	return &member{
		name:      name,
		dir:       t.TempDir(),
		peerURL:   url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", freePort(t))},
		clientURL: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", freePort(t))},
	}
}

// startCluster starts n members as a new cluster and stops them when the test ends.
func startCluster(t testing.TB, n int) []*member {
	t.Helper()
	var ms []*member
	var initial []string
	for i := range n {
		m := newMember(t, fmt.Sprintf("m-%d", i))
		ms = append(ms, m)
		initial = append(initial, m.name+"="+m.peerURL.String())
	}
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Go(func() { startMember(t, m, embed.ClusterStateFlagNew, strings.Join(initial, ","), "backup-test") })
	}
	wg.Wait()
	return ms
}

// startMember runs m on its data dir (a new member, or one restored there) and waits until
// it serves.
func startMember(t testing.TB, m *member, state, initial, token string) {
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = m.dir
	cfg.TickMs = 20
	cfg.ElectionMs = 200
	cfg.ListenPeerUrls = []url.URL{m.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{m.peerURL}
	cfg.ListenClientUrls = []url.URL{m.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{m.clientURL}
	cfg.ListenMetricsUrls = nil
	cfg.InitialCluster = initial
	cfg.ClusterState = state
	cfg.InitialClusterToken = token
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Errorf("start %s: %v", m.name, err)
		return
	}
	t.Cleanup(func() { stopMember(m) })
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		t.Errorf("start %s: %v", m.name, err)
		return
	case <-time.After(20 * time.Second):
		e.Close()
		t.Errorf("start %s: not ready after 20s", m.name)
		return
	}
	m.etcd = e
}

func stopMember(m *member) {
	if m.etcd != nil {
		m.etcd.Server.HardStop()
		m.etcd.Close()
		m.etcd = nil
	}
}

func endpoints(ms ...*member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.clientURL.String())
	}
	return out
}

// leader waits for a leader and returns it.
func leader(t testing.TB, ms []*member) *member {
	t.Helper()
	for range 250 {
		for _, m := range ms {
			if m.etcd != nil && m.etcd.Server.Leader() == m.etcd.Server.MemberID() {
				return m
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("no leader after 5s")
	return nil
}
