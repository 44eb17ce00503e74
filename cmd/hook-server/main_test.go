package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"etcdops.dev/etcdops/manifests"
	"etcdops.dev/etcdops/test/dialguard"
	"etcdops.dev/etcdops/test/testcert"
)

// startServer runs run on 127.0.0.1:0 without a drain period (unless args set one), with the
// dial guard, waits for its "listening" log line and returns the base URL, a stop function
// and the channel run's result arrives on.
func startServer(t *testing.T, args []string, env map[string]string) (string, context.CancelFunc, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"--addr=127.0.0.1:0", "--drain-period=0"}, args...), func(k string) string { return env[k] }, pw, dialguard.ForTest(t))
		pw.Close()
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "listening" {
				addr <- line.Addr
			}
		}
	}()
	select {
	case a := <-addr:
		return "http://" + a, cancel, done
	case err := <-done:
		cancel()
		t.Fatalf("run returned before listening: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("no listening line within 10s")
	}
	return "", nil, nil
}

func TestRunServesHealthAndStopsGracefully(t *testing.T) {
	base, stop, done := startServer(t, nil, map[string]string{"ETCDOPS_LOG_FORMAT": "json"})
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz not OK within 5s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := http.Get(base + "/readyz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz = %v, %v; want 200", resp, err)
	}
	resp.Body.Close()

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return within 10s of cancel")
	}
}

func TestShutdownLetsAnInFlightSyncFinish(t *testing.T) {
	// An "etcd" that accepts connections and never answers keeps the sync in its etcd
	// observation until --observe-timeout; shutdown begins meanwhile and must wait for it.
	// The hook dials a pod's IP on the client port, so the listener takes 2379 on a loopback
	// address of its own.
	silent, err := net.Listen("tcp", "127.0.53.79:2379")
	if err != nil {
		t.Skipf("no loopback address for a silent etcd: %v", err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	base, stop, done := startServer(t, []string{"--observe-timeout=1s", "--sync-timeout=3s"}, nil)

	host, _, _ := net.SplitHostPort(silent.Addr().String())
	body := `{"parent":{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"default","uid":"u"},"spec":{}},` +
		`"children":{"StatefulSet.apps/v1":{}},"related":{"Pod.v1":{"etcd-0":{"metadata":{"name":"etcd-0","namespace":"default","labels":{"etcdops.dev/cluster":"etcd"}},"status":{"podIP":"` + host + `"}}}}}`
	type answer struct {
		status int
		took   time.Duration
	}
	answered := make(chan answer, 1)
	go func() {
		start := time.Now()
		resp, err := http.Post(base+"/sync", "application/json", strings.NewReader(body))
		if err != nil {
			t.Errorf("in-flight sync: %v", err)
			answered <- answer{}
			return
		}
		resp.Body.Close()
		answered <- answer{resp.StatusCode, time.Since(start)}
	}()
	time.Sleep(200 * time.Millisecond)
	stop()
	got := <-answered
	if got.status != http.StatusOK {
		t.Errorf("in-flight sync answered %d after shutdown began, want 200", got.status)
	}
	switch {
	case got.took < 200*time.Millisecond:
		t.Errorf("the sync took %s: it ended before shutdown began, so this proves nothing", got.took)
	case got.took > 3*time.Second:
		t.Errorf("the sync took %s; the observe timeout is 1s", got.took)
	}
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
}

func TestShutdownDrainsBeforeTheListenerCloses(t *testing.T) {
	const drain = 3 * time.Second
	base, stop, done := startServer(t, []string{"--drain-period=" + drain.String()}, nil)
	get := func(path string) (int, error) {
		resp, err := http.Get(base + path)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := get("/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before shutdown: %d %v", code, err)
	}
	stopped := time.Now()
	stop()
	// Within the drain the pod is not ready, and yet still answers: calls routed here
	// before the Service dropped it must not fail.
	notReady := false
	for range 100 {
		if code, err := get("/readyz"); err != nil {
			t.Fatalf("/readyz during the drain: %v", err)
		} else if code == http.StatusServiceUnavailable {
			notReady = true
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !notReady {
		t.Fatal("/readyz never answered 503 after shutdown began")
	}
	if code, err := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz during the drain: %d %v", code, err)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/customize", strings.NewReader(`{"parent":{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"a","namespace":"b"}}}`))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("a hook call during the drain: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if took := time.Since(stopped); took < drain {
		t.Errorf("run returned %s after shutdown began, before the %s drain was over", took, drain)
	}
	if _, err := get("/healthz"); err == nil {
		t.Error("the listener still answers after run returned")
	}
}

func TestRunRequiresTheAuthTokenFromTheFile(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base, stop, done := startServer(t, []string{"--auth-token-file=" + tokenFile}, nil)
	defer func() { stop(); <-done }()

	post := func(auth string) int {
		req, _ := http.NewRequest(http.MethodPost, base+"/customize", strings.NewReader(`{"parent":{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"a","namespace":"b"}}}`))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := post(""); got != http.StatusUnauthorized {
		t.Errorf("without token: %d, want 401", got)
	}
	if got := post("Bearer s3cret"); got != http.StatusOK {
		t.Errorf("with token: %d, want 200", got)
	}
}

func TestRunServesHTTPS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	pool := writeSelfSigned(t, certFile, keyFile)
	base, stop, done := startServer(t, nil, map[string]string{"ETCDOPS_TLS_CERT_FILE": certFile, "ETCDOPS_TLS_KEY_FILE": keyFile})
	defer func() { stop(); <-done }()

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := client.Get(strings.Replace(base, "http://", "https://", 1) + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz over TLS: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz over TLS: %d", resp.StatusCode)
	}
}

// writeSelfSigned writes a certificate for 127.0.0.1 and its key, and returns a pool
// trusting it.
func writeSelfSigned(t *testing.T, certFile, keyFile string) *x509.CertPool {
	t.Helper()
	c, err := testcert.Issue(&x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "hook-server test"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, c.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, c.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(c.X509)
	return pool
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		story   string
		args    []string
		env     map[string]string
		check   func(config) bool
		wantErr string
	}{
		{"defaults suit an in-cluster Deployment", nil, nil, func(c config) bool {
			return c.addr == ":8080" && c.clusterDomain == "cluster.local" && c.syncTimeout == 5*time.Second &&
				c.observeTimeout == 3*time.Second && c.maxBodyBytes == 8<<20 && c.logFormat == "json" &&
				c.drainPeriod == 15*time.Second && c.shutdownTimeout == 20*time.Second && c.slowMember == 250*time.Millisecond
		}, ""},
		{"the environment sets a flag", nil, map[string]string{"ETCDOPS_CLUSTER_DOMAIN": "corp.local", "ETCDOPS_MAX_BODY_BYTES": "1024"},
			func(c config) bool { return c.clusterDomain == "corp.local" && c.maxBodyBytes == 1024 }, ""},
		{"the command line wins over the environment", []string{"--tool-image=x:1"}, map[string]string{"ETCDOPS_TOOL_IMAGE": "y:2"},
			func(c config) bool { return c.toolImage == "x:1" }, ""},
		{"a bad environment value names the variable", nil, map[string]string{"ETCDOPS_SYNC_TIMEOUT": "soon"}, nil,
			`ETCDOPS_SYNC_TIMEOUT="soon"`},
		{"observation must leave time to answer", []string{"--observe-timeout=5s", "--sync-timeout=5s"}, nil, nil,
			"--observe-timeout 5s must be below --sync-timeout 5s"},
		{"a certificate needs its key", []string{"--tls-cert-file=a.pem"}, nil, nil, "--tls-cert-file and --tls-key-file go together"},
		{"a slow member is given up on before the observation is", []string{"--slow-member-timeout=3s"}, nil, nil,
			"--slow-member-timeout 3s must be below --observe-timeout 3s"},
		{"the drain and the slow-member wait are flags", []string{"--drain-period=2s", "--slow-member-timeout=100ms", "--max-cached-clusters=10"}, nil,
			func(c config) bool {
				return c.drainPeriod == 2*time.Second && c.slowMember == 100*time.Millisecond && c.maxClusters == 10
			}, ""},
		{"idle clusters close after five minutes unless told", []string{"--idle-cluster-timeout=90s"}, nil,
			func(c config) bool { return c.idleClusters == 90*time.Second }, ""},
		{"an idle timeout must be positive", []string{"--idle-cluster-timeout=0s"}, nil, nil, "--idle-cluster-timeout must be positive"},
		{"stray arguments are refused", []string{"serve"}, nil, nil, "unexpected arguments"},
		{"the collector's headroom is 16Mi unless told", nil, nil, func(c config) bool { return c.gcHeadroom == 16<<20 }, ""},
		{"the headroom is a quantity, from the environment too", nil, map[string]string{"ETCDOPS_GC_HEADROOM": "64Mi"},
			func(c config) bool { return c.gcHeadroom == 64<<20 }, ""},
		{"a headroom of 0 leaves GOGC alone", []string{"--gc-headroom=0"}, nil, func(c config) bool { return c.gcHeadroom == 0 }, ""},
		{"a headroom that is no size is refused", []string{"--gc-headroom=lots"}, nil, nil, `"lots" is not a size such as 16Mi`},
		{"a negative headroom is refused", []string{"--gc-headroom=-1Mi"}, nil, nil, `"-1Mi" is not a size`},
	}
	for _, tt := range tests {
		c, err := parseFlags(tt.args, func(k string) string { return tt.env[k] }, io.Discard)
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: err = %v, want one containing %q", tt.story, err, tt.wantErr)
			}
		case err != nil:
			t.Errorf("%s: %v", tt.story, err)
		case !tt.check(c):
			t.Errorf("%s: got %+v", tt.story, c)
		}
	}
}

func TestRunHelpIsNotAnError(t *testing.T) {
	var out strings.Builder
	if err := run(context.Background(), []string{"-h"}, func(string) string { return "" }, &out, dialguard.ForTest(t)); err != nil {
		t.Fatalf("run -h: %v", err)
	}
	if !strings.Contains(out.String(), "-observe-timeout") {
		t.Errorf("usage does not list flags:\n%s", out.String())
	}
}

func TestRunFailsOnBusyAddress(t *testing.T) {
	base, stop, done := startServer(t, nil, nil)
	defer func() { stop(); <-done }()
	err := run(context.Background(), []string{"--addr=" + strings.TrimPrefix(base, "http://")}, func(string) string { return "" }, io.Discard, dialguard.ForTest(t))
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("run on a busy address: %v, want a listen error", err)
	}
}

func TestDeploymentGraceCoversTheDrainAndTheShutdown(t *testing.T) {
	d, hook, err := manifests.HookServer()
	if err != nil {
		t.Fatal(err)
	}
	pod := d.Spec.Template.Spec
	if hook.ReadinessProbe == nil || pod.TerminationGracePeriodSeconds == nil {
		t.Fatalf("no readiness probe on the hook-server container, or no grace period, in %+v", d)
	}
	c, err := parseFlags(hook.Args, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatalf("the Deployment's args: %v", err)
	}
	probe := hook.ReadinessProbe
	notice := time.Duration(probe.PeriodSeconds*probe.FailureThreshold) * time.Second
	if c.drainPeriod < notice {
		t.Errorf("--drain-period %s is shorter than the %s the readiness probe needs to notice", c.drainPeriod, notice)
	}
	if grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second; grace < c.drainPeriod+c.shutdownTimeout {
		t.Errorf("terminationGracePeriodSeconds %s does not cover --drain-period %s and --shutdown-timeout %s", grace, c.drainPeriod, c.shutdownTimeout)
	}
}
