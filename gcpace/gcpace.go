// Package gcpace bounds the garbage a long-running process keeps between collections by
// an amount of memory rather than by a share of what is live.
//
// GOGC lets garbage grow to a share of the live heap, stacks and globals before the next
// collection. For the hook that share is right while it serves few clusters (a sync's
// garbage is most of the heap, and collecting less often keeps the slowest syncs short),
// and wrong at a thousand: its live memory is then mostly held etcd connections, and
// GOGC=200 lets twice that (about 180 MB) sit as garbage in the resident set. Run keeps
// GOGC as a ceiling and lowers the collector's percent as live memory grows, so the
// garbage stays within a headroom of bytes, down to a floor that bounds the collector's
// work per allocated byte.
package gcpace

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// DefaultHeadroom is the hook's --gc-headroom: what about 80 syncs of a 3-member cluster
// allocate (200 KB each), and a seventh of what a thousand held clusters' connections take.
// Below 8 MiB of live memory GOGC=200 lets less than this build up, and rules.
const DefaultHeadroom = 16 << 20

// MinPercent is the lowest percent Run sets: at p, the collector marks the live memory once
// per p% of it allocated, so its work per allocated byte grows as 100/p; below 25 that cost
// outweighs the memory saved.
const MinPercent = 25

// Percent is the collector's percent that lets at most headroom bytes of garbage build up
// over live bytes (the live heap, the stacks and the globals the runtime paces by), between
// MinPercent and ceiling; ceiling itself when live memory is small enough.
func Percent(headroom, live uint64, ceiling int) int {
	if ceiling <= MinPercent {
		return ceiling
	}
	if live == 0 {
		return ceiling
	}
	p := headroom * 100 / live
	switch {
	case p >= uint64(ceiling):
		return ceiling
	case p < MinPercent:
		return MinPercent
	}
	return int(p)
}

// names are the runtime's measures of what the collector paces by.
var names = []string{"/gc/gogc:percent", "/gc/heap/live:bytes", "/gc/scan/stack:bytes", "/gc/scan/globals:bytes"}

// Run sets the collector's percent from the live memory of the last collection, every
// period until ctx is done, with the GOGC the process started with as the ceiling. It does
// nothing when GOGC is off or headroom is 0.
func Run(ctx context.Context, headroom uint64, period time.Duration) {
	samples := make([]metrics.Sample, len(names))
	for i, n := range names {
		samples[i].Name = n
	}
	metrics.Read(samples)
	ceiling := int(samples[0].Value.Uint64())
	if headroom == 0 || ceiling <= 0 {
		return
	}
	defer debug.SetGCPercent(ceiling)
	tick := time.NewTicker(period)
	defer tick.Stop()
	set := ceiling
	for {
		metrics.Read(samples)
		live := samples[1].Value.Uint64() + samples[2].Value.Uint64() + samples[3].Value.Uint64()
		if p := Percent(headroom, live, ceiling); p != set {
			debug.SetGCPercent(p)
			set = p
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
