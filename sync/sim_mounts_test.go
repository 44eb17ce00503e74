package sync

import (
	"time"

	"etcdops.dev/etcdops/joinstate"
	"etcdops.dev/etcdops/launcher"
)

// Mounted ConfigMaps in the simulator, as slow as a real kubelet: a pod reads the join state
// from a file its kubelet refreshes late, each pod by its own delay (a minute or more), while
// a new pod mounts the ConfigMap as it is when the pod is created. A ConfigMap deleted leaves
// the last content in the files of the pods that had mounted it.

// simMounts is the history of the join ConfigMap as applied, and each pod's delay.
type simMounts struct {
	// history holds every join state applied, oldest first; nil where the ConfigMap was
	// deleted.
	history []simApplied
	// base is the delay of ordinal 0; each higher ordinal waits step longer.
	base, step time.Duration
}

type simApplied struct {
	at    time.Time
	state *joinstate.State
}

// withMountDelays makes the world's kubelets refresh mounted files late: base for ordinal 0,
// and step more for each higher ordinal.
func (w *simWorld) withMountDelays(base, step time.Duration) {
	w.mounts = &simMounts{base: base, step: step}
	w.recordJoin()
}

// mountDelay is how late the kubelet of the pod at ord refreshes its mounted files.
func (m *simMounts) mountDelay(ord int) time.Duration {
	return m.base + time.Duration(ord)*m.step
}

// recordJoin notes the join ConfigMap as it is now, after a sync applied it.
func (w *simWorld) recordJoin() {
	if w.mounts == nil {
		return
	}
	h := &w.mounts.history
	if n := len(*h); n > 0 && sameJoin((*h)[n-1].state, w.join) {
		return
	}
	var st *joinstate.State
	if w.join != nil {
		c := *w.join
		c.Members = append([]joinstate.Member(nil), w.join.Members...)
		st = &c
	}
	*h = append(*h, simApplied{at: w.now, state: st})
}

func sameJoin(a, b *joinstate.State) bool {
	if a == nil || b == nil {
		return a == b
	}
	return joinstate.Encode(*a) == joinstate.Encode(*b)
}

// mountedJoin is the join state the files of pod p hold now: the ConfigMap as it was when p
// was created or, once its kubelet refreshed it, as it was its delay ago, whichever is later;
// nil when there was none to mount.
func (w *simWorld) mountedJoin(p *simPod) *joinstate.State {
	if w.mounts == nil {
		return w.join
	}
	asOf := w.now.Add(-w.mounts.mountDelay(p.ord))
	if p.created.After(asOf) {
		asOf = p.created
	}
	var st *joinstate.State
	for _, a := range w.mounts.history {
		if a.at.After(asOf) {
			break
		}
		if a.state != nil {
			st = a.state
		}
	}
	return st
}

// peersAnswering are the established members of join, other than the one at ord, whose etcd
// accepts connections on its peer URL: its process runs, also when paused, but not across a
// partition.
func (w *simWorld) peersAnswering(ord int, join joinstate.State) []string {
	var names []string
	for _, o := range sortedInts(w.pods) {
		if m, ok := join.Find(w.podName(o)); !ok || !m.Established {
			continue
		}
		if p := w.pods[o]; o != ord && p.running && !p.stuck {
			names = append(names, w.podName(o))
		}
	}
	return names
}

// launchInput is what the launcher of pod p decides on.
func (w *simWorld) launchInput(p *simPod, join joinstate.State) launcher.Input {
	in := launcher.Input{Join: join, Name: w.podName(p.ord), DataDir: "/var/lib/etcd/data", Volume: volumeOf(w.data[p.ord])}
	if launcher.RecoveryPending(join, in.Name, in.Volume) {
		in.Answering = w.peersAnswering(p.ord, join)
	}
	return in
}
