package sync

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/test/testcert"
)

// testCA signs certificates for TestCertificateProblems.
type testCA struct{ *testcert.Cert }

func newTestCA(t testing.TB) testCA {
	t.Helper()
	ca, err := testcert.NewCA(1, "ca", simStart.Add(-time.Hour), simStart.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return testCA{ca}
}

// secret issues a kubernetes.io/tls Secret from ca; edit shapes the certificate.
func (ca testCA) secret(t testing.TB, name string, bundle []byte, edit func(*x509.Certificate)) corev1.Secret {
	t.Helper()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{"*.etcd.db.svc.cluster.local"}, NotBefore: simStart.Add(-time.Hour), NotAfter: simStart.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	if edit != nil {
		edit(tmpl)
	}
	c, err := testcert.Issue(tmpl, ca.Cert)
	if err != nil {
		t.Fatal(err)
	}
	s := corev1.Secret{Data: map[string][]byte{corev1.TLSCertKey: c.CertPEM, corev1.TLSPrivateKeyKey: c.KeyPEM, secretCAKey: bundle}}
	s.Name, s.Namespace = name, "db"
	return s
}

// certificateProblems is what the hook puts in Observed.CertProblems at now.
func certificateProblems(cfg Config, c *v1alpha1.EtcdCluster, secrets []corev1.Secret, now time.Time) map[string]string {
	problems, _, _ := newCertificateCheck(cfg, c, secrets).Run(now)
	return problems
}

// TestCertificateProblems: certificates members would reject are named, with the Secret and
// what is wrong and never a value; good ones are not.
func TestCertificateProblems(t *testing.T) {
	ca, other := newTestCA(t), newTestCA(t)
	c := &v1alpha1.EtcdCluster{}
	c.Name, c.Namespace, c.Spec.Size = "etcd", "db", ptrTo(int32(3))
	c.Spec.TLS = &v1alpha1.TLSSpec{ServerSecret: "srv", PeerSecret: "peer", ClientSecret: "cli"}
	good := func() []corev1.Secret {
		return []corev1.Secret{ca.secret(t, "srv", ca.CertPEM, nil), ca.secret(t, "peer", ca.CertPEM, nil), ca.secret(t, "cli", ca.CertPEM, func(x *x509.Certificate) { x.DNSNames = nil })}
	}
	if got := certificateProblems(simConfig, c, good(), simStart); len(got) != 0 {
		t.Fatalf("good certificates: %v", got)
	}
	both := append(append([]byte(nil), ca.CertPEM...), other.CertPEM...)
	for _, tc := range []struct {
		story  string
		secret corev1.Secret
		want   string
	}{
		{"peer certificate without client auth", ca.secret(t, "peer", ca.CertPEM, func(x *x509.Certificate) { x.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth} }), "peer: the certificate is not trusted by ca.crt in Secret peer for client auth"},
		{"server certificate from another CA", other.secret(t, "srv", ca.CertPEM, nil), "srv: the certificate is not trusted by ca.crt in Secret srv"},
		{"a bundle of both CAs trusts either", other.secret(t, "srv", both, nil), ""},
		{"a name for one member only", ca.secret(t, "peer", ca.CertPEM, func(x *x509.Certificate) { x.DNSNames = []string{"etcd-0.etcd.db.svc.cluster.local"} }), "peer: the certificate does not name etcd-1.etcd.db.svc.cluster.local"},
		{"expired", ca.secret(t, "peer", ca.CertPEM, func(x *x509.Certificate) { x.NotAfter = simStart.Add(-time.Minute) }), "peer: the certificate expired"},
		{"client certificate the server CA does not trust", other.secret(t, "cli", other.CertPEM, nil), "cli: the certificate is not trusted by ca.crt in Secret srv"},
		{"a key of another certificate", func() corev1.Secret {
			s := ca.secret(t, "peer", ca.CertPEM, nil)
			s.Data[corev1.TLSPrivateKeyKey] = ca.secret(t, "x", nil, nil).Data[corev1.TLSPrivateKeyKey]
			return s
		}(), "peer: tls.crt and tls.key are not a certificate and its key"},
		{"no CA bundle", ca.secret(t, "peer", []byte("not PEM"), nil), "peer: ca.crt holds no CA certificate"},
	} {
		secrets := good()
		for i := range secrets {
			if secrets[i].Name == tc.secret.Name {
				secrets[i] = tc.secret
			}
		}
		got := certificateProblems(simConfig, c, secrets, simStart)
		switch {
		case tc.want == "" && len(got) > 0:
			t.Errorf("%s: %v", tc.story, got)
		case tc.want != "" && !strings.Contains(got[tc.secret.Name], tc.want):
			t.Errorf("%s: %q, want %q", tc.story, got[tc.secret.Name], tc.want)
		}
		for _, p := range got {
			if strings.Contains(p, "BEGIN") || strings.Contains(p, string(tc.secret.Data[corev1.TLSPrivateKeyKey][30:60])) {
				t.Errorf("%s: a problem carries key material: %q", tc.story, p)
			}
		}
	}
}

// BenchmarkCertificateChecks: what the checks of a TLS cluster's three Secrets cost a sync,
// done every time (the hook's BenchmarkCertificateMemo: remembered).
func BenchmarkCertificateChecks(b *testing.B) {
	ca := newTestCA(b)
	c := &v1alpha1.EtcdCluster{}
	c.Name, c.Namespace, c.Spec.Size = "etcd", "db", ptrTo(int32(3))
	c.Spec.TLS = &v1alpha1.TLSSpec{ServerSecret: "srv", PeerSecret: "peer", ClientSecret: "cli"}
	secrets := []corev1.Secret{ca.secret(b, "srv", ca.CertPEM, nil), ca.secret(b, "peer", ca.CertPEM, nil), ca.secret(b, "cli", ca.CertPEM, nil)}
	b.Run("every-sync", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if len(certificateProblems(simConfig, c, secrets, simStart)) != 0 {
				b.Fatal("problems with good certificates")
			}
		}
	})
}
