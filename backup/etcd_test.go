package backup

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"etcdops.dev/etcdops/test/etcdtest"
)

// A small cluster of real embedded etcd members on 127.0.0.1 (test/etcdtest).

type member struct {
	name      string
	dir       string
	peerURL   url.URL
	clientURL url.URL
	etcd      *etcdtest.Etcd
}

var freePort = etcdtest.FreePort

func newMember(t testing.TB, name string) *member {
	return &member{name: name, dir: t.TempDir(), peerURL: etcdtest.FreeURL(t), clientURL: etcdtest.FreeURL(t)}
}

func (m *member) config() *embed.Config {
	return etcdtest.Config(m.name, m.dir, m.peerURL, m.clientURL)
}

// startCluster starts n members as a new cluster and stops them when the test ends.
func startCluster(t testing.TB, n int) []*member {
	t.Helper()
	ms := make([]*member, n)
	cfgs := make([]*embed.Config, n)
	for i := range ms {
		ms[i] = newMember(t, fmt.Sprintf("m-%d", i))
		cfgs[i] = ms[i].config()
	}
	for i, e := range etcdtest.StartCluster(t, "backup-test", cfgs...) {
		ms[i].etcd = e
	}
	return ms
}

// startMember runs m, alone in its cluster, on its data dir (a new member, or one restored
// there) and waits until it serves; its client URL may change (etcdtest.StartAlone).
func startMember(t testing.TB, m *member, state, initial, token string) {
	t.Helper()
	cfg := m.config()
	cfg.ClusterState, cfg.InitialCluster, cfg.InitialClusterToken = state, initial, token
	m.etcd = etcdtest.StartAlone(t, cfg)
	m.clientURL = cfg.ListenClientUrls[0]
}

func stopMember(m *member) {
	if m.etcd != nil {
		m.etcd.Stop()
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
