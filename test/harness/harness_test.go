package harness

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func TestDNSAnswersRegisteredNames(t *testing.T) {
	dns, err := ClusterDNS()
	if err != nil {
		t.Fatal(err)
	}
	dns.Set("a-0.a.ns.svc.cluster.local", netip.MustParseAddr("127.0.9.9"))
	defer dns.Set("a-0.a.ns.svc.cluster.local")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, "a-0.a.ns.svc.cluster.local")
	if err != nil || len(addrs) != 1 || addrs[0] != "127.0.9.9" {
		t.Fatalf("lookup = %v, %v; want [127.0.9.9]", addrs, err)
	}
	if _, err := net.DefaultResolver.LookupHost(ctx, "a-1.a.ns.svc.cluster.local"); err == nil {
		t.Fatal("an unknown name resolved")
	}
}

func TestEtcdConfigRejectsUnknownFlags(t *testing.T) {
	for _, args := range [][]string{{"--no-such-flag=1"}, {"--name=x", "stray"}} {
		if _, err := etcdConfig(args, "127.0.0.2"); err == nil {
			t.Errorf("etcdConfig(%q) accepted it", args)
		}
	}
}

// An etcd member started from a pod's command line, advertising its DNS name, serves a client
// that dials that name.
func TestEtcdFromCommandLineOnItsOwnAddress(t *testing.T) {
	dns, err := ClusterDNS()
	if err != nil {
		t.Fatal(err)
	}
	const host = "solo-0.solo.unit.svc.cluster.local"
	ip := "127.0.250.7"
	dns.Set(host, netip.MustParseAddr(ip))
	defer dns.Set(host)
	peer := "http://" + host + ":2380"
	p, err := startEtcd([]string{
		"--name=solo-0", "--data-dir=" + t.TempDir(),
		"--listen-peer-urls=http://0.0.0.0:2380", "--listen-client-urls=http://0.0.0.0:2379",
		"--initial-advertise-peer-urls=" + peer, "--advertise-client-urls=http://" + host + ":2379",
		"--initial-cluster=solo-0=" + peer, "--initial-cluster-state=new", "--initial-cluster-token=t",
	}, ip, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	select {
	case <-p.e.Server.ReadyNotify():
	case <-time.After(10 * time.Second):
		t.Fatal("member not ready")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + host + ":2379"}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	p.Kill()
	if !p.Exited() {
		t.Fatal("killed member still runs")
	}
}
