package hooks_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/hooks"
	"etcdops.dev/etcdops/sync"
)

// FuzzHooks posts arbitrary bodies to sync, finalize and customize, the first byte choosing
// which. The hook never fails (no 500: a panic or an unexpected error would be one), answers
// bad input with 400, 413 or 422 and a JSON error, and a 200 is a complete answer: for sync,
// a status and a child list that is never null. Etcd is answered by a stub, so nothing is
// dialled. Seeds are the fixtures' requests; the corpus in testdata/fuzz/FuzzHooks replays in
// every go test run.
func FuzzHooks(f *testing.F) {
	files, _ := filepath.Glob("../test/fixtures/*.json")
	for _, file := range files {
		if strings.HasSuffix(file, ".golden.json") || strings.HasSuffix(file, ".etcd.json") {
			continue
		}
		if b, err := os.ReadFile(file); err == nil {
			f.Add(byte(0), b)
			f.Add(byte(2), b)
		}
	}
	f.Add(byte(1), []byte(`{"parent":{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"e","namespace":"n"}},"finalizing":true}`))
	f.Add(byte(0), []byte(`{"parent":{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"e","namespace":"n"},"spec":{"size":"three"}}}`))
	h := hooks.NewHandler(hooks.Deps{
		Config: sync.Config{ClusterDomain: "cluster.local", ToolImage: "etcdops/etcdops:v0.1.0"},
		Etcd: hooks.ObserverFunc(func(context.Context, etcdstate.Request) etcdstate.Snapshot {
			return etcdstate.Snapshot{Err: "fuzz: not asked"}
		}),
		MaxBodyBytes: 1 << 20,
	})
	paths := []string{"/sync", "/finalize", "/customize"}
	f.Fuzz(func(t *testing.T, which byte, body []byte) {
		path := paths[int(which)%len(paths)]
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(string(body)))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK:
			var answer map[string]json.RawMessage
			if err := json.Unmarshal(rec.Body.Bytes(), &answer); err != nil {
				t.Fatalf("%s answered 200 with %q: %v", path, rec.Body.Bytes(), err)
			}
			if path != "/customize" && (string(answer["children"]) == "null" || answer["children"] == nil || answer["status"] == nil) {
				t.Fatalf("%s answered 200 without status or children: %s", path, rec.Body.Bytes())
			}
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
			var e struct{ Error, Detail string }
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error == "" {
				t.Fatalf("%s answered %d without a JSON error: %q", path, rec.Code, rec.Body.Bytes())
			}
		default:
			t.Fatalf("%s answered %d: %s\nfor %q", path, rec.Code, rec.Body.Bytes(), body)
		}
	})
}
