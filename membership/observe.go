package membership

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"etcdops.dev/etcdops/etcdstate"
)

// Defaults of ObserverOptions.
const (
	DefaultDeadline    = 3 * time.Second
	DefaultSlowMember  = 250 * time.Millisecond
	DefaultMaxClients  = 1024
	DefaultIdleTimeout = 5 * time.Minute
)

// ObserverOptions configure an Observer; zero values take the defaults above.
type ObserverOptions struct {
	// Deadline bounds one whole observation.
	Deadline time.Duration
	// SlowMember is how long members still silent are waited for once one member has
	// answered; a member slower than that is reported unknown for this observation.
	SlowMember time.Duration
	// MaxClients bounds how many clusters keep cached clients.
	MaxClients int
	// IdleTimeout closes a cluster's clients when it has not been observed for this long.
	IdleTimeout time.Duration
	// Dial connects to a member's host:port; nil dials TCP directly. Tests pass one that
	// refuses addresses off the machine.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
}

// Observer reads etcd clusters, reusing clients between observations of the same cluster.
// It is safe for concurrent use.
type Observer struct {
	deadline   time.Duration
	slowMember time.Duration
	cache      *clientCache
	stop       chan struct{}
	done       chan struct{}
	once       sync.Once
}

// NewObserver starts an Observer; Close it to release its clients.
func NewObserver(opts ObserverOptions) *Observer {
	if opts.Deadline <= 0 {
		opts.Deadline = DefaultDeadline
	}
	if opts.SlowMember <= 0 {
		opts.SlowMember = DefaultSlowMember
	}
	if opts.MaxClients <= 0 {
		opts.MaxClients = DefaultMaxClients
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	o := &Observer{
		deadline:   opts.Deadline,
		slowMember: opts.SlowMember,
		cache: &clientCache{
			max:            opts.MaxClients,
			idle:           opts.IdleTimeout,
			connectTimeout: opts.Deadline,
			dial:           opts.Dial,
			entries:        map[string]*clusterClients{},
		},
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	go o.janitor(opts.IdleTimeout / 2)
	return o
}

// janitor closes idle clients even when no cluster is being observed any more.
func (o *Observer) janitor(every time.Duration) {
	defer close(o.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-o.stop:
			return
		case now := <-t.C:
			o.cache.sweep(now)
		}
	}
}

// Close closes every client; observations after Close report that they could not ask.
func (o *Observer) Close() {
	o.once.Do(func() {
		close(o.stop)
		<-o.done
		o.cache.closeAll()
	})
}

// endpointStatus is what one member endpoint said, or why it could not be asked.
type endpointStatus struct {
	status    *clientv3.StatusResponse
	statusErr error
	healthErr error
	// authOn: the member refused the anonymous read for want of a user.
	authOn bool
}

// Observe reads the cluster in one parallel round: every endpoint is asked for Status and a
// serializable read, and the member that led at the last observation for the member list,
// linearizably, all at once. Members still silent SlowMember after the first answer are
// reported unknown. Only when that member list did not come is a voter asked again
// (linearizably while a leader is known, else serializably). Nothing asked goes through raft's
// log: Status carries the alarms. Observe never returns an error: what could not be asked is
// said in the Snapshot (Asked, Err, Reachable, Errors).
func (o *Observer) Observe(ctx context.Context, req etcdstate.Request) etcdstate.Snapshot {
	ctx, cancel := context.WithTimeout(ctx, o.deadline)
	defer cancel()
	if len(req.Endpoints) == 0 {
		return etcdstate.Snapshot{Err: "no endpoints: no member pod is known"}
	}
	clients, err := o.cache.acquire(req, time.Now())
	if err != nil {
		return etcdstate.Snapshot{Err: err.Error()}
	}
	defer func() { o.cache.release(clients, time.Now()) }()
	if req.Login != nil {
		clients.logIn(ctx, *req.Login, o.slowMember)
	}

	// A member that hangs must not use up the deadline a second member list read still needs.
	roundCtx, cancelRound := halfOfRemaining(ctx)
	r := o.askAll(roundCtx, clients)
	cancelRound()
	statuses := r.statuses
	voters := voterOrder(clients.members, statuses)
	if len(voters) == 0 {
		return etcdstate.Snapshot{Err: "no voter answered Status: " + endpointErrors(clients.members, statuses)}
	}
	list, note := r.list, ""
	if list == nil {
		leaderKnown := false
		for _, i := range voters {
			leaderKnown = leaderKnown || statuses[i].status.Leader != 0
		}
		list, note, err = readMembership(ctx, clients.members, voters, leaderKnown, r.listErr)
		if err != nil {
			return etcdstate.Snapshot{Err: err.Error() + "; " + endpointErrors(clients.members, statuses)}
		}
	}
	snap := assemble(clients.members, statuses, list)
	snap.Auth = authState(statuses)
	clients.remember(snap)
	snap.Err = joinNonEmpty("; ", note, snap.Err)
	return snap
}

// authState: auth is on when a member refused the anonymous read for want of a user, off
// when every member that answered it served it; unknown when none answered.
func authState(statuses []endpointStatus) etcdstate.AuthState {
	var st etcdstate.AuthState
	for _, s := range statuses {
		if s.healthErr == nil && s.statusErr == nil {
			st.Known = true
			st.Enabled = st.Enabled || s.authOn
		}
	}
	return st
}

// backOffGraceDivisor: an endpoint backing off is waited for SlowMember/10 after the others
// are done, so that one that answers with them again is seen, and its back-off ends.
const backOffGraceDivisor = 10

// round is what one parallel round brought back: every endpoint's answers and, when the
// member asked for it answered, the linearizable member list.
type round struct {
	statuses []endpointStatus
	list     *clientv3.MemberListResponse
	listErr  error
}

// askAll runs the parallel round. It ends when every call has returned, SlowMember after the
// first endpoint answered, or when ctx ends; endpoints backing off after a missed
// observation are waited for only a short grace after the others. Calls still out then are
// cancelled and their members reported unknown.
func (o *Observer) askAll(ctx context.Context, cc *clusterClients) round {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	members := cc.members
	answers, pending, waitAll := startCalls(ctx, members, cc.listTarget())
	w := newWaiter(o.slowMember, start, members, pending)
	r := round{statuses: make([]endpointStatus, len(members))}
	w.collect(ctx, &r, answers)
	// Calls still out are cancelled; what they bring back, errors mostly, is kept.
	cancel()
	waitAll()
	for a := range answers {
		a.apply(&r)
	}
	end := time.Now()
	for i, m := range members {
		if w.pending[i] > 0 {
			r.statuses[i].cutShort(w.whyCut(i))
		}
		m.record(w.answered[i], !w.backingOff[i], end)
	}
	return r
}

// answer is one call's outcome. Only the goroutine that waits applies it, so the round
// needs no lock.
type answer struct {
	i     int // the endpoint's index; len(members) for the member list
	apply func(*round)
}

// startCalls asks every endpoint for Status and a serializable read, and the endpoint
// listFrom for the member list, each call in its own goroutine. pending counts the calls per
// endpoint, the member list's at index len(members). waitAll returns once every call has
// sent its answer, and closes answers.
func startCalls(ctx context.Context, members []*memberClient, listFrom int) (answers chan answer, pending []int, waitAll func()) {
	answers = make(chan answer, 3*len(members))
	pending = make([]int, len(members)+1)
	var wg sync.WaitGroup
	call := func(i int, ask func() func(*round)) {
		pending[i]++
		wg.Go(func() { answers <- answer{i, ask()} })
	}
	for i, m := range members {
		call(i, func() func(*round) { return askStatus(ctx, m, i) })
		call(i, func() func(*round) { return askHealth(ctx, m, i) })
		if i == listFrom {
			call(len(members), func() func(*round) { return askMemberList(ctx, m) })
		}
	}
	return answers, pending, func() {
		wg.Wait()
		close(answers)
	}
}

// askStatus asks endpoint i for its Status, which says its member's raft state and the
// cluster's alarms.
func askStatus(ctx context.Context, m *memberClient, i int) func(*round) {
	st, err := m.status(ctx)
	if err == nil && st.Header == nil {
		st, err = nil, errors.New("status without a response header")
	}
	return func(r *round) { r.statuses[i].status, r.statuses[i].statusErr = st, err }
}

// askHealth reads from endpoint i serializably: a member that cannot serve a local read is
// not healthy, whatever its Status says.
func askHealth(ctx context.Context, m *memberClient, i int) func(*round) {
	authOn, err := m.readLocally(ctx)
	return func(r *round) { r.statuses[i].healthErr, r.statuses[i].authOn = err, authOn }
}

// askMemberList reads the member list linearizably, so it is the cluster's current one.
func askMemberList(ctx context.Context, m *memberClient) func(*round) {
	list, err := m.memberList(ctx, false)
	if err != nil {
		err = fmt.Errorf("member list from %s: %w", m.endpoint.Member, err)
	}
	return func(r *round) { r.list, r.listErr = list, err }
}

// waiter keeps the round's wait for answers: which calls are still out, and so when to stop
// waiting for them.
type waiter struct {
	slowMember time.Duration
	start      time.Time
	// pending counts the calls still out per endpoint. The member list's is at index
	// len(members): it says how the cluster is, not how the endpoint is, so it does not make
	// its endpoint a straggler.
	pending     []int
	backingOff  []bool // endpoints waited for only a short grace after the others
	missed      []int  // observations in a row each endpoint has missed
	answered    []bool // endpoints whose Status came back while the round waited
	firstAnswer time.Time
	lastDone    time.Time
}

// newWaiter reads, as the round starts, which endpoints are backing off after missed
// observations.
func newWaiter(slowMember time.Duration, start time.Time, members []*memberClient, pending []int) *waiter {
	w := &waiter{
		slowMember: slowMember,
		start:      start,
		pending:    pending,
		backingOff: make([]bool, len(members)),
		missed:     make([]int, len(members)),
		answered:   make([]bool, len(members)),
	}
	for i, m := range members {
		w.missed[i], w.backingOff[i] = m.backingOff(start)
	}
	return w
}

// collect applies answers to r until every call has returned, the round stops waiting for
// those still out (until), or ctx ends.
func (w *waiter) collect(ctx context.Context, r *round, answers <-chan answer) {
	outstanding := 0
	for _, n := range w.pending {
		outstanding += n
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ; outstanding > 0; outstanding-- {
		if t := w.until(); !t.IsZero() {
			timer.Reset(time.Until(t))
		}
		select {
		case a := <-answers:
			a.apply(r)
			w.returned(a.i, r.statuses)
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// returned counts one call of endpoint i back; once all of them are, the endpoint is done,
// and answered if its Status came.
func (w *waiter) returned(i int, statuses []endpointStatus) {
	w.pending[i]--
	if w.pending[i] > 0 || i == len(statuses) {
		return
	}
	w.lastDone = time.Now()
	if statuses[i].statusErr == nil {
		w.answered[i] = true
		if w.firstAnswer.IsZero() {
			w.firstAnswer = w.lastDone
		}
	}
}

// until is when the round stops waiting for the endpoints still out; zero: only ctx bounds
// it.
func (w *waiter) until() time.Time {
	waited := w.pending[len(w.backingOff)] > 0
	for i, off := range w.backingOff {
		waited = waited || (w.pending[i] > 0 && !off)
	}
	switch {
	case waited && w.firstAnswer.IsZero():
		return time.Time{}
	case waited:
		return w.firstAnswer.Add(w.slowMember)
	case w.firstAnswer.IsZero():
		return w.start.Add(w.slowMember)
	}
	return w.lastDone.Add(w.slowMember / backOffGraceDivisor)
}

// whyCut says why the round stopped waiting for endpoint i.
func (w *waiter) whyCut(i int) string {
	switch {
	case w.backingOff[i]:
		return fmt.Sprintf("not waited for after %d observations without an answer", w.missed[i])
	case w.firstAnswer.IsZero():
		return "no answer before the deadline"
	}
	return fmt.Sprintf("no answer within %s of the first member's", w.slowMember)
}

// cutShort makes an endpoint whose calls the round cancelled unknown for this observation,
// saying why it was not waited for.
func (st *endpointStatus) cutShort(why string) {
	if st.status != nil && st.healthErr != nil {
		// Its Status came back but its health read did not before the round ended: the hook
		// stopped waiting, which is no evidence from etcd that the member is unhealthy
		// (counted so, a member slow to read would be replaced after the grace period). It is
		// unknown for this observation, as if its Status had not come.
		st.status, st.statusErr = nil, fmt.Errorf("health read: %w", st.healthErr)
	}
	if st.status == nil {
		st.statusErr = fmt.Errorf("%s: %w", why, st.statusErr)
	}
}

// voterOrder lists the endpoints that answered Status as voters, self-reported leaders first,
// so the member list comes from the member most likely to serve it at once.
func voterOrder(members []*memberClient, statuses []endpointStatus) []int {
	var out []int
	for i := range members {
		st := statuses[i].status
		if st != nil && !st.IsLearner {
			out = append(out, i)
		}
	}
	sort.SliceStable(out, func(a, b int) bool {
		return isSelfLeader(statuses[out[a]].status) && !isSelfLeader(statuses[out[b]].status)
	})
	return out
}

func isSelfLeader(st *clientv3.StatusResponse) bool {
	return st != nil && st.Header != nil && st.Leader != 0 && st.Leader == st.Header.MemberId
}

// readMembership reads the member list from a voter when the round did not bring it,
// linearizably when a leader is known. Without a leader a linearizable read cannot succeed,
// so it falls back to a serializable read and says so in note: the planner still sees who is
// a member, and that quorum is gone. lastErr is why the round's read failed, if it was made.
func readMembership(ctx context.Context, members []*memberClient, voters []int, leaderKnown bool, lastErr error) (*clientv3.MemberListResponse, string, error) {
	if leaderKnown {
		budget, cancel := halfOfRemaining(ctx)
		defer cancel()
		for _, i := range voters {
			list, err := members[i].memberList(budget, false)
			if err == nil {
				return list, "", nil
			}
			lastErr = fmt.Errorf("member list from %s: %w", members[i].endpoint.Member, err)
			if budget.Err() != nil {
				break
			}
		}
	}
	for _, i := range voters {
		list, err := members[i].memberList(ctx, true)
		if err == nil {
			note := fmt.Sprintf("no leader: member list read serializably from %s", members[i].endpoint.Member)
			if lastErr != nil {
				note = fmt.Sprintf("%s after %v", note, lastErr)
			}
			return list, note, nil
		}
		lastErr = fmt.Errorf("member list from %s: %w", members[i].endpoint.Member, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, "", lastErr
}

// halfOfRemaining bounds one step so that the steps after it keep the other half.
func halfOfRemaining(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, time.Until(dl)/2)
}

// assemble joins the member list with what each endpoint said, matching by member ID.
func assemble(members []*memberClient, statuses []endpointStatus, list *clientv3.MemberListResponse) etcdstate.Snapshot {
	a := newAssembly(list)
	for i, mc := range members {
		a.add(mc.endpoint.Member, statuses[i])
	}
	return a.snapshot()
}

// assembly is a snapshot being assembled from the member list and the endpoints' answers.
type assembly struct {
	snap       etcdstate.Snapshot
	byID       map[uint64]int // index in snap.Members
	byName     map[string]int
	answeredBy map[uint64]string // endpoint by the member ID it answered as
	notes      []string          // why endpoints of no listed member could not be asked
	conflicts  []string          // answers the member list or other answers contradict
	// forked are the endpoints whose answers say a second membership is alive.
	forked         map[string]bool
	foreignLeaders []string
	alarms         map[uint64][]string // by member ID, as any member's Status lists them
}

// newAssembly starts from the member list: every member listed, none reachable yet.
func newAssembly(list *clientv3.MemberListResponse) *assembly {
	a := &assembly{
		snap:       etcdstate.Snapshot{Asked: true, ClusterID: list.Header.ClusterId},
		byID:       map[uint64]int{},
		byName:     map[string]int{},
		answeredBy: map[uint64]string{},
		forked:     map[string]bool{},
		alarms:     map[uint64][]string{},
	}
	for _, m := range list.Members {
		a.byID[m.ID] = len(a.snap.Members)
		a.snap.Members = append(a.snap.Members, etcdstate.Member{
			ID:         m.ID,
			Name:       m.Name,
			PeerURLs:   append([]string(nil), m.PeerURLs...),
			ClientURLs: append([]string(nil), m.ClientURLs...),
			IsLearner:  m.IsLearner,
		})
	}
	for i, m := range a.snap.Members {
		if m.Name != "" {
			a.byName[m.Name] = i
		}
	}
	return a
}

// add places what endpoint ep said on the member it answers as, unless the answer
// contradicts the member list or another endpoint's.
func (a *assembly) add(ep string, res endpointStatus) {
	st := res.status
	if st == nil {
		a.unanswered(ep, res.statusErr)
		return
	}
	if st.Header.ClusterId != a.snap.ClusterID {
		a.fork(fmt.Sprintf("%s answers for cluster %x, the member list for %x", ep, st.Header.ClusterId, a.snap.ClusterID), ep)
		return
	}
	j, ok := a.byID[st.Header.MemberId]
	if !ok {
		a.unlisted(ep, st)
		return
	}
	if other, dup := a.answeredBy[st.Header.MemberId]; dup {
		a.conflicts = append(a.conflicts, fmt.Sprintf("%s and %s both answer as member %x", other, ep, st.Header.MemberId))
		return
	}
	a.answeredBy[st.Header.MemberId] = ep
	m := &a.snap.Members[j]
	if m.Name != "" && m.Name != ep {
		a.conflicts = append(a.conflicts, fmt.Sprintf("endpoint of %s answers as member %s", ep, m.Name))
		return
	}
	a.reachable(m, st, res.healthErr)
}

// unanswered keeps why ep could not be asked: on its member when the list names one, else
// in the snapshot's error.
func (a *assembly) unanswered(ep string, err error) {
	if j, ok := a.byName[ep]; ok {
		a.snap.Members[j].Errors = append(a.snap.Members[j].Errors, err.Error())
		return
	}
	a.notes = append(a.notes, fmt.Sprintf("%s: %v", ep, err))
}

// unlisted takes an answer from a member not in the list: one removed that still serves, or
// one started on its own (a forced new cluster, a copied volume). One that leads has a
// membership of its own that may take writes this one never sees: a fork. So has one that
// follows a leader outside the list (its leader did not answer here, or answers at no pod of
// the cluster): a removed member follows a listed leader until it hears of its removal, or no
// leader once cut off. One of those is reported for the planner, which knows the member IDs
// its pods had.
func (a *assembly) unlisted(ep string, st *clientv3.StatusResponse) {
	_, listedLeader := a.byID[st.Leader]
	switch {
	case isSelfLeader(st):
		a.fork(fmt.Sprintf("%s answers as member %x, which is not in the member list", ep, st.Header.MemberId), ep)
		a.foreignLeaders = append(a.foreignLeaders, ep)
	case st.Leader != 0 && !listedLeader:
		a.fork(fmt.Sprintf("%s answers as member %x, which is not in the member list, and follows leader %x, not in it either", ep, st.Header.MemberId, st.Leader), ep)
	default:
		a.snap.Unlisted = append(a.snap.Unlisted, etcdstate.Unlisted{Endpoint: ep, MemberID: st.Header.MemberId})
	}
}

// fork records a conflict that says a second membership is alive behind endpoints.
func (a *assembly) fork(conflict string, endpoints ...string) {
	a.conflicts = append(a.conflicts, conflict)
	for _, ep := range endpoints {
		a.forked[ep] = true
	}
}

// reachable fills in member m from its own Status and health read.
func (a *assembly) reachable(m *etcdstate.Member, st *clientv3.StatusResponse, healthErr error) {
	m.Reachable = true
	m.IsLeader = isSelfLeader(st)
	m.RaftIndex = st.RaftIndex
	m.RaftAppliedIndex = st.RaftAppliedIndex
	m.RaftTerm = st.RaftTerm
	m.Version = st.Version
	m.DBSize, m.DBSizeInUse, m.DBSizeQuota = st.DbSize, st.DbSizeInUse, st.DbSizeQuota
	m.Errors = append(m.Errors, st.Errors...)
	// Every member's Status lists the cluster's alarms: they are the alarmed members' state,
	// not this member's, which is judged by its other errors and its read.
	failures := 0
	for _, e := range st.Errors {
		if id, alarm, ok := parseAlarm(e); ok {
			a.alarms[id] = append(a.alarms[id], alarm)
		} else {
			failures++
		}
	}
	if healthErr != nil {
		m.Errors = append(m.Errors, "health read: "+healthErr.Error())
	}
	m.Healthy = failures == 0 && healthErr == nil
}

// placeAlarms lists each alarm once, on the snapshot and on the member it names.
func (a *assembly) placeAlarms() {
	for _, id := range slices.Sorted(maps.Keys(a.alarms)) {
		as := a.alarms[id]
		slices.Sort(as)
		as = slices.Compact(as)
		for _, alarm := range as {
			a.snap.Alarms = append(a.snap.Alarms, etcdstate.Alarm{MemberID: id, Type: alarm})
		}
		if j, ok := a.byID[id]; ok {
			a.snap.Members[j].Alarms = as
			// NOSPACE refuses writes everywhere but leaves the member reading and voting;
			// CORRUPT says this member's data cannot be trusted.
			if slices.Contains(as, "CORRUPT") {
				a.snap.Members[j].Healthy = false
			}
		}
	}
}

// snapshot finishes the assembly: alarms placed, members in ID order, and every conflict,
// two leaders among them, said in Inconsistent.
func (a *assembly) snapshot() etcdstate.Snapshot {
	a.placeAlarms()
	snap := a.snap
	snap.Complete = true
	for _, m := range snap.Members {
		snap.Complete = snap.Complete && m.Reachable
	}
	sort.Slice(snap.Members, func(i, j int) bool { return snap.Members[i].ID < snap.Members[j].ID })
	if leaders, conflict := leaderConflict(snap.Members, a.foreignLeaders); conflict != "" {
		a.fork(conflict, leaders...)
	}
	snap.Inconsistent = strings.Join(a.conflicts, "; ")
	snap.Forked = slices.Sorted(maps.Keys(a.forked))
	snap.Err = strings.Join(a.notes, "; ")
	return snap
}

// parseAlarm reads an alarm as etcd lists it in Status errors: every member's Status carries
// the cluster's active alarms, each as the protobuf text form of an AlarmMember, whose
// spacing protobuf varies on purpose. The text form leaves out a field at its zero value: a
// CORRUPT alarm etcd could not place on a member (member ID 0) reads "alarm:CORRUPT".
func parseAlarm(s string) (memberID uint64, alarm string, ok bool) {
	fields := strings.Fields(s)
	if len(fields) == 0 || len(fields) > 2 {
		return 0, "", false
	}
	if len(fields) == 2 {
		id, ok := strings.CutPrefix(fields[0], "memberID:")
		if !ok {
			return 0, "", false
		}
		var err error
		if memberID, err = strconv.ParseUint(id, 10, 64); err != nil {
			return 0, "", false
		}
	}
	alarm, ok = strings.CutPrefix(fields[len(fields)-1], "alarm:")
	if !ok || alarm == "" {
		return 0, "", false
	}
	return memberID, alarm, true
}

// leaderConflict reports two or more members that each report themselves leader, in any
// terms, with foreign the endpoints that lead outside the member list. Within one membership
// a leader of an older term steps down as soon as it hears of the newer one (etcd checks
// quorum), so two at once are two memberships, or one seen mid-election: the observation
// cannot be trusted either way. leaders are the members (or endpoints) involved.
func leaderConflict(members []etcdstate.Member, foreign []string) (leaders []string, conflict string) {
	var claims []string
	for _, m := range members {
		if m.IsLeader {
			leaders = append(leaders, m.Name)
			claims = append(claims, fmt.Sprintf("%s (term %d)", m.Name, m.RaftTerm))
		}
	}
	leaders = append(leaders, foreign...)
	for _, f := range foreign {
		claims = append(claims, f+" (outside the member list)")
	}
	if len(leaders) < 2 {
		return nil, ""
	}
	return leaders, strings.Join(claims, ", ") + " each report themselves leader"
}

// endpointErrors lists why endpoints did not answer, for a snapshot that could not be taken.
func endpointErrors(members []*memberClient, statuses []endpointStatus) string {
	var out []string
	for i, m := range members {
		switch st := statuses[i]; {
		case st.statusErr != nil:
			out = append(out, fmt.Sprintf("%s: %v", m.endpoint.Member, st.statusErr))
		case st.status.IsLearner:
			out = append(out, fmt.Sprintf("%s: learner", m.endpoint.Member))
		}
	}
	if len(out) == 0 {
		return "every endpoint answered"
	}
	return strings.Join(out, "; ")
}

func joinNonEmpty(sep string, parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, sep)
}
