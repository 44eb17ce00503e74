package manifests

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

const chartDir = "chart"

// chartCopies are the files the chart reads from its files/ directory: copies, because Helm
// reads nothing outside the chart, refreshed by go generate (embed.go).
var chartCopies = map[string]string{
	"chart/files/etcdops.dev_etcdclusters.yaml": crdFile,
	"chart/files/prometheusrule.yaml":           "monitoring/prometheusrule.yaml",
	"chart/files/members-prometheusrule.yaml":   "monitoring/members-prometheusrule.yaml",
	"chart/files/backup-prometheusrule.yaml":    "monitoring/backup-prometheusrule.yaml",
	"chart/files/hook-podmonitor.yaml":          "monitoring/hook-podmonitor.yaml",
	"chart/files/podmonitor.yaml":               "monitoring/podmonitor.yaml",
	"chart/files/backup-stream-podmonitor.yaml": "monitoring/backup-stream-podmonitor.yaml",
	"chart/files/dashboard.json":                "monitoring/dashboard.json",
}

// everything turns on every optional object of the chart.
var everything = []string{"--set", "namespace.create=true,monitoring.rules.enabled=true,monitoring.podMonitor.enabled=true,monitoring.dashboard.enabled=true"}

// helm returns a function that runs the pinned helm with its configuration, cache and data
// in a temporary directory, so nothing of the user's Helm setup takes part.
func helm(t *testing.T) func(args ...string) ([]byte, error) {
	bin := tool(t, "helm")
	home := t.TempDir()
	env := []string{
		"HELM_CACHE_HOME=" + filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME=" + filepath.Join(home, "config"),
		"HELM_DATA_HOME=" + filepath.Join(home, "data"),
	}
	return func(args ...string) ([]byte, error) { return runErr("", env, bin, args...) }
}

// kubeVersion is the oldest Kubernetes docs/install.md supports; helm, built without its
// release's linker flags, would assume an older one than the chart's kubeVersion allows.
const kubeVersion = "1.30.0"

// renderChart runs helm template into namespace etcdops-system with the arguments given.
func renderChart(t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := helm(t)(append([]string{"template", "etcdops", chartDir, "--kube-version", kubeVersion, "--namespace", namespace}, args...)...)
	if err != nil {
		t.Fatalf("helm template %q: %v\n%s", args, err, out)
	}
	docs, err := splitDocs("helm template", out)
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	for _, d := range docs {
		objs = append(objs, d.obj)
	}
	return objs
}

// helmMetadata is what the chart adds to every object and the kustomization does not: Helm's
// own labels, and the policy that keeps the CRD through helm uninstall.
func stripHelmMetadata(o *unstructured.Unstructured) *unstructured.Unstructured {
	o = o.DeepCopy()
	labels := o.GetLabels()
	if labels["app.kubernetes.io/managed-by"] == "Helm" {
		delete(labels, "app.kubernetes.io/managed-by")
	}
	delete(labels, "helm.sh/chart")
	o.SetLabels(labels)
	annotations := o.GetAnnotations()
	delete(annotations, "helm.sh/resource-policy")
	o.SetAnnotations(annotations)
	return o
}

func objectKey(o *unstructured.Unstructured) string {
	return fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
}

// sameObjects reports every object that is in one list and not the other, or differs.
func sameObjects(t *testing.T, what string, got, want []*unstructured.Unstructured) {
	t.Helper()
	index := func(objs []*unstructured.Unstructured) map[string]string {
		m := map[string]string{}
		for _, o := range objs {
			// encoding/json sorts map keys: equal objects give equal text.
			data, err := json.MarshalIndent(o.Object, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			m[objectKey(o)] = string(data)
		}
		return m
	}
	g, w := index(got), index(want)
	for key, wantJSON := range w {
		gotJSON, ok := g[key]
		switch {
		case !ok:
			t.Errorf("%s: %s is missing", what, key)
		case gotJSON != wantJSON:
			t.Errorf("%s: %s differs: %s", what, key, firstDifference(gotJSON, wantJSON))
		}
	}
	for key := range g {
		if _, ok := w[key]; !ok {
			t.Errorf("%s: %s is extra", what, key)
		}
	}
}

// firstDifference shows where two texts part, with the lines before for context.
func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			context := strings.Join(w[max(0, i-3):i], "\n")
			return fmt.Sprintf("after\n%s\ngot  %q\nwant %q", context, gl, wl)
		}
	}
	return "no difference"
}

// monitoringObjects are the objects kubectl apply -k manifests/monitoring creates.
func monitoringObjects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	return kustomizeBuildDir(t, "monitoring")
}

// The chart renders the kustomization's objects, and with monitoring on those of
// manifests/monitoring, equal but for Helm's own labels: the two ways to install cannot
// drift apart.
func TestChartMatchesKustomization(t *testing.T) {
	for copyFile, source := range chartCopies {
		got, err := os.ReadFile(copyFile)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(source)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s is not a copy of %s: run go generate ./manifests", copyFile, source)
		}
	}

	kustomized := kustomizeBuild(t)
	var withoutNamespace []*unstructured.Unstructured
	for _, o := range kustomized {
		if o.GetKind() != "Namespace" {
			withoutNamespace = append(withoutNamespace, o)
		}
	}
	var defaults []*unstructured.Unstructured
	for _, o := range renderChart(t) {
		defaults = append(defaults, stripHelmMetadata(o))
	}
	sameObjects(t, "default values", defaults, withoutNamespace)

	// The dashboard's ConfigMap holds the same JSON, but Helm and kustomize write it with
	// different whitespace: compared as JSON below.
	var all, monitoring []*unstructured.Unstructured
	var dashboard, kustomizedDashboard *unstructured.Unstructured
	for _, o := range renderChart(t, everything...) {
		if o.GetKind() == "ConfigMap" {
			dashboard = o
			continue
		}
		all = append(all, stripHelmMetadata(o))
	}
	for _, o := range monitoringObjects(t) {
		if o.GetKind() == "ConfigMap" {
			kustomizedDashboard = o
			continue
		}
		monitoring = append(monitoring, o)
	}
	sameObjects(t, "everything on", all, append(kustomized, monitoring...))

	raw, err := os.ReadFile("monitoring/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var want any
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	w, _ := json.Marshal(want)
	for what, cm := range map[string]*unstructured.Unstructured{"chart": dashboard, "kustomization": kustomizedDashboard} {
		if cm == nil {
			t.Errorf("%s: no dashboard ConfigMap", what)
			continue
		}
		data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
		var got any
		if err := json.Unmarshal([]byte(data["etcdops.json"]), &got); err != nil {
			t.Fatalf("%s: dashboard ConfigMap: %v", what, err)
		}
		if g, _ := json.Marshal(got); string(g) != string(w) {
			t.Errorf("%s: the dashboard ConfigMap does not hold monitoring/dashboard.json", what)
		}
		if cm.GetName() != "etcdops-dashboard" || cm.GetNamespace() != namespace || cm.GetLabels()["grafana_dashboard"] != "1" {
			t.Errorf("%s: dashboard ConfigMap %s with labels %v; want etcdops-dashboard in %s, labelled grafana_dashboard for Grafana's sidecar",
				what, objectKey(cm), cm.GetLabels(), namespace)
		}
	}
}

// The chart's values reach the objects they name, and flags the chart owns are refused.
func TestChartValues(t *testing.T) {
	// From a file, as a user's values come: YAML numbers reach the templates as floats.
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte("flags:\n  max-body-bytes: 16777216\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	objs := renderChart(t,
		"--namespace", "ops", "--values", values,
		"--set", "image.repository=registry.example.com/etcdops,image.tag=v9.9.9,replicas=3",
		"--set", "resources.requests.cpu=1,resources.limits.memory=1Gi",
		"--set", "flags.cluster-domain=example.org,flags.log-level=debug",
		"--set", "metacontroller.namespace=mc,crds.install=false",
		"--set", "monitoring.prometheus.namespace=prom,monitoring.prometheus.podLabels.app=prometheus",
		"--set-json", `dns.to=[{"ipBlock":{"cidr":"169.254.20.10/32"}}]`)
	kinds := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		kinds[o.GetKind()] = o
		if o.GetNamespace() != "" && o.GetNamespace() != "ops" {
			t.Errorf("%s is in namespace %s, not the release's", objectKey(o), o.GetNamespace())
		}
	}
	for _, absent := range []string{"CustomResourceDefinition", "Namespace", "PrometheusRule", "PodMonitor", "ConfigMap"} {
		if kinds[absent] != nil {
			t.Errorf("%s rendered though not asked for", absent)
		}
	}

	var dep appsv1.Deployment
	var np networkingv1.NetworkPolicy
	decode(t, kinds["Deployment"], &dep)
	decode(t, kinds["NetworkPolicy"], &np)
	c := dep.Spec.Template.Spec.Containers[0]
	const image = "registry.example.com/etcdops:v9.9.9"
	if c.Image != image || toolImage(c.Args) != image {
		t.Errorf("image %q, --tool-image %q; want both %s", c.Image, toolImage(c.Args), image)
	}
	if r := dep.Spec.Replicas; r == nil || *r != 3 {
		t.Errorf("replicas = %v, want 3", r)
	}
	if cpu, mem := c.Resources.Requests.Cpu().String(), c.Resources.Limits.Memory().String(); cpu != "1" || mem != "1Gi" {
		t.Errorf("cpu request %s, memory limit %s; want 1 and 1Gi", cpu, mem)
	}
	if want := []string{"--addr=:8080", "--tool-image=" + image, "--cluster-domain=example.org", "--log-level=debug", "--max-body-bytes=16777216"}; !slices.Equal(c.Args, want) {
		t.Errorf("args = %q, want %q", c.Args, want)
	}
	if ns := np.Spec.Ingress[0].From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"]; ns != "mc" {
		t.Errorf("NetworkPolicy admits namespace %q, want mc", ns)
	}
	if p := np.Spec.Ingress[1].From[0]; p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "prom" ||
		!reflect.DeepEqual(p.PodSelector.MatchLabels, map[string]string{"app": "prometheus", "app.kubernetes.io/name": "prometheus"}) {
		t.Errorf("NetworkPolicy admits Prometheus as %+v, want the pods of namespace prom labelled as set", p)
	}
	if dns := np.Spec.Egress[1].To; len(dns) != 1 || dns[0].IPBlock == nil || dns[0].IPBlock.CIDR != "169.254.20.10/32" {
		t.Errorf("NetworkPolicy lets the hook ask DNS at %+v, want only the NodeLocal DNSCache address set", dns)
	}
	svc, _, _ := unstructured.NestedString(kinds["CompositeController"].Object, "spec", "hooks", "sync", "webhook", "service", "namespace")
	if svc != "ops" {
		t.Errorf("CompositeController calls the hook in namespace %q, want the release's", svc)
	}

	for _, flag := range []string{"addr", "tool-image"} {
		out, err := helm(t)("template", "etcdops", chartDir, "--kube-version", kubeVersion, "--set", "flags."+flag+"=x")
		if err == nil || !strings.Contains(string(out), "the chart sets --addr") {
			t.Errorf("flags.%s accepted (%v): %s", flag, err, out)
		}
	}
}

// decode turns a rendered object into its Go type, refusing unknown fields.
func decode(t *testing.T, o *unstructured.Unstructured, into any) {
	t.Helper()
	if o == nil {
		t.Fatalf("no object to decode into %T", into)
	}
	raw, err := json.Marshal(o.Object)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(raw, into); err != nil {
		t.Fatalf("%s: %v", objectKey(o), err)
	}
}

// helm lint finds nothing to say, with the default values and with everything on.
func TestHelmLint(t *testing.T) {
	h := helm(t)
	for _, args := range [][]string{nil, everything} {
		out, err := h(append([]string{"lint", "--strict", "--kube-version", kubeVersion, chartDir}, args...)...)
		if err != nil {
			t.Errorf("helm lint --strict %q: %v\n%s", args, err, out)
		}
	}
}

// events.enabled=false leaves the hook with no API access: no RBAC, no token, no egress to
// the API, and --events=false.
func TestChartEventsOff(t *testing.T) {
	var dep appsv1.Deployment
	var np networkingv1.NetworkPolicy
	for _, o := range renderChart(t, "--set", "events.enabled=false") {
		switch o.GetKind() {
		case "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			t.Errorf("%s rendered with events off", objectKey(o))
		case "Deployment":
			decode(t, o, &dep)
		case "NetworkPolicy":
			decode(t, o, &np)
		}
	}
	if a := dep.Spec.Template.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Error("the hook's pod mounts a token with events off")
	}
	if args := dep.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--events=false") {
		t.Errorf("args %q lack --events=false", args)
	}
	if len(np.Spec.Egress) != 3 {
		t.Errorf("egress rules %+v, want the three without the API", np.Spec.Egress)
	}
	// And narrowed to an address, the API rule names it.
	for _, o := range renderChart(t, "--set-json", `events.apiServer=[{"ipBlock":{"cidr":"192.0.2.10/32"}}]`) {
		if o.GetKind() == "NetworkPolicy" {
			decode(t, o, &np)
			if api := np.Spec.Egress[3]; len(api.To) != 1 || api.To[0].IPBlock == nil || api.To[0].IPBlock.CIDR != "192.0.2.10/32" {
				t.Errorf("API egress %+v, want only 192.0.2.10/32", api)
			}
		}
	}
}
