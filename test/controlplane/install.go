package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"etcdops.dev/etcdops/kubeevents"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/harness"
	"etcdops.dev/etcdops/test/s3server"
)

// ManifestsDir is the operator's kustomization, ChartDir its Helm chart, from this package.
const (
	ManifestsDir = "../../manifests/metacontroller"
	ChartDir     = "../../manifests/chart"
)

// OperatorNamespace is where both installs put the hook's Deployment and Service.
const OperatorNamespace = "etcdops-system"

// ToolImage is the image the in-test hook renders into member Jobs and etcd pods: the node
// runs the member tool in-process whatever the image says.
const ToolImage = "etcdops/etcdops:v0.1.0"

var compositeControllers = schema.GroupVersionResource{Group: "metacontroller.k8s.io", Version: "v1alpha1", Resource: "compositecontrollers"}

// Kubectl runs the kubectl built from the same release, as the admin, from this package's
// directory; its output comes back with the error.
func (p *Plane) Kubectl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(p.ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.Bins.Kubectl, append([]string{"--kubeconfig=" + p.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// StartMetacontroller installs Metacontroller's namespace, RBAC and CRDs from
// ../shared/metacontroller as its own install does (the CRDs server-side, as its README
// says), and runs it as its service account, with a token from the TokenRequest API.
func (p *Plane) StartMetacontroller() {
	p.t.Helper()
	dir := filepath.Join(SharedDir, "metacontroller")
	for _, args := range [][]string{
		{"apply", "-f", filepath.Join(dir, "metacontroller-namespace.yaml")},
		{"apply", "-f", filepath.Join(dir, "metacontroller-rbac.yaml")},
		{"apply", "--server-side", "-f", filepath.Join(dir, "metacontroller-crds-v1.yaml")},
		{"wait", "--for=condition=Established", "--timeout=60s", "crd/compositecontrollers.metacontroller.k8s.io", "crd/controllerrevisions.metacontroller.k8s.io"},
	} {
		if _, err := p.Kubectl(args...); err != nil {
			p.t.Fatalf("installing Metacontroller: %v", err)
		}
	}
	tok, err := p.token("metacontroller", "metacontroller")
	if err != nil {
		p.t.Fatalf("a token for Metacontroller's service account: %v", err)
	}
	kubeconfig := p.file("metacontroller.kubeconfig")
	if err := writeKubeconfig(kubeconfig, p.host, p.ca.CertPEM, "metacontroller", "", "", tok); err != nil {
		p.t.Fatal(err)
	}
	health := freePort(p.t)
	p.runEnv([]string{"KUBECONFIG=" + kubeconfig}, "metacontroller", p.Metacontroller,
		"--zap-log-level=5", "--discovery-interval=1s", "--metrics-address=127.0.0.1:0",
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", health), "--pprof-address=0")
	if err := waitHTTP(fmt.Sprintf("http://127.0.0.1:%d/readyz", health), 60*time.Second, func() bool { return p.exited("metacontroller") }); err != nil {
		p.t.Fatalf("Metacontroller did not become ready: %v (log: %s)", err, p.logOf("metacontroller"))
	}
}

// token issues a day's token for a service account through the TokenRequest API.
func (p *Plane) token(namespace, account string) (string, error) {
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	exp := int64(24 * 3600)
	var lastErr error
	// The service account controller may not have created the account's token machinery yet.
	for ctx.Err() == nil {
		resp, err := p.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, account,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
		if err == nil {
			return resp.Status.Token, nil
		}
		lastErr = err
		time.Sleep(250 * time.Millisecond)
	}
	return "", lastErr
}

func waitHTTP(url string, bound time.Duration, exited func() bool) error {
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(bound)
	var last error
	for time.Now().Before(deadline) {
		if exited() {
			return fmt.Errorf("the process exited")
		}
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s", url, resp.Status)
		}
		last = err
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("after %s: %v", bound, last)
}

// StartHook runs the hook server in the test on 127.0.0.1 (harness.InProcessHookWithEvents:
// the server cmd/hook-server runs) on HookClock, logging to Dir/hook.log; it returns the base
// URL Metacontroller is to call, a recorder of the requests in front of it (requests.go). Its
// Events go to the API server once an install has created the hook's service account
// (connectEvents), with that account's token, as --events does in the hook's pod.
func (p *Plane) StartHook() string {
	p.t.Helper()
	f, err := os.Create(p.file("hook.log"))
	if err != nil {
		p.t.Fatal(err)
	}
	p.hookLog = slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p.HookClock = &harness.HookClock{}
	p.events = &hookEvents{}
	url, stop, err := harness.InProcessHookWithEvents(sync.Config{ClusterDomain: "cluster.local", ToolImage: ToolImage}, p.hookLog, p.events)(p.ctx, p.HookClock)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { stop(); p.events.stop(); f.Close() })
	return p.recordRequests(url)
}

// UpgradeHook starts a hook of a new release, one rendering toolImage as its member tool, and
// sends Metacontroller's calls to it from now on, as an operator upgrade does; the previous
// hook gets none. Both share the plane's log, clock and Event sink.
func (p *Plane) UpgradeHook(toolImage string) {
	p.t.Helper()
	url, stop, err := harness.InProcessHookWithEvents(sync.Config{ClusterDomain: "cluster.local", ToolImage: toolImage}, p.hookLog, p.events)(p.ctx, p.HookClock)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(stop)
	p.requests.retarget(url)
}

// HookAccount is the hook's service account as both installs create it.
const HookAccount = "etcdops-hook"

// hookEvents is the hook's Event sink: a kubeevents recorder once connectEvents has the
// installed account's credentials; nothing before (the install, which creates the account,
// needs the hook's URL, so the hook starts first).
type hookEvents struct {
	rec atomic.Pointer[kubeevents.Recorder]
}

func (e *hookEvents) Emit(ref *corev1.ObjectReference, events []sync.Event) {
	if r := e.rec.Load(); r != nil {
		r.Emit(ref, events)
	}
}

func (e *hookEvents) stop() {
	if r := e.rec.Swap(nil); r != nil {
		r.Stop()
	}
}

// connectEvents gives the hook's Event recorder a token of the installed etcdops-hook service
// account (TokenRequest), so that the real RBAC decides what the hook may write, as in its pod.
func (p *Plane) connectEvents() {
	p.t.Helper()
	if p.events == nil {
		return
	}
	tok, err := p.token(OperatorNamespace, HookAccount)
	if err != nil {
		p.t.Fatalf("a token for the hook's service account: %v", err)
	}
	rec, err := kubeevents.New(p.accountConfig(tok), p.hookLog)
	if err != nil {
		p.t.Fatal(err)
	}
	p.events.rec.Store(rec)
}

// accountConfig is a client configuration for the API server with a bearer token only.
func (p *Plane) accountConfig(token string) *rest.Config {
	return &rest.Config{Host: p.host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: p.ca.CertPEM}}
}

// InstallKustomize installs the operator as docs/install.md does, `kubectl apply -k
// manifests/metacontroller`, and points its CompositeController's hooks at hookURL.
func (p *Plane) InstallKustomize(hookURL string) {
	p.t.Helper()
	out, err := p.Kubectl("apply", "-k", ManifestsDir)
	if err != nil {
		p.t.Fatalf("kubectl apply -k %s: %v", ManifestsDir, err)
	}
	p.t.Logf("kubectl apply -k %s:\n%s", ManifestsDir, out)
	p.waitHookPods()
	p.connectEvents()
	p.PointHooks(hookURL)
}

// InstallHelm installs the operator with `helm install` of the chart into OperatorNamespace,
// created first with the labels docs/install.md gives it, and points its hooks at hookURL.
// It skips where helm is not built (tools/build), unless ETCDOPS_REQUIRE_TOOLS is set.
func (p *Plane) InstallHelm(hookURL string) {
	p.t.Helper()
	dir, err := s3server.ToolsDir()
	if err != nil {
		p.t.Fatal(err)
	}
	helm := filepath.Join(dir, "helm")
	if _, err := os.Stat(helm); err != nil {
		if os.Getenv("ETCDOPS_REQUIRE_TOOLS") != "" {
			p.t.Fatalf("helm is not built in %s (tools/build helm)", dir)
		}
		p.t.Skipf("helm is not built in %s: run tools/build helm (or set ETCDOPS_REQUIRE_TOOLS to make this a failure)", dir)
	}
	if _, err := p.Kubectl("create", "namespace", OperatorNamespace); err != nil {
		p.t.Fatal(err)
	}
	if _, err := p.Kubectl("label", "namespace", OperatorNamespace, "pod-security.kubernetes.io/enforce=restricted"); err != nil {
		p.t.Fatal(err)
	}
	home := filepath.Join(p.Dir, "helm")
	ctx, cancel := context.WithTimeout(p.ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, helm, "install", "etcdops", ChartDir, "--namespace", OperatorNamespace, "--kubeconfig", p.Kubeconfig, "--wait=false")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"), "HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		p.t.Fatalf("helm install: %v\n%s", err, out)
	}
	p.t.Logf("helm install:\n%s", out)
	p.waitHookPods()
	p.connectEvents()
	p.PointHooks(hookURL)
}

// waitHookPods waits for the hook Deployment's pods to be created: the real Deployment and
// ReplicaSet controllers, and the namespace's Pod Security admission, take them. No node runs
// them (the hook runs in the test), so they stay Pending.
func (p *Plane) waitHookPods() {
	p.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		pods, err := p.Client.CoreV1().Pods(OperatorNamespace).List(p.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=etcdops-hook"})
		if err == nil && len(pods.Items) == 2 {
			return
		}
		if time.Now().After(deadline) {
			events, _ := p.Kubectl("get", "events", "-n", OperatorNamespace)
			p.t.Fatalf("the hook Deployment's 2 pods were not created within a minute (%v); events:\n%s", err, events)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// PointHooks sets every hook of the etcdops CompositeController to a url: under the hook's
// base URL. Metacontroller resolves a webhook's service by cluster DNS
// (<name>.<namespace>:<port>), which its process here cannot, so the installed service
// reference is replaced by the address of the hook the test runs; the hooks' version,
// paths and timeouts stay as installed.
func (p *Plane) PointHooks(hookURL string) {
	p.t.Helper()
	p.PointControllerHooks("etcdops", hookURL)
}

// PointControllerHooks is PointHooks for the CompositeController named controller: a shard's.
func (p *Plane) PointControllerHooks(controller, hookURL string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	cc, err := p.Dynamic.Resource(compositeControllers).Get(ctx, controller, metav1.GetOptions{})
	if err != nil {
		p.t.Fatalf("the %s CompositeController: %v", controller, err)
	}
	hooks, _, _ := unstructured.NestedMap(cc.Object, "spec", "hooks")
	var patch []map[string]any
	for name, h := range hooks {
		hook, _ := h.(map[string]any)
		webhook, _ := hook["webhook"].(map[string]any)
		path, _ := webhook["path"].(string)
		next := map[string]any{"url": hookURL + path}
		if timeout, ok := webhook["timeout"]; ok {
			next["timeout"] = timeout
		}
		patch = append(patch, map[string]any{"op": "replace", "path": "/spec/hooks/" + name + "/webhook", "value": next})
	}
	body, err := json.Marshal(patch)
	if err != nil {
		p.t.Fatal(err)
	}
	if _, err := p.Dynamic.Resource(compositeControllers).Patch(ctx, controller, types.JSONPatchType, body, metav1.PatchOptions{}); err != nil {
		p.t.Fatalf("pointing the hooks of %s at %s: %v", controller, hookURL, err)
	}
}
