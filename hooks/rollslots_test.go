package hooks

import (
	"fmt"
	"testing"
	"time"
)

// TestRollSlotsOutliveNoCluster: a slot whose cluster is not synced for rollSlotIdle (deleted,
// or syncing through another replica) frees; a refusal names the first holders in order.
func TestRollSlotsOutliveNoCluster(t *testing.T) {
	r := newRollSlots(6)
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for i := range 6 {
		if ok, why := r.admit(fmt.Sprintf("ns/c%d", i), now); !ok {
			t.Fatalf("slot %d of 6 refused: %s", i, why)
		}
	}
	ok, why := r.admit("ns/late", now.Add(rollSlotIdle))
	if want := "6 of 6 clusters roll through this hook replica (ns/c0, ns/c1, ns/c2, ns/c3, ns/c4, ...); --max-concurrent-rolls"; ok || why != want {
		t.Fatalf("a seventh cluster: %v %q, want refused with %q", ok, why, want)
	}
	if ok, _ := r.admit("ns/c5", now.Add(rollSlotIdle)); !ok {
		t.Fatal("a holder was refused its own slot")
	}
	if ok, why := r.admit("ns/late", now.Add(rollSlotIdle+time.Second)); !ok || r.inUse() != 2 {
		t.Fatalf("slots idle past %s: %v %q, %d in use; want them freed (2 in use)", rollSlotIdle, ok, why, r.inUse())
	}
	r.release("ns/late")
	if r.inUse() != 1 {
		t.Fatalf("released: %d in use, want 1", r.inUse())
	}
}
