package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"
)

var hostile = flag.Bool("hostile", false, "run the long hostile-request load (24,000 requests and 400 slow connections) instead of the short one")

// TestHostileRequests posts malformed, oversized, deeply nested, duplicate-key and wrong-type
// requests to the real server (run, with its timeouts), and holds slow-loris connections open,
// while a well-behaved client keeps posting a fixture. Every hostile request gets a 4xx (or its
// connection is cut for being too slow), none a 5xx; the good requests are all answered; the
// server's goroutines and heap come back down afterwards. Its figures (latency of the good
// requests meanwhile, peaks) are logged: go test ./cmd/hook-server -run TestHostileRequests -v
// [-hostile].
func TestHostileRequests(t *testing.T) {
	requests, slow, clients := 1200, 40, 8
	if *hostile {
		requests, slow, clients = 24000, 400, 16
	}
	const maxBody = 1 << 20
	good, err := os.ReadFile("../../test/fixtures/create.json")
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	goroutines0 := runtime.NumGoroutine()
	base, stop, _ := startServer(t, []string{fmt.Sprintf("--max-body-bytes=%d", maxBody), "--read-header-timeout=1s"}, nil)
	defer stop()
	addr := strings.TrimPrefix(base, "http://")

	// The well-behaved client: one request after another, each timed.
	var lat []time.Duration
	var goodFailures atomic.Int64
	stopGood := make(chan struct{})
	goodDone := make(chan struct{})
	go func() {
		defer close(goodDone)
		cli := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
		defer cli.CloseIdleConnections()
		for {
			select {
			case <-stopGood:
				return
			default:
			}
			start := time.Now()
			resp, err := cli.Post(base+"/sync", "application/json", bytes.NewReader(good))
			if err != nil || resp.StatusCode != http.StatusOK {
				goodFailures.Add(1)
				if err == nil {
					resp.Body.Close()
				}
				continue
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			lat = append(lat, time.Since(start))
			time.Sleep(5 * time.Millisecond)
		}
	}()

	// Peaks, sampled while the load runs.
	var peakGoroutines int
	var peakHeap uint64
	sampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var ms runtime.MemStats
		for {
			select {
			case <-sampling:
				return
			case <-time.After(20 * time.Millisecond):
			}
			peakGoroutines = max(peakGoroutines, runtime.NumGoroutine())
			runtime.ReadMemStats(&ms)
			peakHeap = max(peakHeap, ms.HeapInuse)
		}
	}()

	// Slow-loris connections: headers one byte at a time (cut after --read-header-timeout), and
	// with -hostile also headers and then a body that never comes (cut once the whole request
	// took --sync-timeout and ten seconds).
	var cut atomic.Int64
	var slowWG gosync.WaitGroup
	for i := range slow {
		slowWG.Go(func() {
			conn, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return
			}
			defer conn.Close()
			var msg string
			if i%2 == 0 || !*hostile {
				msg = "POST /sync HTTP/1.1\r\nHost: hook\r\nContent-Type: application/json\r\n"
			} else {
				fmt.Fprintf(conn, "POST /sync HTTP/1.1\r\nHost: hook\r\nContent-Length: 100000\r\n\r\n{")
			}
			deadline := time.Now().Add(40 * time.Second)
			for j := 0; time.Now().Before(deadline); j++ {
				b := []byte{' '}
				if j < len(msg) {
					b = []byte{msg[j]}
				}
				conn.SetWriteDeadline(time.Now().Add(time.Second))
				if _, err := conn.Write(b); err != nil {
					cut.Add(1)
					return
				}
				conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
				if n, _ := conn.Read(make([]byte, 1)); n > 0 {
					// The server answered (408 or 400) and will close.
					cut.Add(1)
					return
				}
			}
		})
	}

	// The hostile requests, by kind.
	kinds := hostileKinds(good, maxBody)
	counts := map[string]map[int]int{}
	var mu gosync.Mutex
	var wg gosync.WaitGroup
	jobs := make(chan int)
	for range clients {
		wg.Go(func() {
			cli := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
			defer cli.CloseIdleConnections()
			for n := range jobs {
				k := kinds[n%len(kinds)]
				resp, err := cli.Post(base+k.path, "application/json", bytes.NewReader(k.body(n)))
				code := -1
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
				}
				mu.Lock()
				if counts[k.name] == nil {
					counts[k.name] = map[int]int{}
				}
				counts[k.name][code]++
				mu.Unlock()
			}
		})
	}
	start := time.Now()
	for n := range requests {
		jobs <- n
	}
	close(jobs)
	wg.Wait()
	hostileTook := time.Since(start)
	slowWG.Wait()
	close(stopGood)
	<-goodDone
	close(sampling)
	<-sampled

	for _, k := range kinds {
		for code, n := range counts[k.name] {
			if !slices.Contains(k.want, code) {
				t.Errorf("%s: %d answered %d, want one of %v", k.name, n, code, k.want)
			}
		}
	}
	if n := goodFailures.Load(); n > 0 {
		t.Errorf("%d good requests failed during the load", n)
	}
	if len(lat) == 0 {
		t.Fatal("no good request was answered during the load")
	}
	if got := cut.Load(); got != int64(slow) {
		t.Errorf("%d of %d slow connections were cut off by the server", got, slow)
	}

	// Everything the load started ends: goroutines back near where they were.
	var after int
	for range 100 {
		runtime.GC()
		if after = runtime.NumGoroutine(); after <= goroutines0+20 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if after > goroutines0+20 {
		t.Errorf("%d goroutines after the load, %d before", after, goroutines0)
	}
	slices.Sort(lat)
	t.Logf("%d hostile requests (%d kinds) from %d clients in %s, %d slow connections cut; %d good requests meanwhile: p50 %s, p99 %s, max %s; peak %d goroutines (%d before, %d after), peak heap in use %.1f MiB",
		requests, len(kinds), clients, hostileTook.Round(time.Millisecond), cut.Load(), len(lat),
		lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)*99/100].Round(time.Microsecond), lat[len(lat)-1].Round(time.Microsecond),
		peakGoroutines, goroutines0, after, float64(peakHeap)/(1<<20))
}

type hostileKind struct {
	name string
	path string
	body func(n int) []byte
	want []int
}

// hostileKinds are the bad requests, each with the answers it may get.
func hostileKinds(good []byte, maxBody int) []hostileKind {
	rng := rand.New(rand.NewSource(1))
	var rmu gosync.Mutex
	random := func(n int) int {
		rmu.Lock()
		defer rmu.Unlock()
		return rng.Intn(n)
	}
	parent := `{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"e","namespace":"n"}}`
	bad := []int{http.StatusBadRequest}
	return []hostileKind{
		{"truncated", "/sync", func(int) []byte { return good[:random(len(good)-1)] }, bad},
		{"bytes flipped", "/sync", func(int) []byte {
			b := bytes.Clone(good)
			for range 8 {
				b[random(len(b))] = byte(random(256))
			}
			return b
		}, []int{http.StatusOK, http.StatusBadRequest, http.StatusUnprocessableEntity}},
		{"oversized", "/sync", func(int) []byte {
			return append([]byte(`{"parent":`+parent+`,"pad":"`), bytes.Repeat([]byte("x"), maxBody)...)
		}, []int{http.StatusRequestEntityTooLarge}},
		{"deeply nested", "/sync", func(int) []byte {
			depth := 20000 + random(20000)
			return []byte(`{"parent":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}`)
		}, bad},
		{"duplicate keys", "/sync", func(int) []byte {
			return []byte(`{"parent":` + parent + `,"parent":` + strings.Replace(parent, `"e"`, `"other"`, 1) + `}`)
		}, bad},
		{"duplicate spec field", "/sync", func(int) []byte {
			return []byte(`{"parent":` + strings.Replace(parent, `}}`, `},"spec":{"size":3,"size":1}}`, 1) + `}`)
		}, bad},
		{"wrong type: parent", "/sync", func(int) []byte { return []byte(`{"parent":5}`) }, []int{http.StatusUnprocessableEntity}},
		{"wrong type: size", "/sync", func(int) []byte {
			return []byte(`{"parent":` + strings.Replace(parent, `}}`, `},"spec":{"size":"three"}}`, 1) + `}`)
		}, []int{http.StatusUnprocessableEntity}},
		{"wrong type: children", "/sync", func(int) []byte { return []byte(`{"parent":` + parent + `,"children":"all"}`) }, bad},
		{"wrong type: a pod", "/sync", func(int) []byte {
			return []byte(`{"parent":` + parent + `,"related":{"Pod.v1":{"p":{"status":{"podIP":7}}}}}`)
		}, bad},
		{"no parent", "/customize", func(int) []byte { return []byte(`{}`) }, []int{http.StatusUnprocessableEntity}},
		{"not JSON", "/finalize", func(int) []byte { return []byte("\x00\xff<html>") }, bad},
	}
}
