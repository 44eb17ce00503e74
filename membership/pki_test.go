package membership

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"

	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/test/testcert"
)

// testPKI is a CA made for one test, its client certificate, and server certificates on
// demand. Server certificates carry only the member's DNS name, so a client that dials the
// IP address passes verification only by using the endpoint's server name. They also name
// localhost, the host the members advertise, for the member tool's operations.
type testPKI struct {
	dir       string
	ca        *testcert.Cert
	caPEM     []byte
	clientTLS *etcdstate.TLS
}

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	ca, err := testcert.NewCA(1, "etcdops test CA", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{dir: t.TempDir(), ca: ca, caPEM: ca.CertPEM}
	cert, key := p.issue(t, "etcdops-client", nil, x509.ExtKeyUsageClientAuth)
	p.clientTLS = &etcdstate.TLS{CA: p.caPEM, Cert: cert, Key: key}
	return p
}

// issue signs a certificate for cn with the given DNS names; PEM certificate and key.
func (p *testPKI) issue(t testing.TB, cn string, dnsNames []string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	c, err := testcert.Issue(&x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		DNSNames:     dnsNames,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}, p.ca)
	if err != nil {
		t.Fatal(err)
	}
	return c.CertPEM, c.KeyPEM
}

// serverInfo writes member's server certificate and returns etcd's client TLS settings,
// which require a client certificate signed by the CA.
func (p *testPKI) serverInfo(t testing.TB, member string) transport.TLSInfo {
	t.Helper()
	cert, key := p.issue(t, member, []string{member + ".etcd.test", "localhost"}, x509.ExtKeyUsageServerAuth)
	info := transport.TLSInfo{
		CertFile:       filepath.Join(p.dir, member+".crt"),
		KeyFile:        filepath.Join(p.dir, member+".key"),
		TrustedCAFile:  filepath.Join(p.dir, "ca.crt"),
		ClientCertAuth: true,
	}
	for path, data := range map[string][]byte{info.CertFile: cert, info.KeyFile: key, info.TrustedCAFile: p.caPEM} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return info
}
