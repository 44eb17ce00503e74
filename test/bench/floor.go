package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	gosync "sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The floor runs in a process of its own (`bench floor`), as the hook does, so that neither
// shares its cores' scheduling, its collector or its connections with the driver or the
// members. The driver writes the floorSpec as the first JSON value on its stdin, then one
// floorBlock per block; the floor answers each with a floorTimes on its stdout.

// floorSpec is the members the floor asks and, with TLS, the client certificate it presents.
// With Health it asks what the hook asks: each member's serializable read of the key
// "health" too, the hook's health read.
type floorSpec struct {
	Members []floorMember `json:"members"`
	Health  bool          `json:"health,omitempty"`
	CA      []byte        `json:"ca,omitempty"`
	Cert    []byte        `json:"cert,omitempty"`
	Key     []byte        `json:"key,omitempty"`
}

// floorMember is one member's client address and the name its server certificate carries.
type floorMember struct {
	Addr       string `json:"addr"`
	ServerName string `json:"serverName"`
}

// floorBlock asks for ops timed operations from clients workers after leadIn untimed ones.
type floorBlock struct {
	Clients int `json:"clients"`
	Ops     int `json:"ops"`
	LeadIn  int `json:"leadIn"`
}

// floorTimes is a block's timed latencies, every call it ran and how long it took.
type floorTimes struct {
	Lat     []time.Duration `json:"lat"`
	Calls   int             `json:"calls"`
	Elapsed time.Duration   `json:"elapsed"`
	Err     string          `json:"err,omitempty"`
}

// serveFloor is the floor process: it reads the spec and then blocks from in until in closes.
func serveFloor(in io.Reader, out io.Writer) error {
	dec, enc := json.NewDecoder(in), json.NewEncoder(out)
	var spec floorSpec
	if err := dec.Decode(&spec); err != nil {
		return fmt.Errorf("floor spec: %w", err)
	}
	f, err := newFloor(spec)
	if err != nil {
		return err
	}
	defer f.close()
	for {
		var b floorBlock
		if err := dec.Decode(&b); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		t := timings{leadIn: b.LeadIn}
		var ft floorTimes
		if err := t.load(b.Clients, b.Ops, func(int) error { return f.op() }); err != nil {
			ft.Err = err.Error()
		}
		ft.Lat, ft.Calls, ft.Elapsed = t.lat, t.calls, t.elapsed
		if err := enc.Encode(ft); err != nil {
			return err
		}
	}
}

// floorClient asks what an observation needs at the least, over its own warm connections:
// Status of every member and the linearizable member list from the leader, all at once;
// with health reads (floorSpec.Health), every call the hook makes.
type floorClient struct {
	members []*clientv3.Client
	// health reads each member's "health" key serializably, as the hook's health read does;
	// nil for the floor itself.
	health []pb.KVClient
	// status asks each member over its client's connection: clientv3's own Maintenance
	// dials a new connection for every Status, and the hook does not. The member list is
	// asked over the leader's connection the same way, as the hook asks both.
	status []pb.MaintenanceClient
	leader pb.ClusterClient
}

func newFloor(spec floorSpec) (*floorClient, error) {
	f := &floorClient{}
	for _, m := range spec.Members {
		cfg := clientv3.Config{Endpoints: []string{"http://" + m.Addr}, Logger: zap.NewNop(), DialTimeout: 5 * time.Second}
		if len(spec.CA) > 0 {
			tc, err := floorTLS(spec, m.ServerName)
			if err != nil {
				return nil, err
			}
			cfg.Endpoints, cfg.TLS = []string{"https://" + m.Addr}, tc
		}
		cli, err := clientv3.New(cfg)
		if err != nil {
			f.close()
			return nil, err
		}
		f.members = append(f.members, cli)
		f.status = append(f.status, pb.NewMaintenanceClient(cli.ActiveConnection()))
		if spec.Health {
			f.health = append(f.health, pb.NewKVClient(cli.ActiveConnection()))
		}
	}
	// The hook asks the member that led at its last observation, which answers a
	// linearizable read without forwarding it; so does the floor.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, cli := range f.members {
		st, err := f.status[i].Status(ctx, &pb.StatusRequest{})
		if err != nil {
			f.close()
			return nil, fmt.Errorf("floor: status of %s: %w", cli.Endpoints()[0], err)
		}
		if st.Header.MemberId == st.Leader {
			f.leader = pb.NewClusterClient(cli.ActiveConnection())
		}
	}
	if f.leader == nil {
		f.close()
		return nil, errors.New("floor: no member leads")
	}
	return f, nil
}

// floorTLS is the hook's TLS to a member: the cluster's CA, its client certificate, and the
// member's DNS name verified, as the hook verifies it, while the address dialled is an IP.
func floorTLS(spec floorSpec, serverName string) (*tls.Config, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(spec.CA) {
		return nil, errors.New("floor: no CA certificate")
	}
	cert, err := tls.X509KeyPair(spec.Cert, spec.Key)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		Certificates:       []tls.Certificate{cert},
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("floor: no server certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, DNSName: serverName})
			return err
		},
	}, nil
}

func (f *floorClient) op() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errs := make([]error, 2*len(f.members)+1)
	var wg gosync.WaitGroup
	for i, m := range f.status {
		wg.Go(func() { _, errs[i] = m.Status(ctx, &pb.StatusRequest{}) })
	}
	for i, kv := range f.health {
		wg.Go(func() {
			_, errs[len(f.members)+1+i] = kv.Range(ctx, &pb.RangeRequest{Key: []byte("health"), Serializable: true})
		})
	}
	wg.Go(func() { _, errs[len(f.members)] = f.leader.MemberList(ctx, &pb.MemberListRequest{Linearizable: true}) })
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	return nil
}

func (f *floorClient) close() {
	for _, c := range f.members {
		c.Close()
	}
}

// floorProcess is the driver's end of a floor process.
type floorProcess struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	enc *json.Encoder
	dec *json.Decoder
}

func startFloor(spec floorSpec) (*floorProcess, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "floor")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &floorProcess{cmd: cmd, in: in, enc: json.NewEncoder(in), dec: json.NewDecoder(out)}
	if err := p.enc.Encode(spec); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// load runs a block of ops floor operations from clients workers in the floor process and
// adds its timings to t, as timings.load does for a block run here.
func (p *floorProcess) load(t *timings, clients, ops int) error {
	cpu0 := procCPU(p.cmd.Process.Pid)
	if err := p.enc.Encode(floorBlock{Clients: clients, Ops: ops, LeadIn: t.leadIn}); err != nil {
		return err
	}
	var ft floorTimes
	if err := p.dec.Decode(&ft); err != nil {
		return fmt.Errorf("floor process: %w", err)
	}
	t.cpu += procCPU(p.cmd.Process.Pid) - cpu0
	if ft.Err != "" {
		return errors.New(ft.Err)
	}
	t.add(ft.Lat, ft.Calls, ft.Elapsed)
	return nil
}

func (p *floorProcess) stop() {
	p.in.Close()
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
	}
}

// memberAddrs are the floor's members of a steady cluster: each pod's client address and,
// for TLS, the name under the headless Service its certificate covers.
func memberAddrs(sc *steadyCluster) []floorMember {
	var out []floorMember
	for _, p := range sc.env.Pods() {
		out = append(out, floorMember{
			Addr:       net.JoinHostPort(p.Status.PodIP, "2379"),
			ServerName: fmt.Sprintf("%s.%s.%s.svc.%s", p.Name, sc.env.Cluster, sc.env.Namespace, sc.env.Domain),
		})
	}
	return out
}
