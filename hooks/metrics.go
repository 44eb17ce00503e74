package hooks

import (
	"net/http"
	"strconv"
	"strings"
	gosync "sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"etcdops.dev/etcdops/sync"
)

// metrics are the hook's own series, on a registry per handler so that tests and several
// handlers in one process do not collide.
type metrics struct {
	registry        *prometheus.Registry
	duration        *prometheus.HistogramVec
	decisions       *prometheus.CounterVec
	observeFailures prometheus.Counter
	observeDuration prometheus.Histogram
	rollWaits       prometheus.Counter
	staleParents    prometheus.Counter
	clusters        *clusterCollector
}

func newMetrics(now func() time.Time) *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "etcdops_hook_request_duration_seconds",
			Help: "Time to answer a hook call, by hook (sync, finalize, customize) and outcome (HTTP status).",
			// From 1ms (a plan with no etcd call) to Metacontroller's 10s timeout.
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"hook", "outcome"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "etcdops_hook_decisions_total",
			Help: "Decisions returned by sync and finalize, by action type.",
		}, []string{"action"}),
		observeFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "etcdops_hook_etcd_observation_failures_total",
			Help: "etcd observations that could not ask the cluster (the sync then holds).",
		}),
		observeDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "etcdops_hook_etcd_observation_duration_seconds",
			Help:    "Time to observe etcd membership and member status in one sync.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}),
		rollWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "etcdops_hook_roll_waits_total",
			Help: "Syncs whose roll waited for a slot (--max-concurrent-rolls).",
		}),
		staleParents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "etcdops_hook_stale_parents_total",
			Help: "Syncs handed a status older than this replica's newest answer, planned from the newest instead.",
		}),
		clusters: newClusterCollector(now),
	}
	m.registry.MustRegister(m.duration, m.decisions, m.observeFailures, m.observeDuration, m.rollWaits, m.staleParents, m.clusters,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}

// instrument times each hook call, labelled by the route's hook name and the status it
// answered with. It sits outside the recoverer, so a panic counts as a 500.
func (m *metrics) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		next.ServeHTTP(ww, r)
		status := ww.Status()
		if status == 0 {
			status = http.StatusOK
		}
		hook := strings.TrimPrefix(chi.RouteContext(r.Context()).RoutePattern(), "/")
		m.duration.WithLabelValues(hook, strconv.Itoa(status)).Observe(time.Since(start).Seconds())
	})
}

// How long a cluster's series outlive its last sync here. Metacontroller syncs every cluster
// at least every 30 s, but through one kept-alive connection, so with several hook replicas
// one may serve a cluster for hours while another's last view of it ages: that view is
// dropped after stateTTL (4 resyncs), and only the time of the last sync is kept for
// syncTTL, long enough for an alert that a cluster is no longer synced at all.
const (
	stateTTL = 2 * time.Minute
	syncTTL  = time.Hour
)

// clusterCollector reports the last sync of each cluster: one gauge per fact, labelled by the
// cluster's namespace and name, and per member by its ordinal (at most 9 members, plus one
// while a cluster of two rolls: bounded, and stable across member replacements, unlike member
// IDs). A finalized cluster's series go at once.
type clusterCollector struct {
	now      func() time.Time
	mu       gosync.Mutex
	clusters map[string]clusterSeen
}

type clusterSeen struct {
	m  sync.ClusterMetrics
	at time.Time
}

func newClusterCollector(now func() time.Time) *clusterCollector {
	return &clusterCollector{now: now, clusters: map[string]clusterSeen{}}
}

// observe records one sync's metrics, taken at at.
func (c *clusterCollector) observe(m sync.ClusterMetrics, at time.Time) {
	key := m.Namespace + "/" + m.Name
	c.mu.Lock()
	defer c.mu.Unlock()
	if m.Finalized {
		delete(c.clusters, key)
		return
	}
	c.clusters[key] = clusterSeen{m: m, at: at}
}

var (
	clusterLabels     = []string{"namespace", "name"}
	descSize          = clusterDesc("size", "Voting members the spec asks for.")
	descVoters        = clusterDesc("voters", "Voting members etcd lists (the last known membership while etcd's answer cannot be used).")
	descHealthyVoters = clusterDesc("healthy_voters", "Voting members that answered healthy in the last sync; 0 when etcd did not answer.")
	descQuorum        = clusterDesc("quorum_size", "Voters a change needs to commit: a majority of the voters; 0 before there are any.")
	descLearners      = clusterDesc("learners", "Learners etcd lists.")
	descLeader        = clusterDesc("leader_known", "1 when etcd answered in the last sync and a member leads.")
	descAction        = clusterDesc("action", "1 for the current action type, 0 for the others.", "action")
	descActionSeconds = clusterDesc("action_seconds", "Seconds since the current action (same type and member) was first decided.")
	descJobFailures   = clusterDesc("member_job_failures", "Failed member Jobs of the current step.")
	descQuota         = clusterDesc("db_quota_bytes", "Backend quota each member enforces (--quota-backend-bytes, else etcd's 2 GiB); absent when disabled.")
	descDBSize        = prometheus.NewDesc("etcdops_member_db_size_bytes", "Size of a member's backend database, by the ordinal of its pod.", append(clusterLabels, "ordinal"), nil)
	descAlarms        = clusterDesc("alarms", "Members raising the alarm.", "alarm")
	descCondition     = clusterDesc("condition", "1 for each status condition, labelled with its status and reason.", "type", "status", "reason")
	descLastSync      = clusterDesc("last_sync_timestamp_seconds", "Unix time of the last sync of the cluster this hook answered.")
)

func clusterDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc("etcdops_cluster_"+name, help, append(append([]string(nil), clusterLabels...), labels...), nil)
}

// Describe sends every descriptor the collector may emit.
func (c *clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSize, descVoters, descHealthyVoters, descQuorum, descLearners, descLeader, descAction,
		descActionSeconds, descJobFailures, descQuota, descDBSize, descAlarms, descCondition, descLastSync} {
		ch <- d
	}
	describeBackups(ch)
}

// Collect emits each cluster's last sync, dropping what is older than the TTLs.
func (c *clusterCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, seen := range c.clusters {
		age := now.Sub(seen.at)
		if age > syncTTL {
			delete(c.clusters, key)
			continue
		}
		m := seen.m
		gauge := func(d *prometheus.Desc, v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{m.Namespace, m.Name}, labels...)...)
		}
		gauge(descLastSync, float64(seen.at.UnixNano())/1e9)
		if age > stateTTL {
			continue
		}
		gauge(descSize, float64(m.Size))
		gauge(descVoters, float64(m.Voters))
		gauge(descHealthyVoters, float64(m.HealthyVoters))
		gauge(descQuorum, float64(m.QuorumSize))
		gauge(descLearners, float64(m.Learners))
		gauge(descLeader, boolValue(m.LeaderKnown))
		for _, t := range sync.ActionTypes() {
			gauge(descAction, boolValue(t == m.Action), t.String())
		}
		if !m.ActionSince.IsZero() {
			gauge(descActionSeconds, max(0, now.Sub(m.ActionSince).Seconds()))
		}
		gauge(descJobFailures, float64(m.JobFailures))
		if m.QuotaBytes > 0 {
			gauge(descQuota, float64(m.QuotaBytes))
		}
		for _, mm := range m.Members {
			gauge(descDBSize, float64(mm.DBSizeBytes), strconv.Itoa(mm.Ordinal))
		}
		for _, a := range sync.AlarmNames {
			gauge(descAlarms, float64(m.Alarms[a]), a)
		}
		for _, cond := range m.Conditions {
			gauge(descCondition, 1, cond.Type, string(cond.Status), cond.Reason)
		}
		collectBackups(m, gauge)
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
