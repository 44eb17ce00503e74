// Package hooks is the HTTP face of the operator: Metacontroller's sync, finalize and
// customize hooks, health and metrics. Each hook decodes the request, observes etcd when
// there are member pods, asks the planner in sync for a decision and encodes it. The
// decision itself is made in sync; nothing here changes etcd or Kubernetes. A replica keeps
// only what spares work or undoes Metacontroller's lag between syncs: certificate checks
// (certs.go), roll slots (rolls.go) and its newest answer per cluster (statusmemo.go).
package hooks

import (
	"context"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/sync"
)

// Defaults for zero Deps fields.
const (
	DefaultMaxBodyBytes   = 8 << 20
	DefaultSyncTimeout    = 5 * time.Second
	DefaultObserveTimeout = 3 * time.Second
	// DefaultProgressTimeout bounds reading the continuous backup's progress: a small JSON
	// answer in the cluster's network.
	DefaultProgressTimeout = time.Second
)

// Observer reads one snapshot of an etcd cluster under the context's deadline. It never
// fails: what it could not learn is in the snapshot (Asked false, Err). *membership.Observer
// is the real one; tests pass an ObserverFunc.
type Observer interface {
	Observe(ctx context.Context, req etcdstate.Request) etcdstate.Snapshot
}

// ObserverFunc is an Observer made of a function.
type ObserverFunc func(ctx context.Context, req etcdstate.Request) etcdstate.Snapshot

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, req etcdstate.Request) etcdstate.Snapshot {
	return f(ctx, req)
}

// ProgressReader reads the continuous backup's progress from url under the context's
// deadline. It never fails: what it could not read is Known false with the reason, which the
// planner reports and acts on in no way. *HTTPProgress is the real one; tests pass a
// ProgressReaderFunc.
type ProgressReader interface {
	ReadProgress(ctx context.Context, url string) sync.StreamProgress
}

// ProgressReaderFunc is a ProgressReader made of a function.
type ProgressReaderFunc func(ctx context.Context, url string) sync.StreamProgress

// ReadProgress calls f.
func (f ProgressReaderFunc) ReadProgress(ctx context.Context, url string) sync.StreamProgress {
	return f(ctx, url)
}

// Deps is what the handler needs from its host. Zero durations and sizes take the defaults.
type Deps struct {
	// Config shapes what the planner renders.
	Config sync.Config
	// Etcd observes etcd; it must not be nil. It is called only when there are member pods.
	Etcd Observer
	// Progress reads the continuous backup's progress; a new *HTTPProgress when nil. It is
	// called only when the stream's Deployment is observed.
	Progress ProgressReader
	// Log receives one line per hook call and every refused request.
	Log *slog.Logger
	// Now is the planner's clock; time.Now when nil.
	Now func() time.Time
	// MaxBodyBytes bounds a request body; larger bodies get 413.
	MaxBodyBytes int64
	// SyncTimeout bounds one hook call, etcd observation included.
	SyncTimeout time.Duration
	// ObserveTimeout bounds the etcd observation; past it the sync holds.
	ObserveTimeout time.Duration
	// ProgressTimeout bounds reading the continuous backup's progress; past it the progress
	// is unknown.
	ProgressTimeout time.Duration
	// AuthToken, when set, is the bearer token every hook call must present.
	AuthToken string
	// Ready reports readiness for /readyz; always ready when nil.
	Ready func() bool
	// Events emits each decision's Events on its EtcdCluster; none when nil. A sink that is
	// also a prometheus.Collector has its metrics served with the hook's.
	Events EventSink
	// MaxConcurrentRolls bounds the clusters whose pods roll at once through this handler
	// (rollSlots); 0 bounds nothing.
	MaxConcurrentRolls int
}

// EventSink emits Events on the EtcdCluster ref names. It must not block: the sync has
// answered by then. *kubeevents.Recorder is the real one.
type EventSink interface {
	Emit(ref *corev1.ObjectReference, events []sync.Event)
}

// handler holds the dependencies the hook endpoints share.
type handler struct {
	Deps
	metrics  *metrics
	certs    certMemo
	statuses statusMemo
	rolls    *rollSlots
}

// NewHandler builds the router: request IDs, then for the hooks timing, panic recovery,
// authentication, a body limit and a deadline; then the routes.
func NewHandler(d Deps) http.Handler {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.MaxBodyBytes <= 0 {
		d.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if d.SyncTimeout <= 0 {
		d.SyncTimeout = DefaultSyncTimeout
	}
	if d.ObserveTimeout <= 0 {
		d.ObserveTimeout = DefaultObserveTimeout
	}
	if d.ProgressTimeout <= 0 {
		d.ProgressTimeout = DefaultProgressTimeout
	}
	if d.Progress == nil {
		d.Progress = NewHTTPProgress()
	}
	h := &handler{Deps: d, metrics: newMetrics(d.Now), rolls: newRollSlots(d.MaxConcurrentRolls)}
	h.metrics.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "etcdops_hook_rolling_clusters",
		Help: "Clusters whose pods roll through this hook replica, holding one of its --max-concurrent-rolls slots.",
	}, func() float64 { return float64(h.rolls.inUse()) }))
	if c, ok := d.Events.(prometheus.Collector); ok {
		h.metrics.registry.MustRegister(c)
	}

	r := chi.NewRouter()
	r.Use(middleware.RequestID)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, h.Log, refuse(errNotFound, "%s", r.URL.Path))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, h.Log, refuse(errMethodNotAllowed, "%s %s", r.Method, r.URL.Path))
	})
	r.Group(func(r chi.Router) {
		r.Use(h.metrics.instrument, h.recoverer, h.authenticate, h.limit)
		r.Post("/sync", h.sync)
		r.Post("/finalize", h.finalize)
		r.Post("/customize", h.customize)
	})
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	r.Get("/readyz", h.readyz)
	r.Method(http.MethodGet, "/metrics", h.metrics.handler())
	return r
}

func (h *handler) readyz(w http.ResponseWriter, r *http.Request) {
	if h.Ready != nil && !h.Ready() {
		writeError(w, r, h.Log, refuse(errNotReady, "the server is shutting down"))
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// recoverer turns a panic into a 500 so the server keeps serving; the stack goes to the log
// with the request ID. http.ErrAbortHandler is net/http's own signal and passes through.
func (h *handler) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			h.Log.Error("panic in hook", "requestID", middleware.GetReqID(r.Context()), "path", r.URL.Path,
				"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			writeError(w, r, h.Log, fmt.Errorf("the hook failed on this request (request ID %s): %v", middleware.GetReqID(r.Context()), v))
		}()
		next.ServeHTTP(w, r)
	})
}

// authenticate requires "Authorization: Bearer <token>" when a token is configured.
func (h *handler) authenticate(next http.Handler) http.Handler {
	if h.AuthToken == "" {
		return next
	}
	want := []byte("Bearer " + h.AuthToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			writeError(w, r, h.Log, refuse(errUnauthorized, "missing or wrong bearer token"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// limit caps the body and the time of one hook call.
func (h *handler) limit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), h.SyncTimeout)
		defer cancel()
		r.Body = http.MaxBytesReader(w, r.Body, h.MaxBodyBytes)
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}
