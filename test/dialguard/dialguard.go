// Package dialguard keeps tests on the machine. Its dialer connects only to 127.0.0.0/8: any
// other address, whether given as an IP or reached through DNS, is refused before a packet is
// sent, and reported. Tests that start a hook install it as the hook's etcd dialer.
package dialguard

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"
)

// Dialer returns a dialer that calls report with every address outside 127.0.0.0/8 it was
// asked to connect to, and refuses it.
func Dialer(report func(addr string)) func(ctx context.Context, addr string) (net.Conn, error) {
	d := &net.Dialer{
		// Control sees the resolved address of each attempt, so a DNS name that resolves off
		// the machine is caught too.
		Control: func(_, address string, _ syscall.RawConn) error {
			if !Loopback(address) {
				report(address)
				return fmt.Errorf("dialguard: %s is outside 127.0.0.0/8", address)
			}
			return nil
		},
	}
	return func(ctx context.Context, addr string) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", addr)
	}
}

// ForTest is Dialer reporting to t: a dial off the machine fails the test.
func ForTest(t testing.TB) func(ctx context.Context, addr string) (net.Conn, error) {
	return Dialer(func(addr string) { t.Errorf("dialled %s, outside 127.0.0.0/8", addr) })
}

// Loopback reports whether host:port (or a bare host) is an IPv4 address in 127.0.0.0/8.
func Loopback(address string) bool {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		host = address
	}
	ip := net.ParseIP(host).To4()
	return ip != nil && ip[0] == 127
}
