package hooks_test

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"etcdops.dev/etcdops/hooks"
	"etcdops.dev/etcdops/membership"
	"etcdops.dev/etcdops/test/etcdtest"
)

// recorder listens on addr and counts the connections it gets, handing each to serve.
type recorder struct {
	addr string
	mu   gosync.Mutex
	n    int
}

func record(t *testing.T, addr string, serve func(net.Conn)) *recorder {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("no loopback address %s to listen on (run under a network namespace of your own): %v", addr, err)
	}
	t.Cleanup(func() { l.Close() })
	r := &recorder{addr: addr}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			r.n++
			r.mu.Unlock()
			go serve(c)
		}
	}()
	return r
}

func hangUp(c net.Conn) { c.Close() }

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// TestForgedRequestDialsOnlyTheClustersPods posts a request that lists, besides the
// cluster's own pod, pods of another namespace, of another cluster, without the cluster's
// label, with names that are not members', beyond any size, and addresses no pod has; and whose
// one real member (embedded etcd) advertises a client URL elsewhere. The real observer dials
// the cluster's own pod and nothing else: every other address records no connection.
func TestForgedRequestDialsOnlyTheClustersPods(t *testing.T) {
	const ip = "127.0.91."
	foreign := map[string]*recorder{}
	for i, story := range []string{
		"a pod of another namespace", "a pod of another cluster", "a pod without the cluster label",
		"a pod that is not a member by name", "a member beyond any size", "the client URL etcd advertises",
	} {
		foreign[story] = record(t, fmt.Sprintf("%s%d:2379", ip, 11+i), hangUp)
	}
	own := startMember(t, ip+"10", "http://"+foreign["the client URL etcd advertises"].addr)

	o := membership.NewObserver(membership.ObserverOptions{Deadline: 2 * time.Second})
	t.Cleanup(o.Close)
	srv := newServer(t, hooks.Deps{Etcd: o})
	parent := `{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"default","uid":"u"},"spec":{"size":3}}`
	pod := func(name, ns, cluster, ip string) string {
		labels := ""
		if cluster != "" {
			labels = `,"labels":{"etcdops.dev/cluster":"` + cluster + `"}`
		}
		return fmt.Sprintf(`"%s/%s":{"metadata":{"name":%q,"namespace":%q%s},"status":{"podIP":%q}}`, ns, name, name, ns, labels, ip)
	}
	related := `{"Pod.v1":{` + strings.Join([]string{
		pod("etcd-0", "default", "etcd", ip+"10"),
		pod("etcd-1", "other", "etcd", ip+"11"),
		pod("etcd-2", "default", "other", ip+"12"),
		pod("etcd-3", "default", "", ip+"13"),
		pod("kube-apiserver", "default", "etcd", ip+"14"),
		pod("etcd-40", "default", "etcd", ip+"15"),
		pod("etcd-4", "default", "etcd", "169.254.169.254"),
		pod("etcd-5", "default", "etcd", ip+"16:2379"),
		pod("etcd-6", "default", "etcd", "metadata.google.internal"),
	}, ",") + `}}`
	for range 3 {
		if status, body := post(t, srv, "/sync", syncBody(parent, emptyChildren, related)); status != 200 {
			t.Fatalf("%d %s", status, body)
		}
	}
	if own.count() == 0 {
		t.Fatal("the cluster's own pod got no connection: the recorder would see none either way")
	}
	for story, r := range foreign {
		if n := r.count(); n > 0 {
			t.Errorf("%s (%s) got %d connection(s)", story, r.addr, n)
		}
	}
}

// startMember runs a one-member etcd on host's client port, advertising clientURL, and counts
// the connections to its client port.
func startMember(t *testing.T, host, clientURL string) *recorder {
	t.Helper()
	backend := host + ":32379"
	r := record(t, host+":2379", func(c net.Conn) { proxy(c, backend) })

	peer := url.URL{Scheme: "http", Host: host + ":32380"}
	client := url.URL{Scheme: "http", Host: backend}
	advertised, _ := url.Parse(clientURL)
	cfg := etcdtest.Config("etcd-0", t.TempDir(), peer, client)
	cfg.AdvertiseClientUrls = []url.URL{*advertised}
	etcdtest.Start(t, cfg)
	return r
}

// proxy passes one connection through to the member, so the hook's dial of the pod reaches
// etcd while the recorder counts it.
func proxy(c net.Conn, backend string) {
	defer c.Close()
	b, err := net.Dial("tcp", backend)
	if err != nil {
		return
	}
	defer b.Close()
	done := make(chan struct{}, 2)
	go func() { io.Copy(b, c); done <- struct{}{} }()
	go func() { io.Copy(c, b); done <- struct{}{} }()
	<-done
}
