package hooks

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"etcdops.dev/etcdops/backupresult"
)

// The hook reads the stream's progress as the stream serves it (the handler below stands in
// for the stream's HTTP answer, which the e2e tests read from the real stream), and turns
// whatever goes wrong into progress not known, with the reason, in bounded time.
func TestStreamProgressIsReadOrUnknown(t *testing.T) {
	want := backupresult.Progress{StoredRevision: 42, Revision: 43, StoredTime: time.Unix(1700000000, 0).UTC(),
		CaughtUpTime: time.Unix(1700000005, 0).UTC(), BehindSeconds: 2.5, LastError: "storage unreachable"}
	mux := http.NewServeMux()
	mux.HandleFunc(backupresult.ProgressPath, func(w http.ResponseWriter, _ *http.Request) { _ = json.NewEncoder(w).Encode(want) })
	mux.HandleFunc("/garbage", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("<html>")) })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	h := &handler{Deps: Deps{ProgressTimeout: 200 * time.Millisecond, Progress: NewHTTPProgress()}}

	got := h.streamProgress(context.Background(), srv.URL+backupresult.ProgressPath)
	if !got.Known || got.Progress != want || got.Progress.Behind() != 2500*time.Millisecond {
		t.Fatalf("read %+v, want %+v", got, want)
	}
	for _, c := range []struct{ url, err string }{
		{"", "not observed yet"},
		{srv.URL + "/missing", "404"},
		{srv.URL + "/garbage", "backup progress"},
		{srv.URL + "/slow", "deadline exceeded"},
		{"http://127.0.0.1:1/progress", "refused"},
	} {
		start := time.Now()
		got := h.streamProgress(context.Background(), c.url)
		if got.Known || !strings.Contains(got.Err, c.err) {
			t.Errorf("%q: %+v, want unknown with %q", c.url, got, c.err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("%q: took %s, past the 200ms bound", c.url, took)
		}
	}
}
