package sync

import (
	"cmp"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// CertificateCheck checks the certificates in the cluster's TLS Secrets before members rely
// on them (Run). Inputs digests everything it reads but the time, so that the hook may keep
// an answer while they stay.
type CertificateCheck struct {
	Inputs [sha256.Size]byte
	cfg    Config
	c      *v1alpha1.EtcdCluster
	byName map[string]*corev1.Secret
}

func newCertificateCheck(cfg Config, c *v1alpha1.EtcdCluster, secrets []corev1.Secret) CertificateCheck {
	byName := secretsByName(c, secrets)
	return CertificateCheck{Inputs: certInputs(cfg, c, byName), cfg: cfg, c: c, byName: byName}
}

// Run says what is wrong with each Secret that has a problem at now: members that reject each
// other's certificates lose quorum, and etcd says why only in its logs. Checked: the key
// matches the certificate; the certificate is valid now, chains to the CA bundle the members
// trust for it, and has the usages its port needs; server and peer certificates name every
// member's DNS name. A problem names the Secret and the field, never a value, so it may go to
// status and logs. The hook runs it; the planner sees only these strings. The answer stands
// from from to until: with no problem, while every certificate of the chains it verified is
// valid; with one, never (a problem is looked at again on every sync).
func (k CertificateCheck) Run(now time.Time) (problems map[string]string, from, until time.Time) {
	problems, valid := checkCertificates(k.cfg, k.c, k.byName, now)
	return problems, valid.from, valid.until
}

// secretsByName are the Secrets of the cluster's namespace by name.
func secretsByName(c *v1alpha1.EtcdCluster, secrets []corev1.Secret) map[string]*corev1.Secret {
	byName := map[string]*corev1.Secret{}
	for i := range secrets {
		if s := &secrets[i]; s.Namespace == c.Namespace || s.Namespace == "" {
			byName[s.Name] = s
		}
	}
	return byName
}

// certRoles are the checks the cluster's Secrets take.
func certRoles(c *v1alpha1.EtcdCluster) []certRole {
	server, peer, client := secretsInUse(c)
	var roles []certRole
	if server != "" {
		roles = append(roles, certRole{server, server, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, true})
	}
	if peer != "" {
		roles = append(roles, certRole{peer, peer, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, true})
	}
	if client != "" && server != "" {
		// Members verify client certificates against the server Secret's CA bundle.
		roles = append(roles, certRole{client, server, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, false})
	}
	return roles
}

// checkCertificates is CertificateCheck.Run, with the span of time over which its answer
// stands: with no problem, while every certificate of the chains it verified is valid; with
// one, none (a problem is looked at again on every sync).
func checkCertificates(cfg Config, c *v1alpha1.EtcdCluster, byName map[string]*corev1.Secret, now time.Time) (map[string]string, validity) {
	out := map[string]string{}
	valid := validity{until: forever}
	for _, r := range certRoles(c) {
		s, trust := byName[r.secret], byName[r.trustBy]
		if s == nil || trust == nil {
			continue // a missing Secret is reported by the planner (TLSSecretMissing)
		}
		p, v := certificateProblem(cfg, c, s, trust, r, now)
		if p != "" {
			out[r.secret] = p
		}
		valid = valid.and(v)
	}
	if len(out) > 0 {
		valid = validity{}
	}
	return out, valid
}

// certRole is what one Secret's certificate is for.
type certRole struct {
	secret  string
	trustBy string // the Secret whose ca.crt the members verify this certificate against
	usages  []x509.ExtKeyUsage
	hosts   bool // it must name every member
}

// secretsInUse are the Secrets spec.tls names, or status.tls keeps.
func secretsInUse(c *v1alpha1.EtcdCluster) (server, peer, client string) {
	if t := c.Spec.TLS; t != nil {
		server, peer, client = t.ServerSecret, t.PeerSecret, t.ClientSecret
	}
	if t := c.Status.TLS; t != nil {
		server, peer, client = cmp.Or(server, t.ServerSecret), cmp.Or(peer, t.PeerSecret), cmp.Or(client, t.ClientSecret)
	}
	return server, peer, client
}

func certificateProblem(cfg Config, c *v1alpha1.EtcdCluster, s, trust *corev1.Secret, r certRole, now time.Time) (string, validity) {
	name := s.Name
	pair, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return fmt.Sprintf("Secret %s: %s and %s are not a certificate and its key", name, corev1.TLSCertKey, corev1.TLSPrivateKeyKey), validity{}
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return fmt.Sprintf("Secret %s: %s does not parse", name, corev1.TLSCertKey), validity{}
	}
	switch {
	case now.Before(leaf.NotBefore):
		return fmt.Sprintf("Secret %s: the certificate is valid only from %s", name, leaf.NotBefore.UTC().Format(time.RFC3339)), validity{}
	case now.After(leaf.NotAfter):
		return fmt.Sprintf("Secret %s: the certificate expired at %s", name, leaf.NotAfter.UTC().Format(time.RFC3339)), validity{}
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(trust.Data[secretCAKey]) {
		return fmt.Sprintf("Secret %s: %s holds no CA certificate", trust.Name, secretCAKey), validity{}
	}
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		if ic, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(ic)
		}
	}
	valid := validity{until: forever}
	for _, u := range r.usages {
		chains, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{u}})
		if err != nil {
			return fmt.Sprintf("Secret %s: the certificate is not trusted by %s in Secret %s for %s", name, secretCAKey, trust.Name, usageName(u)), validity{}
		}
		for _, cert := range chains[0] {
			valid = valid.and(validity{from: cert.NotBefore, until: cert.NotAfter})
		}
	}
	if r.hosts {
		size := int(v1alpha1.DefaultSize)
		if c.Spec.Size != nil {
			size = int(*c.Spec.Size)
		}
		for ord := range max(size, 1) {
			if host := MemberHost(c, PodName(c.Name, ord), cfg.ClusterDomain); leaf.VerifyHostname(host) != nil {
				return fmt.Sprintf("Secret %s: the certificate does not name %s (a SAN *.%s covers every member)", name, host, strings.SplitN(host, ".", 2)[1]), validity{}
			}
		}
	}
	return "", valid
}

func usageName(u x509.ExtKeyUsage) string {
	if u == x509.ExtKeyUsageClientAuth {
		return "client auth"
	}
	return "server auth"
}

// validity is a span of time, from included to until excluded; the zero value holds never.
type validity struct{ from, until time.Time }

// forever is later than any certificate's NotAfter.
var forever = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

func (v validity) and(o validity) validity {
	if o.from.After(v.from) {
		v.from = o.from
	}
	if o.until.Before(v.until) {
		v.until = o.until
	}
	return v
}

// certInputs digests everything checkCertificates reads but the time: the names members are
// checked for, and the bytes of every Secret a role reads.
func certInputs(cfg Config, c *v1alpha1.EtcdCluster, byName map[string]*corev1.Secret) [sha256.Size]byte {
	h := sha256.New()
	size := int32(v1alpha1.DefaultSize)
	if c.Spec.Size != nil {
		size = *c.Spec.Size
	}
	fmt.Fprintf(h, "%q %q %q %d\n", cfg.ClusterDomain, c.Namespace, c.Name, size)
	for _, r := range certRoles(c) {
		fmt.Fprintf(h, "%q %q %v %t\n", r.secret, r.trustBy, r.usages, r.hosts)
		for _, name := range []string{r.secret, r.trustBy} {
			s := byName[name]
			if s == nil {
				fmt.Fprintf(h, "-\n")
				continue
			}
			for _, k := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey, secretCAKey} {
				fmt.Fprintf(h, "%d:", len(s.Data[k]))
				h.Write(s.Data[k])
			}
		}
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}
