// Package controlplane is the control-plane test tier: the operator against the real
// kube-apiserver (RBAC on, its default admission plugins), kube-controller-manager and
// Metacontroller, each built once into a cache (test/kubebin) and run as a process on
// 127.0.0.1, with the parts that cannot run here played in-process: the kubelet and the
// scheduler (harness.APINode: our pods as processes and in-process Jobs) and a CSI driver
// (harness.CSIDriver). test/README.md says what is real and what is played.
//
// A scenario starts a Plane, installs the operator (InstallKustomize or InstallHelm) with the
// hook running in the test, creates an EtcdCluster (CreateCluster) and drives it through the
// real API server; see controlplane_test.go.
package controlplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	gosync "sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/test/etcdbin"
	"etcdops.dev/etcdops/test/harness"
	"etcdops.dev/etcdops/test/kubebin"
	"etcdops.dev/etcdops/test/testcert"
)

// Enabled runs the tier: it builds the control plane (about 8 minutes cold on 2 cores) and
// runs each scenario for a few minutes, too long for the default `go test ./...`.
var Enabled = flag.Bool("controlplane", false, "run the control-plane tier (real kube-apiserver, kube-controller-manager and Metacontroller)")

// Keep keeps every plane's directory (logs, kubeconfigs), not only a failed test's.
var Keep = flag.Bool("controlplane.keep", false, "keep each control plane's logs and kubeconfigs, also when the test passed")

// SharedDir is ../shared from the project root, where Metacontroller's source and install
// manifests are.
const SharedDir = "../../../shared"

// Plane is one running control plane: etcd, kube-apiserver, kube-controller-manager and
// Metacontroller, on 127.0.0.1, with an admin client. Everything it started is stopped at the
// end of the test; its logs stay in Dir when the test failed.
type Plane struct {
	// Dir holds the certificates, kubeconfigs and every process's log.
	Dir string
	// Config is an admin's (system:masters) client configuration.
	Config     *rest.Config
	Kubeconfig string
	Client     kubernetes.Interface
	Dynamic    dynamic.Interface
	Bins       kubebin.Binaries
	// Metacontroller is the path of the built Metacontroller.
	Metacontroller string
	// HookClock is the hook's clock (StartHook): a scenario moves it on past a grace period
	// the planner measures, rather than wait for it.
	HookClock *harness.HookClock

	// clusters are the plane's clusters, whose invariants steps reports.
	clustersMu gosync.Mutex
	clusters   []*Cluster
	// events is the hook's Event sink (StartHook, connected by the installs).
	events  *hookEvents
	hookLog *slog.Logger
	// requests keeps what Metacontroller posted to the hook (StartHook).
	requests *requestRecorder

	t      testing.TB
	logMu  gosync.Mutex
	closed bool // the test has ended: nothing more goes to its log
	ca     *testcert.Cert
	host   string
	procs  []*process
	ctx    context.Context
	cancel context.CancelFunc
}

// process is one program of the plane, its log in a file.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// binaries skips the test unless the tier is on and what it needs is here: ../shared, and the
// control plane and Metacontroller built (or buildable). It returns the programs.
func binaries(t testing.TB) (kubebin.Binaries, string) {
	t.Helper()
	if !*Enabled {
		t.Skip("the control-plane tier runs with -controlplane (go test ./test/controlplane -controlplane)")
	}
	src := filepath.Join(SharedDir, "metacontroller", "src")
	if _, err := os.Stat(src); err != nil {
		t.Skipf("Metacontroller's source is not here (%s: ../shared is absent), so the control-plane tier cannot run: %v", src, err)
	}
	start := time.Now()
	bins, err := kubebin.Control()
	if err != nil {
		t.Skipf("kube-apiserver and kube-controller-manager cannot be built here, so the control-plane tier skips: %v", err)
	}
	mc, err := kubebin.Metacontroller(src)
	if err != nil {
		t.Skipf("Metacontroller cannot be built here, so the control-plane tier skips: %v", err)
	}
	t.Logf("kube-apiserver, kube-controller-manager, kubectl and Metacontroller built or found in the cache in %s", time.Since(start).Round(time.Millisecond))
	return bins, mc
}

// Start starts a control plane for the test and stops it with the test. It skips unless
// -controlplane is given, ../shared is here and the programs are built or can be.
func Start(t testing.TB) *Plane {
	t.Helper()
	bins, mc := binaries(t)
	etcd, err := etcdbin.Path(v1alpha1.DefaultVersion)
	if err != nil {
		t.Skipf("etcd %s cannot be built here, so the control-plane tier skips: %v", v1alpha1.DefaultVersion, err)
	}
	dir, err := os.MkdirTemp("", "etcdops-controlplane-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Plane{Dir: dir, Bins: bins, Metacontroller: mc, t: t, ctx: ctx, cancel: cancel}
	t.Cleanup(p.stop)
	planesMu.Lock()
	planes[t] = p
	planesMu.Unlock()
	t.Cleanup(func() {
		planesMu.Lock()
		delete(planes, t)
		planesMu.Unlock()
	})
	if err := p.writeCredentials(); err != nil {
		t.Fatal(err)
	}
	etcdClient, etcdPeer := freePort(t), freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	p.run("etcd", etcd, "--name=apiserver-etcd", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", etcdPeer),
		fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", etcdPeer),
		fmt.Sprintf("--initial-cluster=apiserver-etcd=http://127.0.0.1:%d", etcdPeer),
		"--listen-metrics-urls=", "--quota-backend-bytes=1073741824")
	apiPort := freePort(t)
	p.host = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	p.run("kube-apiserver", bins.APIServer,
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", apiPort),
		"--cert-dir="+filepath.Join(dir, "apiserver"),
		"--tls-cert-file="+p.file("apiserver.crt"), "--tls-private-key-file="+p.file("apiserver.key"),
		"--client-ca-file="+p.file("ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+p.file("sa.key"), "--service-account-signing-key-file="+p.file("sa.key"),
		// Allocated to Services, never dialled: cluster DNS answers pod addresses (harness.DNS).
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=Node,RBAC",
		// The kubernetes Service's endpoints would be 127.0.0.1, which Endpoints refuse.
		"--endpoint-reconciler-type=none",
		"--profiling=false")
	if err := p.writeKubeconfig(); err != nil {
		t.Fatal(err)
	}
	if err := p.waitReady(90 * time.Second); err != nil {
		t.Fatalf("kube-apiserver did not become ready: %v (log: %s)", err, p.logOf("kube-apiserver"))
	}
	p.run("kube-controller-manager", bins.ControllerManager,
		"--kubeconfig="+p.Kubeconfig, "--authentication-kubeconfig="+p.Kubeconfig, "--authorization-kubeconfig="+p.Kubeconfig,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", freePort(t)),
		"--cert-dir="+filepath.Join(dir, "controller-manager"),
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+p.file("sa.key"), "--root-ca-file="+p.file("ca.crt"),
		"--controllers="+strings.Join(controllers, ","),
		"--profiling=false")
	return p
}

// planes are the running planes by the test that started them, for steps.
var (
	planesMu gosync.Mutex
	planes   = map[testing.TB]*Plane{}
)

// planeOf is the plane test t started.
func planeOf(t testing.TB) *Plane {
	t.Helper()
	planesMu.Lock()
	defer planesMu.Unlock()
	p, ok := planes[t]
	if !ok {
		t.Fatal("no control plane started by this test")
	}
	return p
}

// controllers are kube-controller-manager's controllers the tier runs: those our objects meet.
// The node lifecycle controller is left out, so the played node needs no heartbeat.
var controllers = []string{
	"statefulset-controller", "job-controller", "replicaset-controller", "deployment-controller",
	"garbage-collector-controller", "serviceaccount-controller", "serviceaccount-token-controller",
	"root-ca-certificate-publisher-controller", "persistentvolume-binder-controller",
	"persistentvolume-expander-controller", "persistentvolumeclaim-protection-controller",
	"persistentvolume-protection-controller", "ttl-after-finished-controller", "disruption-controller",
	"namespace-controller", "clusterrole-aggregation-controller", "resourcequota-controller",
}

func (p *Plane) file(name string) string { return filepath.Join(p.Dir, name) }

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// writeCredentials writes the plane's CA, the API server's serving certificate, an admin's
// client certificate and the service account signing key.
func (p *Plane) writeCredentials() error {
	now := time.Now()
	ca, err := testcert.NewCA(1, "etcdops-controlplane-ca", now.Add(-time.Hour), now.Add(24*time.Hour))
	if err != nil {
		return err
	}
	p.ca = ca
	serving, err := testcert.Issue(&x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}, ca)
	if err != nil {
		return err
	}
	admin, err := testcert.Issue(&x509.Certificate{SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, ca)
	if err != nil {
		return err
	}
	// Only its key is used: it signs the service accounts' tokens.
	sa, err := testcert.NewCA(4, "service-accounts", now.Add(-time.Hour), now.Add(24*time.Hour))
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{
		"ca.crt": ca.CertPEM, "apiserver.crt": serving.CertPEM, "apiserver.key": serving.KeyPEM,
		"admin.crt": admin.CertPEM, "admin.key": admin.KeyPEM, "sa.key": sa.KeyPEM,
	} {
		if err := os.WriteFile(p.file(name), data, 0o600); err != nil {
			return err
		}
	}
	p.Config = &rest.Config{Host: "", QPS: 50, Burst: 100, TLSClientConfig: rest.TLSClientConfig{
		CAData: ca.CertPEM, CertData: admin.CertPEM, KeyData: admin.KeyPEM}}
	return nil
}

// writeKubeconfig writes the admin's kubeconfig and makes the clients.
func (p *Plane) writeKubeconfig() error {
	p.Config.Host = p.host
	p.Kubeconfig = p.file("admin.kubeconfig")
	if err := writeKubeconfig(p.Kubeconfig, p.host, p.ca.CertPEM, "admin", p.file("admin.crt"), p.file("admin.key"), ""); err != nil {
		return err
	}
	var err error
	if p.Client, err = kubernetes.NewForConfig(p.Config); err != nil {
		return err
	}
	p.Dynamic, err = dynamic.NewForConfig(p.Config)
	return err
}

// writeKubeconfig writes a kubeconfig for a client certificate or a bearer token.
func writeKubeconfig(path, host string, ca []byte, user, cert, key, token string) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Config\nclusters:\n- name: plane\n  cluster:\n    server: %s\n    certificate-authority-data: %s\n", host, b64(ca))
	fmt.Fprintf(&b, "users:\n- name: %s\n  user:\n", user)
	if token != "" {
		fmt.Fprintf(&b, "    token: %s\n", token)
	} else {
		fmt.Fprintf(&b, "    client-certificate: %s\n    client-key: %s\n", cert, key)
	}
	fmt.Fprintf(&b, "contexts:\n- name: plane\n  context:\n    cluster: plane\n    user: %s\ncurrent-context: plane\n", user)
	return os.WriteFile(path, b.Bytes(), 0o600)
}

// waitReady polls the API server's /readyz.
func (p *Plane) waitReady(bound time.Duration) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.ca.CertPEM)
	cert, err := tls.X509KeyPair(p.Config.CertData, p.Config.KeyData)
	if err != nil {
		return err
	}
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
	deadline := time.Now().Add(bound)
	last := errors.New("no answer")
	for time.Now().Before(deadline) {
		if p.exited("kube-apiserver") {
			return errors.New("kube-apiserver exited")
		}
		resp, err := c.Get(p.host + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("/readyz: %s", resp.Status)
		}
		last = err
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("after %s: %w", bound, last)
}

// run starts a program of the plane with its log in Dir/<name>.log.
func (p *Plane) run(name, bin string, args ...string) { p.runEnv(nil, name, bin, args...) }

// runEnv is run with more environment.
func (p *Plane) runEnv(env []string, name, bin string, args ...string) {
	p.t.Helper()
	log := p.file(name + ".log")
	f, err := os.Create(log)
	if err != nil {
		p.t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		p.t.Fatalf("starting %s: %v", name, err)
	}
	pr := &process{name: name, cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		f.Close()
		close(pr.done)
	}()
	p.procs = append(p.procs, pr)
}

func (p *Plane) exited(name string) bool {
	for _, pr := range p.procs {
		if pr.name == name {
			select {
			case <-pr.done:
				return true
			default:
			}
		}
	}
	return false
}

func (p *Plane) logOf(name string) string { return p.file(name + ".log") }

// Logs names every process's log, for failure messages.
func (p *Plane) Logs() string {
	var names []string
	for _, pr := range p.procs {
		names = append(names, pr.log)
	}
	if _, err := os.Stat(p.file("hook.log")); err == nil {
		names = append(names, p.file("hook.log"))
	}
	return strings.Join(names, " ")
}

// stop ends every process, last started first: SIGTERM, then SIGKILL after 5 seconds.
func (p *Plane) stop() {
	p.cancel()
	p.logMu.Lock()
	p.closed = true
	p.logMu.Unlock()
	for i := len(p.procs) - 1; i >= 0; i-- {
		pr := p.procs[i]
		pr.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-pr.done:
		case <-time.After(5 * time.Second):
			pr.cmd.Process.Kill()
			<-pr.done
		}
	}
	if p.t.Failed() || *Keep {
		p.t.Logf("the control plane's logs are kept in %s (admin kubeconfig: %s)", p.Dir, p.Kubeconfig)
		return
	}
	os.RemoveAll(p.Dir)
}

// Writes counts the API server's requests of a verb on the main resource (not a
// subresource such as status) of the resources named, since it started, from its metrics
// (apiserver_request_total).
func (p *Plane) Writes(verb string, resources ...string) (int, error) {
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	raw, err := p.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, err
	}
	total := 0
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `verb="`+verb+`"`) || !strings.Contains(line, `subresource=""`) {
			continue
		}
		for _, r := range resources {
			if strings.Contains(line, `resource="`+r+`"`) {
				var n float64
				if _, err := fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &n); err != nil {
					return 0, fmt.Errorf("metrics line %q: %w", line, err)
				}
				total += int(n)
			}
		}
	}
	return total, nil
}
