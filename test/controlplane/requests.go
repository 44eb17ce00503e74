package controlplane

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	gosync "sync"
	"time"
)

// requestRecorder sits between Metacontroller and the hook: it forwards every call and keeps
// the last request body each hook path received, so that a scenario can hold the fixtures
// (test/fixtures) to what the real Metacontroller sends. The bodies go to Dir/requests, kept
// with the plane's logs.
type requestRecorder struct {
	dir    string
	client *http.Client

	mu     gosync.Mutex
	target string // the hook's URL; retarget changes it
	last   map[string][]byte
	syncs  int // /sync calls forwarded
}

// recordRequests starts the recorder in front of the hook at target and returns its URL.
func (p *Plane) recordRequests(target string) string {
	p.t.Helper()
	r := &requestRecorder{target: target, dir: p.file("requests"), client: &http.Client{Timeout: time.Minute}, last: map[string][]byte{}}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		p.t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		p.t.Fatal(err)
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	p.t.Cleanup(func() { srv.Close() })
	p.requests = r
	return "http://" + ln.Addr().String()
}

func (r *requestRecorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.last[req.URL.Path] = body
	target := r.target
	if req.URL.Path == "/sync" {
		r.syncs++
	}
	r.mu.Unlock()
	_ = os.WriteFile(filepath.Join(r.dir, filepath.Base(req.URL.Path)+".json"), body, 0o644)
	fwd, err := http.NewRequestWithContext(req.Context(), req.Method, target+req.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	fwd.Header = req.Header.Clone()
	resp, err := r.client.Do(fwd)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// retarget sends every call from now on to the hook at target.
func (r *requestRecorder) retarget(target string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.target = target
}

// syncCount is how many /sync calls were forwarded so far.
func (r *requestRecorder) syncCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.syncs
}

// lastRequest is the last body posted to path (/sync, /customize, /finalize), nil if none.
func (r *requestRecorder) lastRequest(path string) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last[path]
}
