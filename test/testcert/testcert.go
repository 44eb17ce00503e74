// Package testcert issues certificates for tests: ECDSA P-256 keys, a self-signed CA, and
// leaves signed from a template the caller shapes (names, usages, validity; a broken one
// too). Only tests and the test harness import it.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"time"
)

// Cert is a certificate and its private key, parsed and in PEM.
type Cert struct {
	X509    *x509.Certificate
	Key     *ecdsa.PrivateKey
	CertPEM []byte
	KeyPEM  []byte // SEC 1 ("EC PRIVATE KEY")
}

// NewCA makes a self-signed CA named cn, valid from notBefore to notAfter.
func NewCA(serial int64, cn string, notBefore, notAfter time.Time) (*Cert, error) {
	return Issue(&x509.Certificate{
		SerialNumber:          big.NewInt(serial),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}, nil)
}

// Issue signs tmpl for a new key with issuer's key, or with the new key itself if issuer is
// nil.
func Issue(tmpl *x509.Certificate, issuer *Cert) (*Cert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	parent, signer := tmpl, key
	if issuer != nil {
		parent, signer = issuer.X509, issuer.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &Cert{
		X509:    cert,
		Key:     key,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}),
	}, nil
}
