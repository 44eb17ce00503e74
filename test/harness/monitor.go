package harness

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"
	gosync "sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/joinstate"
	"etcdops.dev/etcdops/sync"
)

// Member is one etcd member as the harness sees it from inside the servers.
type Member struct {
	ID        uint64
	Name      string // pod name; from the peer URL for a member not started yet
	IsLearner bool
	Running   bool // its pod's etcd process runs this member and is not cut off
	PeerURLs  []string
}

// View is one look at the cluster from inside its servers, without going through the hook.
type View struct {
	Members []Member
	Leader  string
	Term    uint64
}

// Voters counts voting members.
func (v View) Voters() (n int) {
	for _, m := range v.Members {
		if !m.IsLearner {
			n++
		}
	}
	return n
}

// Learners counts learners.
func (v View) Learners() (n int) {
	for _, m := range v.Members {
		if m.IsLearner {
			n++
		}
	}
	return n
}

// Monitor watches the cluster from the harness's side: leader changes, membership changes,
// quorum, and every invariant the operator must keep.
type Monitor struct {
	env *Env

	mu     gosync.Mutex
	faults map[string]time.Time // pod → when the scenario broke it
	// downAtFault are voters that were already down, or being deleted, by the operator's
	// hand when the scenario broke another: a planned disruption that a fault then turns
	// into a quorum loss is the fault's doing, not the operator's.
	downAtFault map[string]bool
	voters      []string        // voters' pods at the last sample
	cut         map[string]bool // pods whose peer traffic is cut
	leaderSeen  string
	counts      Counts
	violations  []string
	seen        map[string]bool // violations already reported, without their time
	panics      []string
	inLoss      bool
	partition   int32 // the StatefulSet's partition after the last sync, -1 before it exists
	// ledger are the members seen in etcd's membership while the join ConfigMap listed them
	// by name and peer URL: member ID → name.
	ledger map[uint64]string
}

// Counts are the figures the monitor accumulates.
type Counts struct {
	// Panics counts members that ended in a panic of etcd itself (not a harness fault).
	Panics int
	// MembershipChanges counts member Jobs that added, promoted or removed a member.
	MembershipChanges  int
	LeaderChanges      int
	OperatorQuorumLoss int
}

func newMonitor(env *Env) *Monitor {
	return &Monitor{env: env, faults: map[string]time.Time{}, downAtFault: map[string]bool{}, cut: map[string]bool{}, seen: map[string]bool{}, partition: -1,
		ledger: map[uint64]string{}}
}

// Counts returns the figures so far.
func (m *Monitor) Counts() Counts {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.counts
}

// Panics lists the etcd panics so far, as "pod: message".
func (m *Monitor) Panics() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.panics...)
}

// Ledger returns every member seen in the ledger so far: member ID → name.
func (m *Monitor) Ledger() map[uint64]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[uint64]string, len(m.ledger))
	for id, name := range m.ledger {
		out[id] = name
	}
	return out
}

// noteLedger adds the members of v that the join ConfigMap lists, by name and peer URL.
func (m *Monitor) noteLedger(v View) {
	o, ok := m.env.Store.Get("ConfigMap", sync.JoinConfigMapName(m.env.Cluster))
	if !ok {
		return
	}
	st, err := joinstate.Decode([]byte(o.(*corev1.ConfigMap).Data[joinstate.ConfigMapKey]))
	if err != nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, mem := range v.Members {
		if rec, ok := st.Find(mem.Name); ok && slices.Contains(mem.PeerURLs, rec.PeerURL) {
			m.ledger[mem.ID] = mem.Name
		}
	}
}

// Violations returns every invariant broken so far.
func (m *Monitor) Violations() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.violations...)
}

// violate records a broken invariant once: the sampler would otherwise repeat it every tick.
func (m *Monitor) violate(format string, args ...any) {
	what := fmt.Sprintf(format, args...)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seen[what] {
		return
	}
	m.seen[what] = true
	msg := time.Now().Format("15:04:05.000") + ": " + what
	m.violations = append(m.violations, msg)
	m.env.logf("VIOLATION %s", msg)
}

// markFault records that the scenario itself took pod down; the fault lasts until a process
// started after it runs the pod's member again and is not cut off.
func (m *Monitor) markFault(pod string) {
	m.mu.Lock()
	voters := m.voters
	m.mu.Unlock()
	var down []string
	for _, v := range voters {
		if v != pod && m.goingDown(v) {
			down = append(down, v)
		}
	}
	m.mu.Lock()
	m.faults[pod] = time.Now()
	for _, v := range down {
		if m.faults[v].IsZero() {
			m.downAtFault[v] = true
		}
	}
	m.mu.Unlock()
}

// goingDown reports whether pod's etcd is not running, or its pod is gone or being deleted
// from the store while the kubelet has yet to stop it.
func (m *Monitor) goingDown(pod string) bool {
	if m.env.Kubelet.runningSince(pod).IsZero() {
		return true
	}
	o, ok := m.env.Store.Get("Pod", pod)
	return !ok || o.(*corev1.Pod).DeletionTimestamp != nil
}

// Run samples the cluster every 20ms until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.sample()
		}
	}
}

// podOfPeerURL is the pod name a member's peer URL points at: the first DNS label.
func podOfPeerURL(peerURLs []string) string {
	for _, s := range peerURLs {
		if u, err := url.Parse(s); err == nil {
			return strings.SplitN(u.Hostname(), ".", 2)[0]
		}
	}
	return ""
}

// View looks at the cluster from inside its running servers: membership from the one that
// has applied the most, the leader from the one with the highest term.
func (m *Monitor) View() View {
	m.mu.Lock()
	cut := map[string]bool{}
	for p, c := range m.cut {
		cut[p] = c
	}
	m.mu.Unlock()
	return viewOf(m.env.Kubelet.servers(), cut)
}

// viewOf is the cluster as servers (by pod name) see it, leaving out those whose peer
// traffic is cut.
func viewOf(servers map[string]etcdServer, cut map[string]bool) View {
	var best etcdServer
	var v View
	for _, s := range servers {
		if best == nil || s.AppliedIndex() > best.AppliedIndex() {
			best = s
		}
	}
	if best == nil {
		return v
	}
	byID := map[uint64]string{}
	for _, mem := range best.members() {
		name := mem.Name
		if name == "" {
			name = podOfPeerURL(mem.PeerURLs)
		}
		s, running := servers[name]
		running = running && uint64(s.MemberID()) == uint64(mem.ID) && !cut[name]
		v.Members = append(v.Members, Member{ID: uint64(mem.ID), Name: name, IsLearner: mem.IsLearner, Running: running, PeerURLs: mem.PeerURLs})
		byID[uint64(mem.ID)] = name
	}
	sort.Slice(v.Members, func(i, j int) bool { return v.Members[i].Name < v.Members[j].Name })
	for name, s := range servers {
		if cut[name] {
			continue
		}
		if t := s.Term(); t >= v.Term && s.Lead() != 0 {
			v.Term, v.Leader = t, byID[s.Lead()]
		}
	}
	return v
}

func (m *Monitor) sample() {
	replicas := m.replicas()
	v := m.View()
	if len(v.Members) == 0 {
		return
	}
	m.noteLedger(v)
	m.mu.Lock()
	for pod, at := range m.faults {
		if m.env.Kubelet.runningSince(pod).After(at) && !m.cut[pod] {
			delete(m.faults, pod)
		}
	}
	for pod := range m.downAtFault {
		if len(m.faults) == 0 || !m.env.Kubelet.runningSince(pod).IsZero() {
			delete(m.downAtFault, pod)
		}
	}
	if v.Leader != "" && v.Leader != m.leaderSeen {
		if m.leaderSeen != "" {
			m.counts.LeaderChanges++
		}
		m.leaderSeen = v.Leader
	}
	var states []voterState
	var down, names []string
	for _, mem := range v.Members {
		if mem.IsLearner {
			continue
		}
		names = append(names, mem.Name)
		switch {
		case mem.Running:
			states = append(states, voterUp)
		case !m.faults[mem.Name].IsZero():
			states = append(states, voterFaulted)
			down = append(down, mem.Name+"(fault)")
		case m.downAtFault[mem.Name]:
			states = append(states, voterDownAtFault)
			down = append(down, mem.Name+"(down before the fault)")
		default:
			states = append(states, voterDown)
			down = append(down, mem.Name)
		}
	}
	m.voters = names
	avail := voterCount(states, voterUp)
	loss := operatorLostQuorum(states)
	newLoss := loss && !m.inLoss
	m.inLoss = loss
	if newLoss {
		m.counts.OperatorQuorumLoss++
	}
	m.mu.Unlock()
	if newLoss {
		m.env.logf("quorum lost by the operator's hand: %d of %d voters up, down: %v", avail, len(states), down)
	}
	if v.Learners() > 1 {
		m.violate("%d learners at once: %+v", v.Learners(), v.Members)
	}
	m.checkStatefulSet(replicas, v)
}

// voterState is how the monitor finds a voter at one sample.
type voterState int

const (
	voterUp          voterState = iota
	voterFaulted                // down by the scenario's hand
	voterDownAtFault            // down by the operator's hand since before a fault came
	voterDown                   // down by the operator's hand
)

// operatorLostQuorum reports a quorum loss that the scenario's faults do not explain: fewer
// voters are up than a quorum, while the voters the faults left would have been enough. A
// voter the operator took down before a fault came counts with the fault: that is a planned
// disruption (one pod of a rolling change) that the fault turned into the loss. One it took
// down while a fault was in force counts against it.
func operatorLostQuorum(states []voterState) bool {
	q := etcdstate.Quorum(len(states))
	spared := len(states) - voterCount(states, voterFaulted) - voterCount(states, voterDownAtFault)
	return voterCount(states, voterUp) < q && spared >= q
}

func voterCount(states []voterState, s voterState) int {
	n := 0
	for _, v := range states {
		if v == s {
			n++
		}
	}
	return n
}

// jobDone counts a membership change when a member Job changed the membership: the member
// tool says "done" then, and "already done" when a retry found it done.
func (m *Monitor) jobDone(args []string, out string) {
	if len(args) < 2 || !(args[1] == "add-learner" || args[1] == "promote" || args[1] == "remove") {
		return
	}
	if !strings.Contains(out, ": done") {
		return
	}
	m.mu.Lock()
	m.counts.MembershipChanges++
	m.mu.Unlock()
}

// replicas is the StatefulSet's, -1 when there is none. It is read before the membership it
// is checked against: replicas only go below a member after the member is removed, so a voter
// in a later view above replicas read earlier is a true violation, where the other way round a
// removal and the sync that follows it between the two reads would look like one.
func (m *Monitor) replicas() int {
	o, ok := m.env.Store.Get("StatefulSet", m.env.Cluster)
	if !ok || o.(*appsv1.StatefulSet).Spec.Replicas == nil {
		return -1
	}
	return int(*o.(*appsv1.StatefulSet).Spec.Replicas)
}

// checkStatefulSet: the StatefulSet never shrinks below a member that is still a voter.
func (m *Monitor) checkStatefulSet(replicas int, v View) {
	if replicas < 0 {
		return
	}
	for _, mem := range v.Members {
		if ord, ok := podOrdinal(m.env.Cluster, mem.Name); ok && !mem.IsLearner && ord >= replicas {
			m.violate("StatefulSet has %d replicas but %s is still a voter", replicas, mem.Name)
		}
	}
}

// afterSync checks what must hold after every sync.
func (m *Monitor) afterSync(rec SyncRecord) {
	inFlight := 0
	var names []string
	for _, o := range m.env.Store.List("Job") {
		j := o.(*batchv1.Job)
		if done, _ := jobDone(j); !done {
			inFlight++
			names = append(names, j.Name)
		}
	}
	if inFlight > 1 {
		m.violate("sync %d: %d member Jobs in flight: %v", rec.N, inFlight, names)
	}
	m.checkStatefulSet(m.replicas(), m.View())
	m.checkOneReplacement(rec)
}

// checkOneReplacement: pods are replaced one at a time. When a sync lowers the partition onto
// an outdated pod (starting its replacement), every pod above must already run the new
// revision with its member up again; otherwise the StatefulSet controller, not the planner,
// decides when the next pod goes, without the planner's quorum and leadership checks at
// that moment.
func (m *Monitor) checkOneReplacement(rec SyncRecord) {
	o, ok := m.env.Store.Get("StatefulSet", m.env.Cluster)
	if !ok {
		return
	}
	sts := o.(*appsv1.StatefulSet)
	p := int32(0)
	if ru := sts.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.Partition != nil {
		p = *ru.Partition
	}
	m.mu.Lock()
	prev := m.partition
	m.partition = p
	m.mu.Unlock()
	if prev < 0 || p >= prev || sts.Spec.Replicas == nil {
		return
	}
	update := revision(sts)
	pods := map[string]*corev1.Pod{}
	for _, pod := range m.env.Pods() {
		pods[pod.Name] = pod
	}
	if target := pods[fmt.Sprintf("%s-%d", sts.Name, p)]; target == nil || target.Labels[appsv1.ControllerRevisionHashLabelKey] == update {
		return
	}
	up := map[string]bool{}
	for _, mem := range m.View().Members {
		up[mem.Name] = mem.Running
	}
	for k := p + 1; k < *sts.Spec.Replicas; k++ {
		name := fmt.Sprintf("%s-%d", sts.Name, k)
		pod := pods[name]
		if pod == nil || pod.DeletionTimestamp != nil || pod.Labels[appsv1.ControllerRevisionHashLabelKey] != update || !up[name] {
			m.violate("sync %d lowered the partition to %d while %s was still being replaced", rec.N, p, name)
		}
	}
}

// beforeJob checks a member Job's command before it runs: a remove must leave the remaining
// voters with quorum among those that are up.
func (m *Monitor) beforeJob(job string, args []string) {
	if len(args) < 2 || args[1] != "remove" {
		return
	}
	var id string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--id="); ok {
			id = v
		}
	}
	v := m.View()
	remaining, up := 0, 0
	target := false
	for _, mem := range v.Members {
		if fmt.Sprintf("%x", mem.ID) == strings.TrimPrefix(strings.ToLower(id), "0x") {
			target = !mem.IsLearner
			continue
		}
		if !mem.IsLearner {
			remaining++
			if mem.Running {
				up++
			}
		}
	}
	if target && up < etcdstate.Quorum(remaining) {
		m.violate("job %s removes voter %s while only %d of the %d remaining voters are up", job, id, up, remaining)
	}
}
