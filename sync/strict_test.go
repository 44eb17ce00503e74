package sync

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/test/strictdecode"
)

// checkTyped decodes every child of d strictly into its typed Kubernetes struct: a field the
// type does not have (a misspelling the API server would drop without a word), a value of
// the wrong type, or a kind Kubernetes does not serve fails the test. The simulator can call
// it on every decision.
func checkTyped(t testing.TB, d Decision) {
	t.Helper()
	for _, c := range d.Children {
		b, err := json.Marshal(c.Object)
		if err != nil {
			t.Fatalf("encoding %s %s: %v", c.Kind, c.Name, err)
		}
		obj, err := strictdecode.Object(b)
		if err != nil {
			t.Fatalf("%v\n%s", err, b)
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			t.Fatal(err)
		}
		gvk := obj.GetObjectKind().GroupVersionKind()
		if gvk.GroupVersion().String() != c.APIVersion || gvk.Kind != c.Kind || m.GetName() != c.Name {
			t.Errorf("child %s %s %s renders as %s %s %s", c.APIVersion, c.Kind, c.Name, gvk.GroupVersion(), gvk.Kind, m.GetName())
		}
	}
	b, err := json.Marshal(d.Status)
	if err != nil {
		t.Fatal(err)
	}
	if err := strictdecode.Into(b, new(v1alpha1.EtcdClusterStatus)); err != nil {
		t.Fatalf("status: %v", err)
	}
}

// TestSimulatedChildrenAreTyped tells every scenario story in testdata/ to the simulator
// again and checks every decision it makes, and every one it only plans, with checkTyped;
// then the same for a cluster with TLS, which no story covers. Between them they render
// every child kind and every member Job.
func TestSimulatedChildrenAreTyped(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: TestScenarios runs the same scenarios; the default run decodes their children strictly")
	}
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenario files: %v", err)
	}
	seen := map[string]bool{}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) {
			var w *simWorld
			for _, b := range parseScenario(t, file) {
				for _, l := range b.lines {
					if !strings.HasPrefix(l, "#") && strings.TrimSpace(l) != "" {
						w = typedCommand(t, w, l, seen)
					}
				}
			}
		})
	}
	t.Run("tls", func(t *testing.T) {
		w := newSimWorld(t, 3, true)
		w.setTLS("client,peer")
		for _, l := range []string{"run", "spec size=5", "run", "leader etcd-4", "fault etcd-4 crash", "step 20", "fault etcd-4 heal", "run",
			"spec version=v3.6.17", "run", "spec size=3", "run", "spec delete", "step 10"} {
			w = typedCommand(t, w, l, seen)
		}
		if !seen["tls"] {
			t.Error("the TLS cluster rendered no TLS volume")
		}
	})
	for _, want := range []string{"StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget", "Job",
		verbAddLearner, verbPromote, verbRemove, verbMoveLeader, verbExpandClaim, verbRestartPod} {
		if !seen[want] {
			t.Errorf("no decision rendered a %s", want)
		}
	}
}

// typedCommand runs one scenario command, checking every decision of one that syncs or
// plans, and notes in seen the kinds and Job verbs rendered. "run", "step" and "watch" sync
// exactly as runCommand does.
func typedCommand(t *testing.T, w *simWorld, line string, seen map[string]bool) *simWorld {
	t.Helper()
	check := func(d Decision) Decision {
		checkTyped(t, d)
		for _, c := range d.Children {
			seen[c.Kind] = true
			if o, ok := c.Object.(apiObject); ok && c.Kind == "Job" {
				seen[o.Metadata.Labels[LabelAction]] = true
			}
			if b, _ := json.Marshal(c.Object); strings.Contains(string(b), `"secretName":"`+simServerSecret+`"`) {
				seen["tls"] = true
			}
		}
		return d
	}
	f := strings.Fields(line)
	switch f[0] {
	case "run":
		for range 400 {
			if d := check(w.step()); w.converged(d) {
				return w
			}
		}
		t.Fatalf("%q: not converged:\n%s", line, w.describe())
	case "step", "watch":
		n := 1
		if len(f) > 1 {
			n, _ = strconv.Atoi(f[1])
		}
		for range n {
			check(w.step())
		}
		return w
	case "plan":
		check(Plan(simConfig, w.observe()))
		return w
	}
	return runCommand(t, w, line, &strings.Builder{})
}
