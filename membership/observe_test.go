package membership

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"

	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/test/dialguard"
)

// newTestObserver waits for slow members longer than the default: a loaded test machine
// can stall one member's answer past 250ms, and these tests are not about that wait.
func newTestObserver(t testing.TB) *Observer {
	o := NewObserver(ObserverOptions{Deadline: testDeadline, SlowMember: testDeadline / 4, Dial: dialguard.ForTest(t)})
	t.Cleanup(o.Close)
	return o
}

// observeTimed observes and fails the test if the deadline was not kept.
func observeTimed(t *testing.T, o *Observer, req etcdstate.Request) etcdstate.Snapshot {
	t.Helper()
	start := time.Now()
	snap := o.Observe(context.Background(), req)
	if took := time.Since(start); took > testDeadline+500*time.Millisecond {
		t.Fatalf("observe took %v, deadline %v", took, testDeadline)
	}
	return snap
}

func TestObserveHealthyCluster(t *testing.T) {
	for _, n := range []int{1, 3} {
		c := newTestCluster(t, n, nil)
		leader := c.leader()
		snap := observeTimed(t, newTestObserver(t), c.request())
		if !snap.Asked || !snap.Complete || snap.Inconsistent != "" || snap.Err != "" {
			t.Fatalf("%d members: want a complete consistent snapshot, got %+v", n, snap)
		}
		if len(snap.Members) != n {
			t.Fatalf("%d members: got %d", n, len(snap.Members))
		}
		for _, m := range snap.Members {
			if !m.Reachable || !m.Healthy || m.IsLearner || m.Version == "" || m.RaftTerm == 0 {
				t.Errorf("%d members: member %+v not a healthy reachable voter", n, m)
			}
		}
		if l, ok := snap.Leader(); !ok || l.Name != leader.name || l.ID != leader.id() {
			t.Errorf("%d members: leader %+v, want %s", n, l, leader.name)
		}
	}
}

func TestObserveOneMemberDown(t *testing.T) {
	slowTest(t)
	c := newTestCluster(t, 3, nil)
	leader := c.leader()
	var down *testMember
	for _, m := range c.members {
		if m != leader {
			down = m
		}
	}
	downID := down.id()
	c.stop(down)

	snap := observeTimed(t, newTestObserver(t), c.request())
	if !snap.Asked || snap.Complete || snap.Inconsistent != "" {
		t.Fatalf("want an asked, partial, consistent snapshot; got %+v", snap)
	}
	if l, ok := snap.Leader(); !ok || l.ID != leader.id() {
		t.Errorf("leader %+v, want %s", l, leader.name)
	}
	for _, m := range snap.Members {
		if wantUp := m.ID != downID; m.Reachable != wantUp || m.Healthy != wantUp {
			t.Errorf("member %s: reachable %v healthy %v, want %v", m.Name, m.Reachable, m.Healthy, wantUp)
		}
		if m.ID == downID && len(m.Errors) == 0 {
			t.Errorf("down member %s: no error says why", m.Name)
		}
	}
}

func TestObserveQuorumLost(t *testing.T) {
	slowTest(t)
	c := newTestCluster(t, 3, nil)
	survivor := c.members[0]
	c.stop(c.members[1])
	c.stop(c.members[2])
	// Let the survivor notice it lost its peers, as it would have long before a resync.
	time.Sleep(3 * testElectionMs * time.Millisecond)

	o := newTestObserver(t)
	req := c.request()
	snap := observeTimed(t, o, req)
	if _, ok := snap.Leader(); ok || snap.Complete || snap.Err == "" {
		t.Fatalf("want no leader, incomplete, and a reason; got %+v", snap)
	}
	// The survivor answered; only the linearizable member list asked of it could not be
	// served. That is the cluster's state, not a hung endpoint to back off from.
	clients, err := o.cache.acquire(req, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer o.cache.release(clients, time.Now())
	if _, off := clients.members[0].backingOff(time.Now()); off {
		t.Errorf("the survivor's endpoint backs off after a member list that could not be linearizable")
	}
	if snap.Asked {
		// The member list came from the survivor's own view, and says whom it could not reach.
		if len(snap.Members) != 3 || len(snap.Voters()) != 3 {
			t.Fatalf("want the three voters of the survivor's list, got %+v", snap.Members)
		}
		for _, m := range snap.Members {
			if m.Reachable != (m.Name == survivor.name) || m.Healthy {
				t.Errorf("member %+v: only %s should answer, and none is healthy without a leader", m, survivor.name)
			}
		}
	}
}

func TestObserveEveryMemberDown(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	o := newTestObserver(t)
	if snap := observeTimed(t, o, c.request()); !snap.Complete {
		t.Fatalf("before the outage: %+v", snap)
	}
	c.stopAll()
	// Twice: once with the cached clients of the healthy cluster, once on their retries.
	for range 2 {
		snap := observeTimed(t, o, c.request())
		if snap.Asked || snap.Err == "" || len(snap.Members) != 0 {
			t.Fatalf("want not asked with a reason; got %+v", snap)
		}
	}
}

func TestObserveLearnerEndpointFirst(t *testing.T) {
	c := newTestCluster(t, 1, nil)
	op := dialTest(t, c, c.members[0])
	learner := c.newMember("m-1")
	id := joinLearner(t, c, op, learner)

	// The learner answers Status but rejects the member list; the voter must be asked.
	snap := observeTimed(t, newTestObserver(t), c.request(learner, c.members[0]))
	if !snap.Asked || !snap.Complete || snap.Inconsistent != "" {
		t.Fatalf("want a complete snapshot; got %+v", snap)
	}
	if ls := snap.Learners(); len(ls) != 1 || ls[0].ID != id || !ls[0].Reachable || ls[0].Name != learner.name {
		t.Fatalf("learners %+v, want reachable %s", ls, learner.name)
	}
}

func TestObserveUnstartedMember(t *testing.T) {
	c := newTestCluster(t, 1, nil)
	op := dialTest(t, c, c.members[0])
	pending := c.newMember("m-1")
	if _, _, err := op.AddLearner(opContext(t), pending.name, pending.peerURL.String()); err != nil {
		t.Fatal(err)
	}
	snap := observeTimed(t, newTestObserver(t), c.request(c.members...))
	if !snap.Asked || snap.Complete {
		t.Fatalf("want asked and incomplete; got %+v", snap)
	}
	ls := snap.Learners()
	if len(ls) != 1 || ls[0].Started() || ls[0].Reachable || ls[0].PeerURLs[0] != pending.peerURL.String() {
		t.Fatalf("want the unstarted learner by its peer URL; got %+v", ls)
	}
}

func TestObserveMixedClustersIsInconsistent(t *testing.T) {
	a := newTestCluster(t, 1, nil)
	b := newTestCluster(t, 1, nil)
	req := a.request()
	stray := b.endpoint(b.members[0])
	stray.Member = "m-1"
	req.Endpoints = append(req.Endpoints, stray)

	snap := observeTimed(t, newTestObserver(t), req)
	if snap.Inconsistent == "" {
		t.Fatalf("an endpoint of another cluster must make the snapshot inconsistent; got %+v", snap)
	}
}

func TestObserveTLS(t *testing.T) {
	pki := newTestPKI(t)
	c := newTestCluster(t, 3, pki)
	o := newTestObserver(t)

	snap := observeTimed(t, o, c.request())
	if !snap.Asked || !snap.Complete || snap.Inconsistent != "" {
		t.Fatalf("want a complete snapshot over TLS; got %+v", snap)
	}

	noClientCert := c.request()
	noClientCert.TLS = &etcdstate.TLS{CA: pki.caPEM}
	if snap := observeTimed(t, o, noClientCert); snap.Asked {
		t.Fatalf("the cluster demands a client certificate; got %+v", snap)
	}

	wrongName := c.request()
	for i := range wrongName.Endpoints {
		wrongName.Endpoints[i].ServerName = "elsewhere.etcd.test"
	}
	if snap := observeTimed(t, o, wrongName); snap.Asked {
		t.Fatalf("server certificates do not name elsewhere.etcd.test; got %+v", snap)
	}

	// Each endpoint is asked over the scheme it is flagged with: plain HTTP to a member that
	// serves only TLS gets no answer, and TLS without material verifies against the system's
	// roots, which do not hold this CA; the other members still answer.
	mixed := c.request()
	mixed.Endpoints[2].TLS = false
	if snap := observeTimed(t, o, mixed); !snap.Asked || snap.Complete || !strings.Contains(snap.Err+fmt.Sprint(snap.Members), c.members[2].name) {
		t.Fatalf("a member asked over http must be the one not answering; got %+v", snap)
	}
	noMaterial := c.request()
	noMaterial.TLS = nil
	if snap := observeTimed(t, o, noMaterial); snap.Asked {
		t.Fatalf("a member asked over TLS without the CA must not be trusted; got %+v", snap)
	}

	// The member tool dials the advertised URLs with the same client certificate.
	op := dialTest(t, c, c.members[0])
	leader := c.leader()
	var target *testMember
	for _, m := range c.members {
		if m != leader {
			target = m
		}
	}
	out, err := op.MoveLeader(opContext(t), target.name, target.id())
	wantOutcome(t, "move leader over TLS", out, err, Done)
}

// silentEndpoint accepts connections and never answers, like a member that hangs.
func silentEndpoint(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { conn.Close() })
		}
	}()
	return l.Addr().String()
}

func TestObserveHungMemberKeepsDeadline(t *testing.T) {
	c := newTestCluster(t, 1, nil)
	req := c.request()
	req.Endpoints = append(req.Endpoints, etcdstate.Endpoint{Member: "m-1", Address: silentEndpoint(t), ServerName: "m-1.etcd.test"})
	o := NewObserver(ObserverOptions{Deadline: time.Second})
	defer o.Close()

	start := time.Now()
	snap := o.Observe(context.Background(), req)
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Fatalf("observe took %v with a deadline of 1s", took)
	}
	if !snap.Asked || !snap.Complete || !strings.Contains(snap.Err, "m-1") {
		t.Fatalf("want the one member asked and the hung endpoint named; got %+v", snap)
	}
}

func TestObserveHungMemberAmongAnsweringOnes(t *testing.T) {
	slowTest(t)
	c := newTestCluster(t, 3, nil)
	c.leader()
	hung := c.members[2]
	req := c.request()
	// The pod of m-2 accepts connections and never answers: a hung process.
	req.Endpoints[2].Address = silentEndpoint(t)
	// With this deadline, waiting for the hung member as long as the deadline allows takes
	// 10s; the slow-member wait ends the round 300ms after the first answer.
	o := NewObserver(ObserverOptions{Deadline: 20 * time.Second, SlowMember: 300 * time.Millisecond, Dial: dialguard.ForTest(t)})
	defer o.Close()

	check := func(which, wantErr string) {
		t.Helper()
		start := time.Now()
		snap := o.Observe(context.Background(), req)
		took := time.Since(start)
		if !snap.Asked || snap.Complete || snap.Inconsistent != "" || len(snap.Members) != 3 {
			t.Fatalf("%s: want the member list with one member unknown; got %+v", which, snap)
		}
		if took > 5*time.Second {
			t.Errorf("%s: took %s, as if the hung member were waited for until the deadline", which, took)
		}
		for _, m := range snap.Members {
			if m.Name == hung.name {
				if m.Reachable || len(m.Errors) == 0 || !strings.Contains(m.Errors[0], wantErr) {
					t.Errorf("%s: hung member %+v, want unreachable with %q", which, m, wantErr)
				}
			} else if !m.Reachable || !m.Healthy {
				t.Errorf("%s: member %+v should have answered", which, m)
			}
		}
	}
	check("first observation", "no answer within 300ms of the first member's")
	// Right after, the member is backing off: asked, but not waited for at all.
	check("second observation", "not waited for after 1 observations without an answer")
}

// TestObserveSlowHealthReadIsUnknown: a member whose Status answers but whose health read the
// round stops waiting for is unknown for that observation, not unhealthy: the hook's own wait
// is no evidence from etcd, and an unhealthy voter is replaced after the grace period. The
// members are real; the slow read is the one fake, the member's client wrapped so that its
// reads wait, because no etcd setting slows serializable reads and not Status.
func TestObserveSlowHealthReadIsUnknown(t *testing.T) {
	slowTest(t)
	c := newTestCluster(t, 3, nil)
	c.leader()
	slow := c.members[2]
	req := c.request()
	o := NewObserver(ObserverOptions{Deadline: 20 * time.Second, SlowMember: 300 * time.Millisecond, Dial: dialguard.ForTest(t)})
	defer o.Close()
	if snap := o.Observe(context.Background(), req); !snap.Complete {
		t.Fatalf("before: want every member answering; got %+v", snap)
	}
	release := make(chan struct{})
	defer close(release)
	o.cache.mu.Lock()
	for _, e := range o.cache.entries {
		for _, m := range e.members {
			if m.endpoint.Member == slow.name {
				m.kv = heldReads{KVClient: m.kv, release: release}
			}
		}
	}
	o.cache.mu.Unlock()
	snap := o.Observe(context.Background(), req)
	if !snap.Asked || snap.Complete || snap.Inconsistent != "" || len(snap.Members) != 3 {
		t.Fatalf("want the member list with one member unknown; got %+v", snap)
	}
	for _, m := range snap.Members {
		switch {
		case m.Name == slow.name && (m.Reachable || len(m.Errors) == 0 || !strings.Contains(m.Errors[0], "health read")):
			t.Errorf("member whose health read was not waited for: %+v, want unknown (not reachable), the health read named", m)
		case m.Name != slow.name && (!m.Reachable || !m.Healthy):
			t.Errorf("member %+v should have answered", m)
		}
	}
}

// heldReads is a member's KV whose reads wait until release is closed or their context ends.
type heldReads struct {
	pb.KVClient
	release chan struct{}
}

func (h heldReads) Range(ctx context.Context, req *pb.RangeRequest, opts ...grpc.CallOption) (*pb.RangeResponse, error) {
	select {
	case <-h.release:
		return h.KVClient.Range(ctx, req, opts...)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func TestObserveTakesAlarmsFromStatus(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.leader()
	alarmed := c.members[1]
	// Raise NOSPACE on m-1 as its backend would, through the raw maintenance API.
	op := dialTest(t, c, c.members[0])
	if _, err := pb.NewMaintenanceClient(op.cli.ActiveConnection()).Alarm(opContext(t), &pb.AlarmRequest{
		Action: pb.AlarmRequest_ACTIVATE, MemberID: alarmed.id(), Alarm: pb.AlarmType_NOSPACE,
	}); err != nil {
		t.Fatal(err)
	}
	var snap etcdstate.Snapshot
	for range 50 {
		// Each member applies the alarm when it applies the entry that raised it.
		if snap = observeTimed(t, newTestObserver(t), c.request()); snap.Complete && allAlarmed(snap) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, m := range snap.Members {
		wantAlarm := m.ID == alarmed.id()
		if got := len(m.Alarms) == 1 && m.Alarms[0] == "NOSPACE"; got != wantAlarm {
			t.Errorf("member %s: alarms %v in %+v", m.Name, m.Alarms, snap)
		}
		// NOSPACE refuses writes; the members still read and vote.
		if !m.Healthy {
			t.Errorf("member %s unhealthy under a NOSPACE alarm: %+v", m.Name, m)
		}
		if m.DBSize == 0 || m.DBSizeInUse == 0 || m.DBSizeInUse > m.DBSize {
			t.Errorf("member %s: database %d bytes, %d in use", m.Name, m.DBSize, m.DBSizeInUse)
		}
	}
	if want := []etcdstate.Alarm{{MemberID: alarmed.id(), Type: "NOSPACE"}}; !slices.Equal(snap.Alarms, want) {
		t.Errorf("snapshot alarms %v, want %v", snap.Alarms, want)
	}
}

// TestObserveCorruptOfNoMember: when the members' hashes disagree and no majority says which
// one is wrong, etcd raises CORRUPT with member ID 0 (server/etcdserver/corrupt.go); raised
// here through etcd's own Alarm API, as that check does. Every member's Status then lists
// "alarm:CORRUPT" (protobuf's text form leaves the zero ID out) and etcd refuses writes. The
// snapshot says what etcd said: a CORRUPT alarm of member 0, no member named corrupt, every
// member reading and voting, so the planner sees the alarm, not a lost quorum.
func TestObserveCorruptOfNoMember(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.leader()
	op := dialTest(t, c, c.members[0])
	if _, err := pb.NewMaintenanceClient(op.cli.ActiveConnection()).Alarm(opContext(t), &pb.AlarmRequest{
		Action: pb.AlarmRequest_ACTIVATE, MemberID: 0, Alarm: pb.AlarmType_CORRUPT,
	}); err != nil {
		t.Fatalf("etcd refused a CORRUPT alarm of member 0: %v", err)
	}
	if _, err := op.cli.Put(opContext(t), "k", "v"); rpctypes.ErrorDesc(err) != rpctypes.ErrorDesc(rpctypes.ErrGRPCCorrupt) {
		t.Errorf("a write under a CORRUPT alarm of member 0: %v, want etcd's refusal", err)
	}
	var snap etcdstate.Snapshot
	for range 50 {
		if snap = observeTimed(t, newTestObserver(t), c.request()); snap.Complete && allAlarmed(snap) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if want := []etcdstate.Alarm{{MemberID: 0, Type: "CORRUPT"}}; !slices.Equal(snap.Alarms, want) {
		t.Errorf("snapshot alarms %v, want %v", snap.Alarms, want)
	}
	for _, m := range snap.Members {
		if !m.Healthy || len(m.Alarms) != 0 {
			t.Errorf("member %s: healthy %v, alarms %v, errors %v: an alarm of member 0 is no member's own", m.Name, m.Healthy, m.Alarms, m.Errors)
		}
	}
}

// TestObserveReportsQuota: each member's Status carries the backend quota it runs with
// (etcd 3.6 on), etcd's default when none is configured; the snapshot keeps it per member.
func TestObserveReportsQuota(t *testing.T) {
	for _, tc := range []struct {
		configured, want int64
	}{{5 << 20, 5 << 20}, {0, 2 << 30}} {
		c := startTestCluster(t, clusterOptions{members: 1, quota: tc.configured})
		snap := observeTimed(t, newTestObserver(t), c.request())
		if len(snap.Members) != 1 || snap.Members[0].DBSizeQuota != tc.want {
			t.Errorf("quota %d configured: snapshot %+v, want a reported quota of %d", tc.configured, snap.Members, tc.want)
		}
	}
}

// allAlarmed reports whether every member's Status listed an alarm.
func allAlarmed(snap etcdstate.Snapshot) bool {
	for _, m := range snap.Members {
		if len(m.Errors) == 0 {
			return false
		}
	}
	return true
}

func TestObservingDoesNotWriteToTheRaftLog(t *testing.T) {
	slowTest(t)
	c := newTestCluster(t, 3, nil)
	leader := c.leader()
	o := newTestObserver(t)
	req := c.request()
	if snap := observeTimed(t, o, req); !snap.Complete {
		t.Fatalf("warm-up: %+v", snap)
	}
	// A fresh cluster appends a few entries of its own (cluster version, member attributes);
	// wait until its log is still before counting.
	before := leader.etcd.Server.CommittedIndex()
	for range 100 {
		time.Sleep(50 * time.Millisecond)
		now := leader.etcd.Server.CommittedIndex()
		if now == before {
			break
		}
		before = now
	}
	complete := 0
	for range 1000 {
		if o.Observe(context.Background(), req).Complete {
			complete++
		}
	}
	if after := leader.etcd.Server.CommittedIndex(); after != before {
		t.Errorf("the raft index moved from %d to %d across 1,000 observations: observing wrote to the log", before, after)
	}
	// A loaded machine may cut a member now and then; most observations must have asked all.
	if complete < 500 {
		t.Errorf("only %d of 1,000 observations were complete: too few to show anything", complete)
	}
}

func TestObserverDialsThroughItsDialer(t *testing.T) {
	c := newTestCluster(t, 1, nil)
	var mu sync.Mutex
	dialled := map[string]bool{}
	var d net.Dialer
	o := NewObserver(ObserverOptions{Deadline: testDeadline, Dial: func(ctx context.Context, addr string) (net.Conn, error) {
		mu.Lock()
		dialled[addr] = true
		mu.Unlock()
		return d.DialContext(ctx, "tcp", addr)
	}})
	defer o.Close()
	if snap := observeTimed(t, o, c.request()); !snap.Complete {
		t.Fatalf("%+v", snap)
	}
	mu.Lock()
	defer mu.Unlock()
	if addr := c.members[0].clientURL.Host; !dialled[addr] {
		t.Errorf("dialled %v, not %s", dialled, addr)
	}
}

// pausableProxy forwards TCP connections to target; while paused it forwards nothing, like a
// member that hangs and later recovers.
type pausableProxy struct {
	addr   string
	mu     sync.Mutex
	paused bool
}

func newPausableProxy(t *testing.T, target string) *pausableProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pausableProxy{addr: l.Addr().String()}
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			go p.pipe(in, out)
			go p.pipe(out, in)
		}
	}()
	return p
}

func (p *pausableProxy) set(paused bool) {
	p.mu.Lock()
	p.paused = paused
	p.mu.Unlock()
}

// pipe copies from src to dst, holding each chunk back while paused.
func (p *pausableProxy) pipe(src, dst net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		for {
			p.mu.Lock()
			paused := p.paused
			p.mu.Unlock()
			if !paused {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

func TestObserveSeesAHungMemberAgainAsSoonAsItAnswers(t *testing.T) {
	slowTest(t)
	c := newTestCluster(t, 3, nil)
	c.leader()
	flaky := c.members[2]
	proxy := newPausableProxy(t, flaky.clientURL.Host)
	req := c.request()
	req.Endpoints[2].Address = proxy.addr
	o := NewObserver(ObserverOptions{Deadline: 20 * time.Second, SlowMember: time.Second, Dial: dialguard.ForTest(t)})
	defer o.Close()
	member := func(snap etcdstate.Snapshot) etcdstate.Member {
		for _, m := range snap.Members {
			if m.Name == flaky.name {
				return m
			}
		}
		t.Fatalf("%s not in the member list: %+v", flaky.name, snap)
		return etcdstate.Member{}
	}
	if m := member(o.Observe(context.Background(), req)); !m.Reachable {
		t.Fatalf("before the hang: %+v", m)
	}
	proxy.set(true)
	for _, want := range []string{"no answer within 1s of the first member's", "not waited for after 1 observations"} {
		if m := member(o.Observe(context.Background(), req)); m.Reachable || len(m.Errors) == 0 || !strings.Contains(m.Errors[0], want) {
			t.Fatalf("while hung: %+v, want an error saying %q", m, want)
		}
	}
	proxy.set(false)
	// Still backing off, the member is asked and, answering with the others, seen at once.
	// A loaded machine may delay one answer past the grace; three tries are plenty.
	for try := 1; ; try++ {
		m := member(o.Observe(context.Background(), req))
		if m.Reachable && m.Healthy {
			break
		}
		if try == 3 {
			t.Fatalf("after the hang ended: %+v", m)
		}
	}
}

func TestBackOffGrowsOnlyWithFullWaitsMissed(t *testing.T) {
	m := &memberClient{}
	now := time.Now()
	m.record(false, true, now)
	if missed, off := m.backingOff(now.Add(999 * time.Millisecond)); !off || missed != 1 {
		t.Fatalf("after one miss: missed %d, backing off %v; want 1 and true for 1s", missed, off)
	}
	if _, off := m.backingOff(now.Add(time.Second)); off {
		t.Fatal("still backing off after 1s")
	}
	m.record(false, false, now.Add(500*time.Millisecond))
	if missed, _ := m.backingOff(now); missed != 1 {
		t.Fatalf("a miss while backing off counted: missed %d", missed)
	}
	m.record(false, true, now.Add(time.Second))
	if _, off := m.backingOff(now.Add(2900 * time.Millisecond)); !off {
		t.Fatal("the second full miss did not double the back-off to 2s")
	}
	for range 10 {
		m.record(false, true, now)
	}
	if _, off := m.backingOff(now.Add(maxBackOff)); off {
		t.Fatalf("backing off beyond %s", maxBackOff)
	}
	m.record(true, false, now)
	if missed, off := m.backingOff(now); off || missed != 0 {
		t.Fatalf("an answer did not end the back-off: missed %d, backing off %v", missed, off)
	}
}
