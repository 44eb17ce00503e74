package harness

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/manifests"
)

// Metacontroller's apply: create, update in place, never update an OnDelete child (and say
// so for a Job), delete what the answer leaves out, replace status with observedGeneration.
func TestMetacontrollerAppliesAnswers(t *testing.T) {
	answers := []string{
		`{"status":{"phase":"Creating","readyMembers":0},"children":[
			{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"data":{"k":"1"}},
			{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"j"},"spec":{"backoffLimit":1}},
			{"apiVersion":"v1","kind":"Service","metadata":{"name":"s"}}],"resyncAfterSeconds":1}`,
		`{"status":{"phase":"Running","readyMembers":3},"children":[
			{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"data":{"k":"2"}},
			{"kind":"Job","apiVersion":"batch/v1","metadata":{"name":"j"},"spec":{"backoffLimit":2}}]}`,
	}
	var requests []map[string]json.RawMessage
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req map[string]json.RawMessage
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Error(err)
		}
		requests = append(requests, req)
		w.Write([]byte(answers[len(requests)-1]))
	}))
	defer hook.Close()

	s := NewStore("ns")
	s.CreateParent(&v1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Name: "c"}})
	ctrl := Controller{Paths: map[string]string{"sync": "/sync"}, Version: "v1", Children: []ChildResource{
		child("v1", "configmaps", "InPlace"), child("v1", "services", "InPlace"), child("batch/v1", "jobs", "OnDelete")}}
	mc := NewMetacontroller(s, ctrl, func() string { return hook.URL }, 1)

	for i := range answers {
		if rec := mc.Sync(context.Background()); rec.Err != nil || !rec.Applied {
			t.Fatalf("sync %d: applied=%v err=%v", i+1, rec.Applied, rec.Err)
		}
	}
	var children map[string]map[string]json.RawMessage
	if err := json.Unmarshal(requests[1]["children"], &children); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"ConfigMap.v1", "Service.v1", "Job.batch/v1"} {
		if len(children[key]) != 1 {
			t.Errorf("second request: children[%q] = %d objects, want 1", key, len(children[key]))
		}
	}
	o, ok := s.Get("ConfigMap", "a")
	if !ok || o.(*corev1.ConfigMap).Data["k"] != "2" {
		t.Errorf("ConfigMap not updated in place: %v", o)
	}
	if _, ok := s.Get("Service", "s"); ok {
		t.Error("a child left out of the answer was not deleted")
	}
	if len(mc.JobChanges()) != 1 {
		t.Errorf("a changed Job under the same name was not reported: %v", mc.JobChanges())
	}
	p := s.Parent()
	if p.Status.Phase != v1alpha1.PhaseRunning || p.Status.ObservedGeneration != p.Generation {
		t.Errorf("status = %+v, want Running at generation %d", p.Status, p.Generation)
	}
}

// A spec edited while the hook answers stays unobserved: Metacontroller stamps the status
// with the generation it synced, so a test waiting for observedGeneration cannot mistake an
// answer to the old spec for one to the new.
func TestMetacontrollerObservesTheGenerationItSynced(t *testing.T) {
	s := NewStore("ns")
	s.CreateParent(&v1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Name: "c", Generation: 1}})
	edited := false
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !edited {
			edited = true
			s.EditParentSpec(func(spec *v1alpha1.EtcdClusterSpec) { spec.Version = "3.6.16" })
		}
		w.Write([]byte(`{"status":{"phase":"Running"},"children":[]}`))
	}))
	defer hook.Close()
	mc := NewMetacontroller(s, Controller{Paths: map[string]string{"sync": "/sync"}, Version: "v1"}, func() string { return hook.URL }, 1)

	for want := int64(1); want <= 2; want++ {
		if rec := mc.Sync(context.Background()); rec.Err != nil || !rec.Applied {
			t.Fatalf("sync: applied=%v err=%v", rec.Applied, rec.Err)
		}
		if got := s.Parent().Status.ObservedGeneration; got != want {
			t.Errorf("observedGeneration = %d after a sync of generation %d (the parent is at %d now)", got, want, s.Parent().Generation)
		}
	}
}

func child(apiVersion, resource, method string) ChildResource {
	c := ChildResource{APIVersion: apiVersion, Resource: resource}
	c.UpdateStrategy.Method = method
	return c
}

func TestSameObservation(t *testing.T) {
	healthy := `{"status":{"leader":"etcd-0","members":[{"name":"etcd-0","healthy":true},{"name":"etcd-1","healthy":true}]},"children":[]}`
	cases := []struct {
		story string
		a, b  string
		want  bool
	}{
		{"the same answer", healthy, healthy, true},
		{"another decision on the same observation", healthy,
			`{"status":{"leader":"etcd-0","members":[{"name":"etcd-0","healthy":true},{"name":"etcd-1","healthy":true}],"phase":"Running"},"children":[{"kind":"Job"}]}`, true},
		{"a member missed the hook's deadline once", healthy,
			`{"status":{"leader":"etcd-0","members":[{"name":"etcd-0","healthy":true},{"name":"etcd-1","healthy":false}]},"children":[]}`, false},
		{"the leader moved", healthy,
			`{"status":{"leader":"etcd-1","members":[{"name":"etcd-0","healthy":true},{"name":"etcd-1","healthy":true}]},"children":[]}`, false},
		{"not an answer", healthy, `{`, false},
	}
	for _, tc := range cases {
		if got := sameObservation([]byte(tc.a), []byte(tc.b)); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.story, got, tc.want)
		}
	}
}

// Metacontroller applies an answer's children kind by kind in the order of group, version and
// kind (its GetAllGVKs): core objects first, then apps, batch and policy, whatever order the
// answer lists them in. A budget closed in the same answer as a StatefulSet change lands after
// it, which the planner must not count on.
func TestMetacontrollerAppliesByAPIGroup(t *testing.T) {
	answer := `{"status":{"phase":"Creating"},"children":[
		{"apiVersion":"policy/v1","kind":"PodDisruptionBudget","metadata":{"name":"p"},"spec":{}},
		{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"j"},"spec":{}},
		{"apiVersion":"apps/v1","kind":"StatefulSet","metadata":{"name":"e"},"spec":{}},
		{"apiVersion":"v1","kind":"Service","metadata":{"name":"s"}}]}`
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(answer))
	}))
	defer hook.Close()

	s := NewStore("ns")
	s.CreateParent(&v1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Name: "c"}})
	ctrl := Controller{Paths: map[string]string{"sync": "/sync"}, Version: "v1", Children: []ChildResource{
		child("policy/v1", "poddisruptionbudgets", "InPlace"), child("batch/v1", "jobs", "OnDelete"),
		child("apps/v1", "statefulsets", "InPlace"), child("v1", "services", "InPlace")}}
	mc := NewMetacontroller(s, ctrl, func() string { return hook.URL }, 1)
	if rec := mc.Sync(context.Background()); rec.Err != nil || !rec.Applied {
		t.Fatalf("sync: applied=%v err=%v", rec.Applied, rec.Err)
	}
	var last int
	for _, k := range []objKey{{"Service", "s"}, {"StatefulSet", "e"}, {"Job", "j"}, {"PodDisruptionBudget", "p"}} {
		o, ok := s.Get(k.Kind, k.Name)
		if !ok {
			t.Fatalf("%s %s not created", k.Kind, k.Name)
		}
		rv, err := strconv.Atoi(o.GetResourceVersion())
		if err != nil {
			t.Fatal(err)
		}
		if rv <= last {
			t.Errorf("%s %s written at resourceVersion %d, not after %d: want core, apps, batch, policy", k.Kind, k.Name, rv, last)
		}
		last = rv
	}
}

// With generateSelector, Metacontroller labels every desired child with the parent's
// controller-uid before applying it, so the child and its last-applied configuration carry
// the label the hook never wrote, and the same answer again changes nothing.
func TestMetacontrollerLabelsChildrenWithTheControllerUID(t *testing.T) {
	answer := `{"status":{"phase":"Creating"},"children":[
		{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","labels":{"app":"etcd"}},"data":{"k":"1"}}]}`
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(answer))
	}))
	defer hook.Close()

	s := NewStore("ns")
	s.CreateParent(&v1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Name: "c"}})
	ctrl := Controller{Paths: map[string]string{"sync": "/sync"}, Version: "v1", GenerateSelector: true,
		Children: []ChildResource{child("v1", "configmaps", "InPlace")}}
	mc := NewMetacontroller(s, ctrl, func() string { return hook.URL }, 1)
	var rv string
	for i := range 2 {
		if rec := mc.Sync(context.Background()); rec.Err != nil || !rec.Applied {
			t.Fatalf("sync %d: applied=%v err=%v", i+1, rec.Applied, rec.Err)
		}
		o, ok := s.Get("ConfigMap", "a")
		if !ok {
			t.Fatal("ConfigMap a not created")
		}
		uid := string(s.Parent().UID)
		if got := o.GetLabels(); got["controller-uid"] != uid || got["app"] != "etcd" {
			t.Errorf("sync %d: labels %v, want app=etcd and controller-uid=%s", i+1, got, uid)
		}
		if last := o.GetAnnotations()[lastApplied]; !strings.Contains(last, `"controller-uid":"`+uid+`"`) {
			t.Errorf("sync %d: last-applied %s does not record the controller-uid label", i+1, last)
		}
		if i == 1 && o.GetResourceVersion() != rv {
			t.Errorf("the same answer again wrote the ConfigMap: resourceVersion %s, was %s", o.GetResourceVersion(), rv)
		}
		rv = o.GetResourceVersion()
	}
}

// The shipped CompositeController is read as deployed: its child types, hooks and
// generateSelector, which decides whether children carry the controller-uid label.
func TestLoadControllerReadsTheShippedManifest(t *testing.T) {
	ctrl, err := LoadController(manifests.FS, "metacontroller")
	if err != nil {
		t.Fatal(err)
	}
	if !ctrl.GenerateSelector || len(ctrl.Children) == 0 || ctrl.Paths["sync"] == "" || ctrl.Resync == 0 {
		t.Errorf("controller read as %+v, want generateSelector, child types, a sync hook and a resync period", ctrl)
	}
}
