package sync

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// CertificateProblems checks the certificates in the cluster's TLS Secrets before members
// rely on them, and says what is wrong with each Secret that has a problem: members that
// reject each other's certificates lose quorum, and etcd says why only in its logs. Checked:
// the key matches the certificate; the certificate is valid now, chains to the CA bundle the
// members trust for it, and has the usages its port needs; server and peer certificates name
// every member's DNS name. A problem names the Secret and the field, never a value, so it
// may go to status and logs. The hook computes it; the planner sees only these strings.
func CertificateProblems(cfg Config, c *v1alpha1.EtcdCluster, secrets []corev1.Secret, now time.Time) map[string]string {
	out := map[string]string{}
	byName := map[string]*corev1.Secret{}
	for i := range secrets {
		if s := &secrets[i]; s.Namespace == c.Namespace || s.Namespace == "" {
			byName[s.Name] = s
		}
	}
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
	for _, r := range roles {
		s, trust := byName[r.secret], byName[r.trustBy]
		if s == nil || trust == nil {
			continue // a missing Secret is reported by the planner (TLSSecretMissing)
		}
		if p := certificateProblem(cfg, c, s, trust, r, now); p != "" {
			out[r.secret] = p
		}
	}
	return out
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

func certificateProblem(cfg Config, c *v1alpha1.EtcdCluster, s, trust *corev1.Secret, r certRole, now time.Time) string {
	name := s.Name
	pair, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return fmt.Sprintf("Secret %s: %s and %s are not a certificate and its key", name, corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return fmt.Sprintf("Secret %s: %s does not parse", name, corev1.TLSCertKey)
	}
	switch {
	case now.Before(leaf.NotBefore):
		return fmt.Sprintf("Secret %s: the certificate is valid only from %s", name, leaf.NotBefore.UTC().Format(time.RFC3339))
	case now.After(leaf.NotAfter):
		return fmt.Sprintf("Secret %s: the certificate expired at %s", name, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(trust.Data[secretCAKey]) {
		return fmt.Sprintf("Secret %s: %s holds no CA certificate", trust.Name, secretCAKey)
	}
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		if ic, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(ic)
		}
	}
	for _, u := range r.usages {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			return fmt.Sprintf("Secret %s: the certificate is not trusted by %s in Secret %s for %s", name, secretCAKey, trust.Name, usageName(u))
		}
	}
	if r.hosts {
		size := int(v1alpha1.DefaultSize)
		if c.Spec.Size != nil {
			size = int(*c.Spec.Size)
		}
		for ord := range max(size, 1) {
			if host := MemberHost(c, PodName(c.Name, ord), cfg.ClusterDomain); leaf.VerifyHostname(host) != nil {
				return fmt.Sprintf("Secret %s: the certificate does not name %s (a SAN *.%s covers every member)", name, host, strings.SplitN(host, ".", 2)[1])
			}
		}
	}
	return ""
}

func usageName(u x509.ExtKeyUsage) string {
	if u == x509.ExtKeyUsageClientAuth {
		return "client auth"
	}
	return "server auth"
}
