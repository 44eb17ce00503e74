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
	clients.remember(snap)
	snap.Err = joinNonEmpty("; ", note, snap.Err)
	return snap
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
	listFrom := cc.listTarget()
	r := round{statuses: make([]endpointStatus, len(members))}
	answered := make([]bool, len(members))
	// Calls still out per endpoint; the member list's is at index len(members): it says how
	// the cluster is, not how the endpoint is, so it does not make its endpoint a straggler.
	pending := make([]int, len(members)+1)
	type result struct {
		i int
		f func()
	}
	results := make(chan result, 3*len(members))
	var wg sync.WaitGroup
	call := func(i int, f func() func()) {
		pending[i]++
		wg.Go(func() { results <- result{i, f()} })
	}
	for i, m := range members {
		call(i, func() func() {
			st, err := m.maint.Status(ctx, "")
			if err == nil && st.Header == nil {
				st, err = nil, errors.New("status without a response header")
			}
			return func() { r.statuses[i].status, r.statuses[i].statusErr = st, err }
		})
		call(i, func() func() {
			_, err := m.cli.Get(ctx, "health", clientv3.WithSerializable())
			return func() { r.statuses[i].healthErr = err }
		})
		if i == listFrom {
			call(len(members), func() func() {
				list, err := m.cli.MemberList(ctx)
				if err != nil {
					err = fmt.Errorf("member list from %s: %w", m.endpoint.Member, err)
				}
				return func() { r.list, r.listErr = list, err }
			})
		}
	}
	backingOff := make([]bool, len(members))
	missed := make([]int, len(members))
	for i, m := range members {
		missed[i], backingOff[i] = m.backingOff(start)
	}
	// until is when the round stops waiting for the endpoints still out; zero: only ctx
	// bounds it.
	var firstAnswer, lastDone time.Time
	until := func() time.Time {
		waited := pending[len(members)] > 0
		for i := range members {
			waited = waited || (pending[i] > 0 && !backingOff[i])
		}
		switch {
		case waited && firstAnswer.IsZero():
			return time.Time{}
		case waited:
			return firstAnswer.Add(o.slowMember)
		case firstAnswer.IsZero():
			return start.Add(o.slowMember)
		}
		return lastDone.Add(o.slowMember / backOffGraceDivisor)
	}
	outstanding := 0
	for _, n := range pending {
		outstanding += n
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	stopped := false
	for outstanding > 0 && !stopped {
		if t := until(); !t.IsZero() {
			timer.Reset(time.Until(t))
		}
		select {
		case res := <-results:
			res.f()
			outstanding--
			pending[res.i]--
			if pending[res.i] > 0 || res.i == len(members) {
				continue
			}
			lastDone = time.Now()
			if r.statuses[res.i].statusErr == nil {
				answered[res.i] = true
				if firstAnswer.IsZero() {
					firstAnswer = lastDone
				}
			}
		case <-timer.C:
			stopped = true
		case <-ctx.Done():
			stopped = true
		}
	}
	cut := make([]bool, len(members))
	for i := range members {
		cut[i] = pending[i] > 0
	}
	cancel()
	wg.Wait()
	close(results)
	for res := range results {
		res.f()
	}
	end := time.Now()
	for i, m := range members {
		st := &r.statuses[i]
		if cut[i] && st.status != nil && st.healthErr != nil {
			// Its Status came back but its health read did not before the round ended: the
			// hook stopped waiting, which is no evidence from etcd that the member is
			// unhealthy (counted so, a member slow to read would be replaced after the grace
			// period). It is unknown for this observation, as if its Status had not come.
			st.status, st.statusErr = nil, fmt.Errorf("health read: %w", st.healthErr)
		}
		if cut[i] && st.status == nil {
			why := fmt.Sprintf("no answer within %s of the first member's", o.slowMember)
			switch {
			case backingOff[i]:
				why = fmt.Sprintf("not waited for after %d observations without an answer", missed[i])
			case firstAnswer.IsZero():
				why = "no answer before the deadline"
			}
			st.statusErr = fmt.Errorf("%s: %w", why, st.statusErr)
		}
		m.record(answered[i], !backingOff[i], end)
	}
	return r
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
			list, err := members[i].cli.MemberList(budget)
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
		list, err := members[i].cli.MemberList(ctx, clientv3.WithSerializable())
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
	snap := etcdstate.Snapshot{Asked: true, ClusterID: list.Header.ClusterId}
	byID := map[uint64]int{}
	for _, m := range list.Members {
		byID[m.ID] = len(snap.Members)
		snap.Members = append(snap.Members, etcdstate.Member{
			ID:         m.ID,
			Name:       m.Name,
			PeerURLs:   append([]string(nil), m.PeerURLs...),
			ClientURLs: append([]string(nil), m.ClientURLs...),
			IsLearner:  m.IsLearner,
		})
	}
	byName := map[string]int{}
	for i, m := range snap.Members {
		if m.Name != "" {
			byName[m.Name] = i
		}
	}

	var notes, conflicts []string
	// forked are the endpoints whose answers say a second membership is alive.
	forked := map[string]bool{}
	answeredBy := map[uint64]string{}
	var foreignLeaders []string
	alarms := map[uint64][]string{} // by member ID, as any member's Status lists them
	for i, mc := range members {
		ep, res := mc.endpoint, statuses[i]
		if res.status == nil {
			if j, ok := byName[ep.Member]; ok {
				snap.Members[j].Errors = append(snap.Members[j].Errors, res.statusErr.Error())
			} else {
				notes = append(notes, fmt.Sprintf("%s: %v", ep.Member, res.statusErr))
			}
			continue
		}
		st := res.status
		if st.Header.ClusterId != snap.ClusterID {
			conflicts = append(conflicts, fmt.Sprintf("%s answers for cluster %x, the member list for %x", ep.Member, st.Header.ClusterId, snap.ClusterID))
			forked[ep.Member] = true
			continue
		}
		j, ok := byID[st.Header.MemberId]
		if !ok {
			// A member removed from this list that still serves, or one started on its own
			// (a forced new cluster, a copied volume). One that leads has a membership of its
			// own that may take writes this one never sees: a fork. One that does not is
			// reported for the planner, which knows the member IDs its pods had.
			if !isSelfLeader(st) {
				snap.Unlisted = append(snap.Unlisted, etcdstate.Unlisted{Endpoint: ep.Member, MemberID: st.Header.MemberId})
				continue
			}
			conflicts = append(conflicts, fmt.Sprintf("%s answers as member %x, which is not in the member list", ep.Member, st.Header.MemberId))
			forked[ep.Member] = true
			foreignLeaders = append(foreignLeaders, ep.Member)
			continue
		}
		if other, dup := answeredBy[st.Header.MemberId]; dup {
			conflicts = append(conflicts, fmt.Sprintf("%s and %s both answer as member %x", other, ep.Member, st.Header.MemberId))
			continue
		}
		answeredBy[st.Header.MemberId] = ep.Member
		m := &snap.Members[j]
		if m.Name != "" && m.Name != ep.Member {
			conflicts = append(conflicts, fmt.Sprintf("endpoint of %s answers as member %s", ep.Member, m.Name))
			continue
		}
		m.Reachable = true
		m.IsLeader = isSelfLeader(st)
		m.RaftIndex = st.RaftIndex
		m.RaftAppliedIndex = st.RaftAppliedIndex
		m.RaftTerm = st.RaftTerm
		m.Version = st.Version
		m.DBSize, m.DBSizeInUse, m.DBSizeQuota = st.DbSize, st.DbSizeInUse, st.DbSizeQuota
		m.Errors = append(m.Errors, st.Errors...)
		// Every member's Status lists the cluster's alarms: they are the alarmed members'
		// state, not this member's, which is judged by its other errors and its read.
		failures := 0
		for _, e := range st.Errors {
			if id, alarm, ok := parseAlarm(e); ok {
				alarms[id] = append(alarms[id], alarm)
			} else {
				failures++
			}
		}
		if res.healthErr != nil {
			m.Errors = append(m.Errors, "health read: "+res.healthErr.Error())
		}
		m.Healthy = failures == 0 && res.healthErr == nil
	}
	for _, id := range slices.Sorted(maps.Keys(alarms)) {
		as := alarms[id]
		slices.Sort(as)
		as = slices.Compact(as)
		for _, a := range as {
			snap.Alarms = append(snap.Alarms, etcdstate.Alarm{MemberID: id, Type: a})
		}
		if j, ok := byID[id]; ok {
			snap.Members[j].Alarms = as
			// NOSPACE refuses writes everywhere but leaves the member reading and voting;
			// CORRUPT says this member's data cannot be trusted.
			if slices.Contains(as, "CORRUPT") {
				snap.Members[j].Healthy = false
			}
		}
	}

	snap.Complete = true
	for _, m := range snap.Members {
		snap.Complete = snap.Complete && m.Reachable
	}
	sort.Slice(snap.Members, func(a, b int) bool { return snap.Members[a].ID < snap.Members[b].ID })
	leaders, conflict := leaderConflict(snap.Members, foreignLeaders)
	if conflict != "" {
		conflicts = append(conflicts, conflict)
		for _, l := range leaders {
			forked[l] = true
		}
	}
	snap.Inconsistent = strings.Join(conflicts, "; ")
	snap.Forked = slices.Sorted(maps.Keys(forked))
	snap.Err = strings.Join(notes, "; ")
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
