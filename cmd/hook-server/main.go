// Command hook-server serves Metacontroller's sync, finalize and customize hooks for
// EtcdClusters, with health, readiness and Prometheus metrics on the same port.
//
// Every flag can also be set from the environment: --sync-timeout is ETCDOPS_SYNC_TIMEOUT.
// A flag on the command line wins over the environment.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"etcdops.dev/etcdops/cmd/hook-server/hookserver"
	"etcdops.dev/etcdops/gcpace"
	"etcdops.dev/etcdops/hooks"
	"etcdops.dev/etcdops/kubeevents"
	"etcdops.dev/etcdops/membership"
	"etcdops.dev/etcdops/sync"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, nil); err != nil {
		fmt.Fprintln(os.Stderr, "hook-server:", err)
		os.Exit(1)
	}
}

// config is the parsed command line.
type config struct {
	addr            string
	clusterDomain   string
	toolImage       string
	syncTimeout     time.Duration
	observeTimeout  time.Duration
	slowMember      time.Duration
	maxClusters     int
	maxRolls        int
	idleClusters    time.Duration
	drainPeriod     time.Duration
	shutdownTimeout time.Duration
	headerTimeout   time.Duration
	maxBodyBytes    int64
	logLevel        string
	logFormat       string
	tlsCertFile     string
	tlsKeyFile      string
	authTokenFile   string
	events          bool
	kubeconfig      string
	gcHeadroom      uint64
}

// envPrefix turns a flag name into its environment variable: sync-timeout → ETCDOPS_SYNC_TIMEOUT.
const envPrefix = "ETCDOPS_"

func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseFlags reads the environment first and the command line over it.
func parseFlags(args []string, getenv func(string) string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("hook-server", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.addr, "addr", ":8080", "address to listen on")
	fs.StringVar(&c.clusterDomain, "cluster-domain", "cluster.local", "the Kubernetes cluster's DNS domain, used in member URLs")
	fs.StringVar(&c.toolImage, "tool-image", "etcdops/etcdops:v0.1.0", "image holding etcdops-member, run by member Jobs and etcd pods' init container")
	// Metacontroller gives up after 10s by default; leave room for the network and a retry.
	fs.DurationVar(&c.syncTimeout, "sync-timeout", hooks.DefaultSyncTimeout, "upper bound of one hook call, etcd observation included")
	fs.DurationVar(&c.observeTimeout, "observe-timeout", hooks.DefaultObserveTimeout, "upper bound of one etcd observation; past it the sync holds")
	fs.DurationVar(&c.slowMember, "slow-member-timeout", membership.DefaultSlowMember, "once one etcd member has answered, how long the others are waited for; a slower one is reported unknown for that sync")
	fs.IntVar(&c.maxRolls, "max-concurrent-rolls", 4, "how many clusters' pods roll at once through this replica; the others' rolls wait (0: no bound)")
	fs.IntVar(&c.maxClusters, "max-cached-clusters", membership.DefaultMaxClients, "how many clusters keep open etcd clients between syncs")
	// Metacontroller resyncs every cluster every 30s; an idle cluster is one it stopped syncing.
	fs.DurationVar(&c.idleClusters, "idle-cluster-timeout", membership.DefaultIdleTimeout, "a cluster not synced for this long has its etcd connections closed")
	// The readiness probe (every 5s, 2 failures) and the endpoints update need this long to
	// take the pod out of the Service.
	fs.DurationVar(&c.drainPeriod, "drain-period", 15*time.Second, "after SIGTERM, how long /readyz answers 503 while calls are still served")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 20*time.Second, "after the drain, how long in-flight calls may take to finish")
	fs.DurationVar(&c.headerTimeout, "read-header-timeout", 10*time.Second, "time a client gets to send its request headers; a slower connection is closed")
	fs.Int64Var(&c.maxBodyBytes, "max-body-bytes", hooks.DefaultMaxBodyBytes, "largest request body accepted; larger ones get 413")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "json", "json or text")
	fs.StringVar(&c.tlsCertFile, "tls-cert-file", "", "serve HTTPS with this certificate (with --tls-key-file)")
	fs.StringVar(&c.tlsKeyFile, "tls-key-file", "", "private key of --tls-cert-file")
	fs.StringVar(&c.authTokenFile, "auth-token-file", "", "file holding the bearer token every hook call must present")
	fs.BoolVar(&c.events, "events", true, "emit Events on EtcdClusters through the Kubernetes API, with the pod's service account or --kubeconfig; off where neither is found")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig for the Events, when not running in a pod")
	c.gcHeadroom = gcpace.DefaultHeadroom
	fs.Func("gc-headroom", "garbage the Go collector may let build up between collections, as a Kubernetes quantity (16Mi), when that is less than GOGC's share of live memory; 0 leaves GOGC alone (default 16Mi)", func(v string) error {
		q, err := resource.ParseQuantity(v)
		if err != nil || q.Sign() < 0 {
			return fmt.Errorf("%q is not a size such as 16Mi", v)
		}
		c.gcHeadroom = uint64(q.Value())
		return nil
	})

	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if v := getenv(envName(f.Name)); v != "" && envErr == nil {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("%s=%q: %v", envName(f.Name), v, err)
			}
		}
	})
	if envErr != nil {
		return c, envErr
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	switch {
	case (c.tlsCertFile == "") != (c.tlsKeyFile == ""):
		return c, errors.New("--tls-cert-file and --tls-key-file go together")
	case c.syncTimeout <= 0 || c.observeTimeout <= 0 || c.slowMember <= 0 || c.headerTimeout <= 0 || c.idleClusters <= 0:
		return c, errors.New("--sync-timeout, --observe-timeout, --slow-member-timeout, --read-header-timeout and --idle-cluster-timeout must be positive")
	case c.slowMember >= c.observeTimeout:
		return c, fmt.Errorf("--slow-member-timeout %s must be below --observe-timeout %s", c.slowMember, c.observeTimeout)
	case c.maxClusters <= 0:
		return c, errors.New("--max-cached-clusters must be positive")
	case c.maxRolls < 0:
		return c, errors.New("--max-concurrent-rolls cannot be negative (0 bounds nothing)")
	case c.drainPeriod < 0 || c.shutdownTimeout < 0:
		return c, errors.New("--drain-period and --shutdown-timeout cannot be negative")
	case c.observeTimeout >= c.syncTimeout:
		return c, fmt.Errorf("--observe-timeout %s must be below --sync-timeout %s, so a slow etcd still gets an answer", c.observeTimeout, c.syncTimeout)
	case c.maxBodyBytes <= 0:
		return c, errors.New("--max-body-bytes must be positive")
	}
	return c, nil
}

func newLogger(c config, out io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %v", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch c.logFormat {
	case "json":
		return slog.New(slog.NewJSONHandler(out, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(out, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: allowed json or text", c.logFormat)
}

// run serves until ctx is done, then drains and shuts down as hookserver.Serve does. dial
// connects to etcd members; nil dials directly.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer, dial func(context.Context, string) (net.Conn, error)) error {
	c, err := parseFlags(args, getenv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	log, err := newLogger(c, stdout)
	if err != nil {
		return err
	}
	var token string
	if c.authTokenFile != "" {
		b, err := os.ReadFile(c.authTokenFile)
		if err != nil {
			return fmt.Errorf("--auth-token-file: %w", err)
		}
		if token = strings.TrimSpace(string(b)); token == "" {
			return fmt.Errorf("--auth-token-file %s is empty", c.authTokenFile)
		}
	}
	events, err := newEvents(c, log)
	if err != nil {
		return err
	}
	if events != nil {
		defer events.Stop()
	}
	srv := hookserver.New(hookserver.Options{
		Config:             sync.Config{ClusterDomain: c.clusterDomain, ToolImage: c.toolImage},
		SyncTimeout:        c.syncTimeout,
		ObserveTimeout:     c.observeTimeout,
		SlowMember:         c.slowMember,
		MaxClusters:        c.maxClusters,
		MaxConcurrentRolls: c.maxRolls,
		IdleClusterTimeout: c.idleClusters,
		MaxBodyBytes:       c.maxBodyBytes,
		AuthToken:          token,
		TLSCertFile:        c.tlsCertFile,
		TLSKeyFile:         c.tlsKeyFile,
		DrainPeriod:        c.drainPeriod,
		ShutdownTimeout:    c.shutdownTimeout,
		HeaderTimeout:      c.headerTimeout,
		Log:                log,
		Dial:               dial,
		Events:             eventSink(events),
		GCHeadroom:         c.gcHeadroom,
	})
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return err
	}
	return srv.Serve(ctx, ln)
}

// newEvents starts the Events recorder: through --kubeconfig, else the pod's service account;
// nil when --events is off, or outside a pod without a kubeconfig (go run on a laptop).
func newEvents(c config, log *slog.Logger) (*kubeevents.Recorder, error) {
	if !c.events {
		return nil, nil
	}
	var cfg *rest.Config
	var err error
	if c.kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	} else if cfg, err = rest.InClusterConfig(); errors.Is(err, rest.ErrNotInCluster) {
		log.Info("events off: not in a pod, and no --kubeconfig")
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	// client-go's event recorder logs through klog: into the hook's log.
	klog.SetSlogLogger(log)
	return kubeevents.New(cfg, log)
}

// eventSink is events as the handler takes it: a nil recorder is no sink at all.
func eventSink(events *kubeevents.Recorder) hooks.EventSink {
	if events == nil {
		return nil
	}
	return events
}
