package hooks_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/hooks"
	"etcdops.dev/etcdops/sync"
)

// A finalize call for a cluster that is not being deleted, as Metacontroller makes for a
// parent that stops matching its CompositeController's labelSelector (steady-3 is a recorded
// request of a running cluster, without a deletionTimestamp), is answered on the wire with
// every child it observed, finalized false, a hold that says why in the status, and one
// Warning Event saying the same. The same cluster deleted (finalizing) starts its teardown.
func TestFinalizeOfAClusterNotDeleted(t *testing.T) {
	log := &eventLog{}
	srv := newServer(t, hooks.Deps{Etcd: recorded(t, "steady-3"), Events: log})
	req := fixture(t, "steady-3")
	code, body := post(t, srv, "/finalize", req)
	if code != 200 {
		t.Fatalf("finalize answered %d: %s", code, body)
	}
	var resp struct {
		Status struct {
			Phase  string `json:"phase"`
			Action struct {
				Type   string `json:"type"`
				Reason string `json:"reason"`
			} `json:"action"`
		} `json:"status"`
		Children []struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		} `json:"children"`
		Finalized *bool `json:"finalized"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if resp.Finalized == nil || *resp.Finalized {
		t.Errorf("finalized %v, want false", resp.Finalized)
	}
	if a := resp.Status.Action; a.Type != "Hold" || a.Reason != sync.ReasonNotBeingDeleted {
		t.Errorf("status.action %+v, want a Hold with reason %q", a, sync.ReasonNotBeingDeleted)
	}
	if resp.Status.Phase != "Running" {
		t.Errorf("status.phase %q, want the cluster's Running kept", resp.Status.Phase)
	}

	var in struct {
		Children map[string]map[string]json.RawMessage `json:"children"`
	}
	if err := json.Unmarshal([]byte(req), &in); err != nil {
		t.Fatal(err)
	}
	var observed, answered []string
	for group, objs := range in.Children {
		kind, _, _ := strings.Cut(group, ".")
		for key := range objs {
			_, name, _ := strings.Cut(key, "/")
			observed = append(observed, kind+"/"+name)
		}
	}
	for _, c := range resp.Children {
		answered = append(answered, c.Kind+"/"+c.Metadata.Name)
	}
	slices.Sort(observed)
	slices.Sort(answered)
	if len(observed) == 0 || !slices.Equal(answered, observed) {
		t.Errorf("children %v, want every observed child %v", answered, observed)
	}
	if len(log.events) != 1 || log.events[0].Type != corev1.EventTypeWarning || log.events[0].Reason != sync.EventHold ||
		log.events[0].Message != sync.ReasonNotBeingDeleted {
		t.Errorf("events %+v, want one Warning Hold saying why", log.events)
	}

	// Deleted, the same cluster is torn down.
	var whole map[string]any
	if err := json.Unmarshal([]byte(req), &whole); err != nil {
		t.Fatal(err)
	}
	whole["parent"].(map[string]any)["metadata"].(map[string]any)["deletionTimestamp"] = "2026-11-29T13:00:00Z"
	raw, err := json.Marshal(whole)
	if err != nil {
		t.Fatal(err)
	}
	deleted := string(raw)
	if code, body := post(t, srv, "/finalize", deleted); code != 200 || !strings.Contains(string(body), `"type":"Teardown"`) {
		t.Errorf("finalize of the deleted cluster answered %d: %.300s; want a Teardown", code, body)
	}
}

// Metacontroller's v2 hooks relate pods and claims by label from every namespace unless the
// rule names one: a cluster of the same name in another namespace, with its pods and claims
// carrying the same labels, must change nothing of this cluster's answer. steady-3 with the
// other cluster's etcd-0 pod (another configuration) and claim added answers as steady-3.
func TestRelatedObjectsOfAnotherNamespaceIgnored(t *testing.T) {
	srv := newServer(t, hooks.Deps{Etcd: recorded(t, "steady-3")})
	req := fixture(t, "steady-3")
	_, want := post(t, srv, "/sync", req)

	var whole map[string]any
	if err := json.Unmarshal([]byte(req), &whole); err != nil {
		t.Fatal(err)
	}
	related := whole["related"].(map[string]any)
	added := 0
	for typ, key := range map[string]string{"Pod.v1": "default/etcd-0", "PersistentVolumeClaim.v1": "default/data-etcd-0"} {
		objs := related[typ].(map[string]any)
		raw, err := json.Marshal(objs[key])
		if err != nil || objs[key] == nil {
			t.Fatalf("steady-3 relates no %s %s", typ, key)
		}
		var other map[string]any
		if err := json.Unmarshal(raw, &other); err != nil {
			t.Fatal(err)
		}
		meta := other["metadata"].(map[string]any)
		meta["namespace"] = "zz-other"
		meta["uid"] = "another"
		if a, ok := meta["annotations"].(map[string]any); ok {
			for k := range a {
				a[k] = "another-configuration"
			}
		}
		objs["zz-other/"+strings.TrimPrefix(key, "default/")] = other
		added++
	}
	raw, err := json.Marshal(whole)
	if err != nil {
		t.Fatal(err)
	}
	code, got := post(t, srv, "/sync", string(raw))
	if code != 200 || string(got) != string(want) || added != 2 {
		t.Errorf("with another namespace's pod and claim the answer differs:\n got %d %.600s\nwant %.600s", code, got, want)
	}
}
