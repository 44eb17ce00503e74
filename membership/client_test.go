package membership

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/connectivity"

	"etcdops.dev/etcdops/etcdstate"
)

// fakeRequest names a cluster whose endpoints are never dialled: creating clients does not
// connect, so the cache can be tested without etcd.
func fakeRequest(key string) etcdstate.Request {
	return etcdstate.Request{Key: key, Endpoints: []etcdstate.Endpoint{{Member: key + "-0", Address: "127.0.0.1:1", ServerName: key + "-0.test"}}}
}

// closed reports whether e's channels are closed.
func closed(e *clusterClients) bool {
	return e.channels[0].GetState() == connectivity.Shutdown
}

func newTestCache(max int, idle time.Duration) *clientCache {
	return &clientCache{max: max, idle: idle, connectTimeout: time.Second, entries: map[string]*clusterClients{}}
}

func TestCacheReusesClients(t *testing.T) {
	c := newTestCache(4, time.Minute)
	defer c.closeAll()
	now := time.Now()
	first, err := c.acquire(fakeRequest("a"), now)
	if err != nil {
		t.Fatal(err)
	}
	c.release(first, now)
	second, err := c.acquire(fakeRequest("a"), now)
	if err != nil {
		t.Fatal(err)
	}
	c.release(second, now)
	if first != second {
		t.Fatal("the same request got new clients")
	}

	changed := fakeRequest("a")
	changed.TLS = &etcdstate.TLS{CA: []byte("other CA")}
	changed.Endpoints[0].TLS = true
	if _, err := c.acquire(changed, now); err == nil || !strings.Contains(err.Error(), "CA") {
		t.Fatalf("bad CA: got %v", err)
	}
	moved := fakeRequest("a")
	moved.Endpoints[0].Address = "127.0.0.1:2"
	third, err := c.acquire(moved, now)
	if err != nil {
		t.Fatal(err)
	}
	c.release(third, now)
	if third == first {
		t.Fatal("a changed endpoint reused the old clients")
	}
}

func TestCacheIsBounded(t *testing.T) {
	c := newTestCache(2, time.Minute)
	defer c.closeAll()
	start := time.Now()
	held, err := c.acquire(fakeRequest("a"), start)
	if err != nil {
		t.Fatal(err)
	}
	for i, key := range []string{"b", "c", "d"} {
		e, err := c.acquire(fakeRequest(key), start.Add(time.Duration(i+1)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		c.release(e, start.Add(time.Duration(i+1)*time.Second))
	}
	if got := c.size(); got != 2 {
		t.Fatalf("cache holds %d clusters, bound 2", got)
	}
	// The oldest entry was evicted while in use: its clients stay open until released.
	if !held.evicted || closed(held) {
		t.Fatalf("evicted %v, closed %v; want evicted and still open", held.evicted, closed(held))
	}
	c.release(held, start)
	if !closed(held) {
		t.Fatal("an evicted entry stays open after its last release")
	}
}

func TestCacheClosesIdleClients(t *testing.T) {
	c := newTestCache(4, time.Minute)
	now := time.Now()
	e, err := c.acquire(fakeRequest("a"), now)
	if err != nil {
		t.Fatal(err)
	}
	c.release(e, now)
	c.sweep(now.Add(30 * time.Second))
	if c.size() != 1 {
		t.Fatal("swept a client idle for less than the timeout")
	}
	c.sweep(now.Add(2 * time.Minute))
	if c.size() != 0 || !closed(e) {
		t.Fatal("an idle client survived the sweep")
	}
}

func TestObserverClose(t *testing.T) {
	o := NewObserver(ObserverOptions{Deadline: 200 * time.Millisecond})
	snap := o.Observe(context.Background(), fakeRequest("a"))
	if snap.Asked || snap.Err == "" {
		t.Fatalf("nothing listens on the fake endpoint; got %+v", snap)
	}
	o.Close()
	o.Close()
	if snap := o.Observe(context.Background(), fakeRequest("a")); !strings.Contains(snap.Err, "closed") {
		t.Fatalf("after Close: got %+v", snap)
	}
}

func TestDialTarget(t *testing.T) {
	for _, tc := range []struct {
		story          string
		ep             etcdstate.Endpoint
		addr, verifyAs string
	}{
		{"pod IP, DNS name to verify", etcdstate.Endpoint{Address: "10.0.0.7:2379", ServerName: "e-0.e.ns.svc.cluster.local"}, "10.0.0.7:2379", "e-0.e.ns.svc.cluster.local"},
		{"no IP yet: dial the DNS name on the client port", etcdstate.Endpoint{ServerName: "e-0.e.ns.svc"}, "e-0.e.ns.svc:2379", "e-0.e.ns.svc"},
		{"a DNS name with its port", etcdstate.Endpoint{ServerName: "e-0.e.ns.svc:32379"}, "e-0.e.ns.svc:32379", "e-0.e.ns.svc"},
	} {
		addr, name := dialTarget(tc.ep)
		if addr != tc.addr || name != tc.verifyAs {
			t.Errorf("%s: got %s verified as %s, want %s as %s", tc.story, addr, name, tc.addr, tc.verifyAs)
		}
	}
}
