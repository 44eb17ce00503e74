package harness

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	gosync "sync"

	"golang.org/x/net/dns/dnsmessage"
)

// DNS stands in for cluster DNS (CoreDNS): an authoritative UDP responder on 127.0.0.1 that
// answers A queries for the names the harness registers. Installing it replaces
// net.DefaultResolver, so both the hook's clientv3 and etcd's peer transport resolve
// <pod>.<svc>.<ns>.svc.<domain> exactly as they would in a pod. A name of several addresses
// answers them in a rotating order, query after query: a client Service's name stands for its
// virtual IP, behind which kube-proxy picks any ready pod for each new connection.
type DNS struct {
	conn *net.UDPConn

	mu      gosync.Mutex
	records map[string][]netip.Addr // lower-case FQDN with trailing dot
	turns   map[string]int          // queries answered, per name: where the rotation starts
}

// StartDNS listens on an ephemeral UDP port of 127.0.0.1 and serves until ctx ends.
func StartDNS(ctx context.Context) (*DNS, error) {
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	d := &DNS{conn: conn, records: map[string][]netip.Addr{}, turns: map[string]int{}}
	go func() {
		<-ctx.Done()
		conn.Close()
	}()
	go d.serve()
	return d, nil
}

// Install makes every lookup in this process go to d. Go's resolver reads /etc/hosts first
// (so "localhost" still works) and then asks d for everything else.
func (d *DNS) Install() {
	addr := d.conn.LocalAddr().String()
	net.DefaultResolver = &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "udp", addr)
		},
	}
}

// Set makes name resolve to addrs; no addrs removes the name.
func (d *DNS) Set(name string, addrs ...netip.Addr) {
	key := fqdn(name)
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(addrs) == 0 {
		delete(d.records, key)
		return
	}
	d.records[key] = append([]netip.Addr(nil), addrs...)
}

func fqdn(name string) string {
	name = strings.ToLower(name)
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	return name
}

func (d *DNS) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := d.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if resp, ok := d.answer(buf[:n]); ok {
			_, _ = d.conn.WriteToUDPAddrPort(resp, from)
		}
	}
}

// answer builds the reply to one query: A records for a known name, an empty NOERROR answer
// for other types of a known name (so AAAA lookups do not hide the A records), NXDOMAIN
// otherwise.
func (d *DNS) answer(query []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, false
	}
	name := strings.ToLower(q.Name.String())
	d.mu.Lock()
	addrs, known := d.records[name]
	if n := len(addrs); n > 1 && q.Type == dnsmessage.TypeA {
		first := d.turns[name] % n
		d.turns[name]++
		addrs = append(append([]netip.Addr(nil), addrs[first:]...), addrs[:first]...)
	}
	d.mu.Unlock()

	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RCode: dnsmessage.RCodeSuccess}
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(q) != nil || b.StartAnswers() != nil {
		return nil, false
	}
	if known && q.Type == dnsmessage.TypeA {
		for _, a := range addrs {
			rr := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 0}
			if b.AResource(rr, dnsmessage.AResource{A: a.As4()}) != nil {
				return nil, false
			}
		}
	}
	resp, err := b.Finish()
	return resp, err == nil
}
