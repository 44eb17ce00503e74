package sync

import (
	"encoding/json"
	"testing"
)

// Children another version of the hook named: created by Metacontroller for this parent (so
// observed as children), under names the current planner never renders.

// addForeignChildren adds a ConfigMap, a Service, a PodDisruptionBudget and a StatefulSet of
// names the planner does not render.
func (w *simWorld) addForeignChildren() {
	w.t.Helper()
	meta := func(name string) map[string]any {
		return map[string]any{"name": name, "namespace": w.cluster.Namespace, "labels": map[string]any{LabelCluster: w.cluster.Name}}
	}
	for key, obj := range map[string]map[string]any{
		"ConfigMap/etcd-config": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("etcd-config"), "data": map[string]any{"initial-cluster": "etcd-0=http://etcd-0.etcd:2380"}},
		"Service/etcd-peers": {"apiVersion": "v1", "kind": "Service", "metadata": meta("etcd-peers"),
			"spec": map[string]any{"clusterIP": "None", "ports": []any{map[string]any{"name": "peer", "port": 2380}}}},
		"PodDisruptionBudget/etcd-pdb": {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta("etcd-pdb"),
			"spec": map[string]any{"minAvailable": 2, "selector": map[string]any{"matchLabels": map[string]any{LabelCluster: w.cluster.Name}}}},
		"StatefulSet/etcd-v0": {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta("etcd-v0"),
			"spec": map[string]any{"replicas": 0, "serviceName": "etcd-peers"}},
	} {
		w.applied[key] = w.mustJSON(obj)
	}
}

// foreignJob adds a Job without a member Job's labels, still running or done.
func (w *simWorld) foreignJob(name string, done bool) {
	w.t.Helper()
	job := map[string]any{"apiVersion": "batch/v1", "kind": "Job",
		"metadata": map[string]any{"name": name, "namespace": w.cluster.Namespace},
		"spec":     map[string]any{"template": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "member", "command": []any{"/member-tool", "remove", "etcd-2"}}}}}}}
	if done {
		job["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Complete", "status": "True"}}}
	}
	w.applied["Job/"+name] = w.mustJSON(job)
}

func (w *simWorld) mustJSON(v any) []byte {
	w.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		w.t.Fatal(err)
	}
	return b
}

// foreignJob: the Job has no member Job's labels; no Job controller of the world runs it.
func foreignJob(b []byte) bool {
	var j struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	return json.Unmarshal(b, &j) != nil || j.Metadata.Labels[LabelAction] == ""
}

// TestForeignChildrenAdoptedOrCleanedUp: the steps of a scale-out keep another hook's
// ConfigMap, Service and StatefulSet as they were and delete its disruption budget; its Job
// is kept while it may run and deleted once finished.
func TestForeignChildrenAdoptedOrCleanedUp(t *testing.T) {
	w, _ := created(t, 3, true)
	w.addForeignChildren()
	w.foreignJob("etcd-old-job", false)
	kept := map[string]string{}
	for _, k := range []string{"ConfigMap/etcd-config", "Service/etcd-peers", "StatefulSet/etcd-v0"} {
		kept[k] = string(w.applied[k])
	}
	w.cluster.Spec.Size = ptrTo(int32(5))
	w.cluster.Generation++
	if d := w.step(); d.Action.Type != Wait {
		t.Fatalf("want a wait for the foreign Job, got %v", d.Action)
	}
	if _, ok := w.applied["Job/etcd-old-job"]; !ok {
		t.Fatal("a foreign Job that may still run was deleted")
	}
	w.foreignJob("etcd-old-job", true)
	w.run(200)
	for k, v := range kept {
		if got, ok := w.applied[k]; !ok || !sameJSON(got, []byte(v)) {
			t.Errorf("%s changed or deleted: %s", k, got)
		}
	}
	for _, k := range []string{"PodDisruptionBudget/etcd-pdb", "Job/etcd-old-job"} {
		if _, ok := w.applied[k]; ok {
			t.Errorf("%s is left", k)
		}
	}
}
