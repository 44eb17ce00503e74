package membership

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"etcdops.dev/etcdops/etcdstate"
)

// ObserverOptions configure an Observer; zero values take the defaults.
type ObserverOptions struct {
	// Deadline bounds one whole observation. Default 3s.
	Deadline time.Duration
	// MaxClients bounds how many clusters keep cached clients. Default 64.
	MaxClients int
	// IdleTimeout closes a cluster's clients when it has not been observed for this long.
	// Default 5m.
	IdleTimeout time.Duration
}

// Observer reads etcd clusters, reusing clients between observations of the same cluster.
// It is safe for concurrent use.
type Observer struct {
	deadline time.Duration
	cache    *clientCache
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
}

// NewObserver starts an Observer; Close it to release its clients.
func NewObserver(opts ObserverOptions) *Observer {
	if opts.Deadline <= 0 {
		opts.Deadline = 3 * time.Second
	}
	if opts.MaxClients <= 0 {
		opts.MaxClients = 64
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = 5 * time.Minute
	}
	o := &Observer{
		deadline: opts.Deadline,
		cache: &clientCache{
			max:            opts.MaxClients,
			idle:           opts.IdleTimeout,
			connectTimeout: opts.Deadline,
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

// Observe reads the cluster under one deadline: Status and a serializable read from every
// endpoint in parallel (within the first half), then the member list and alarms from a
// voter (linearizable in the third quarter, else serializable). It never returns an
// error: what could not be asked is said in the Snapshot (Asked, Err, Reachable, Errors).
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

	// A member that hangs must not use up the deadline the member list still needs.
	statusCtx, cancelStatus := halfOfRemaining(ctx)
	statuses := askEndpoints(statusCtx, clients.members)
	cancelStatus()
	voters := voterOrder(clients.members, statuses)
	if len(voters) == 0 {
		return etcdstate.Snapshot{Err: "no voter answered Status: " + endpointErrors(clients.members, statuses)}
	}
	leaderKnown := false
	for _, i := range voters {
		leaderKnown = leaderKnown || statuses[i].status.Leader != 0
	}
	list, alarms, note, err := readMembership(ctx, clients.members, voters, leaderKnown)
	if err != nil {
		return etcdstate.Snapshot{Err: err.Error() + "; " + endpointErrors(clients.members, statuses)}
	}
	snap := assemble(clients.members, statuses, list, alarms)
	snap.Err = joinNonEmpty("; ", note, snap.Err)
	return snap
}

// askEndpoints asks every endpoint for Status, then for a serializable read, in parallel.
func askEndpoints(ctx context.Context, members []*memberClient) []endpointStatus {
	out := make([]endpointStatus, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		wg.Go(func() {
			st, err := m.maint.Status(ctx, "")
			if err == nil && st.Header == nil {
				st, err = nil, errors.New("status without a response header")
			}
			out[i] = endpointStatus{status: st, statusErr: err}
			if err != nil {
				return
			}
			_, out[i].healthErr = m.cli.Get(ctx, "health", clientv3.WithSerializable())
		})
	}
	wg.Wait()
	return out
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

// readMembership reads the member list from a voter, linearizably when a leader is known.
// Without a leader a linearizable read cannot succeed, so it falls back to a serializable
// read and says so in note: the planner still sees who is a member, and that quorum is gone.
// Alarms need raft too and are read only with a leader.
func readMembership(ctx context.Context, members []*memberClient, voters []int, leaderKnown bool) (*clientv3.MemberListResponse, *clientv3.AlarmResponse, string, error) {
	var lastErr error
	if leaderKnown {
		budget, cancel := halfOfRemaining(ctx)
		defer cancel()
		var alarms *clientv3.AlarmResponse
		var wg sync.WaitGroup
		wg.Go(func() {
			// Alarms are best effort: Status errors carry them too.
			alarms, _ = members[voters[0]].maint.AlarmList(budget)
		})
		for _, i := range voters {
			list, err := members[i].cli.MemberList(budget)
			if err == nil {
				wg.Wait()
				return list, alarms, "", nil
			}
			lastErr = fmt.Errorf("member list from %s: %w", members[i].endpoint.Member, err)
			if budget.Err() != nil {
				break
			}
		}
		wg.Wait()
	}
	for _, i := range voters {
		list, err := members[i].cli.MemberList(ctx, clientv3.WithSerializable())
		if err == nil {
			note := fmt.Sprintf("no leader: member list read serializably from %s", members[i].endpoint.Member)
			if lastErr != nil {
				note = fmt.Sprintf("%s after %v", note, lastErr)
			}
			return list, nil, note, nil
		}
		lastErr = fmt.Errorf("member list from %s: %w", members[i].endpoint.Member, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, nil, "", lastErr
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
func assemble(members []*memberClient, statuses []endpointStatus, list *clientv3.MemberListResponse, alarms *clientv3.AlarmResponse) etcdstate.Snapshot {
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
	answeredBy := map[uint64]string{}
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
			continue
		}
		j, ok := byID[st.Header.MemberId]
		if !ok {
			notes = append(notes, fmt.Sprintf("%s answers as member %x, which is not in the member list", ep.Member, st.Header.MemberId))
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
		m.DBSize = st.DbSize
		m.Errors = append(m.Errors, st.Errors...)
		if res.healthErr != nil {
			m.Errors = append(m.Errors, "health read: "+res.healthErr.Error())
		}
		m.Healthy = len(st.Errors) == 0 && res.healthErr == nil
	}
	if alarms != nil {
		for _, a := range alarms.Alarms {
			if j, ok := byID[a.MemberID]; ok {
				snap.Members[j].Alarms = append(snap.Members[j].Alarms, a.Alarm.String())
				snap.Members[j].Healthy = false
			}
		}
	}

	snap.Complete = true
	for _, m := range snap.Members {
		snap.Complete = snap.Complete && m.Reachable
	}
	conflicts = append(conflicts, leaderConflicts(snap.Members)...)
	sort.Slice(snap.Members, func(a, b int) bool { return snap.Members[a].ID < snap.Members[b].ID })
	snap.Inconsistent = strings.Join(conflicts, "; ")
	snap.Err = strings.Join(notes, "; ")
	return snap
}

// leaderConflicts reports two members that both claim leadership in the same term; raft
// allows at most one leader per term, so the observation cannot be trusted.
func leaderConflicts(members []etcdstate.Member) []string {
	leaderOfTerm := map[uint64]string{}
	var out []string
	for _, m := range members {
		if !m.IsLeader {
			continue
		}
		if other, ok := leaderOfTerm[m.RaftTerm]; ok {
			out = append(out, fmt.Sprintf("%s and %s both lead term %d", other, m.Name, m.RaftTerm))
			continue
		}
		leaderOfTerm[m.RaftTerm] = m.Name
	}
	return out
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
