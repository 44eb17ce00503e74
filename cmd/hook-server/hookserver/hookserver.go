// Package hookserver builds and runs the hook server: the hooks handler over the real
// membership Observer, on one listener, with a shutdown that drains. cmd/hook-server runs it
// from its flags; the test harness and the benchmarks start it through the same New, so what
// they exercise is what ships.
package hookserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"etcdops.dev/etcdops/gcpace"
	"etcdops.dev/etcdops/hooks"
	"etcdops.dev/etcdops/membership"
	"etcdops.dev/etcdops/sync"
)

// Options configure a Server; zero durations and sizes take the hooks' and the Observer's
// defaults.
type Options struct {
	Config         sync.Config
	SyncTimeout    time.Duration
	ObserveTimeout time.Duration
	// SlowMember is how long members still silent are waited for once one has answered.
	SlowMember time.Duration
	// MaxClusters bounds how many clusters keep cached etcd clients.
	MaxClusters int
	// IdleClusterTimeout closes a cluster's etcd clients when it was not synced for this long.
	IdleClusterTimeout time.Duration
	// MaxConcurrentRolls bounds the clusters whose pods roll at once; 0 bounds nothing.
	MaxConcurrentRolls int
	MaxBodyBytes       int64
	AuthToken          string
	// TLSCertFile and TLSKeyFile, when set, serve HTTPS.
	TLSCertFile, TLSKeyFile string
	// DrainPeriod is how long /readyz answers 503 before the listener closes, so the
	// Service stops routing calls here first.
	DrainPeriod time.Duration
	// ShutdownTimeout is how long in-flight calls may take after the drain.
	ShutdownTimeout time.Duration
	// HeaderTimeout is how long a client may take to send its request headers; 10s when 0.
	HeaderTimeout time.Duration
	Log           *slog.Logger
	// Now is the planner's clock; time.Now when nil.
	Now func() time.Time
	// Dial connects to etcd members; nil dials TCP directly.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// Events emits decisions' Events on their EtcdClusters; none when nil.
	Events hooks.EventSink
	// GCHeadroom bounds the garbage kept between collections, in bytes, below GOGC's share
	// of live memory (gcpace); 0 leaves GOGC alone.
	GCHeadroom uint64
}

// Server is one hook server. Serve it once; Close releases it at once.
type Server struct {
	opts     Options
	observer *membership.Observer
	http     *http.Server
	ready    atomic.Bool
}

// New wires the hooks handler to a new membership Observer.
func New(o Options) *Server {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.SyncTimeout <= 0 {
		o.SyncTimeout = hooks.DefaultSyncTimeout
	}
	if o.HeaderTimeout <= 0 {
		o.HeaderTimeout = 10 * time.Second
	}
	s := &Server{opts: o}
	s.observer = membership.NewObserver(membership.ObserverOptions{
		Deadline:    o.ObserveTimeout,
		SlowMember:  o.SlowMember,
		MaxClients:  o.MaxClusters,
		IdleTimeout: o.IdleClusterTimeout,
		Dial:        o.Dial,
	})
	handler := hooks.NewHandler(hooks.Deps{
		Config:             o.Config,
		Etcd:               s.observer,
		Progress:           hooks.NewHTTPProgress(),
		Log:                o.Log,
		Now:                o.Now,
		MaxBodyBytes:       o.MaxBodyBytes,
		SyncTimeout:        o.SyncTimeout,
		ObserveTimeout:     o.ObserveTimeout,
		AuthToken:          o.AuthToken,
		Ready:              s.ready.Load,
		Events:             o.Events,
		MaxConcurrentRolls: o.MaxConcurrentRolls,
	})
	// A client that sends its headers, or its body, too slowly (a slow-loris) is cut off: the
	// headers get HeaderTimeout, the whole request and the answer SyncTimeout and ten seconds
	// more (a body of MaxBodyBytes over a slow link); an idle keep-alive connection is closed
	// after two minutes. Headers beyond 64 KiB get 431: Metacontroller sends a few hundred
	// bytes.
	s.http = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: o.HeaderTimeout,
		ReadTimeout:       o.SyncTimeout + 10*time.Second,
		WriteTimeout:      o.SyncTimeout + 10*time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(o.Log.Handler(), slog.LevelWarn),
	}
	return s
}

// Serve answers on ln until ctx is done. Then /readyz answers 503 for DrainPeriod while calls
// are still served, the listener closes, and in-flight calls get ShutdownTimeout to finish.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	defer s.observer.Close()
	served := make(chan error, 1)
	go func() {
		if s.opts.TLSCertFile != "" {
			served <- s.http.ServeTLS(ln, s.opts.TLSCertFile, s.opts.TLSKeyFile)
			return
		}
		served <- s.http.Serve(ln)
	}()
	s.opts.Log.Info("listening", "addr", ln.Addr().String(), "tls", s.opts.TLSCertFile != "", "auth", s.opts.AuthToken != "",
		"clusterDomain", s.opts.Config.ClusterDomain, "toolImage", s.opts.Config.ToolImage,
		"syncTimeout", s.opts.SyncTimeout.String(), "observeTimeout", s.opts.ObserveTimeout.String(), "drainPeriod", s.opts.DrainPeriod.String())
	s.ready.Store(true)
	paceCtx, stopPacing := context.WithCancel(ctx)
	paced := make(chan struct{})
	go func() { gcpace.Run(paceCtx, s.opts.GCHeadroom, time.Second); close(paced) }()
	defer func() { stopPacing(); <-paced }()

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	s.ready.Store(false)
	s.opts.Log.Info("draining", "period", s.opts.DrainPeriod.String())
	select {
	case err := <-served:
		return err
	case <-time.After(s.opts.DrainPeriod):
	}
	s.opts.Log.Info("shutting down", "timeout", s.opts.ShutdownTimeout.String())
	shutdownCtx, cancel := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
	defer cancel()
	if err := s.http.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	s.opts.Log.Info("stopped")
	return nil
}

// Close stops at once, as a crash would: connections are closed, in-flight calls dropped,
// and the Observer's clients released.
func (s *Server) Close() {
	s.ready.Store(false)
	s.http.Close()
	s.observer.Close()
}
