package harness

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"strings"
	gosync "sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"etcdops.dev/etcdops/test/testcert"
)

// PKI plays cert-manager for one cluster: a CA (two while one is rotated), and the Secrets of
// type kubernetes.io/tls the EtcdCluster names, each with tls.crt, tls.key and ca.crt. It also
// holds an application's client certificate, which the workload presents.
type PKI struct {
	Server, Peer, Client string // Secret names

	mu        gosync.Mutex
	namespace string
	cluster   string
	domain    string
	trusted   []*testcert.Cert // the ca.crt bundle, in order
	issuer    *testcert.Cert   // signs the leaves
	leaves    map[string]*testcert.Cert
	app       *testcert.Cert
	serial    int64
	// keys are every private key handed out, CAs' included, superseded ones too.
	keys [][]byte
}

// NewPKI makes a CA and the three Secrets' certificates for cluster in namespace.
func NewPKI(namespace, cluster, domain string) (*PKI, error) {
	p := &PKI{Server: cluster + "-server", Peer: cluster + "-peer", Client: cluster + "-client",
		namespace: namespace, cluster: cluster, domain: domain, leaves: map[string]*testcert.Cert{}}
	ca, err := p.newAuthority()
	if err != nil {
		return nil, err
	}
	p.trusted, p.issuer = []*testcert.Cert{ca}, ca
	return p, p.issueAll()
}

func (p *PKI) newAuthority() (*testcert.Cert, error) {
	p.serial++
	ca, err := testcert.NewCA(p.serial, fmt.Sprintf("%s CA %d", p.cluster, p.serial), time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour))
	if err != nil {
		return nil, err
	}
	p.keys = append(p.keys, ca.KeyPEM)
	return ca, nil
}

// issue signs a leaf certificate with the current issuer.
func (p *PKI) issue(cn string, dns []string, ips []net.IP, usages ...x509.ExtKeyUsage) (*testcert.Cert, error) {
	p.serial++
	l, err := testcert.Issue(&x509.Certificate{
		SerialNumber: big.NewInt(p.serial),
		Subject:      pkix.Name{CommonName: cn},
		DNSNames:     dns,
		IPAddresses:  ips,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usages,
	}, p.issuer)
	if err != nil {
		return nil, err
	}
	p.keys = append(p.keys, l.KeyPEM)
	return l, nil
}

// issueAll issues every leaf anew from the current issuer, with the names cert-manager would
// be told: members by wildcard under the headless Service, the client Service for the server
// certificate; peer and server certificates serve and present (etcd's own gateway and its
// peers dial with them).
func (p *PKI) issueAll() error {
	members := fmt.Sprintf("*.%s.%s.svc.%s", p.cluster, p.namespace, p.domain)
	client := fmt.Sprintf("%s-client.%s.svc", p.cluster, p.namespace)
	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	// etcd accepts a peer's certificate only if it names the address the peer connects from:
	// one of its IPs, or a DNS name that resolves back from it (in a cluster, CoreDNS answers
	// a pod's address with its name under the headless Service, which the wildcard covers).
	// Here every member connects from 127.0.0.1, the source address the shared loopback gives
	// them all, and Go's resolver answers that one from /etc/hosts: so the peer certificate
	// names it as an IP.
	loopback := []net.IP{net.IPv4(127, 0, 0, 1)}
	for _, c := range []struct {
		secret, cn string
		dns        []string
		ips        []net.IP
		usages     []x509.ExtKeyUsage
	}{
		{p.Server, "etcd server", []string{members, client, client + "." + p.domain}, nil, both},
		{p.Peer, "etcd peer", []string{members}, loopback, both},
		{p.Client, "etcdops", nil, nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{"", "application", nil, nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
	} {
		l, err := p.issue(c.cn, c.dns, c.ips, c.usages...)
		if err != nil {
			return err
		}
		if c.secret == "" {
			p.app = l
		} else {
			p.leaves[c.secret] = l
		}
	}
	return nil
}

// RenewLeaves issues new leaf certificates and keys from the same CA, as cert-manager does
// before expiry.
func (p *PKI) RenewLeaves() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.issueAll()
}

// TrustNewCA adds a new CA to every ca.crt; the leaves stay signed by the old one. The first
// step of a CA rotation: every member must trust both before any certificate changes.
func (p *PKI) TrustNewCA() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	ca, err := p.newAuthority()
	if err != nil {
		return err
	}
	p.trusted = append(p.trusted, ca)
	return nil
}

// IssueFromNewCA re-issues every leaf from the newest trusted CA.
func (p *PKI) IssueFromNewCA() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.issuer = p.trusted[len(p.trusted)-1]
	return p.issueAll()
}

// DropOldCAs leaves only the issuing CA in every ca.crt.
func (p *PKI) DropOldCAs() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trusted = []*testcert.Cert{p.issuer}
}

// Serial is the serial number of the certificate the named Secret holds now.
func (p *PKI) Serial(secret string) *big.Int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.leaves[secret].X509.SerialNumber
}

func (p *PKI) bundle() []byte {
	var b []byte
	for _, ca := range p.trusted {
		b = append(b, ca.CertPEM...)
	}
	return b
}

// Secrets are the cluster's TLS Secrets as they are now.
func (p *PKI) Secrets() []*corev1.Secret {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*corev1.Secret
	for _, name := range []string{p.Server, p.Peer, p.Client} {
		l := p.leaves[name]
		out = append(out, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: p.namespace},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{corev1.TLSCertKey: l.CertPEM, corev1.TLSPrivateKeyKey: l.KeyPEM, "ca.crt": p.bundle()},
		})
	}
	return out
}

// KeyMaterial is every private key the PKI ever handed out, superseded ones too, in the
// forms it may leak in: the PEM, base64 of the PEM (a Secret's data as JSON carries it), and
// the start of the key's own base64 (the PEM body).
func (p *PKI) KeyMaterial() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, key := range p.keys {
		out = append(out, string(key), base64.StdEncoding.EncodeToString(key))
		if b, _ := pem.Decode(key); b != nil {
			out = append(out, base64.StdEncoding.EncodeToString(b.Bytes)[:40])
		}
	}
	return out
}

// UseTLS makes the PKI's Secrets exist in the store as they are now (created or updated: the
// kubelet refreshes them in the pods on its next pass), and makes the workload present the
// application's certificate to members that serve TLS.
func (e *Env) UseTLS(p *PKI) error {
	e.tlsMu.Lock()
	e.pki = p
	e.tlsMu.Unlock()
	for _, s := range p.Secrets() {
		if _, ok := e.Store.Get("Secret", s.Name); ok {
			if err := e.Store.Update(s); err != nil {
				return err
			}
			continue
		}
		if err := e.Store.Create(s); err != nil {
			return err
		}
	}
	e.logf("TLS Secrets written")
	return nil
}

// ClientTLS is the application's TLS: its own certificate, and the CAs of the PKI as they are
// at each handshake (an application reloading its trust bundle). Server names are verified.
func (p *PKI) ClientTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			p.mu.Lock()
			defer p.mu.Unlock()
			c, err := tls.X509KeyPair(p.app.CertPEM, p.app.KeyPEM)
			return &c, err
		},
		// The standard verification, against the bundle of the moment.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			pool := x509.NewCertPool()
			p.mu.Lock()
			pool.AppendCertsFromPEM(p.bundle())
			p.mu.Unlock()
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no server certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, DNSName: cs.ServerName})
			return err
		},
	}
}

// ClientConfig is an application's client configuration: the running voters' DNS names,
// and once the cluster has TLS Secrets, transport credentials that speak TLS to a member
// whose pod serves it and plain HTTP to one that serves only that, connection by connection.
// So the workload writes through a TLS change as applications moved from one scheme to the
// other during its first stage would, without a client made anew.
func (e *Env) ClientConfig() clientv3.Config {
	cfg := clientv3.Config{Endpoints: e.ClientURLs(), DialTimeout: time.Second, Logger: zap.NewNop()}
	e.tlsMu.Lock()
	p := e.pki
	if l := e.login; l != nil {
		cfg.Username, cfg.Password = l.Username, l.Password
	}
	e.tlsMu.Unlock()
	if p != nil {
		cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(&podScheme{env: e, tls: credentials.NewTLS(p.ClientTLS())})}
	}
	return cfg
}

// UseLogin makes applications' clients (ClientConfig, the workload's among them) log in as
// user: etcd ignores it while its auth is off, and requires it once auth is on.
func (e *Env) UseLogin(user, password string) {
	e.tlsMu.Lock()
	defer e.tlsMu.Unlock()
	e.login = &clientv3.Config{Username: user, Password: password}
	e.Kubelet.Login = func() (string, string) { return user, password }
}

// podScheme is transport credentials that follow each pod's client port: gRPC's own TLS
// (verified against the PKI's bundle of the moment) when its etcd flags list https, plain
// otherwise.
type podScheme struct {
	env *Env
	tls credentials.TransportCredentials
}

func (c *podScheme) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	host, _, _ := net.SplitHostPort(raw.RemoteAddr().String())
	if !c.servesTLS(host) {
		return raw, insecureInfo{}, nil
	}
	return c.tls.ClientHandshake(ctx, authority, raw)
}

// servesTLS: the pod at address ip lists https among its client URLs.
func (c *podScheme) servesTLS(ip string) bool {
	for _, p := range c.env.Pods() {
		if p.Status.PodIP == ip {
			return servesClientTLS(p)
		}
	}
	return false
}

func (c *podScheme) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("client credentials only")
}

func (c *podScheme) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}
func (c *podScheme) Clone() credentials.TransportCredentials {
	return &podScheme{env: c.env, tls: c.tls.Clone()}
}
func (c *podScheme) OverrideServerName(string) error { return nil }

// insecureInfo is the AuthInfo of a plain connection.
type insecureInfo struct{ credentials.CommonAuthInfo }

func (insecureInfo) AuthType() string { return "insecure" }

func servesClientTLS(p *corev1.Pod) bool {
	for _, c := range p.Spec.Containers {
		for _, a := range c.Args {
			if v, ok := strings.CutPrefix(a, "--listen-client-urls="); ok {
				return strings.Contains(v, "https://")
			}
		}
	}
	return false
}

// PeerURLs are the peer URLs etcd has for each member, by pod name, from the running server
// that applied the most.
func (e *Env) PeerURLs() map[string][]string {
	out := map[string][]string{}
	var best etcdServer
	for _, s := range e.Kubelet.servers() {
		if best == nil || s.AppliedIndex() > best.AppliedIndex() {
			best = s
		}
	}
	if best == nil {
		return out
	}
	for _, m := range best.members() {
		name := m.Name
		if name == "" {
			name = podOfPeerURL(m.PeerURLs)
		}
		out[name] = append([]string(nil), m.PeerURLs...)
	}
	return out
}
