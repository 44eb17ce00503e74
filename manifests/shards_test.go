package manifests

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// twoShardsDir is the kustomization of an install with two shards: manifests/metacontroller
// and the shard-1 component.
const twoShardsDir = "shards/two"

// The kustomization with the shard-1 component renders what the chart renders with
// shards=2, but for Helm's own labels.
func TestShardComponentMatchesChart(t *testing.T) {
	var kustomized []*unstructured.Unstructured
	for _, o := range kustomizeBuildDir(t, twoShardsDir) {
		if o.GetKind() != "Namespace" {
			kustomized = append(kustomized, o)
		}
	}
	var chart []*unstructured.Unstructured
	for _, o := range renderChart(t, "--set", "shards=2") {
		chart = append(chart, stripHelmMetadata(o))
	}
	sameObjects(t, "shards=2", chart, kustomized)
}

// shardObjects are one shard's objects, decoded.
type shardObjects struct {
	controller    *unstructured.Unstructured
	deployment    appsv1.Deployment
	service       corev1.Service
	pdb           policyv1.PodDisruptionBudget
	networkPolicy networkingv1.NetworkPolicy
}

// Every shard's CompositeController selects its own share of the EtcdClusters: each label
// value (none, a shard's number, a number of no shard) is selected by exactly one shard,
// unlabelled clusters by shard 0; each calls its own hook Service, which, like its budget
// and NetworkPolicy, selects that shard's hook pods and no other shard's. Shard 0 keeps the
// single-shard names, so its Metacontroller finalizer stays on existing clusters.
func TestChartShards(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			shards := map[string]*shardObjects{}
			shard := func(name string) *shardObjects {
				if shards[name] == nil {
					shards[name] = &shardObjects{}
				}
				return shards[name]
			}
			var vap admissionregistrationv1.ValidatingAdmissionPolicy
			for _, o := range renderChart(t, "--set", fmt.Sprintf("shards=%d", n)) {
				name := strings.TrimPrefix(o.GetName(), "etcdops-hook")
				switch o.GetKind() {
				case "CompositeController":
					shard(strings.TrimPrefix(o.GetName(), "etcdops")).controller = o
				case "Deployment":
					decode(t, o, &shard(name).deployment)
				case "Service":
					decode(t, o, &shard(name).service)
				case "PodDisruptionBudget":
					decode(t, o, &shard(name).pdb)
				case "NetworkPolicy":
					decode(t, o, &shard(name).networkPolicy)
				case "ValidatingAdmissionPolicy":
					if o.GetName() == "etcdops-shard-label" {
						decode(t, o, &vap)
					}
				}
			}
			var want []string
			for k := range n {
				want = append(want, shardSuffix(k))
			}
			got := slices.Sorted(func(yield func(string) bool) {
				for k := range shards {
					if !yield(k) {
						return
					}
				}
			})
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("shards %q, want %q", got, want)
			}

			selectors := map[string]labels.Selector{}
			for suffix, s := range shards {
				if s.controller == nil || s.deployment.Name == "" || s.service.Name == "" || s.pdb.Name == "" || s.networkPolicy.Name == "" {
					t.Fatalf("shard %q lacks an object: %+v", suffix, s)
				}
				sel := labels.Everything()
				if raw, ok, _ := unstructured.NestedMap(s.controller.Object, "spec", "parentResource", "labelSelector"); ok {
					var ls metav1.LabelSelector
					decode(t, &unstructured.Unstructured{Object: raw}, &ls)
					var err error
					if sel, err = metav1.LabelSelectorAsSelector(&ls); err != nil {
						t.Fatalf("shard %q: %v", suffix, err)
					}
				} else if n > 1 {
					t.Errorf("shard %q of %d has no labelSelector", suffix, n)
				}
				selectors[suffix] = sel
				for _, hook := range []string{"sync", "finalize", "customize"} {
					svc, _, _ := unstructured.NestedString(s.controller.Object, "spec", "hooks", hook, "webhook", "service", "name")
					if svc != s.service.Name {
						t.Errorf("shard %q's %s hook calls Service %q, want its own %q", suffix, hook, svc, s.service.Name)
					}
				}
				pod := s.deployment.Spec.Template.Labels
				if pod["app.kubernetes.io/component"] != "sync-hook" {
					t.Errorf("shard %q's hook pods %v are not the sync-hook component the PodMonitor scrapes", suffix, pod)
				}
				for other, o := range shards {
					mine := other == suffix
					if labels.SelectorFromSet(s.service.Spec.Selector).Matches(labels.Set(o.deployment.Spec.Template.Labels)) != mine {
						t.Errorf("shard %q's Service selects shard %q's pods: %v", suffix, other, !mine)
					}
					for what, sel := range map[string]*metav1.LabelSelector{"Deployment": s.deployment.Spec.Selector, "PodDisruptionBudget": s.pdb.Spec.Selector, "NetworkPolicy": &s.networkPolicy.Spec.PodSelector} {
						ls, err := metav1.LabelSelectorAsSelector(sel)
						if err != nil {
							t.Fatal(err)
						}
						if ls.Matches(labels.Set(o.deployment.Spec.Template.Labels)) != mine {
							t.Errorf("shard %q's %s selects shard %q's pods: %v", suffix, what, other, !mine)
						}
					}
				}
			}
			if name := shards[""].controller.GetName(); name != "etcdops" || shards[""].service.Name != hookName {
				t.Errorf("shard 0 is CompositeController %s calling %s, want the single-shard names etcdops and %s", name, shards[""].service.Name, hookName)
			}

			cluster := func(value string) labels.Set {
				if value == "" {
					return labels.Set{"app": "x"}
				}
				return labels.Set{"app": "x", "etcdops.dev/shard": value}
			}
			values := []string{"", "0", "7"}
			for k := 1; k < n; k++ {
				values = append(values, fmt.Sprint(k))
			}
			for _, v := range values {
				var by []string
				for suffix, sel := range selectors {
					if sel.Matches(cluster(v)) {
						by = append(by, suffix)
					}
				}
				want := shardSuffix(0)
				if k := slices.Index(values, v); k >= 3 {
					want = shardSuffix(k - 2)
				}
				if len(by) != 1 || by[0] != want {
					t.Errorf("a cluster labelled %q is selected by shards %q, want only %q", v, by, want)
				}
			}

			var listed string
			for _, v := range vap.Spec.Variables {
				if v.Name == "shards" {
					listed = v.Expression
				}
			}
			var names []string
			for k := range n {
				names = append(names, fmt.Sprintf("'%d'", k))
			}
			if want := "[" + strings.Join(names, ", ") + "]"; listed != want {
				t.Errorf("the shard label policy accepts shards %s, want %s", listed, want)
			}
		})
	}
	if out, err := helm(t)("template", "etcdops", chartDir, "--kube-version", kubeVersion, "--set", "shards=0"); err == nil || !strings.Contains(string(out), "shards: at least 1") {
		t.Errorf("shards=0 accepted (%v): %s", err, out)
	}
}

// shardSuffix is what a shard's names add to shard 0's.
func shardSuffix(k int) string {
	if k == 0 {
		return ""
	}
	return fmt.Sprintf("-shard-%d", k)
}
