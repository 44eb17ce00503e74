package hooks

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/testcert"
)

var (
	certConfig = sync.Config{ClusterDomain: "cluster.local"}
	certStart  = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
)

// issueSecret issues a kubernetes.io/tls Secret in namespace db from ca, trusting ca; edit
// shapes the certificate.
func issueSecret(t testing.TB, ca *testcert.Cert, name string, edit func(*x509.Certificate)) corev1.Secret {
	t.Helper()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{"*.etcd.db.svc.cluster.local"}, NotBefore: certStart.Add(-time.Hour), NotAfter: certStart.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	if edit != nil {
		edit(tmpl)
	}
	c, err := testcert.Issue(tmpl, ca)
	if err != nil {
		t.Fatal(err)
	}
	s := corev1.Secret{Data: map[string][]byte{corev1.TLSCertKey: c.CertPEM, corev1.TLSPrivateKeyKey: c.KeyPEM, secretCAKey: ca.CertPEM}}
	s.Name, s.Namespace = name, "db"
	return s
}

func newCA(t testing.TB) *testcert.Cert {
	t.Helper()
	ca, err := testcert.NewCA(1, "ca", certStart.Add(-time.Hour), certStart.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// checked is the certificate problems of c's Secrets at now, as the hook observes them.
func checked(m *certMemo, c *v1alpha1.EtcdCluster, secrets []corev1.Secret, now time.Time) map[string]string {
	return m.problems(c.Namespace+"/"+c.Name, sync.Need(certConfig, c, sync.Children{}, nil, secrets).Certificates, now)
}

// TestCertificateMemo: the remembered answer is the one the check gives, and it is given again
// only while the Secrets' bytes, the members' names and the certificates' validity stay as
// they were.
func TestCertificateMemo(t *testing.T) {
	ca := newCA(t)
	c := &v1alpha1.EtcdCluster{}
	size := int32(3)
	c.Name, c.Namespace, c.Spec.Size = "etcd", "db", &size
	c.Spec.TLS = &v1alpha1.TLSSpec{ServerSecret: "srv", PeerSecret: "peer"}
	// The peer certificate outlives the server's by a minute, the CA both; the server
	// certificate names three members.
	secrets := []corev1.Secret{
		issueSecret(t, ca, "srv", func(x *x509.Certificate) {
			x.NotAfter = certStart.Add(30 * time.Minute)
			x.DNSNames = []string{"etcd-0.etcd.db.svc.cluster.local", "etcd-1.etcd.db.svc.cluster.local", "etcd-2.etcd.db.svc.cluster.local"}
		}),
		issueSecret(t, ca, "peer", func(x *x509.Certificate) { x.NotAfter = certStart.Add(31 * time.Minute) }),
	}
	var m certMemo
	fresh := func(c *v1alpha1.EtcdCluster, secrets []corev1.Secret) map[string]string {
		return checked(&certMemo{}, c, secrets, certStart)
	}
	same := func(a, b map[string]string) bool { return reflect.ValueOf(a).Pointer() == reflect.ValueOf(b).Pointer() }

	first := checked(&m, c, secrets, certStart)
	if len(first) != 0 {
		t.Fatalf("good certificates: %v", first)
	}
	if again := checked(&m, c, secrets, certStart.Add(29*time.Minute)); !same(first, again) {
		t.Error("the answer was not kept for the same Secrets within their validity")
	}
	if got := checked(&m, c, secrets, certStart.Add(30*time.Minute+time.Second)); !strings.Contains(got["srv"], "expired") {
		t.Errorf("past the server certificate's NotAfter: %v, want it expired", got)
	}

	grown := *c
	five := int32(5)
	grown.Spec.Size = &five
	named := issueSecret(t, ca, "srv", func(x *x509.Certificate) { x.DNSNames = []string{"etcd-0.etcd.db.svc.cluster.local"} })
	for _, tc := range []struct {
		story   string
		c       *v1alpha1.EtcdCluster
		secrets []corev1.Secret
	}{
		{"the server Secret replaced", c, []corev1.Secret{named, secrets[1]}},
		{"the cluster grown", &grown, secrets},
		{"the CA bundle emptied", c, []corev1.Secret{secrets[0], func() corev1.Secret {
			s := *secrets[1].DeepCopy()
			s.Data[secretCAKey] = []byte("not PEM")
			return s
		}()}},
	} {
		checked(&m, c, secrets, certStart)
		got, want := checked(&m, tc.c, tc.secrets, certStart), fresh(tc.c, tc.secrets)
		if len(want) == 0 || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %v, want %v", tc.story, got, want)
		}
	}
	bad := []corev1.Secret{named, secrets[1]}
	if a, b := checked(&m, c, bad, certStart), checked(&m, c, bad, certStart); len(a) == 0 || same(a, b) {
		t.Errorf("a problem is looked at again on every sync: %v then %v", a, b)
	}
}

// BenchmarkCertificateMemo: what the checks of a TLS cluster's three Secrets cost a sync when
// remembered (sync's BenchmarkCertificateChecks: done every time).
func BenchmarkCertificateMemo(b *testing.B) {
	ca := newCA(b)
	c := &v1alpha1.EtcdCluster{}
	size := int32(3)
	c.Name, c.Namespace, c.Spec.Size = "etcd", "db", &size
	c.Spec.TLS = &v1alpha1.TLSSpec{ServerSecret: "srv", PeerSecret: "peer", ClientSecret: "cli"}
	secrets := []corev1.Secret{issueSecret(b, ca, "srv", nil), issueSecret(b, ca, "peer", nil), issueSecret(b, ca, "cli", nil)}
	var m certMemo
	b.ReportAllocs()
	for b.Loop() {
		if len(checked(&m, c, secrets, certStart)) != 0 {
			b.Fatal("problems with good certificates")
		}
	}
}
