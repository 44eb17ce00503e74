package harness

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A restore to a revision is checked against what the workload's watch saw: the key space at
// that revision is every event up to it applied in order, and a cluster restored to it must
// hold exactly that, key by key, with each key's modification revision, and every write
// acknowledged at or before it.

// keyAt is one key as it was at a revision.
type keyAt struct {
	value       string
	modRevision int64
}

// stateAt is the key space under prefix at rev, from the first watcher's events (complete
// once Stop has returned: the watchers reached the final revision). The cluster must have held
// no key under prefix before the workload started.
func (w *Workload) stateAt(prefix string, rev int64) (map[string]keyAt, error) {
	w.hist.mu.Lock()
	defer w.hist.mu.Unlock()
	if rev > w.hist.Final {
		return nil, fmt.Errorf("revision %d is past the workload's final %d", rev, w.hist.Final)
	}
	state := map[string]keyAt{}
	last := w.hist.Initial.Revision
	for _, ev := range w.hist.Watchers[0] {
		if ev.Revision > rev {
			break
		}
		if ev.Revision < last {
			return nil, fmt.Errorf("watch event of revision %d after %d", ev.Revision, last)
		}
		last = ev.Revision
		if !strings.HasPrefix(ev.Key, prefix) {
			continue
		}
		if ev.Delete {
			delete(state, ev.Key)
		} else {
			state[ev.Key] = keyAt{value: ev.Value, modRevision: ev.Revision}
		}
	}
	return state, nil
}

// CheckRestoredAt reads the key space of e's cluster, restored to revision rev, and returns
// every difference from the workload's keys at rev, and every acknowledged append at or
// before rev that is missing or one after it that is present.
func (w *Workload) CheckRestoredAt(e Target, rev int64, timeout time.Duration) ([]string, error) {
	prefix := w.prefix + "/"
	want, err := w.stateAt(prefix, rev)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(e.ClientConfig())
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	cli.SetEndpoints(e.ClientURLs()...)
	resp, err := readUntil(cli, prefix, timeout)
	if err != nil {
		return nil, fmt.Errorf("reading back: %w", err)
	}
	got := map[string]keyAt{}
	for _, kv := range resp.Kvs {
		got[string(kv.Key)] = keyAt{value: string(kv.Value), modRevision: kv.ModRevision}
	}
	var diff []string
	for k, g := range got {
		if wk, ok := want[k]; !ok {
			diff = append(diff, fmt.Sprintf("%s=%q@%d restored, absent at revision %d", k, g.value, g.modRevision, rev))
		} else if wk != g {
			diff = append(diff, fmt.Sprintf("%s=%q@%d restored, %q@%d at revision %d", k, g.value, g.modRevision, wk.value, wk.modRevision, rev))
		}
	}
	for k, wk := range want {
		if _, ok := got[k]; !ok {
			diff = append(diff, fmt.Sprintf("%s=%q@%d missing", k, wk.value, wk.modRevision))
		}
	}
	w.hist.mu.Lock()
	for _, op := range w.hist.Ops {
		if op.Input.Kind != OpAppend || op.Output.Unknown || !strings.HasPrefix(op.Input.Name, prefix) {
			continue
		}
		g, ok := got[op.Input.Name]
		switch {
		case op.Output.Revision <= rev && (!ok || g.modRevision < op.Output.Revision):
			diff = append(diff, fmt.Sprintf("append %s acknowledged at revision %d missing", op.Input.Name, op.Output.Revision))
		case op.Output.Revision > rev && ok && g.modRevision >= op.Output.Revision:
			diff = append(diff, fmt.Sprintf("append %s acknowledged at revision %d restored", op.Input.Name, op.Output.Revision))
		}
	}
	w.hist.mu.Unlock()
	sort.Strings(diff)
	return diff, nil
}

// Compact compacts the cluster's history up to the revision every watcher has seen, so that
// none of them loses an event, and returns it.
func (w *Workload) Compact() (int64, error) {
	var rev int64
	for i := range w.opts.Watchers {
		if r := w.hist.lastSeen(i); i == 0 || r < rev {
			rev = r
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := w.clients[len(w.clients)-1].Compact(ctx, rev, clientv3.WithCompactPhysical())
	return rev, err
}

// Acked counts the acknowledged appends so far.
func (w *Workload) Acked() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}
