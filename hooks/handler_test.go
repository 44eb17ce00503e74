package hooks_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/hooks"
	"etcdops.dev/etcdops/membership"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/dialguard"
)

var testNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// offline is an Observer that fails the test if the hook asks etcd at all.
func offline(t *testing.T) hooks.Observer {
	return hooks.ObserverFunc(func(context.Context, etcdstate.Request) etcdstate.Snapshot {
		t.Error("the hook asked etcd although there was nothing to ask")
		return etcdstate.Snapshot{}
	})
}

// newServer starts the handler on 127.0.0.1:0. Without an Observer it gets the real one,
// dialling through the loopback guard: a dial off the machine fails the test.
func newServer(t *testing.T, d hooks.Deps) *httptest.Server {
	t.Helper()
	if d.Etcd == nil {
		o := membership.NewObserver(membership.ObserverOptions{Deadline: 2 * time.Second, Dial: dialguard.ForTest(t)})
		t.Cleanup(o.Close)
		d.Etcd = o
	}
	if d.Config == (sync.Config{}) {
		d.Config = sync.Config{ClusterDomain: "cluster.local", ToolImage: "etcdops/etcdops:v0.1.0"}
	}
	if d.Now == nil {
		d.Now = func() time.Time { return testNow }
	}
	srv := httptest.NewServer(hooks.NewHandler(d))
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, srv *httptest.Server, path, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

const parent = `{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"default","uid":"u-1"},"spec":{"size":3}}`

const emptyChildren = `{"StatefulSet.apps/v1":{},"Service.v1":{},"ConfigMap.v1":{},"PodDisruptionBudget.policy/v1":{},"Job.batch/v1":{}}`

func syncBody(parent, children, related string) string {
	return `{"controller":{},"parent":` + parent + `,"children":` + children + `,"related":` + related + `,"finalizing":false}`
}

func TestBadInputIsRefusedWithAReason(t *testing.T) {
	srv := newServer(t, hooks.Deps{Etcd: offline(t), MaxBodyBytes: 4096})
	tests := []struct {
		story      string
		method     string
		path, body string
		wantStatus int
		wantError  string
		wantDetail string
	}{
		{"a truncated body is malformed", "POST", "/sync", `{"parent":`, 400, "malformed request", "unexpected end of JSON input"},
		{"a JSON array is not a hook request", "POST", "/sync", `[1,2]`, 400, "malformed request", "cannot unmarshal array"},
		{"a child that is not an object is malformed", "POST", "/sync",
			syncBody(parent, `{"StatefulSet.apps/v1":{"etcd":"oops"}}`, `{}`), 400, "malformed request", `StatefulSet.apps/v1 "etcd"`},
		{"a body over the limit is refused whole", "POST", "/sync", `{"pad":"` + strings.Repeat("x", 5000) + `"}`, 413, "request body too large", "exceeds 4096 bytes"},
		{"a request without a parent cannot be answered", "POST", "/sync", `{"children":{}}`, 422, "unprocessable request", "no parent"},
		{"a parent of another kind is not ours", "POST", "/sync",
			syncBody(`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"x","namespace":"y"}}`, emptyChildren, `{}`),
			422, "unprocessable request", `the parent is "apps/v1" "Deployment"`},
		{"a parent of another version is not ours either", "POST", "/customize",
			`{"parent":{"apiVersion":"etcdops.dev/v1beta1","kind":"EtcdCluster","metadata":{"name":"x","namespace":"y"}}}`,
			422, "unprocessable request", "this hook serves apiVersion \"etcdops.dev/v1alpha1\""},
		{"a parent that breaks the schema is refused, not guessed at", "POST", "/sync",
			syncBody(`{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"x","namespace":"y"},"spec":{"size":"three"}}`, emptyChildren, `{}`),
			422, "unprocessable request", "does not match the EtcdCluster schema"},
		{"children of an undeclared type would be deleted, so nothing is answered", "POST", "/sync",
			syncBody(parent, `{"DaemonSet.apps/v1":{"x":{"metadata":{"name":"x"}}}}`, `{}`), 422, "unprocessable request", `"DaemonSet.apps/v1" are not managed`},
		{"an unknown path", "POST", "/reconcile", `{}`, 404, "not found", "/reconcile"},
		{"hooks are POST only", "GET", "/sync", ``, 405, "method not allowed", "GET /sync"},
	}
	for _, tt := range tests {
		t.Run(tt.story, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, srv.URL+tt.path, strings.NewReader(tt.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct{ Error, Detail string }
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatalf("body is not JSON: %v", err)
			}
			if resp.StatusCode != tt.wantStatus || body.Error != tt.wantError || !strings.Contains(body.Detail, tt.wantDetail) {
				t.Errorf("got %d %+v\nwant %d error %q, detail containing %q", resp.StatusCode, body, tt.wantStatus, tt.wantError, tt.wantDetail)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
}

func TestInvalidSpecIsA200ThatKeepsTheObservedChildren(t *testing.T) {
	// An invalid spec is the user's to fix, not a failed sync: status says why, and the
	// observed children come back as last applied, so nothing is deleted and nothing is new.
	srv := newServer(t, hooks.Deps{Etcd: offline(t)})
	invalid := `{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"default","uid":"u-1"},"spec":{"size":12,"etcdOptions":["--name=x"]}}`
	applied := `{"apiVersion":"v1","kind":"Service","metadata":{"name":"etcd","namespace":"default"},"spec":{"clusterIP":"None"}}`
	svc := `{"apiVersion":"v1","kind":"Service","metadata":{"name":"etcd","namespace":"default","uid":"s-1","annotations":{"metacontroller.k8s.io/last-applied-configuration":` + jsonString(applied) + `}},"spec":{"clusterIP":"None","type":"ClusterIP"}}`
	status, body := post(t, srv, "/sync", syncBody(invalid, `{"Service.v1":{"etcd":`+svc+`}}`, `{}`))
	if status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	var resp struct {
		Status struct {
			Conditions []struct{ Type, Status, Reason, Message string } `json:"conditions"`
		} `json:"status"`
		Children []json.RawMessage `json:"children"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		t.Fatal(err)
	}
	if len(resp.Children) != 1 || string(resp.Children[0]) != applied {
		t.Errorf("children changed: %s", body)
	}
	var degraded bool
	for _, c := range resp.Status.Conditions {
		if c.Type == "Degraded" && c.Status == "True" && c.Reason == "InvalidSpec" &&
			strings.Contains(c.Message, "spec.size 12 is out of range") && strings.Contains(c.Message, "--name") {
			degraded = true
		}
	}
	if !degraded {
		t.Errorf("no Degraded/InvalidSpec condition naming every problem: %s", body)
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// pod is a member pod with an IP, so the hook has an endpoint to observe; nothing listens
// there.
const pod = `{"metadata":{"name":"etcd-0","namespace":"default","labels":{"etcdops.dev/cluster":"etcd"}},"status":{"podIP":"127.0.0.10"}}`

func TestTheRealObserverDialsThePodAndReportsItUnreachable(t *testing.T) {
	var logs lockedBuffer
	srv := newServer(t, hooks.Deps{Log: slog.New(slog.NewJSONHandler(&logs, nil))})
	status, body := post(t, srv, "/sync", syncBody(parent, emptyChildren, `{"Pod.v1":{"etcd-0":`+pod+`}}`))
	if status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	if m := metricsText(t, srv); !strings.Contains(m, "etcdops_hook_etcd_observation_failures_total 1") {
		t.Errorf("the failed observation was not counted:\n%s", grep(m, "etcdops_"))
	}
	if l := logs.String(); !strings.Contains(l, "etcd not observed") || !strings.Contains(l, "127.0.0.10:2379") || !strings.Contains(l, "connection refused") {
		t.Errorf("the log does not say the pod's etcd refused the connection:\n%s", l)
	}
}

func TestPanicIsA500AndTheServerKeepsServing(t *testing.T) {
	var logs lockedBuffer
	srv := newServer(t, hooks.Deps{
		Log: slog.New(slog.NewJSONHandler(&logs, nil)),
		Etcd: hooks.ObserverFunc(func(context.Context, etcdstate.Request) etcdstate.Snapshot {
			panic("observer exploded")
		}),
	})
	status, body := post(t, srv, "/sync", syncBody(parent, emptyChildren, `{"Pod.v1":{"etcd-0":`+pod+`}}`))
	if status != 500 || !strings.Contains(string(body), `"error":"internal error"`) || !strings.Contains(string(body), "observer exploded") {
		t.Errorf("panic answered %d %s", status, body)
	}
	if !strings.Contains(logs.String(), `"msg":"panic in hook"`) || !strings.Contains(logs.String(), `"requestID":`) {
		t.Errorf("panic not logged with a request ID:\n%s", logs.String())
	}
	if status, body := post(t, srv, "/sync", syncBody(parent, emptyChildren, `{"Pod.v1":{}}`)); status != 200 {
		t.Errorf("after a panic the next sync answered %d %s", status, body)
	}
}

func TestCreateIsAnsweredOfflineAndIdempotently(t *testing.T) {
	srv := newServer(t, hooks.Deps{Etcd: offline(t)})
	body := syncBody(parent, emptyChildren, `{"Pod.v1":{}}`)
	s1, b1 := post(t, srv, "/sync", body)
	s2, b2 := post(t, srv, "/sync", body)
	if s1 != 200 || s2 != 200 {
		t.Fatalf("statuses %d %d: %s", s1, s2, b1)
	}
	if !bytes.Equal(b1, b2) {
		t.Errorf("the same request answered differently:\n%s\n%s", b1, b2)
	}
	var resp struct {
		Children []struct{ Kind string } `json:"children"`
	}
	if err := json.Unmarshal(b1, &resp); err != nil || len(resp.Children) == 0 {
		t.Errorf("no children in the create answer (%v): %s", err, b1)
	}
	for _, bad := range []string{`"creationTimestamp":null`, `"status":{}`} {
		if strings.Contains(string(b1), bad) {
			t.Errorf("the answer carries %s", bad)
		}
	}
}

func TestChildMapsKeyedByNameOrNamespaceNameAnswerAlike(t *testing.T) {
	// Hook v1 keys children by name, v2 by namespace/name; the answer must not depend on it.
	srv := newServer(t, hooks.Deps{Etcd: offline(t)})
	cm := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"etcd-join","namespace":"default"},"data":{"k":"v"}}`
	svc := `{"apiVersion":"v1","kind":"Service","metadata":{"name":"etcd","namespace":"default"},"spec":{"clusterIP":"None"}}`
	v1 := syncBody(parent, `{"ConfigMap.v1":{"etcd-join":`+cm+`},"Service.v1":{"etcd":`+svc+`}}`, `{}`)
	v2 := syncBody(parent, `{"ConfigMap.v1":{"default/etcd-join":`+cm+`},"Service.v1":{"default/etcd":`+svc+`}}`, `{}`)
	s1, b1 := post(t, srv, "/sync", v1)
	s2, b2 := post(t, srv, "/sync", v2)
	if s1 != 200 || s2 != 200 || !bytes.Equal(b1, b2) {
		t.Errorf("v1 keys: %d %s\nv2 keys: %d %s", s1, b1, s2, b2)
	}
}

func TestObserverGetsEndpointsAndTheClientCertificate(t *testing.T) {
	var got etcdstate.Request
	var deadline time.Duration
	srv := newServer(t, hooks.Deps{
		ObserveTimeout: 2 * time.Second,
		Etcd: hooks.ObserverFunc(func(ctx context.Context, req etcdstate.Request) etcdstate.Snapshot {
			got = req
			d, _ := ctx.Deadline()
			deadline = time.Until(d)
			return etcdstate.Snapshot{Err: "test: not asked"}
		}),
	})
	tlsParent := `{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"default","uid":"u-1"},"spec":{"tls":{"serverSecret":"srv","clientSecret":"cli"}}}`
	secret := `{"metadata":{"name":"cli","namespace":"default"},"data":{"ca.crt":"Q0E=","tls.crt":"Q0VSVA==","tls.key":"S0VZ"}}`
	status, body := post(t, srv, "/sync", syncBody(tlsParent, emptyChildren, `{"Pod.v1":{"etcd-0":`+pod+`},"Secret.v1":{"cli":`+secret+`}}`))
	if status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	want := etcdstate.Request{
		Key:       "default/etcd/u-1",
		Endpoints: []etcdstate.Endpoint{{Member: "etcd-0", Address: "127.0.0.10:2379", ServerName: "etcd-0.etcd.default.svc.cluster.local", TLS: true}},
		TLS:       &etcdstate.TLS{CA: []byte("CA"), Cert: []byte("CERT"), Key: []byte("KEY")},
	}
	if gj, wj := mustJSON(t, got), mustJSON(t, want); gj != wj {
		t.Errorf("observer got %s\nwant %s", gj, wj)
	}
	if deadline <= 0 || deadline > 2*time.Second {
		t.Errorf("observation deadline %s, want within the 2s observe timeout", deadline)
	}
}

func TestMissingClientSecretHoldsWithoutDialling(t *testing.T) {
	srv := newServer(t, hooks.Deps{Etcd: offline(t)})
	tlsParent := `{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"default","uid":"u-1"},"spec":{"tls":{"serverSecret":"srv","clientSecret":"cli"}}}`
	if status, body := post(t, srv, "/sync", syncBody(tlsParent, emptyChildren, `{"Pod.v1":{"etcd-0":`+pod+`},"Secret.v1":{}}`)); status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	if m := metricsText(t, srv); !strings.Contains(m, "etcdops_hook_etcd_observation_failures_total 1") {
		t.Errorf("the missing Secret was not counted as an observation failure:\n%s", grep(m, "etcdops_"))
	}
}

func TestCustomizeRelatesPodsSecretsAndClaims(t *testing.T) {
	srv := newServer(t, hooks.Deps{Etcd: offline(t)})
	tests := []struct {
		story, parent, want string
	}{
		{"without TLS only the cluster's pods are related, in its namespace", parent,
			`{"relatedResources":[{"apiVersion":"v1","resource":"pods","labelSelector":{"matchLabels":{"etcdops.dev/cluster":"etcd"}},"namespace":"default"}]}`},
		{"with TLS every named Secret is related once, by name, in the parent's namespace",
			`{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"db"},"spec":{"tls":{"serverSecret":"etcd-tls","peerSecret":"etcd-peer","clientSecret":"etcd-tls"}}}`,
			`{"relatedResources":[{"apiVersion":"v1","resource":"pods","labelSelector":{"matchLabels":{"etcdops.dev/cluster":"etcd"}},"namespace":"db"},{"apiVersion":"v1","resource":"secrets","namespace":"db","names":["etcd-peer","etcd-tls"]}]}`},
		{"with backups the backup Jobs' pods too, for their reports; not the credentials Secret, which only the Jobs mount",
			`{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"db"},"spec":{"backup":{"schedule":"@daily","destination":{"s3":{"endpoint":"https://s3.test","bucket":"b","credentialsSecret":"s3"}}}}}`,
			`{"relatedResources":[{"apiVersion":"v1","resource":"pods","labelSelector":{"matchLabels":{"etcdops.dev/cluster":"etcd"}},"namespace":"db"},{"apiVersion":"v1","resource":"pods","labelSelector":{"matchLabels":{"etcdops.dev/backup-of":"etcd"}},"namespace":"db"}]}`},
		{"with storage the members' claims by the cluster label, and every StorageClass (a claim without a class name gets the default)",
			`{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"db"},"spec":{"storageSpec":{"volumeSizeRequest":"1Gi"}}}`,
			`{"relatedResources":[{"apiVersion":"v1","resource":"pods","labelSelector":{"matchLabels":{"etcdops.dev/cluster":"etcd"}},"namespace":"db"},{"apiVersion":"v1","resource":"persistentvolumeclaims","labelSelector":{"matchLabels":{"etcdops.dev/cluster":"etcd"}},"namespace":"db"},{"apiVersion":"storage.k8s.io/v1","resource":"storageclasses","labelSelector":{}}]}`},
	}
	for _, tt := range tests {
		status, body := post(t, srv, "/customize", `{"controller":{},"parent":`+tt.parent+`}`)
		if status != 200 || strings.TrimSpace(string(body)) != tt.want {
			t.Errorf("%s:\n got %d %s\nwant %s", tt.story, status, body, tt.want)
		}
	}
}

func TestBearerToken(t *testing.T) {
	srv := newServer(t, hooks.Deps{Etcd: offline(t), AuthToken: "t0ken"})
	for _, tt := range []struct {
		story, header string
		want          int
	}{
		{"no header", "", 401},
		{"a wrong token", "Bearer nope", 401},
		{"the token", "Bearer t0ken", 200},
	} {
		req, _ := http.NewRequest("POST", srv.URL+"/customize", strings.NewReader(`{"parent":`+parent+`}`))
		if tt.header != "" {
			req.Header.Set("Authorization", tt.header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("%s: %d, want %d", tt.story, resp.StatusCode, tt.want)
		}
	}
	resp, err := http.Get(srv.URL + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("probes must not need the token: %v %v", resp, err)
	}
	resp.Body.Close()
}

func TestReadiness(t *testing.T) {
	var mu gosync.Mutex
	ready := false
	srv := newServer(t, hooks.Deps{Etcd: offline(t), Ready: func() bool { mu.Lock(); defer mu.Unlock(); return ready }})
	get := func() int {
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get(); got != 503 {
		t.Errorf("not ready: %d, want 503", got)
	}
	mu.Lock()
	ready = true
	mu.Unlock()
	if got := get(); got != 200 {
		t.Errorf("ready: %d, want 200", got)
	}
}

func TestMetricsCountCallsAndDecisions(t *testing.T) {
	srv := newServer(t, hooks.Deps{Etcd: offline(t)})
	post(t, srv, "/sync", syncBody(parent, emptyChildren, `{}`))
	post(t, srv, "/sync", `{`)
	post(t, srv, "/customize", `{"parent":`+parent+`}`)
	m := metricsText(t, srv)
	for _, want := range []string{
		`etcdops_hook_request_duration_seconds_count{hook="sync",outcome="200"} 1`,
		`etcdops_hook_request_duration_seconds_count{hook="sync",outcome="400"} 1`,
		`etcdops_hook_request_duration_seconds_count{hook="customize",outcome="200"} 1`,
		`etcdops_hook_decisions_total{action="Bootstrap"} 1`,
		`etcdops_hook_etcd_observation_failures_total 0`,
		`go_goroutines`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// lockedBuffer collects log lines written by the server's goroutines.
type lockedBuffer struct {
	mu  gosync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func metricsText(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func grep(s, substr string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// BenchmarkSync measures one /sync through the router without the network (decode, plan,
// encode) for the create fixture (no etcd call) and steady-3 (a recorded etcd snapshot).
func BenchmarkSync(b *testing.B) {
	for _, name := range []string{"create", "steady-3"} {
		b.Run(name, func(b *testing.B) {
			var snap etcdstate.Snapshot
			if raw, err := os.ReadFile("../test/fixtures/" + name + ".etcd.json"); err == nil {
				if err := json.Unmarshal(raw, &snap); err != nil {
					b.Fatal(err)
				}
			}
			benchmarkHook(b, "/sync", name, snap)
		})
	}
}

// BenchmarkCustomize measures one /customize through the router for the customize fixture.
func BenchmarkCustomize(b *testing.B) {
	benchmarkHook(b, "/customize", "customize", etcdstate.Snapshot{})
}

// benchmarkHook posts fixture name's request to path, etcd answering snap.
func benchmarkHook(b *testing.B, path, name string, snap etcdstate.Snapshot) {
	body, err := os.ReadFile("../test/fixtures/" + name + ".json")
	if err != nil {
		b.Fatal(err)
	}
	h := hooks.NewHandler(hooks.Deps{
		Config: sync.Config{ClusterDomain: "cluster.local", ToolImage: "etcdops/etcdops:v0.1.0"},
		Etcd:   hooks.ObserverFunc(func(context.Context, etcdstate.Request) etcdstate.Snapshot { return snap }),
	})
	if path == "/sync" {
		body = handedItsAnswer(b, h, body)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		w := &answerSink{header: http.Header{}}
		// Not httptest.NewRequest: it parses the request line through a bufio.Reader
		// of its own per request (4 KB), which a server keeps per connection.
		r, err := http.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		h.ServeHTTP(w, r)
		if w.status != 200 || w.written == 0 {
			b.Fatalf("answered %d with %d bytes", w.status, w.written)
		}
	}
}

// handedItsAnswer is a sync request body with the parent's status replaced by the status
// the hook answers to body: a cluster's sync as Metacontroller sends it once its last status
// is written, which the hook does not take for a stale parent (statusmemo.go).
func handedItsAnswer(b *testing.B, h http.Handler, body []byte) []byte {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/sync", bytes.NewReader(body)))
	var answer struct {
		Status json.RawMessage `json:"status"`
	}
	var req map[string]json.RawMessage
	var parent map[string]json.RawMessage
	if err := json.Unmarshal(w.Body.Bytes(), &answer); err != nil {
		b.Fatal(err)
	}
	if err := json.Unmarshal(body, &req); err != nil {
		b.Fatal(err)
	}
	if err := json.Unmarshal(req["parent"], &parent); err != nil {
		b.Fatal(err)
	}
	parent["status"] = answer.Status
	raw, err := json.Marshal(parent)
	if err != nil {
		b.Fatal(err)
	}
	req["parent"] = raw
	if raw, err = json.Marshal(req); err != nil {
		b.Fatal(err)
	}
	// Indented as the fixture is, so that the bytes decoded stay comparable with earlier runs.
	var indented bytes.Buffer
	if err := json.Indent(&indented, raw, "", "  "); err != nil {
		b.Fatal(err)
	}
	return indented.Bytes()
}

// answerSink is the benchmark's response writer: it counts the answer and keeps none of it,
// as the server's connection writer does, where httptest's recorder would grow a buffer per
// answer (8 KB a steady-3 sync) that is the benchmark's, not the hook's.
type answerSink struct {
	header  http.Header
	status  int
	written int
}

func (w *answerSink) Header() http.Header { return w.header }

func (w *answerSink) WriteHeader(status int) { w.status = status }

func (w *answerSink) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.written += len(b)
	return len(b), nil
}

func TestTheRequestIsReadAsEncodingJSONWouldReadIt(t *testing.T) {
	srv := newServer(t, hooks.Deps{Etcd: offline(t)})
	// An invalid spec answers with the observed children unchanged, so the answer shows
	// exactly which children were read.
	parent := `{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"default","uid":"u-1"},"spec":{"size":12}}`
	svc := func(clusterIP string) string {
		return `{"apiVersion":"v1","kind":"Service","metadata":{"name":"etcd","namespace":"default"},"spec":{"clusterIP":"` + clusterIP + `"}}`
	}
	answer := func(body string) string {
		t.Helper()
		status, b := post(t, srv, "/sync", body)
		if status != 200 {
			t.Fatalf("%d %s", status, b)
		}
		return string(b)
	}
	want := answer(syncBody(parent, `{"Service.v1":{"etcd":`+svc("None")+`}}`, `{}`))
	if !strings.Contains(want, `"clusterIP":"None"`) {
		t.Fatalf("the observed Service is not in the answer: %s", want)
	}
	for _, tc := range []struct{ story, body string }{
		{"a null entry is no object", syncBody(parent, `{"Service.v1":{"etcd":`+svc("None")+`,"gone":null}}`, `{}`)},
		{"related types the hook does not read are skipped", syncBody(parent, `{"Service.v1":{"etcd":`+svc("None")+`}}`, `{"Node.v1":{"n":{"spec":[1,2]}}}`)},
		{"members in any order", `{"children":{"Service.v1":{"etcd":` + svc("None") + `}},"finalizing":false,"related":{},"parent":` + parent + `}`},
	} {
		if got := answer(tc.body); got != want {
			t.Errorf("%s: answered\n%s\nwant\n%s", tc.story, got, want)
		}
	}
	for _, tc := range []struct{ story, body, detail string }{
		{"data after the request", syncBody(parent, emptyChildren, `{}`) + ` {}`, "data after the request object"},
		{"finalizing must be a bool", `{"parent":` + parent + `,"finalizing":"yes"}`, "finalizing"},
		{"children must be an object", `{"parent":` + parent + `,"children":[]}`, "cannot unmarshal array into children"},
		// encoding/json keeps a repeated key's last value, other decoders its first: neither.
		{"a repeated key is refused", syncBody(parent, `{"Service.v1":{"etcd":`+svc("10.0.0.1")+`,"etcd":`+svc("None")+`}}`, `{}`), "duplicate object member name"},
	} {
		status, b := post(t, srv, "/sync", tc.body)
		if status != 400 || !strings.Contains(string(b), tc.detail) {
			t.Errorf("%s: %d %s, want 400 saying %q", tc.story, status, b, tc.detail)
		}
	}
}
