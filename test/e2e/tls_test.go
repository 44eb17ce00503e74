package e2e

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"strings"
	gosync "sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/harness"
)

// TestTLS takes a running cluster from plain HTTP to TLS on both ports (killing the leader
// half-way through the roll), renews every leaf certificate (etcd reloads it: nothing rolls),
// rotates the CA in three steps (trust both, issue from the new one, drop the old one: the
// pods roll where etcd must restart to trust a CA), and turns TLS off again, with the
// workload writing throughout (over https once every pod serves it). Nothing acknowledged may
// be lost, no key may show in a log or answer. Both ports change together, to keep the run
// short; the planner's scenarios (sync/testdata/tls.txt) turn each on and off alone.
func TestTLS(t *testing.T) {
	t.Parallel()
	env, pki, logs := newTLSEnv(t)
	size := 3
	t.Run("create", func(t *testing.T) {
		env.Create(spec(int32(size)))
		waitLeader(t, env)
		measure(t, env, scenario{act: func(*testing.T, *harness.Env) int { return size }})
	})
	tlsScenario(t, env, size, "tls-on-kill-leader", func(t *testing.T) int {
		env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) {
			s.TLS = &v1alpha1.TLSSpec{ServerSecret: pki.Server, PeerSecret: pki.Peer, ClientSecret: pki.Client}
		})
		// The leader dies once the roll is half-way: a pod already listens on https for peers.
		if _, err := env.WaitFor(changeBound, func() (bool, string) {
			for _, p := range env.Pods() {
				if flagOf(p, "--listen-peer-urls") == "https://0.0.0.0:2380" {
					return true, ""
				}
			}
			return false, "no pod listens on https for peers yet"
		}); err != nil {
			t.Fatal(err)
		}
		if err := env.Kill(leaderOf(t, env)); err != nil {
			t.Fatal(err)
		}
		return size
	}, func(t *testing.T) { wantServing(t, env, "https", "https") })
	tlsScenario(t, env, size, "rotate-leaf", func(t *testing.T) int {
		pods := podUIDs(env)
		renew(t, env, pki, pki.RenewLeaves)
		for name, uid := range podUIDs(env) {
			if pods[name] != uid {
				t.Errorf("pod %s was recreated for a renewed leaf certificate", name)
			}
		}
		return size
	}, nil)
	tlsScenario(t, env, size, "rotate-ca", func(t *testing.T) int {
		if err := pki.TrustNewCA(); err != nil {
			t.Fatal(err)
		}
		trustRoll(t, env, pki)
		pods := podUIDs(env)
		renew(t, env, pki, pki.IssueFromNewCA)
		for name, uid := range podUIDs(env) {
			if pods[name] != uid {
				t.Errorf("pod %s was recreated for certificates of a CA it already trusts", name)
			}
		}
		pki.DropOldCAs()
		trustRoll(t, env, pki)
		return size
	}, nil)
	tlsScenario(t, env, size, "tls-off", func(t *testing.T) int {
		env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { s.TLS = nil })
		return size
	}, func(t *testing.T) {
		wantServing(t, env, "http", "http")
		if st := env.Store.Parent().Status.TLS; st != nil {
			t.Errorf("status.tls is %+v after TLS was turned off", st)
		}
	})
	noKeyMaterial(t, env, pki, logs)
}

// TestTLSCreated creates a cluster with TLS on both ports from the start.
func TestTLSCreated(t *testing.T) {
	t.Parallel()
	env, pki, logs := newTLSEnv(t)
	size := 3
	s := spec(int32(size))
	s.TLS = &v1alpha1.TLSSpec{ServerSecret: pki.Server, PeerSecret: pki.Peer, ClientSecret: pki.Client}
	t.Run("create-with-tls", func(t *testing.T) {
		env.Create(s)
		waitLeader(t, env)
		measure(t, env, scenario{act: func(*testing.T, *harness.Env) int { return size }})
		wantServing(t, env, "https", "https")
	})
	noKeyMaterial(t, env, pki, logs)
}

// newTLSEnv is newEnv with the cluster's TLS Secrets in place and the hook's log kept.
func newTLSEnv(t *testing.T) (*harness.Env, *harness.PKI, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts := envOptions(t, false)
	opts.Hook = harness.InProcessHook(sync.Config{ClusterDomain: "cluster.local", ToolImage: "etcdops.dev/etcdops:e2e"}, log)
	logf := opts.Logf
	opts.Logf = func(format string, args ...any) {
		fmt.Fprintf(logs, format+"\n", args...)
		logf(format, args...)
	}
	env := startEnv(t, opts)
	pki, err := harness.NewPKI(env.Namespace, env.Cluster, env.Domain)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.UseTLS(pki); err != nil {
		t.Fatal(err)
	}
	return env, pki, logs
}

// tlsScenario runs one change on the steady cluster under the workload, then check.
func tlsScenario(t *testing.T, env *harness.Env, size int, name string, act func(t *testing.T) int, check func(t *testing.T)) {
	t.Run(name, func(t *testing.T) {
		waitSteady(t, env, size)
		measure(t, env, scenario{act: func(t *testing.T, _ *harness.Env) int { return act(t) }})
		if check != nil {
			check(t)
		}
	})
}

func waitLeader(t *testing.T, env *harness.Env) {
	t.Helper()
	if _, err := env.WaitFor(createBound, func() (bool, string) {
		return env.Monitor.View().Leader != "", "no leader yet"
	}); err != nil {
		t.Fatal(err)
	}
}

// wantServing checks every pod's flags, every member's peer URL in etcd and status.tls.
func wantServing(t *testing.T, env *harness.Env, client, peer string) {
	t.Helper()
	for _, p := range env.Pods() {
		if got := flagOf(p, "--listen-client-urls"); got != client+"://0.0.0.0:2379" {
			t.Errorf("%s listens for clients at %s, want %s only", p.Name, got, client)
		}
		if got := flagOf(p, "--listen-peer-urls"); got != peer+"://0.0.0.0:2380" {
			t.Errorf("%s listens for peers at %s, want %s", p.Name, got, peer)
		}
	}
	for name, urls := range env.PeerURLs() {
		if len(urls) != 1 || !strings.HasPrefix(urls[0], peer+"://") {
			t.Errorf("etcd has %s at %v, want one %s peer URL", name, urls, peer)
		}
	}
	if st := env.Store.Parent().Status.TLS; client == "https" && (st == nil || st.Client != "https" || st.Peer != peer || st.Progress != "") {
		t.Errorf("status.tls %+v, want client https, peer %s, no progress", st, peer)
	}
}

func flagOf(p *corev1.Pod, name string) string {
	for _, c := range p.Spec.Containers {
		for _, a := range c.Args {
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v
			}
		}
	}
	return ""
}

// renew changes the certificates in the Secrets and waits until every member serves the new
// ones on both ports: the kubelet refreshes the mounted Secrets, etcd reads them at the next
// handshake.
func renew(t *testing.T, env *harness.Env, pki *harness.PKI, change func() error) {
	t.Helper()
	if err := change(); err != nil {
		t.Fatal(err)
	}
	if err := env.UseTLS(pki); err != nil {
		t.Fatal(err)
	}
	server, peer := pki.Serial(pki.Server), pki.Serial(pki.Peer)
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		for _, p := range env.Pods() {
			for port, want := range map[string]*big.Int{"2379": server, "2380": peer} {
				got, err := servedSerial(env, pki, p.Status.PodIP, port)
				if err != nil || got.Cmp(want) != 0 {
					return false, fmt.Sprintf("%s:%s serves serial %v (%v), want %v", p.Name, port, got, err, want)
				}
			}
		}
		return true, ""
	}); err != nil {
		t.Fatal(err)
	}
}

// servedSerial is the serial of the certificate a member presents on port, presenting the
// peer certificate (members require one on both ports).
func servedSerial(env *harness.Env, pki *harness.PKI, ip, port string) (*big.Int, error) {
	o, ok := env.Store.Get("Secret", pki.Peer)
	if !ok {
		return nil, fmt.Errorf("no Secret %s", pki.Peer)
	}
	s := o.(*corev1.Secret)
	cert, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, err
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", net.JoinHostPort(ip, port),
		// The serial is all that is read: who signed it is checked by the members themselves.
		&tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

// trustRoll writes the Secrets with a changed CA bundle and waits for the roll it causes:
// every pod recreated with the new trust digest, the cluster steady again.
func trustRoll(t *testing.T, env *harness.Env, pki *harness.PKI) {
	t.Helper()
	before := map[string]string{}
	for _, p := range env.Pods() {
		before[p.Name] = p.Annotations[sync.AnnotationTrust]
	}
	if err := env.UseTLS(pki); err != nil {
		t.Fatal(err)
	}
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		for _, p := range env.Pods() {
			if p.Annotations[sync.AnnotationTrust] == before[p.Name] {
				return false, p.Name + " still trusts the CAs it started with"
			}
		}
		return env.Steady(len(before))
	}); err != nil {
		t.Fatalf("%v\n%s", err, env.Describe())
	}
}

// noKeyMaterial fails if a private key shows in the hook's log, the harness's log (Jobs'
// output included), an answer of the hook, an error it returned, or the parent's status.
func noKeyMaterial(t *testing.T, env *harness.Env, pki *harness.PKI, logs *syncBuffer) {
	t.Run("no-key-material", func(t *testing.T) {
		var texts []string
		texts = append(texts, logs.String())
		for _, rec := range env.MC.History() {
			texts = append(texts, string(rec.Response))
			if rec.Err != nil {
				texts = append(texts, rec.Err.Error())
			}
		}
		texts = append(texts, fmt.Sprintf("%+v", env.Store.Parent().Status))
		keys := pki.KeyMaterial()
		if len(keys) == 0 {
			t.Fatal("no key material to look for")
		}
		scanned := 0
		for _, text := range texts {
			scanned += len(text)
			for _, k := range keys {
				if strings.Contains(text, k) {
					t.Errorf("a private key shows in %q", text[max(0, strings.Index(text, k)-80):min(len(text), strings.Index(text, k)+40)])
				}
			}
			if strings.Contains(text, "PRIVATE KEY") {
				t.Errorf("a PEM private key shows in the hook's output or logs")
			}
		}
		t.Logf("scanned %d bytes of logs, answers and status for %d forms of %d keys", scanned, len(keys), len(keys)/3)
	})
}

// syncBuffer is a log sink shared by the hook and the harness.
type syncBuffer struct {
	mu gosync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
