package sync

import (
	"fmt"
	"sort"

	"etcdops.dev/etcdops/etcdstate"
)

// Forks in the simulator. A member forced into a new cluster does not end the old one: every
// other member's data still holds the old membership, and an etcd started on it (or never
// stopped) runs as a member of that membership, beside the forced cluster, under the same
// name, until it reaches the survivor and is told it was removed (a tick after it can; never
// while cut off). Such a process takes no part in the forced cluster and does not answer the hook as
// one of its members. If enough of them run to be a quorum of the old membership, even for a
// tick, two clusters serve: checkFork fails the run.

// simFork is the membership a quorum recovery forced the survivor out of.
type simFork struct {
	// voters are the old membership's voters by member ID; survivor is the one forced out.
	voters   map[uint64]bool
	survivor uint64
}

// recordFork notes the old membership when the member with ID survivor forces a new cluster.
func (w *simWorld) recordFork(survivor uint64) {
	f := &simFork{voters: map[uint64]bool{}, survivor: survivor}
	for _, m := range w.members {
		if !m.learner {
			f.voters[m.id] = true
		}
	}
	w.forks = append(w.forks, f)
}

// oldData: the data d was written by a member of a membership a recovery forced a survivor
// out of, and not by the survivor.
func (w *simWorld) oldData(d *simData) bool {
	if d == nil {
		return false
	}
	for _, f := range w.forks {
		if f.voters[d.id] && d.id != f.survivor && w.memberByID(d.id) == nil {
			return true
		}
	}
	return false
}

// checkFork fails when the voters of an old membership running beside the forced cluster are
// a quorum of it while the forced cluster has one too: two clusters under one name.
func (w *simWorld) checkFork() {
	w.t.Helper()
	for _, f := range w.forks {
		var running []string
		for _, ord := range sortedInts(w.pods) {
			p, d := w.pods[ord], w.data[ord]
			if p.old && p.running && !p.down && d != nil && f.voters[d.id] {
				running = append(running, w.podName(ord))
			}
		}
		sort.Strings(running)
		if len(running) >= etcdstate.Quorum(len(f.voters)) && w.hasQuorum() {
			w.t.Fatalf("fork: %v run a quorum of the old membership of %d beside the recovered cluster\n%s\nlast actions:\n  %s",
				running, len(f.voters), w.describe(), fmt.Sprint(lastN(w.log, 12)))
		}
	}
}
