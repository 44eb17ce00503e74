package harness

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	gosync "sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Op is one client operation with its call and return times in nanoseconds since the
// history began. An operation with an unknown outcome never returns: Return is
// math.MaxInt64, so the checker may place its effect anywhere after its call, or after
// everything else, which is as if it never took effect.
type Op struct {
	Client int    `json:"client"`
	Input  Input  `json:"input"`
	Output Output `json:"output"`
	Call   int64  `json:"call"`
	Return int64  `json:"return"`
}

// WatchEvent is one event as a watcher received it.
type WatchEvent struct {
	Revision int64  `json:"revision"`
	Delete   bool   `json:"delete,omitempty"`
	Key      string `json:"key"`
	Value    string `json:"value,omitempty"`
	Member   uint64 `json:"member"`
	Cluster  uint64 `json:"cluster"`
	// Reconnects is how many times the watcher had reconnected before this event.
	Reconnects int `json:"reconnects,omitempty"`
}

// History is everything the clients of one workload did and saw: the revision and the
// shared keys before the first operation, every operation, every watcher's events, and the
// revision after the last operation.
type History struct {
	start time.Time

	mu       gosync.Mutex
	Initial  kvState        `json:"initial"`
	Keys     []string       `json:"keys"`
	Ops      []Op           `json:"ops"`
	Watchers [][]WatchEvent `json:"watchers"`
	Final    int64          `json:"final"`
	// WatchErrors count what ended the watchers' streams, by message.
	WatchErrors map[string]int `json:"watchErrors,omitempty"`
}

func (h *History) now() int64 { return time.Since(h.start).Nanoseconds() }

func (h *History) add(op Op) {
	h.mu.Lock()
	h.Ops = append(h.Ops, op)
	h.mu.Unlock()
}

func (h *History) event(watcher int, ev WatchEvent) {
	h.mu.Lock()
	h.Watchers[watcher] = append(h.Watchers[watcher], ev)
	h.mu.Unlock()
}

func (h *History) watchError(watcher int, err error) {
	h.mu.Lock()
	if h.WatchErrors == nil {
		h.WatchErrors = map[string]int{}
	}
	h.WatchErrors[fmt.Sprintf("watcher %d: %v", watcher, err)]++
	h.mu.Unlock()
}

// lastSeen is the revision of a watcher's last event, or the revision it started after.
func (h *History) lastSeen(watcher int) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if evs := h.Watchers[watcher]; len(evs) > 0 {
		return evs[len(evs)-1].Revision
	}
	return h.Initial.Revision
}

// Verdict is what checking a history found.
type Verdict struct {
	// Ops counts the operations checked. Unknown counts the writes whose outcome the client
	// never learned; Resolved those of them a watch showed taking effect, which are checked.
	// The others are checked only while the watches are incomplete.
	Ops, Unknown, Resolved int
	// WatchEvents counts the events checked, over all watchers.
	WatchEvents int
	// Linearizable: porcupine found an order of the operations that the model allows.
	Linearizable bool
	// Problems are the violations found: of linearizability, and of the watch guarantees.
	Problems []string
	// CheckTime is how long porcupine took.
	CheckTime time.Duration
	// Written is where the history and its visualisation were written, when there was a
	// problem.
	Written string
}

// checkBound bounds one linearizability check; a history that cannot be decided within it
// counts as a violation: bounded histories decide in well under a second.
const checkBound = 2 * time.Minute

// Check checks the history: the watch guarantees first (each watcher's events ordered,
// without gaps or duplicates across its reconnects, from the first revision after the start
// to at least the final one, each matching a write, which tells the revision of writes whose outcome
// the client did not learn), then linearizability against the key-value model with
// revisions. On a problem it writes history.json and porcupine's visualisation
// (linearization.html) into a new directory under dir and names it in the verdict.
func (h *History) Check(dir string) Verdict {
	h.mu.Lock()
	defer h.mu.Unlock()
	var v Verdict
	v.Problems = h.checkWatches(&v)
	// With complete watches, an unknown write that no watch saw took no effect up to the final
	// revision, and no answer depends on it: it is left out. Kept in, each could be placed at
	// every point where it changes nothing, and the search would grow with their subsets.
	complete := len(h.Watchers) > 0 && len(v.Problems) == 0
	ops := make([]porcupine.Operation, 0, len(h.Ops))
	for _, op := range h.Ops {
		if op.Output.Unknown {
			v.Unknown++
			switch {
			case op.Output.Revision != 0:
				v.Resolved++
			case complete:
				continue
			}
		}
		ops = append(ops, porcupine.Operation{ClientId: op.Client, Input: op.Input, Call: op.Call, Output: op.Output, Return: op.Return})
	}
	v.Ops = len(ops)
	model := kvModel(h.Initial)
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, ops, checkBound)
	v.CheckTime = time.Since(start)
	v.Linearizable = res == porcupine.Ok
	switch res {
	case porcupine.Illegal:
		v.Problems = append(v.Problems, fmt.Sprintf("the history of %d operations is not linearizable", len(ops)))
	case porcupine.Unknown:
		v.Problems = append(v.Problems, fmt.Sprintf("the checker could not decide %d operations within %s", len(ops), checkBound))
	}
	if len(v.Problems) > 0 {
		written, err := h.write(dir, model, info)
		if err != nil {
			v.Problems = append(v.Problems, "writing the history: "+err.Error())
		}
		v.Written = written
	}
	return v
}

func (h *History) write(dir string, model porcupine.Model, info porcupine.LinearizationInfo) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	out, err := os.MkdirTemp(dir, "history-")
	if err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(h, "", " ")
	if err != nil {
		return out, err
	}
	if err := os.WriteFile(filepath.Join(out, "history.json"), b, 0o644); err != nil {
		return out, err
	}
	return out, porcupine.VisualizePath(model, info, filepath.Join(out, "linearization.html"))
}

// checkWatches checks every watcher's events and fills in the revision of each unknown
// write that a watch saw take effect. Values are unique to one attempt of one write, so an
// event names the write it comes from.
func (h *History) checkWatches(v *Verdict) []string {
	var problems []string
	if h.Final == 0 {
		problems = append(problems, "the final revision was not read: the watches cannot be checked to their end")
	}
	byValue := map[string]int{}
	deletes := map[string][]int{}
	for i, op := range h.Ops {
		switch op.Input.Kind {
		case OpPut, OpCAS, OpAppend:
			byValue[op.Input.Value] = i
		case OpDelete:
			deletes[op.Input.Name] = append(deletes[op.Input.Name], i)
		}
	}
	for w, evs := range h.Watchers {
		v.WatchEvents += len(evs)
		next := h.Initial.Revision + 1
		for _, ev := range evs {
			if ev.Revision != next {
				what := "a gap"
				if ev.Revision < next {
					what = "a duplicate or out of order"
				}
				problems = append(problems, fmt.Sprintf("watcher %d: %s: event at revision %d after %d (after %d reconnects)", w, what, ev.Revision, next-1, ev.Reconnects))
			}
			next = ev.Revision + 1
			if p := h.matchEvent(ev, byValue, deletes); p != "" {
				problems = append(problems, fmt.Sprintf("watcher %d: %s", w, p))
			}
		}
		// An unknown write may take effect after the final read, and show up past it.
		if last := next - 1; last < h.Final {
			problems = append(problems, fmt.Sprintf("watcher %d: last event at revision %d, but the final revision is %d", w, last, h.Final))
		}
	}
	return problems
}

// matchEvent finds the write an event comes from and checks it; it records the revision of
// an unknown write. It returns the problem, or "".
func (h *History) matchEvent(ev WatchEvent, byValue map[string]int, deletes map[string][]int) string {
	if ev.Delete {
		var unresolved []int
		for _, i := range deletes[ev.Key] {
			out := h.Ops[i].Output
			if out.Revision == ev.Revision && (out.Unknown || out.Deleted == 1) {
				return ""
			}
			if out.Unknown && out.Revision == 0 {
				unresolved = append(unresolved, i)
			}
		}
		// Two unknown deletes of one key are told apart by time: the earliest call first.
		sort.Slice(unresolved, func(a, b int) bool { return h.Ops[unresolved[a]].Call < h.Ops[unresolved[b]].Call })
		if len(unresolved) > 0 {
			h.Ops[unresolved[0]].Output.Revision = ev.Revision
			return ""
		}
		return fmt.Sprintf("delete of %s at revision %d matches no delete", ev.Key, ev.Revision)
	}
	i, ok := byValue[ev.Value]
	if !ok || h.Ops[i].Input.Name != ev.Key {
		return fmt.Sprintf("put of %s=%s at revision %d matches no write", ev.Key, ev.Value, ev.Revision)
	}
	out := &h.Ops[i].Output
	switch {
	case out.Unknown && out.Revision == 0:
		out.Revision = ev.Revision
	case h.Ops[i].Input.Kind == OpCAS && !out.Unknown && !out.Succeeded:
		return fmt.Sprintf("put of %s=%s seen at revision %d, but its compare-and-swap failed", ev.Key, ev.Value, ev.Revision)
	case out.Revision != ev.Revision:
		return fmt.Sprintf("put of %s=%s seen at revision %d, but etcd answered revision %d", ev.Key, ev.Value, ev.Revision, out.Revision)
	}
	return ""
}

// neverReturned is the return time of an operation whose outcome is unknown.
const neverReturned = math.MaxInt64
