package hooks

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the hook's own series, on a registry per handler so that tests and several
// handlers in one process do not collide.
type metrics struct {
	registry        *prometheus.Registry
	duration        *prometheus.HistogramVec
	decisions       *prometheus.CounterVec
	observeFailures prometheus.Counter
	observeDuration prometheus.Histogram
}

func newMetrics() *metrics {
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
	}
	m.registry.MustRegister(m.duration, m.decisions, m.observeFailures, m.observeDuration,
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
