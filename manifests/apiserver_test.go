package manifests

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	servertesting "k8s.io/apiextensions-apiserver/pkg/cmd/server/testing"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/test/etcdtest"
)

// metacontrollerCRDs are Metacontroller's own CRDs (v4.17.2), kept as data beside the project.
const metacontrollerCRDs = "../../shared/metacontroller/metacontroller-crds-v1.yaml"

// hookFixtures are the hook's recorded requests (<name>.json) and answers (<name>.golden.json).
const hookFixtures = "../test/fixtures"

const testNamespace = "default"

var (
	etcdClusters          = schema.GroupVersionResource{Group: v1alpha1.Group, Version: v1alpha1.Version, Resource: v1alpha1.Resource}
	compositeControllers  = schema.GroupVersionResource{Group: "metacontroller.k8s.io", Version: "v1alpha1", Resource: "compositecontrollers"}
	strictCreate          = metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}
	strictUpdate          = metav1.UpdateOptions{FieldValidation: metav1.FieldValidationStrict}
	errNoMetacontrollerCR = errors.New("no Metacontroller CRDs")
)

// apiServer is a real apiextensions API server backed by a real embedded etcd, both on
// 127.0.0.1: it serves CustomResourceDefinitions and custom resources with the same
// validation, defaulting, CEL rules, pruning, status subresource and table printing as a
// kube-apiserver. It does not serve built-in kinds (Deployments, Services); those are
// checked by decoding them strictly into their Go types.
type apiServer struct {
	config  *rest.Config
	crds    clientset.Interface
	dynamic dynamic.Interface
}

func startAPIServer(t *testing.T) *apiServer {
	t.Helper()
	silenceKlog(t)
	etcdURL := startEtcd(t)

	// The delegated authentication and authorization need a kubeconfig to start; nothing is
	// ever sent to it: the test talks to the server as its privileged loopback client.
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters:
- name: unused
  cluster:
    server: https://127.0.0.1:1
contexts:
- name: unused
  context:
    cluster: unused
    user: unused
current-context: unused
users:
- name: unused
  user:
    token: unused
`), 0o600); err != nil {
		t.Fatal(err)
	}
	server, err := servertesting.StartTestServer(t, nil, []string{
		"--etcd-servers", etcdURL,
		"--etcd-prefix", "/registry/manifests-test",
		"--authentication-skip-lookup",
		"--authentication-kubeconfig", kubeconfig,
		"--authorization-kubeconfig", kubeconfig,
		"--kubeconfig", kubeconfig,
		"--enable-priority-and-fairness=false",
		// Admission plugins that read namespaces or policies from a kube-apiserver.
		"--disable-admission-plugins", "NamespaceLifecycle,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,MutatingAdmissionPolicy",
	}, nil)
	if err != nil {
		t.Fatalf("start apiextensions-apiserver: %v", err)
	}
	t.Cleanup(server.TearDownFn)

	s := &apiServer{config: server.ClientConfig}
	if s.crds, err = clientset.NewForConfig(s.config); err != nil {
		t.Fatal(err)
	}
	if s.dynamic, err = dynamic.NewForConfig(s.config); err != nil {
		t.Fatal(err)
	}
	return s
}

// silenceKlog keeps the API server's logs out of the test output unless -v is given.
func silenceKlog(t *testing.T) {
	if testing.Verbose() {
		return
	}
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	for name, value := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
		if err := fs.Set(name, value); err != nil {
			t.Fatal(err)
		}
	}
	klog.SetOutput(io.Discard)
}

// startEtcd starts a one-member etcd on free loopback ports and returns its client URL.
func startEtcd(t *testing.T) string {
	t.Helper()
	client := etcdtest.FreeURL(t)
	etcdtest.Start(t, etcdtest.Config("apiserver-test", t.TempDir(), etcdtest.FreeURL(t), client))
	return client.String()
}

// createCRD creates crd and waits until the server serves it.
func (s *apiServer) createCRD(ctx context.Context, crd *apiextv1.CustomResourceDefinition) error {
	if _, err := s.crds.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, strictCreate); err != nil {
		return fmt.Errorf("create CRD %s: %w", crd.Name, err)
	}
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := s.crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range got.Status.Conditions {
			if c.Type == apiextv1.NamesAccepted && c.Status == apiextv1.ConditionFalse {
				return false, fmt.Errorf("CRD %s names not accepted: %s", crd.Name, c.Message)
			}
			if c.Type == apiextv1.Established && c.Status == apiextv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}

// createMetacontrollerCRDs installs Metacontroller's CRDs, or returns errNoMetacontrollerCR
// when the shared data is not beside the project.
func (s *apiServer) createMetacontrollerCRDs(ctx context.Context) error {
	data, err := os.ReadFile(metacontrollerCRDs)
	if errors.Is(err, os.ErrNotExist) {
		return errNoMetacontrollerCR
	}
	if err != nil {
		return err
	}
	docs, err := splitDocs(metacontrollerCRDs, data)
	if err != nil {
		return err
	}
	for _, d := range docs {
		crd := &apiextv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(d.raw, crd); err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
		if err := s.createCRD(ctx, crd); err != nil {
			return err
		}
	}
	return nil
}

func (s *apiServer) clusters() dynamic.ResourceInterface {
	return s.dynamic.Resource(etcdClusters).Namespace(testNamespace)
}

func toUnstructured(t *testing.T, v any) *unstructured.Unstructured {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(data); err != nil {
		t.Fatal(err)
	}
	return u
}

func fromUnstructured(t *testing.T, u *unstructured.Unstructured) v1alpha1.EtcdCluster {
	t.Helper()
	data, err := u.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var c v1alpha1.EtcdCluster
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestAPIServer installs the CRDs and the CompositeController on a real API server, creates
// every sample, and checks defaulting, validation, immutability, the status subresource,
// printer columns and the published OpenAPI schema: once for the objects the kustomization
// builds, once for those the Helm chart renders.
func TestAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and an API server")
	}
	t.Run("kustomize", func(t *testing.T) { testAPIServer(t, kustomizeBuild(t)) })
	t.Run("helm", func(t *testing.T) { testAPIServer(t, renderChart(t)) })
}

func testAPIServer(t *testing.T, objs []*unstructured.Unstructured) {
	var crd *apiextv1.CustomResourceDefinition
	var controller *unstructured.Unstructured
	for _, o := range objs {
		switch o.GetKind() {
		case "CustomResourceDefinition":
			crd = &apiextv1.CustomResourceDefinition{}
			decode(t, o, crd)
		case "CompositeController":
			controller = o
		}
	}
	if crd == nil || controller == nil {
		t.Fatalf("no CRD or no CompositeController among %d objects", len(objs))
	}
	start := time.Now()
	s := startAPIServer(t)
	ctx := t.Context()
	t.Logf("etcd and API server up in %s", time.Since(start).Round(time.Millisecond))

	if err := s.createCRD(ctx, crd); err != nil {
		t.Fatal(err)
	}

	t.Run("CompositeController", func(t *testing.T) {
		switch err := s.createMetacontrollerCRDs(ctx); {
		case errors.Is(err, errNoMetacontrollerCR):
			t.Skipf("Metacontroller's CRDs are not at %s; the CompositeController is only checked offline", metacontrollerCRDs)
		case err != nil:
			t.Fatal(err)
		}
		if _, err := s.dynamic.Resource(compositeControllers).Create(ctx, controller, strictCreate); err != nil {
			t.Fatalf("create CompositeController %s: %v", controller.GetName(), err)
		}
	})

	t.Run("samples", func(t *testing.T) { testSamples(t, s) })
	t.Run("validation", func(t *testing.T) { testValidation(t, s) })
	t.Run("owned flags", func(t *testing.T) { testOwnedFlags(t, s) })
	t.Run("immutable storage", func(t *testing.T) { testImmutableStorage(t, s) })
	t.Run("tls transitions", func(t *testing.T) { testTLSTransitions(t, s) })
	t.Run("status", func(t *testing.T) { testStatus(t, s) })
	t.Run("advice", func(t *testing.T) { testAdvice(t, s) })
	t.Run("hook fixtures", func(t *testing.T) { testHookFixtures(t, s) })
	t.Run("printer columns", func(t *testing.T) { testPrinterColumns(t, s) })
	t.Run("openapi", func(t *testing.T) { testOpenAPI(t, s) })
	t.Logf("done in %s", time.Since(start).Round(time.Millisecond))
}

// Every sample is accepted as written (strict field validation), and the API server's
// defaults give the spec the hook's own defaulting would.
func testSamples(t *testing.T, s *apiServer) {
	for _, d := range readDocs(t, samplesDir) {
		created, err := s.clusters().Create(t.Context(), d.obj.DeepCopy(), strictCreate)
		if err != nil {
			t.Errorf("%s: %v", d, err)
			continue
		}
		got := fromUnstructured(t, created)
		want := v1alpha1.Defaulted(fromUnstructured(t, d.obj))
		if !apiequality.Semantic.DeepEqual(got.Spec, want.Spec) {
			g, _ := json.Marshal(got.Spec)
			w, _ := json.Marshal(want.Spec)
			t.Errorf("%s: the API server defaults the spec to\n%s\nthe hook to\n%s", d, g, w)
		}
	}
}

func sampleCluster(name string) v1alpha1.EtcdCluster {
	size := int32(3)
	return v1alpha1.EtcdCluster{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.EtcdClusterSpec{
			Size:        &size,
			StorageSpec: &v1alpha1.StorageSpec{VolumeSizeRequest: resource.MustParse("1Gi")},
		},
	}
}

// Specs the hook would reject are rejected at admission, each with a message naming the rule.
func testValidation(t *testing.T, s *apiServer) {
	q := func(v string) *resource.Quantity { r := resource.MustParse(v); return &r }
	for _, c := range []struct {
		story  string
		mutate func(*v1alpha1.EtcdCluster)
		want   string
	}{
		{"no members", func(c *v1alpha1.EtcdCluster) { *c.Spec.Size = 0 }, "spec.size"},
		{"more members than etcd handles well", func(c *v1alpha1.EtcdCluster) { *c.Spec.Size = 10 }, "spec.size"},
		{"a version that is not a release", func(c *v1alpha1.EtcdCluster) { c.Spec.Version = "latest" }, "spec.version"},
		{"a registry with a digest", func(c *v1alpha1.EtcdCluster) { c.Spec.ImageRegistry = "quay.io/coreos/etcd@sha256" }, "spec.imageRegistry"},
		{"a registry with a tag", func(c *v1alpha1.EtcdCluster) { c.Spec.ImageRegistry = "registry.local:5000/etcd:v3" }, "must not carry a tag"},
		{"an option that is not a flag", func(c *v1alpha1.EtcdCluster) { c.Spec.EtcdOptions = []string{"quota-backend-bytes=1"} }, "spec.etcdOptions[0]"},
		{"a read-only volume", func(c *v1alpha1.EtcdCluster) { c.Spec.StorageSpec.AccessModes = "ReadOnlyMany" }, "spec.storageSpec.accessModes"},
		{"an unknown retention", func(c *v1alpha1.EtcdCluster) { c.Spec.StorageSpec.WhenDeleted = "Keep" }, "spec.storageSpec.whenDeleted"},
		{"an empty volume", func(c *v1alpha1.EtcdCluster) { c.Spec.StorageSpec.VolumeSizeRequest = resource.MustParse("0") }, "volumeSizeRequest must be greater than zero"},
		{"a limit below the request", func(c *v1alpha1.EtcdCluster) { c.Spec.StorageSpec.VolumeSizeLimit = q("512Mi") }, "volumeSizeLimit must be at least volumeSizeRequest"},
		{"a client certificate without server TLS", func(c *v1alpha1.EtcdCluster) {
			c.Spec.TLS = &v1alpha1.TLSSpec{ClientSecret: "client"}
		}, "serverSecret and clientSecret go together"},
		{"server TLS without a client certificate", func(c *v1alpha1.EtcdCluster) {
			c.Spec.TLS = &v1alpha1.TLSSpec{ServerSecret: "server", PeerSecret: "peer"}
		}, "serverSecret and clientSecret go together"},
		{"a Secret name with capitals", func(c *v1alpha1.EtcdCluster) {
			c.Spec.TLS = &v1alpha1.TLSSpec{ServerSecret: "Server", ClientSecret: "client"}
		}, "spec.tls.serverSecret"},
		{"a name too long for pod labels", func(c *v1alpha1.EtcdCluster) { c.Name = strings.Repeat("e", 53) }, "at most 52 characters"},
		{"a name that is not a DNS label", func(c *v1alpha1.EtcdCluster) { c.Name = "etcd.prod" }, "DNS-1035"},
		{"a restore to a revision and a time", func(c *v1alpha1.EtcdCluster) {
			c.Spec.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: &v1alpha1.FromBackup{Name: "latest", Revision: new(int64(42)), Time: &metav1.Time{Time: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)},
				BackupDestination: v1alpha1.BackupDestination{PersistentVolumeClaim: &v1alpha1.PVCDestination{ClaimName: "b"}}}}
		}, "set at most one of revision and time"},
		{"a lineage that is no cluster ID", func(c *v1alpha1.EtcdCluster) {
			c.Spec.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: &v1alpha1.FromBackup{Name: "latest", Lineage: "newest",
				BackupDestination: v1alpha1.BackupDestination{PersistentVolumeClaim: &v1alpha1.PVCDestination{ClaimName: "b"}}}}
		}, "spec.bootstrap.fromBackup.lineage"},
	} {
		c1 := sampleCluster("invalid")
		c.mutate(&c1)
		_, err := s.clusters().Create(t.Context(), toUnstructured(t, c1), strictCreate)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error mentioning %q", c.story, err, c.want)
		}
	}

	withPort := sampleCluster("registry-port")
	withPort.Spec.ImageRegistry = "registry.local:5000/etcd"
	if _, err := s.clusters().Create(t.Context(), toUnstructured(t, withPort), strictCreate); err != nil {
		t.Errorf("a registry with a port: %v", err)
	}

	u := toUnstructured(t, sampleCluster("unknown-field"))
	if err := unstructured.SetNestedField(u.Object, int64(3), "spec", "replicas"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.clusters().Create(t.Context(), u, strictCreate); err == nil || !strings.Contains(err.Error(), "spec.replicas") {
		t.Errorf("an unknown spec field: got %v, want it rejected", err)
	}

	minimal := toUnstructured(t, v1alpha1.EtcdCluster{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: "no-spec"},
	})
	unstructured.RemoveNestedField(minimal.Object, "spec")
	unstructured.RemoveNestedField(minimal.Object, "status")
	created, err := s.clusters().Create(t.Context(), minimal, strictCreate)
	if err != nil {
		t.Fatalf("an EtcdCluster without spec: %v", err)
	}
	if got := fromUnstructured(t, created).Spec; got.Size == nil || *got.Size != v1alpha1.DefaultSize || got.Version != v1alpha1.DefaultVersion {
		t.Errorf("an EtcdCluster without spec is defaulted to %+v, want size %d and version %s", got, v1alpha1.DefaultSize, v1alpha1.DefaultVersion)
	}
}

// The API server refuses exactly the etcd flags the hook's validation refuses, so a user learns
// at kubectl apply, not from an Invalid phase.
func testOwnedFlags(t *testing.T, s *apiServer) {
	for i, flag := range []string{
		"name", "data-dir", "wal-dir", "initial-cluster", "initial-cluster-state", "initial-cluster-token",
		"initial-advertise-peer-urls", "advertise-client-urls", "listen-client-urls", "listen-peer-urls",
		"listen-metrics-urls", "listen-client-http-urls", "peer-cert-file", "peer-key-file",
		"peer-trusted-ca-file", "peer-client-cert-auth", "peer-auto-tls", "cert-file", "key-file",
		"trusted-ca-file", "client-cert-auth", "auto-tls", "force-new-cluster", "config-file",
		"discovery", "discovery-srv", "discovery-token",
		"quota-backend-bytes", "snapshot-count", "heartbeat-interval", "election-timeout",
		"auto-compaction-mode", "auto-compaction-retention", "max-request-bytes", "max-txn-ops",
		"log-level", "enable-pprof", "metrics", "cipher-suites", "tls-min-version", "client-crl-file",
		"experimental-initial-corrupt-check", "feature-gates", "unsafe-no-fsync", "strict-reconfig-check",
	} {
		c := sampleCluster(fmt.Sprintf("flag-%d", i))
		c.Spec.EtcdOptions = []string{"--" + flag + "=1"}
		goErr := v1alpha1.Validate(v1alpha1.Defaulted(c))
		_, apiErr := s.clusters().Create(t.Context(), toUnstructured(t, c), strictCreate)
		if (goErr == nil) != (apiErr == nil) {
			t.Errorf("--%s: the hook's validation says %v, the API server %v", flag, goErr, apiErr)
		}
	}
}

// Storage settings baked into the StatefulSet's volume claim templates cannot change after
// creation, but for a volume size that grows; the rest of the spec can.
func testImmutableStorage(t *testing.T, s *apiServer) {
	ctx := t.Context()
	created, err := s.clusters().Create(ctx, toUnstructured(t, sampleCluster("immutable")), strictCreate)
	if err != nil {
		t.Fatal(err)
	}
	base := fromUnstructured(t, created)
	update := func(mutate func(*v1alpha1.EtcdCluster)) error {
		c := base
		c.Spec.StorageSpec = new(*base.Spec.StorageSpec)
		c.Spec.Size = new(*base.Spec.Size)
		mutate(&c)
		_, err := s.clusters().Update(ctx, toUnstructured(t, c), strictUpdate)
		return err
	}
	for _, c := range []struct {
		story  string
		mutate func(*v1alpha1.EtcdCluster)
		want   string
	}{
		{"storage removed", func(c *v1alpha1.EtcdCluster) { c.Spec.StorageSpec = nil }, "storageSpec cannot be added or removed"},
		{"a storage class set", func(c *v1alpha1.EtcdCluster) { c.Spec.StorageSpec.StorageClassName = "fast" }, "storageClassName cannot change"},
		{"a smaller volume", func(c *v1alpha1.EtcdCluster) { c.Spec.StorageSpec.VolumeSizeRequest = resource.MustParse("512Mi") }, "volumeSizeRequest can only grow: a volume cannot shrink"},
		{"a bigger volume past its limit", func(c *v1alpha1.EtcdCluster) {
			c.Spec.StorageSpec.VolumeSizeLimit = new(resource.MustParse("1Gi"))
			c.Spec.StorageSpec.VolumeSizeRequest = resource.MustParse("2Gi")
		}, "volumeSizeLimit must be at least volumeSizeRequest"},
		{"a volume limit set", func(c *v1alpha1.EtcdCluster) {
			c.Spec.StorageSpec.VolumeSizeLimit = new(resource.MustParse("4Gi"))
		}, "volumeSizeLimit cannot change"},
		{"another access mode", func(c *v1alpha1.EtcdCluster) { c.Spec.StorageSpec.AccessModes = "ReadWriteOncePod" }, "accessModes cannot change"},
		{"a restore asked of a running cluster", func(c *v1alpha1.EtcdCluster) {
			c.Spec.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: &v1alpha1.FromBackup{Name: "latest",
				BackupDestination: v1alpha1.BackupDestination{PersistentVolumeClaim: &v1alpha1.PVCDestination{ClaimName: "b"}}}}
		}, "spec.bootstrap is fixed at creation"},
	} {
		if err := update(c.mutate); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error mentioning %q", c.story, err, c.want)
		}
	}
	if err := update(func(c *v1alpha1.EtcdCluster) {
		*c.Spec.Size = 5
		c.Spec.StorageSpec.WhenDeleted = v1alpha1.PVCDelete
		c.Spec.StorageSpec.VolumeSizeRequest = resource.MustParse("2Gi")
		c.Spec.Paused = true
	}); err != nil {
		t.Errorf("size, whenDeleted and paused may change, and volumeSizeRequest grow: %v", err)
	}
}

// fullStatus sets every field of the status the hook reports.
func fullStatus(now time.Time) v1alpha1.EtcdClusterStatus {
	since := metav1.NewTime(now.Truncate(time.Second))
	return v1alpha1.EtcdClusterStatus{
		ObservedGeneration: 1,
		Phase:              v1alpha1.PhaseRunning,
		ReadyMembers:       3,
		Members: []v1alpha1.MemberStatus{
			{Name: "status-0", ID: "8e9e05c52164694d", Ordinal: 0, IsLeader: true, Healthy: true, Version: "3.6.16",
				Volume: &v1alpha1.VolumeStatus{Requested: "2Gi", Capacity: "1Gi", Resizing: "FileSystemResizePending"}},
			{Name: "status-1", ID: "91bc3c398fb3c146", Ordinal: 1, Version: "3.6.16", UnansweredSince: &since, UnhealthySince: &since,
				LaunchRefused: "the volume lost the member's data: established member status-1 has no data of incarnation 2 in /var/lib/etcd/data"},
			{Name: "status-2", ID: "fd422379fda50e48", Ordinal: 2, IsLearner: true, Version: "3.6.16", RunningSince: &since, AppliedIndex: 42, ProgressSince: &since},
		},
		Leader:         "status-0",
		ClusterID:      "cdf818194e3a8c32",
		CurrentVersion: "v3.6.16",
		V2LogIndex:     4096,
		ForkSeenSince:  &since,
		Conditions: []metav1.Condition{
			{Type: v1alpha1.ConditionAvailable, Status: metav1.ConditionTrue, ObservedGeneration: 1, LastTransitionTime: since, Reason: "QuorumHealthy", Message: "3 of 3 voters healthy"},
			{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionTrue, ObservedGeneration: 1, LastTransitionTime: since, Reason: "PromoteLearner", Message: "promoting status-2"},
			{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionFalse, ObservedGeneration: 1, LastTransitionTime: since, Reason: "MembersHealthy", Message: ""},
		},
		Warnings:    []string{v1alpha1.EvenSizeWarning(4)},
		Action:      &v1alpha1.Action{Type: "PromoteLearner", Member: "status-2", Reason: "learner caught up", Since: since},
		JobFailures: 1,
		Maintenance: &v1alpha1.MaintenanceStatus{Operation: "NoSpace", Phase: "Defragmenting", Member: "status-1", Defragmented: []string{"status-2"}, Since: since, LastDisarmed: &since},
		Recovery:    &v1alpha1.RecoveryStatus{Survivor: "status-0", ID: "8e9e05c52164694d", RaftIndex: 4711, Trigger: "Automatic", Phase: "Done", Token: "r-1", Since: since},
		History: []v1alpha1.StepRecord{
			{Type: "ReplacePod", Member: "status-0", Reason: "member status-0 unhealthy on an outdated pod", Result: v1alpha1.StepSucceeded, Repair: true, Started: since, Finished: &since},
			{Type: "AddLearner", Member: "status-2", Reason: "2 of 3 members", Job: "status-add-learner-status-2-0123456789", Result: v1alpha1.StepRunning, Started: since},
		},
		Backup: &v1alpha1.BackupStatus{LastScheduleTime: &since, LastRequest: "before-upgrade", LastSuccessfulTime: &since,
			LastSuccessful: &v1alpha1.BackupRecord{Object: "s3://b/ns/status/status-20261201T090000Z-r42.db", Revision: 42, Size: 20512, SHA256: "ab12", Member: "status-1", Time: since},
			LastFailure:    &v1alpha1.BackupFailure{Job: "status-backup-status-2-0123456789", Reason: "no member can give a snapshot", Time: since},
			Continuous: &v1alpha1.ContinuousBackupStatus{StoredRevision: 4711, StoredTime: &since, BehindSince: &since, Message: "changes wait unstored",
				SupersededBy: "status-backup-stream-7d9c-x2 (writer 1f2e3d4c5b6a7988, since 2026-12-01T09:00:00Z)"},
			LastDrillScheduleTime: &since, LastDrillRequest: "after-the-fix",
			LastDrill: &v1alpha1.DrillRecord{Job: "status-drill-status-2-0123456789", Time: since, Result: v1alpha1.DrillMismatch,
				Message: `key "/registry/a": its value differs`, Lineage: "8e9e05c52164694d", Snapshot: "s3://b/ns/status/lineages/8e9e05c52164694d/status-20261201T090000Z-r42.db",
				RestoredRevision: 4711, Revision: 4711, Keys: 1523, Digest: "9f86d081884c7d65", RestoreDuration: &metav1.Duration{Duration: 12 * time.Second}},
			Guard: &v1alpha1.StepGuard{Step: "upgrade-v3.7.3", Since: since, Requested: &since, Snapshot: "s3://b/ns/status/status-20261201T090000Z-r42.db",
				Revision: 42, SnapshotTime: &since, Failure: "Access Denied", FailureTime: &since, Skipped: true, Done: &since}},
		RestoredFrom:     "latest",
		RestoredRevision: 4700,
		RestoredTime:     &metav1.MicroTime{Time: since.Add(1500 * time.Millisecond)},
		RestoredLineage:  "8e9e05c52164694d",
		RestoreDuration:  &metav1.Duration{Duration: 2 * time.Minute},
		LastSwitchover:   &v1alpha1.SwitchoverRecord{Request: "status-1@2", Member: "status-0", Moved: true, Time: since},
		Ledger: []v1alpha1.LedgerRecord{
			{Name: "status-0", ID: "8e9e05c52164694d", Incarnation: 0, Established: true},
			{Name: "status-1", ID: "91bc3c398fb3c146", Incarnation: 2, Established: true, PastIDs: []string{"2a1b3c4d5e6f7081", "3b2c4d5e6f708192"}},
			{Name: "status-2", ID: "fd422379fda50e48", Incarnation: 1},
		},
		TLS: &v1alpha1.TLSStatus{Client: "http+https", Peer: "https", ServerSecret: "status-server", PeerSecret: "status-peer",
			ClientSecret: "status-client", Progress: "client TLS on, stage 1 of 2: 1 of 3 pods rolled"},
		Client: &v1alpha1.ClientStatus{Endpoints: []string{"https://status-0.status.default.svc.cluster.local:2379"}, Service: "https://status-client.default.svc.cluster.local:2379",
			Scheme: "https", ClientSecret: "status-client", ConfigMap: "status-client",
			Users: []v1alpha1.ClientUser{{Name: "orders", Secret: "status-user-orders"}}},
		Auth: &v1alpha1.AuthStatus{Enabled: true, Applied: "3f2a9c", Users: []string{"orders"}, Roles: []string{"orders"}},
	}
}

// A status with every field the hook emits is stored as written: nothing is pruned, so
// Metacontroller's status writes settle instead of being rewritten on every sync.
func testStatus(t *testing.T, s *apiServer) {
	ctx := t.Context()
	want := fullStatus(time.Now())
	assertAllFieldsSet(t, "status", want)

	created, err := s.clusters().Create(ctx, toUnstructured(t, sampleCluster("status")), strictCreate)
	if err != nil {
		t.Fatal(err)
	}
	c := fromUnstructured(t, created)
	c.Status = want
	updated, err := s.clusters().UpdateStatus(ctx, toUnstructured(t, c), strictUpdate)
	if err != nil {
		t.Fatalf("status update: %v", err)
	}
	got, _ := json.Marshal(fromUnstructured(t, updated).Status)
	sent, _ := json.Marshal(want)
	if string(got) != string(sent) {
		t.Errorf("status stored as\n%s\nsent\n%s", got, sent)
	}

	// An action the hook has not timed yet encodes since as null; the write must still succeed.
	c = fromUnstructured(t, updated)
	c.Status.Action = &v1alpha1.Action{Type: "Wait", Reason: "pod status-2 not ready"}
	if _, err := s.clusters().UpdateStatus(ctx, toUnstructured(t, c), strictUpdate); err != nil {
		t.Errorf("status with a zero action time: %v", err)
	}
}

// assertAllFieldsSet fails when a field of the operator's own types is zero everywhere in v,
// so that a new status field must be added to fullStatus, and so is checked against the API
// server.
func assertAllFieldsSet(t *testing.T, at string, v any) {
	t.Helper()
	set := map[string]bool{}
	setFields(reflect.ValueOf(v), at, set)
	var all []string
	fieldPaths(reflect.TypeOf(v), at, &all)
	for _, p := range all {
		if !set[p] {
			t.Errorf("%s is zero in every place of the test status", p)
		}
	}
}

var ownPackage = reflect.TypeFor[v1alpha1.EtcdCluster]().PkgPath()

// setFields records the paths of the fields that are non-zero somewhere in v.
func setFields(v reflect.Value, at string, set map[string]bool) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			setFields(v.Elem(), at, set)
		}
	case reflect.Slice:
		for i := range v.Len() {
			setFields(v.Index(i), at+"[]", set)
		}
	case reflect.Struct:
		if v.Type().PkgPath() != ownPackage {
			return
		}
		for name, f := range jsonFields(v.Type()) {
			fv := v.FieldByIndex(f.Index)
			if !fv.IsZero() {
				set[at+"."+name] = true
			}
			setFields(fv, at+"."+name, set)
		}
	}
}

// fieldPaths lists the paths of every field of the operator's own types under t.
func fieldPaths(t reflect.Type, at string, out *[]string) {
	switch t.Kind() {
	case reflect.Pointer:
		fieldPaths(t.Elem(), at, out)
	case reflect.Slice:
		fieldPaths(t.Elem(), at+"[]", out)
	case reflect.Struct:
		if t.PkgPath() != ownPackage {
			return
		}
		for name, f := range jsonFields(t) {
			*out = append(*out, at+"."+name)
			fieldPaths(f.Type, at+"."+name, out)
		}
	}
}

// The parents in the hook's fixtures are what this CRD stores, and every status the hook
// answers with is stored as written, conditions and all. A fixture the hook answers Invalid
// may hold a spec admission refuses (the hook must hold on it all the same, e.g. under an
// older CRD): its status is written to a valid parent instead.
func testHookFixtures(t *testing.T, s *apiServer) {
	requests, err := filepath.Glob(filepath.Join(hookFixtures, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, file := range requests {
		name := strings.TrimSuffix(filepath.Base(file), ".json")
		if strings.Contains(name, ".") {
			continue
		}
		var request struct {
			Parent *struct {
				Spec map[string]any `json:"spec"`
			} `json:"parent"`
		}
		readJSON(t, file, &request)
		if request.Parent == nil {
			continue
		}
		var answer struct {
			Status map[string]any `json:"status"`
		}
		readJSON(t, filepath.Join(hookFixtures, name+".golden.json"), &answer)

		parent := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.APIVersion, "kind": v1alpha1.Kind,
			"metadata": map[string]any{"name": "fixture-" + name},
			"spec":     request.Parent.Spec,
		}}
		invalid := answer.Status != nil && answer.Status["phase"] == string(v1alpha1.PhaseInvalid)
		if invalid {
			parent = toUnstructured(t, sampleCluster("fixture-"+name))
		}
		created, err := s.clusters().Create(t.Context(), parent, strictCreate)
		if err != nil {
			t.Errorf("%s: parent: %v", file, err)
			continue
		}
		stored, _ := json.Marshal(created.Object["spec"])
		sent, _ := json.Marshal(parent.Object["spec"])
		if !invalid && string(stored) != string(sent) {
			t.Errorf("%s: the API server stores the parent's spec as\n%s\nthe fixture has\n%s", file, stored, sent)
		}
		if answer.Status == nil {
			continue
		}

		answer.Status["observedGeneration"] = created.GetGeneration()
		created.Object["status"] = answer.Status
		updated, err := s.clusters().UpdateStatus(t.Context(), created, strictUpdate)
		if err != nil {
			t.Errorf("%s: status: %v", name+".golden.json", err)
			continue
		}
		stored, _ = json.Marshal(updated.Object["status"])
		sent, _ = json.Marshal(answer.Status)
		if string(stored) != string(sent) {
			t.Errorf("%s: status stored as\n%s\nsent\n%s", name+".golden.json", stored, sent)
		}
		checked++
	}
	if checked == 0 {
		t.Skipf("no hook fixtures with a status under %s", hookFixtures)
	}
	t.Logf("%d hook answers stored as written", checked)
}

func readJSON(t *testing.T, file string, v any) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// The table kubectl get prints has the columns users look for, filled from the status. It
// reads cluster "status", which testStatus left with a full status and a waiting action.
func testPrinterColumns(t *testing.T, s *apiServer) {
	client, err := rest.HTTPClientFor(s.config)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet,
		s.config.Host+"/apis/etcdops.dev/v1alpha1/namespaces/"+testNamespace+"/etcdclusters/status", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET table: %s: %s", resp.Status, body)
	}
	var table metav1.Table
	if err := json.Unmarshal(body, &table); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range table.ColumnDefinitions {
		if c.Priority == 0 {
			names = append(names, c.Name)
		}
	}
	if want := []string{"Name", "Size", "Ready", "Version", "Leader", "Phase", "Action", "Age"}; !slices.Equal(names, want) {
		t.Fatalf("columns = %v, want %v", names, want)
	}
	if len(table.Rows) != 1 {
		t.Fatalf("%d rows, want 1", len(table.Rows))
	}
	row := fmt.Sprint(table.Rows[0].Cells[:7])
	if want := "[status 3 3 v3.6.16 status-0 Running Wait]"; row != want {
		t.Errorf("row = %s, want %s", row, want)
	}
}

// kubectl explain reads the published OpenAPI schema; the Go doc comments are there.
func testOpenAPI(t *testing.T, s *apiServer) {
	client, err := rest.HTTPClientFor(s.config)
	if err != nil {
		t.Fatal(err)
	}
	var description string
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.config.Host+"/openapi/v3/apis/etcdops.dev/v1alpha1", nil)
		if err != nil {
			return false, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, nil
		}
		var doc struct {
			Components struct {
				Schemas map[string]struct {
					Properties map[string]struct {
						Properties map[string]struct {
							Description string `json:"description"`
						} `json:"properties"`
					} `json:"properties"`
				} `json:"schemas"`
			} `json:"components"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
			return false, err
		}
		description = doc.Components.Schemas["dev.etcdops.v1alpha1.EtcdCluster"].Properties["spec"].Properties["size"].Description
		return description != "", nil
	})
	if err != nil || !strings.Contains(description, "voting members") {
		t.Errorf("published spec.size description %q (%v); want the Go doc comment", description, err)
	}
}
