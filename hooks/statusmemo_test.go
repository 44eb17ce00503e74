package hooks_test

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/hooks"
)

// answer is the part of a sync answer these tests read.
type answer struct {
	Status   v1alpha1.EtcdClusterStatus `json:"status"`
	Children []json.RawMessage          `json:"children"`
}

// sender posts a sync body to srv and returns the answer, failing the test on any status
// but 200.
func sender(t *testing.T, srv *httptest.Server) func(string) []byte {
	return func(body string) []byte {
		t.Helper()
		code, raw := post(t, srv, "/sync", body)
		if code != 200 {
			t.Fatalf("answered %d: %s", code, raw)
		}
		return raw
	}
}

// syncAt sends a sync of cluster (a parent's JSON) with status (raw JSON, "" for none) and
// children (as an answer listed them), and returns the answer and its status as JSON.
func syncAt(t *testing.T, send func(string) []byte, cluster, status string, children []json.RawMessage) (answer, string) {
	t.Helper()
	p := cluster
	if status != "" {
		p = strings.TrimSuffix(cluster, "}") + `,"status":` + status + `}`
	}
	var byKind map[string]map[string]json.RawMessage
	if err := json.Unmarshal([]byte(emptyChildren), &byKind); err != nil {
		t.Fatal(err)
	}
	for _, c := range children {
		var o struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(c, &o); err != nil {
			t.Fatal(err)
		}
		key := o.Kind + "." + o.APIVersion
		if byKind[key] == nil {
			byKind[key] = map[string]json.RawMessage{}
		}
		byKind[key][o.Metadata.Name] = c
	}
	raw := send(syncBody(p, mustJSON(t, byKind), `{"Pod.v1":{}}`))
	var a answer
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	var st struct {
		Status json.RawMessage `json:"status"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	return a, string(st.Status)
}

// TestStaleParentIsPlannedFromTheNewestAnswer: Metacontroller may hand a sync the parent as
// it was before the hook's last answers were written, and writes that sync's status over
// them. The hook plans such a sync from the newest status it answered, so that the answer
// keeps what the newer ones recorded (here, when the cluster's bootstrap started and when
// its pause began); a status it does not know, or the newest one, is planned from as handed.
func TestStaleParentIsPlannedFromTheNewestAnswer(t *testing.T) {
	var mu gosync.Mutex
	now := testNow
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	tick := func() {
		mu.Lock()
		now = now.Add(10 * time.Second)
		mu.Unlock()
	}
	srv := newServer(t, hooks.Deps{Etcd: offline(t), Now: clock})
	send := sender(t, srv)

	// S1: the bootstrap starts, from no status.
	a1, s1 := syncAt(t, send, parent, "", nil)
	started := a1.Status.Action.Since
	if a1.Status.Action.Type != "Bootstrap" || len(a1.Status.History) != 1 {
		t.Fatalf("first answer: action %+v, history %+v", a1.Status.Action, a1.Status.History)
	}
	tick()
	// Handed no status again (Metacontroller's cache a write behind): planned from S1, the
	// bootstrap started when S1 says.
	a, _ := syncAt(t, send, parent, "", nil)
	if a.Status.Action.Since != started || len(a.Status.History) != 1 || a.Status.History[0].Started != started {
		t.Errorf("a stale parent planned afresh: action since %s, history %+v; want the bootstrap started at %s", a.Status.Action.Since, a.Status.History, started)
	}

	// S2: the cluster is paused: the hold starts.
	paused := strings.Replace(parent, `"spec":{"size":3}`, `"spec":{"size":3,"paused":true}`, 1)
	tick()
	a2, s2 := syncAt(t, send, paused, s1, a1.Children)
	if a2.Status.Action.Type == "Bootstrap" || a2.Status.Action.Since == started {
		t.Fatalf("second answer: action %+v; want a new action", a2.Status.Action)
	}
	waitSince := a2.Status.Action.Since
	// Handed S1 again, then no status at all: both older than S2, planned from S2.
	for _, stale := range []string{s1, ""} {
		tick()
		a, _ := syncAt(t, send, paused, stale, a1.Children)
		if a.Status.Action.Since != waitSince {
			t.Errorf("handed a status older than the newest answer (%.40s): action %+v; want it as the newest, since %s", stale, a.Status.Action, waitSince)
		}
	}

	if m := metricsText(t, srv); !strings.Contains(m, "\netcdops_hook_stale_parents_total 3\n") {
		t.Errorf("three stale parents planned from the newest answer; the metric says %q", grep(m, "etcdops_hook_stale_parents_total"))
	}

	// Handed S2 (the cache caught up) and nothing changes: the memo is dropped, and a status
	// handed in is planned from as it is.
	tick()
	if a, _ := syncAt(t, send, paused, s2, a1.Children); a.Status.Action.Since != waitSince {
		t.Fatalf("handed the newest status: action %+v", a.Status.Action)
	}
	tick()
	if a, _ := syncAt(t, send, paused, s1, a1.Children); a.Status.Action.Since == waitSince {
		t.Errorf("after the cache caught up, an older status was still replaced: action %+v", a.Status.Action)
	}
}

// TestUnknownStatusIsPlannedAsHanded: a status this hook did not answer (another replica's,
// or one from before this process) is the newest there is: it is planned from as handed.
func TestUnknownStatusIsPlannedAsHanded(t *testing.T) {
	now := testNow
	send := sender(t, newServer(t, hooks.Deps{Etcd: offline(t), Now: func() time.Time { return now }}))
	a1, s1 := syncAt(t, send, parent, "", nil)
	// Another replica's answer: the same step, started a minute earlier.
	other := strings.Replace(s1, a1.Status.Action.Since.UTC().Format(time.RFC3339), testNow.Add(-time.Minute).UTC().Format(time.RFC3339), -1)
	if other == s1 {
		t.Fatalf("no time to change in %s", s1)
	}
	if a, _ := syncAt(t, send, parent, other, nil); !a.Status.Action.Since.Time.Equal(testNow.Add(-time.Minute)) {
		t.Errorf("a status the hook never answered was replaced: action %+v", a.Status.Action)
	}
}
