package manifests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"etcdops.dev/etcdops/api/v1alpha1"
)

const (
	kustomizeDir = "metacontroller"
	samplesDir   = "metacontroller/samples"
	crdFile      = "metacontroller/crd/etcdops.dev_etcdclusters.yaml"
	namespace    = "etcdops-system"
	hookName     = "etcdops-hook"
	hookPort     = 80
)

// doc is one YAML document of a manifest file.
type doc struct {
	file string
	raw  []byte
	obj  *unstructured.Unstructured
}

func (d doc) String() string {
	return fmt.Sprintf("%s: %s %s", d.file, d.obj.GetKind(), d.obj.GetName())
}

// readDocs returns every document of every YAML file under dir, kustomization.yaml aside.
func readDocs(t *testing.T, dir string) []doc {
	t.Helper()
	var docs []doc
	err := fs.WalkDir(FS, dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || path.Ext(p) != ".yaml" || path.Base(p) == "kustomization.yaml" {
			return err
		}
		data, err := FS.ReadFile(p)
		if err != nil {
			return err
		}
		parsed, err := splitDocs(p, data)
		docs = append(docs, parsed...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatalf("no manifests under %s", dir)
	}
	return docs
}

func splitDocs(file string, data []byte) ([]doc, error) {
	var docs []doc
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		js, err := yaml.YAMLToJSON(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if string(bytes.TrimSpace(js)) == "null" {
			continue
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(js); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		docs = append(docs, doc{file: file, raw: raw, obj: obj})
	}
}

// typedObject returns the Go type a manifest of apiVersion and kind decodes into, or nil for
// kinds without Go types here (Metacontroller's CompositeController, checked by the API
// server test instead).
func typedObject(apiVersion, kind string) any {
	switch apiVersion + ", " + kind {
	case "v1, Namespace":
		return &corev1.Namespace{}
	case "v1, Pod":
		return &corev1.Pod{}
	case "v1, ServiceAccount":
		return &corev1.ServiceAccount{}
	case "v1, Service":
		return &corev1.Service{}
	case "apps/v1, Deployment":
		return &appsv1.Deployment{}
	case "policy/v1, PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}
	case "networking.k8s.io/v1, NetworkPolicy":
		return &networkingv1.NetworkPolicy{}
	case "rbac.authorization.k8s.io/v1, ClusterRole":
		return &rbacv1.ClusterRole{}
	case "rbac.authorization.k8s.io/v1, ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}
	case "admissionregistration.k8s.io/v1, ValidatingAdmissionPolicy":
		return &admissionregistrationv1.ValidatingAdmissionPolicy{}
	case "admissionregistration.k8s.io/v1, ValidatingAdmissionPolicyBinding":
		return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	case "apiextensions.k8s.io/v1, CustomResourceDefinition":
		return &apiextv1.CustomResourceDefinition{}
	case v1alpha1.APIVersion + ", " + v1alpha1.Kind:
		return &v1alpha1.EtcdCluster{}
	}
	return nil
}

// Every manifest decodes into its Go type with no unknown or duplicate field.
func TestManifestsDecodeStrictly(t *testing.T) {
	for _, d := range readDocs(t, kustomizeDir) {
		obj := typedObject(d.obj.GetAPIVersion(), d.obj.GetKind())
		if obj == nil {
			if d.obj.GetKind() != "CompositeController" {
				t.Errorf("%s: no Go type known for %s", d, d.obj.GetAPIVersion())
			}
			continue
		}
		if err := yaml.UnmarshalStrict(d.raw, obj); err != nil {
			t.Errorf("%s: %v", d, err)
		}
	}
}

// hookObjects are the hook's manifests, decoded.
type hookObjects struct {
	namespace      *corev1.Namespace
	serviceAccount *corev1.ServiceAccount
	deployment     *appsv1.Deployment
	service        *corev1.Service
	pdb            *policyv1.PodDisruptionBudget
	networkPolicy  *networkingv1.NetworkPolicy
	role           *rbacv1.ClusterRole
	binding        *rbacv1.ClusterRoleBinding
	controller     *unstructured.Unstructured
}

func decodeHookObjects(t *testing.T, docs []doc) hookObjects {
	t.Helper()
	var h hookObjects
	for _, d := range docs {
		if strings.HasPrefix(d.file, samplesDir+"/") {
			continue
		}
		obj := typedObject(d.obj.GetAPIVersion(), d.obj.GetKind())
		if obj == nil {
			h.controller = d.obj
			continue
		}
		if err := yaml.Unmarshal(d.raw, obj); err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		switch o := obj.(type) {
		case *corev1.Namespace:
			h.namespace = o
		case *corev1.ServiceAccount:
			h.serviceAccount = o
		case *appsv1.Deployment:
			h.deployment = o
		case *corev1.Service:
			h.service = o
		case *policyv1.PodDisruptionBudget:
			h.pdb = o
		case *networkingv1.NetworkPolicy:
			h.networkPolicy = o
		case *rbacv1.ClusterRole:
			h.role = o
		case *rbacv1.ClusterRoleBinding:
			h.binding = o
		}
	}
	if h.namespace == nil || h.serviceAccount == nil || h.deployment == nil || h.service == nil ||
		h.pdb == nil || h.networkPolicy == nil || h.role == nil || h.binding == nil || h.controller == nil {
		t.Fatalf("missing a hook manifest: %+v", h)
	}
	return h
}

func selects(t *testing.T, what string, sel *metav1.LabelSelector, podLabels map[string]string) {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if s.Empty() || !s.Matches(labels.Set(podLabels)) {
		t.Errorf("%s selects %v, which does not match the hook's pod labels %v", what, s, podLabels)
	}
}

// The hook's Deployment, Service, PodDisruptionBudget, NetworkPolicy, ServiceAccount and the
// CompositeController refer to each other consistently and are secure by default.
func TestHookManifests(t *testing.T) {
	h := decodeHookObjects(t, readDocs(t, kustomizeDir))
	dep := h.deployment
	pod := dep.Spec.Template

	for _, m := range []metav1.Object{h.serviceAccount, dep, h.service, h.pdb, h.networkPolicy} {
		if m.GetNamespace() != namespace || m.GetNamespace() != h.namespace.Name {
			t.Errorf("%s is in namespace %q, want %q", m.GetName(), m.GetNamespace(), namespace)
		}
	}
	if h.namespace.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("namespace %s does not enforce the restricted Pod Security Standard", h.namespace.Name)
	}

	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 {
		t.Errorf("Deployment replicas = %v, want 2", dep.Spec.Replicas)
	}
	selects(t, "Deployment selector", dep.Spec.Selector, pod.Labels)
	selects(t, "Service selector", &metav1.LabelSelector{MatchLabels: h.service.Spec.Selector}, pod.Labels)
	selects(t, "PodDisruptionBudget selector", h.pdb.Spec.Selector, pod.Labels)
	selects(t, "NetworkPolicy podSelector", &h.networkPolicy.Spec.PodSelector, pod.Labels)
	if h.pdb.Spec.MinAvailable == nil || h.pdb.Spec.MinAvailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget minAvailable = %v, want 1", h.pdb.Spec.MinAvailable)
	}

	if pod.Spec.ServiceAccountName != h.serviceAccount.Name {
		t.Errorf("pod runs as ServiceAccount %q, want %q", pod.Spec.ServiceAccountName, h.serviceAccount.Name)
	}
	// The token is mounted where it is used, for the Events: the account mounts none of itself.
	if a := h.serviceAccount.AutomountServiceAccountToken; a == nil || *a {
		t.Error("the ServiceAccount mounts its token into every pod that runs as it")
	}
	if a := pod.Spec.AutomountServiceAccountToken; a == nil || !*a {
		t.Error("the hook's pod mounts no token: it cannot write Events")
	}
	checkHookRBAC(t, h.role, h.binding, h.serviceAccount)
	psc := pod.Spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil ||
		psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v: want runAsNonRoot and seccomp RuntimeDefault", psc)
	}

	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("hook pod has %d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if !slices.Equal(c.Command, []string{"/hook-server"}) {
		t.Errorf("command = %q, want /hook-server", c.Command)
	}
	if !slices.Contains(c.Args, "--addr=:8080") || toolImage(c.Args) == "" {
		t.Errorf("args = %q, want --addr=:8080 and --tool-image", c.Args)
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "http" || c.Ports[0].ContainerPort != 8080 {
		t.Errorf("ports = %+v, want http on 8080", c.Ports)
	}
	for probe, p := range map[string]*corev1.Probe{"/readyz": c.ReadinessProbe, "/healthz": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != probe || p.HTTPGet.Port.String() != "http" {
			t.Errorf("probe %s: got %+v", probe, p)
		}
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			t.Errorf("container requests no %s", r)
		}
	}
	if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
		t.Error("container has no memory limit")
	}
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container securityContext %+v: want no privilege escalation, read-only root, non-root, drop ALL, seccomp RuntimeDefault", sc)
	}

	if len(h.service.Spec.Ports) != 1 || h.service.Spec.Ports[0].Port != hookPort || h.service.Spec.Ports[0].TargetPort.String() != "http" {
		t.Errorf("Service ports = %+v, want %d to http", h.service.Spec.Ports, hookPort)
	}

	// Two ingress rules: Metacontroller, and Prometheus (TestEveryAlertIsScraped checks that
	// the scrape is admitted).
	np := h.networkPolicy.Spec
	if len(np.Ingress) != 2 || !slices.Contains(np.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Fatalf("NetworkPolicy: want two ingress rules, got %+v", np)
	}
	for i, want := range []string{"metacontroller", "prometheus"} {
		rule := np.Ingress[i]
		if len(rule.From) != 1 {
			t.Fatalf("NetworkPolicy ingress rule %d from %+v, want one peer", i, rule.From)
		}
		peer := rule.From[0]
		if peer.NamespaceSelector == nil || peer.PodSelector == nil || peer.PodSelector.MatchLabels["app.kubernetes.io/name"] != want {
			t.Errorf("NetworkPolicy ingress rule %d admits %+v, want only %s's pods", i, peer, want)
		}
		if len(rule.Ports) != 1 || rule.Ports[0].Port.String() != "http" {
			t.Errorf("NetworkPolicy ingress rule %d ports = %+v, want the hook's http port only", i, rule.Ports)
		}
	}
	checkHookEgress(t, np)

	checkCompositeController(t, h.controller)
}

func toolImage(args []string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--tool-image="); ok {
			return v
		}
	}
	return ""
}

func checkCompositeController(t *testing.T, cc *unstructured.Unstructured) {
	t.Helper()
	if cc.GetAPIVersion() != "metacontroller.k8s.io/v1alpha1" || cc.GetKind() != "CompositeController" {
		t.Fatalf("not a CompositeController: %s %s", cc.GetAPIVersion(), cc.GetKind())
	}
	if cc.GetNamespace() != "" {
		t.Errorf("CompositeController is cluster-scoped but names namespace %q", cc.GetNamespace())
	}
	spec := cc.Object["spec"].(map[string]any)
	if spec["generateSelector"] != true {
		t.Error("generateSelector is not true")
	}
	if n, _ := spec["resyncPeriodSeconds"].(int64); n <= 0 {
		t.Errorf("resyncPeriodSeconds = %v, want a period", spec["resyncPeriodSeconds"])
	}
	parent := spec["parentResource"].(map[string]any)
	if parent["apiVersion"] != v1alpha1.APIVersion || parent["resource"] != v1alpha1.Resource {
		t.Errorf("parentResource = %v", parent)
	}

	want := map[string]string{
		"apps/v1 statefulsets":                      "InPlace",
		"v1 services":                               "InPlace",
		"v1 serviceaccounts":                        "InPlace",
		"rbac.authorization.k8s.io/v1 roles":        "InPlace",
		"rbac.authorization.k8s.io/v1 rolebindings": "InPlace",
		"v1 configmaps":                             "InPlace",
		"policy/v1 poddisruptionbudgets":            "InPlace",
		"batch/v1 jobs":                             "OnDelete",
		"apps/v1 deployments":                       "InPlace",
	}
	got := map[string]string{}
	for _, c := range spec["childResources"].([]any) {
		c := c.(map[string]any)
		method, _, _ := unstructured.NestedString(c, "updateStrategy", "method")
		got[fmt.Sprintf("%s %s", c["apiVersion"], c["resource"])] = method
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("childResources = %v, want %v", got, want)
	}

	for hook, p := range map[string]string{"sync": "/sync", "finalize": "/finalize", "customize": "/customize"} {
		wh, ok, _ := unstructured.NestedMap(spec, "hooks", hook, "webhook")
		if !ok {
			t.Errorf("no %s hook", hook)
			continue
		}
		svc, _, _ := unstructured.NestedMap(wh, "service")
		if svc["name"] != hookName || svc["namespace"] != namespace || svc["port"] != int64(hookPort) || wh["path"] != p {
			t.Errorf("%s hook calls %v path %v, want Service %s/%s port %d path %s", hook, svc, wh["path"], namespace, hookName, hookPort, p)
		}
		timeout, err := time.ParseDuration(fmt.Sprint(wh["timeout"]))
		if err != nil || timeout <= 0 || timeout > 10*time.Second {
			t.Errorf("%s hook timeout = %v, want an explicit timeout of at most 10s", hook, wh["timeout"])
		}
	}
}

// checkHookRBAC: the install grants one permission, to the hook's account: create and patch
// core Events (kubeevents). The one member Job that needs more (expand-claim, restart-pod) runs
// under a Role the hook renders per cluster, not the install.
func checkHookRBAC(t *testing.T, role *rbacv1.ClusterRole, binding *rbacv1.ClusterRoleBinding, sa *corev1.ServiceAccount) {
	t.Helper()
	want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}}
	if !reflect.DeepEqual(role.Rules, want) || role.AggregationRule != nil {
		t.Errorf("ClusterRole %s allows %+v, want only %+v", role.Name, role.Rules, want)
	}
	if binding.RoleRef != (rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name}) ||
		!reflect.DeepEqual(binding.Subjects, []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: sa.Namespace}}) {
		t.Errorf("ClusterRoleBinding %s binds %+v to %+v, want %s to the hook's account only", binding.Name, binding.RoleRef, binding.Subjects, role.Name)
	}
}

// The install's RBAC is the hook's Events permission and nothing else.
func TestInstallRBAC(t *testing.T) {
	var n int
	for _, d := range readDocs(t, kustomizeDir) {
		if d.obj.GroupVersionKind().Group != "rbac.authorization.k8s.io" {
			continue
		}
		n++
		if d.file != kustomizeDir+"/rbac.yaml" || !strings.HasPrefix(d.obj.GetName(), "etcdops-hook-events") {
			t.Errorf("%s grants API permissions beyond the hook's Events", d)
		}
	}
	if n != 2 {
		t.Errorf("%d RBAC objects, want the hook's ClusterRole and ClusterRoleBinding", n)
	}
}

// The kustomization lists every manifest in its directory, builds, and keeps --tool-image
// equal to the hook's image.
func TestKustomizeBuild(t *testing.T) {
	listed := map[string]bool{}
	var k struct {
		Resources []string `json:"resources"`
	}
	data, err := FS.ReadFile(kustomizeDir + "/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	for _, r := range k.Resources {
		listed[path.Join(kustomizeDir, r)] = true
	}
	for _, d := range readDocs(t, kustomizeDir) {
		if !strings.HasPrefix(d.file, samplesDir+"/") && !listed[d.file] {
			t.Errorf("%s is not listed in the kustomization", d.file)
		}
	}

	objs := kustomizeBuild(t)
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
		if o.GetLabels()["app.kubernetes.io/part-of"] != "etcdops" {
			t.Errorf("%s %s lacks the part-of label", o.GetKind(), o.GetName())
		}
		if o.GetKind() != "Deployment" {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		c := containers[0].(map[string]any)
		args, _, _ := unstructured.NestedStringSlice(c, "args")
		if image := c["image"].(string); toolImage(args) != image || !strings.HasPrefix(image, "etcdops/etcdops:") {
			t.Errorf("built Deployment runs image %q with --tool-image %q; want both etcdops/etcdops and equal", image, toolImage(args))
		}
	}
	want := map[string]int{
		"Namespace": 1, "CustomResourceDefinition": 1, "ServiceAccount": 1, "Deployment": 1, "Service": 1,
		"PodDisruptionBudget": 1, "NetworkPolicy": 1, "CompositeController": 1, "ClusterRole": 1, "ClusterRoleBinding": 1,
		"ValidatingAdmissionPolicy": 2, "ValidatingAdmissionPolicyBinding": 2,
	}
	if !reflect.DeepEqual(kinds, want) {
		t.Errorf("kustomize build gives %v, want %v", kinds, want)
	}
}

// kustomizeBuild runs kustomize on manifests/metacontroller, as kubectl apply -k does.
func kustomizeBuild(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	return kustomizeBuildDir(t, kustomizeDir)
}

// kustomizeBuildDir runs kustomize on a directory of manifests/, as kubectl apply -k does.
func kustomizeBuildDir(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	var objs []*unstructured.Unstructured
	for _, r := range m.Resources() {
		data, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		o := &unstructured.Unstructured{}
		if err := o.UnmarshalJSON(data); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o)
	}
	return objs
}

func loadCRD(t *testing.T) *apiextv1.CustomResourceDefinition {
	t.Helper()
	data, err := FS.ReadFile(crdFile)
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(data, crd); err != nil {
		t.Fatal(err)
	}
	return crd
}

func crdSchema(t *testing.T, crd *apiextv1.CustomResourceDefinition) *apiextv1.JSONSchemaProps {
	t.Helper()
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != v1alpha1.Version {
		t.Fatalf("CRD versions = %+v, want only %s", crd.Spec.Versions, v1alpha1.Version)
	}
	return crd.Spec.Versions[0].Schema.OpenAPIV3Schema
}

// The CRD names, scope, subresource and printer columns are what users and Metacontroller
// rely on.
func TestCRDShape(t *testing.T) {
	crd := loadCRD(t)
	if crd.Spec.Group != v1alpha1.Group || crd.Spec.Names.Kind != v1alpha1.Kind || crd.Spec.Names.Plural != v1alpha1.Resource ||
		crd.Spec.Scope != apiextv1.NamespaceScoped || len(crd.Spec.Names.ShortNames) == 0 {
		t.Errorf("CRD names/scope: %+v %s", crd.Spec.Names, crd.Spec.Scope)
	}
	v := crd.Spec.Versions[0]
	if !v.Served || !v.Storage {
		t.Error("v1alpha1 is not served and stored")
	}
	if v.Subresources == nil || v.Subresources.Status == nil {
		t.Error("no status subresource: Metacontroller ignores a parent without one")
	}
	var columns []string
	for _, c := range v.AdditionalPrinterColumns {
		if c.Priority == 0 {
			columns = append(columns, c.Name)
		}
	}
	if want := []string{"Size", "Ready", "Version", "Leader", "Phase", "Action", "Age"}; !slices.Equal(columns, want) {
		t.Errorf("printer columns = %v, want %v", columns, want)
	}
}

// The CRD's defaults and bounds are the Go defaults and bounds, so the object the API server
// stores is the object the hook would default to.
func TestCRDDefaultsMatchGo(t *testing.T) {
	spec := crdSchema(t, loadCRD(t)).Properties["spec"]
	storage := spec.Properties["storageSpec"]
	for _, c := range []struct {
		field string
		got   *apiextv1.JSON
		want  any
	}{
		{"spec.size", spec.Properties["size"].Default, v1alpha1.DefaultSize},
		{"spec.deletionProtection", spec.Properties["deletionProtection"].Default, true},
		{"spec.version", spec.Properties["version"].Default, v1alpha1.DefaultVersion},
		{"spec.imageRegistry", spec.Properties["imageRegistry"].Default, v1alpha1.DefaultImageRegistry},
		{"spec.storageSpec.accessModes", storage.Properties["accessModes"].Default, corev1.ReadWriteOnce},
		{"spec.storageSpec.whenDeleted", storage.Properties["whenDeleted"].Default, v1alpha1.PVCRetain},
		{"spec.maintenance.noSpace", spec.Properties["maintenance"].Properties["noSpace"].Default, v1alpha1.NoSpaceRemediate},
		{"spec.maintenance.defragment.inUseBelowPercent", spec.Properties["maintenance"].Properties["defragment"].Properties["inUseBelowPercent"].Default, v1alpha1.DefaultDefragmentInUseBelowPercent},
		{"spec.maintenance.defragment.minFree", spec.Properties["maintenance"].Properties["defragment"].Properties["minFree"].Default, v1alpha1.DefaultDefragmentMinFree},
		{"spec.recovery.quorumLoss", spec.Properties["recovery"].Properties["quorumLoss"].Default, v1alpha1.QuorumLossManual},
		{"spec.recovery.after", spec.Properties["recovery"].Properties["after"].Default, metav1.Duration{Duration: v1alpha1.DefaultRecoveryAfter}},
	} {
		want, _ := json.Marshal(c.want)
		if c.got == nil || string(c.got.Raw) != string(want) {
			t.Errorf("%s default = %v, want %s", c.field, c.got, want)
		}
	}
	size := spec.Properties["size"]
	if size.Minimum == nil || *size.Minimum != float64(v1alpha1.MinSize) || size.Maximum == nil || *size.Maximum != float64(v1alpha1.MaxSize) {
		t.Errorf("spec.size bounds = [%v, %v], want [%d, %d]", size.Minimum, size.Maximum, v1alpha1.MinSize, v1alpha1.MaxSize)
	}
	var enum []string
	for _, e := range storage.Properties["whenDeleted"].Enum {
		enum = append(enum, strings.Trim(string(e.Raw), `"`))
	}
	if want := []string{string(v1alpha1.PVCRetain), string(v1alpha1.PVCDelete)}; !slices.Equal(enum, want) {
		t.Errorf("whenDeleted enum = %v, want %v", enum, want)
	}
}

// Every spec and status field of the Go types is in the CRD's schema and the other way
// round, with matching types. A status field missing from the schema would be pruned from
// every status Metacontroller writes.
func TestCRDSchemaMatchesGoTypes(t *testing.T) {
	root := crdSchema(t, loadCRD(t))
	typ := reflect.TypeFor[v1alpha1.EtcdCluster]()
	for _, field := range []string{"spec", "status"} {
		f, ok := jsonFields(typ)[field]
		if !ok {
			t.Fatalf("EtcdCluster has no %s field", field)
		}
		s, ok := root.Properties[field]
		if !ok {
			t.Fatalf("CRD schema has no %s", field)
		}
		compareSchema(t, field, f.Type, &s)
	}
	if d := root.Properties["spec"].Properties["size"].Description; !strings.Contains(d, "voting members") {
		t.Errorf("spec.size has description %q; kubectl explain shows the Go doc comment", d)
	}
}

// jsonFields maps JSON names to struct fields, flattening inline embedded structs.
func jsonFields(t reflect.Type) map[string]reflect.StructField {
	fields := map[string]reflect.StructField{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-" || !f.IsExported():
			continue
		case f.Anonymous && (name == "" || opts == "inline"):
			for n, inner := range jsonFields(f.Type) {
				fields[n] = inner
			}
			continue
		case name == "":
			name = f.Name
		}
		fields[name] = f
	}
	return fields
}

var (
	quantityType = reflect.TypeFor[resource.Quantity]()
	timeType     = reflect.TypeFor[metav1.Time]()
	microTime    = reflect.TypeFor[metav1.MicroTime]()
	durationType = reflect.TypeFor[metav1.Duration]()
)

func compareSchema(t *testing.T, at string, typ reflect.Type, s *apiextv1.JSONSchemaProps) {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if s.XPreserveUnknownFields != nil && *s.XPreserveUnknownFields {
		t.Errorf("%s preserves unknown fields; every field should have a schema", at)
		return
	}
	switch {
	case typ == quantityType:
		if !s.XIntOrString {
			t.Errorf("%s: a quantity should be int-or-string", at)
		}
		return
	case typ == timeType || typ == microTime:
		if s.Type != "string" || s.Format != "date-time" {
			t.Errorf("%s: a time should be a date-time string, schema says %s/%s", at, s.Type, s.Format)
		}
		return
	case typ == durationType:
		if s.Type != "string" {
			t.Errorf("%s: a duration should be a string, schema says %s", at, s.Type)
		}
		return
	}
	want := map[reflect.Kind]string{
		reflect.String: "string", reflect.Bool: "boolean",
		reflect.Int32: "integer", reflect.Int64: "integer", reflect.Int: "integer", reflect.Uint64: "integer",
		reflect.Struct: "object", reflect.Map: "object", reflect.Slice: "array",
	}[typ.Kind()]
	if want == "" || s.Type != want {
		t.Errorf("%s: Go %s, schema type %q", at, typ, s.Type)
		return
	}
	switch typ.Kind() {
	case reflect.Slice:
		if s.Items == nil || s.Items.Schema == nil {
			t.Errorf("%s: array without an items schema", at)
			return
		}
		compareSchema(t, at+"[]", typ.Elem(), s.Items.Schema)
	case reflect.Map:
		if s.AdditionalProperties == nil || s.AdditionalProperties.Schema == nil {
			t.Errorf("%s: map without an additionalProperties schema", at)
			return
		}
		compareSchema(t, at+"{}", typ.Elem(), s.AdditionalProperties.Schema)
	case reflect.Struct:
		fields := jsonFields(typ)
		for name, f := range fields {
			p, ok := s.Properties[name]
			if !ok {
				t.Errorf("%s.%s is in the Go type but not in the CRD schema", at, name)
				continue
			}
			compareSchema(t, at+"."+name, f.Type, &p)
		}
		for name := range s.Properties {
			if _, ok := fields[name]; !ok {
				t.Errorf("%s.%s is in the CRD schema but not in the Go type %s", at, name, typ)
			}
		}
	}
}

// Every sample decodes strictly into the Go type and, once defaulted, passes the hook's own
// validation.
func TestSamplesValidateInGo(t *testing.T) {
	sizes := map[int32]bool{}
	for _, d := range readDocs(t, samplesDir) {
		var c v1alpha1.EtcdCluster
		if err := yaml.UnmarshalStrict(d.raw, &c); err != nil {
			t.Errorf("%s: %v", d, err)
			continue
		}
		if err := v1alpha1.Validate(v1alpha1.Defaulted(c)); err != nil {
			t.Errorf("%s: %v", d, err)
		}
		if c.Spec.Size != nil {
			sizes[*c.Spec.Size] = true
		}
	}
	for _, n := range []int32{1, 3, 5} {
		if !sizes[n] {
			t.Errorf("no sample with %d members", n)
		}
	}
}

// The YAML shown in the operator's docs parses, and every object of a kind with a Go type
// here decodes strictly into it.
func TestDocsYAML(t *testing.T) {
	for _, file := range docPages(t) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		blocks := 0
		rest := string(data)
		for {
			_, after, found := strings.Cut(rest, "```yaml\n")
			if !found {
				break
			}
			block, tail, _ := strings.Cut(after, "```")
			rest = tail
			blocks++
			docs, err := splitDocs(file, []byte(block))
			if err != nil {
				// A fragment without apiVersion and kind: it must still be YAML.
				var v any
				if err := yaml.Unmarshal([]byte(block), &v); err != nil {
					t.Errorf("%s: block %d: %v", file, blocks, err)
				}
				continue
			}
			for _, d := range docs {
				if obj := typedObject(d.obj.GetAPIVersion(), d.obj.GetKind()); obj != nil {
					if err := yaml.UnmarshalStrict(d.raw, obj); err != nil {
						t.Errorf("%s: block %d: %v", file, blocks, err)
					}
				}
			}
		}
		t.Logf("%s: %d YAML blocks", file, blocks)
	}
}
