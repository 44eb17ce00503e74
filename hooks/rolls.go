package hooks

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	gosync "sync"
	"time"
)

// rollSlots bounds how many clusters roll their pods at once through this hook, so that a
// change every cluster needs (a new release rendering a different pod template, say) rolls
// the fleet a few clusters at a time rather than all at once. A cluster whose pods run an
// outdated template (sync.Decision.Rolls) holds a slot until a sync sees none outdated; one
// not synced for rollSlotIdle (deleted, or syncing through another replica) gives its slot
// up. A cluster refused a slot is planned again with sync.Observed.RollWait, and its roll
// waits without changing a pod. Each hook replica keeps its own slots.
type rollSlots struct {
	max  int // 0: no bound
	mu   gosync.Mutex
	held map[string]time.Time // cluster (namespace/name) -> the last sync that saw it rolling
}

// rollSlotIdle is how long a slot outlives its cluster's last sync. Metacontroller syncs each
// cluster every 30 s; a slot not refreshed for this long belongs to no roll here.
const rollSlotIdle = 10 * time.Minute

func newRollSlots(max int) *rollSlots {
	return &rollSlots{max: max, held: map[string]time.Time{}}
}

// admit: cluster has pods to roll. It may when it holds a slot or a free one is left; else
// the answer says why not, naming the clusters that hold the slots.
func (r *rollSlots) admit(cluster string, now time.Time) (bool, string) {
	if r.max <= 0 {
		return true, ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for c, seen := range r.held {
		if now.Sub(seen) > rollSlotIdle {
			delete(r.held, c)
		}
	}
	if _, ok := r.held[cluster]; ok || len(r.held) < r.max {
		r.held[cluster] = now
		return true, ""
	}
	holders := slices.Sorted(maps.Keys(r.held))
	named := strings.Join(holders[:min(len(holders), 5)], ", ")
	if len(holders) > 5 {
		named += ", ..."
	}
	return false, fmt.Sprintf("%d of %d clusters roll through this hook replica (%s); --max-concurrent-rolls", len(r.held), r.max, named)
}

// release: cluster has no pod to roll (or is being deleted); its slot, if it held one, is free.
func (r *rollSlots) release(cluster string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.held, cluster)
}

// inUse is how many slots are held.
func (r *rollSlots) inUse() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.held)
}
