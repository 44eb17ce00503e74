package gcpace

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name           string
		headroom, live uint64
		ceiling, want  int
	}{
		{"small: the ceiling", 32 * mib, 10 * mib, 200, 200},
		{"at the ceiling", 32 * mib, 16 * mib, 200, 200},
		{"a thousand clusters", 32 * mib, 90 * mib, 200, 35},
		{"past the floor", 32 * mib, 1024 * mib, 200, MinPercent},
		{"nothing live yet", 32 * mib, 0, 200, 200},
		{"a ceiling below the floor stays", 32 * mib, 1024 * mib, 10, 10},
	} {
		if got := Percent(c.headroom, c.live, c.ceiling); got != c.want {
			t.Errorf("%s: Percent(%d, %d, %d) = %d, want %d", c.name, c.headroom, c.live, c.ceiling, got, c.want)
		}
	}
}

func gcPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// Run lowers the percent once live memory outgrows the headroom, and gives the ceiling back
// when it stops.
func TestRunLowersThePercentAsLiveMemoryGrows(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(200))
	live := make([][]byte, 64)
	for i := range live {
		live[i] = make([]byte, 1<<20)
	}
	runtime.GC()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { Run(ctx, 16<<20, 10*time.Millisecond); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for gcPercent() == 200 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	got := gcPercent()
	cancel()
	<-done
	runtime.KeepAlive(live)
	if got != MinPercent {
		t.Errorf("with 64 MiB live and 16 MiB of headroom the percent is %d, want %d (16/64, at the floor)", got, MinPercent)
	}
	if after := gcPercent(); after != 200 {
		t.Errorf("after Run the percent is %d, want GOGC's 200 back", after)
	}
}

// GOGC=off is left off: there is no collection to pace.
func TestRunLeavesTheCollectorOff(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	Run(ctx, 1, time.Millisecond)
	if p := debug.SetGCPercent(-1); p != -1 {
		t.Errorf("Run set the percent to %d with the collector off", p)
	}
}
