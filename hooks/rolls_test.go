package hooks_test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/hooks"
)

// recordedIn answers each observation with a fixture's recorded etcd snapshot as the same
// cluster in the request's namespace (Request.Key is namespace/name) would answer it.
func recordedIn(t *testing.T, fixture string) hooks.Observer {
	t.Helper()
	raw, err := os.ReadFile("../test/fixtures/" + fixture + ".etcd.json")
	if err != nil {
		t.Fatal(err)
	}
	return hooks.ObserverFunc(func(_ context.Context, r etcdstate.Request) etcdstate.Snapshot {
		ns, _, _ := strings.Cut(r.Key, "/")
		var snap etcdstate.Snapshot
		if err := json.Unmarshal([]byte(inNamespace(string(raw), ns)), &snap); err != nil {
			t.Error(err)
		}
		return snap
	})
}

// inNamespace is a fixture's request for the same cluster in namespace ns.
func inNamespace(body, ns string) string {
	return strings.NewReplacer(`"namespace": "default"`, `"namespace": "`+ns+`"`, `"default/`, `"`+ns+`/`, ".default.svc", "."+ns+".svc").Replace(body)
}

// action is the action a sync answer's status records.
func action(t *testing.T, answer []byte) (typ, reason string) {
	t.Helper()
	var resp struct {
		Status struct {
			Action struct{ Type, Reason string } `json:"action"`
		} `json:"status"`
	}
	if err := json.Unmarshal(answer, &resp); err != nil {
		t.Fatalf("%v: %s", err, answer)
	}
	return resp.Status.Action.Type, resp.Status.Action.Reason
}

// TestRollsBeyondTheBoundWait: with one roll slot, a second cluster with pods to roll waits,
// its pods untouched and the reason naming the cluster that rolls, while the first goes on;
// once the first has rolled (here: is deleted, which frees its slot as a roll done does), the
// second rolls.
func TestRollsBeyondTheBoundWait(t *testing.T) {
	srv := newServer(t, hooks.Deps{Etcd: recordedIn(t, "config-change"), MaxConcurrentRolls: 1})
	first := fixture(t, "config-change")
	second := inNamespace(first, "other")
	for range 2 {
		_, b := post(t, srv, "/sync", first)
		if typ, reason := action(t, b); typ != "ReplacePod" {
			t.Fatalf("the first cluster to roll: %s %q, want ReplacePod", typ, reason)
		}
		_, b = post(t, srv, "/sync", second)
		typ, reason := action(t, b)
		if typ != "Wait" || !strings.Contains(reason, "waiting for the hook's bound on clusters rolling at once: 1 of 1 clusters roll through this hook replica (default/etcd)") {
			t.Fatalf("the second cluster to roll: %s %q, want a Wait naming default/etcd", typ, reason)
		}
	}
	if got, _ := value(scrape(t, metricsText(t, srv)), "etcdops_hook_rolling_clusters", nil); got != 1 {
		t.Errorf("etcdops_hook_rolling_clusters %v, want 1", got)
	}
	if s, _ := post(t, srv, "/finalize", first); s != 200 {
		t.Fatalf("finalize: %d", s)
	}
	_, b := post(t, srv, "/sync", second)
	if typ, reason := action(t, b); typ != "ReplacePod" {
		t.Fatalf("the second cluster, its slot free: %s %q, want ReplacePod", typ, reason)
	}
}
