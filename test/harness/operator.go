package harness

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	gosync "sync"
	"time"

	"etcdops.dev/etcdops/cmd/etcdops-member/membertool"
	"etcdops.dev/etcdops/cmd/hook-server/hookserver"
	"etcdops.dev/etcdops/hooks"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/dialguard"
)

// InProcessHook starts the hook server exactly as cmd/hook-server builds it (hookserver.New:
// the hooks handler over the real membership Observer, with the shipped defaults) on an
// ephemeral port of 127.0.0.1, dialling etcd through dialguard: a dial outside 127.0.0.0/8
// is refused and panics, which fails the test or the playground at once.
// Stopping it closes the server and the Observer at once, as a crash would: the next start
// has no state from the last.
func InProcessHook(cfg sync.Config, log *slog.Logger) HookStarter {
	return InProcessHookWithEvents(cfg, log, nil)
}

// InProcessHookWithEvents is InProcessHook with the hook's Events going to events, as
// cmd/hook-server's --events sends them to the API server.
func InProcessHookWithEvents(cfg sync.Config, log *slog.Logger, events hooks.EventSink) HookStarter {
	return func(_ context.Context, clock *HookClock) (string, func(), error) {
		srv := hookserver.New(hookserver.Options{
			Config: cfg,
			Log:    log,
			Events: events,
			Now:    clock.Now,
			Dial: dialguard.Dialer(func(addr string) {
				panic(fmt.Sprintf("harness: the hook dialled %s, outside 127.0.0.0/8", addr))
			}),
		})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			srv.Close()
			return "", nil, err
		}
		go srv.Serve(context.Background(), ln)
		return "http://" + ln.Addr().String(), srv.Close, nil
	}
}

// HookClock is the hook's clock: the wall clock, except while Metacontroller holds it still
// to post the same request twice. The hook stamps a transition (status.action.since) with its
// clock, so two answers a second apart may rightly differ there; held, they must not differ
// at all.
type HookClock struct {
	mu   gosync.Mutex
	held time.Time
	// offset is how far the clock was moved on (Advance).
	offset time.Duration
}

// Advance moves the clock on by d from now on, as if that much time had passed for the hook.
func (c *HookClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}

// Now is the held time, or the wall clock moved on by the offset.
func (c *HookClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.held.IsZero() {
		return c.held
	}
	return time.Now().Add(c.offset)
}

// Hold stops the clock at the current time until the returned release is called.
func (c *HookClock) Hold() (release func()) {
	c.mu.Lock()
	c.held = time.Now().Add(c.offset)
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		c.held = time.Time{}
		c.mu.Unlock()
	}
}

// OperatorTools runs the real member tool in-process: Jobs through membertool.Run, as the
// binary's main does, but for the claims API, which is the store as the Job's pod may use it; etcd pods through membertool.LaunchArgv, which does everything
// `launch` does short of exec, and whose argv the kubelet then runs as an embedded member.
func OperatorTools() Tools {
	return Tools{
		Launch: func(_ context.Context, args []string) ([]string, error) {
			if len(args) == 0 || args[0] != "launch" {
				return nil, fmt.Errorf("not a launch command: %q", args)
			}
			argv, d, restored, err := membertool.LaunchArgv(args[1:])
			if err != nil {
				return nil, err
			}
			if restored != "" {
				return nil, ContainerExited{Message: restored}
			}
			if argv == nil {
				return nil, fmt.Errorf("%v: %s", d.Kind, d.Reason)
			}
			return argv[1:], nil
		},
		Member: func(ctx context.Context, args []string) (string, error) {
			var stdout, stderr bytes.Buffer
			if code := membertool.RunWithClaims(ctx, args, &stdout, &stderr, claimsOf(ctx)); code != membertool.ExitOK {
				return "", fmt.Errorf("exit %d: %s", code, strings.TrimSpace(stderr.String()))
			}
			return strings.TrimSpace(stdout.String()), nil
		},
	}
}
