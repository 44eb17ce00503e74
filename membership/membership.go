// Package membership is the only place that talks to etcd. It observes a cluster in one
// parallel, read-only round under one deadline, with cached clients (Observer), and performs
// what the member tool runs (Operator): the idempotent membership changes (AddLearner,
// Promote, Remove, MoveLeader, UpdatePeerURL), maintenance (Compact, Defragment, Disarm) and
// the snapshot read of a backup. Each change checks live state first, so running it again
// after success, or after a crash half-way, does no harm.
package membership

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"etcdops.dev/etcdops/etcdstate"
)

// DefaultClientPort is dialled when an endpoint falls back to a DNS name without a port.
const DefaultClientPort = "2379"

// Errors of membership operations. Callers tell them apart with errors.Is: a retryable error
// means "try again later, nothing is wrong"; a refusal means the change is unsafe or does not
// fit the live state, and repeating it will not help until the state changes.
var (
	ErrRetryable = errors.New("retryable")
	ErrRefused   = errors.New("refused")
)

// retryable wraps err so that errors.Is(err, ErrRetryable) holds.
func retryable(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrRetryable}, args...)...)
}

// refused wraps err so that errors.Is(err, ErrRefused) holds.
func refused(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrRefused}, args...)...)
}

// isEtcdError compares by description: the client hands back either gRPC statuses or
// rpctypes values for the same server error.
func isEtcdError(err, target error) bool {
	return err != nil && rpctypes.ErrorDesc(err) == rpctypes.ErrorDesc(target)
}

// tlsConfig builds a client TLS configuration from t. The name the server's certificate must
// carry is the one its address is dialled for (resolver.Address.ServerName in the observer's
// channels, the endpoint URL's host for an Operator); gRPC sets it per connection.
func tlsConfig(t *etcdstate.TLS) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if len(t.CA) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(t.CA) {
			return nil, errors.New("tls: no CA certificate in PEM")
		}
		cfg.RootCAs = pool
	}
	if len(t.Cert) > 0 || len(t.Key) > 0 {
		cert, err := tls.X509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("tls: client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// dialTarget is the host:port to dial for ep and the name its certificate must carry.
func dialTarget(ep etcdstate.Endpoint) (addr, serverName string) {
	serverName = ep.ServerName
	if host, _, err := net.SplitHostPort(serverName); err == nil {
		serverName = host
	}
	switch {
	case ep.Address != "":
		return ep.Address, serverName
	case serverName != ep.ServerName:
		return ep.ServerName, serverName
	default:
		return net.JoinHostPort(serverName, DefaultClientPort), serverName
	}
}
