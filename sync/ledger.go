package sync

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/joinstate"
)

// AnnotationClusterID on the join ConfigMap records the etcd cluster ID in hex, beside
// status.clusterID: with either lost, a cluster that answers with another ID is still
// recognised as a stranger.
const AnnotationClusterID = "etcdops.dev/cluster-id"

// ledger remembers every member name the cluster has used: the member ID it last had, its
// incarnation and whether it was established. It lives in an annotation of the join
// ConfigMap and, durably, in status.ledger, so it outlives a member's removal and the
// ConfigMap's deletion: a member re-added under the same name is told apart from its
// predecessor by its ID and gets the next incarnation, and a member that keeps its name and
// ID keeps its incarnation.
type ledger map[string]ledgerEntry

type ledgerEntry struct {
	// ID is the etcd member ID in hex; empty until the member is first seen in the membership.
	ID          string `json:"id,omitempty"`
	Incarnation int64  `json:"incarnation"`
	Established bool   `json:"established,omitempty"`
	// Past are the IDs the name carried before ID, oldest first, at most maxPastIDs: an etcd
	// answering under one of them at the name's pod is a removed member that still runs.
	Past []string `json:"past,omitempty"`
}

// maxPastIDs bounds the IDs a name's record keeps from before: a removed member runs on only
// until its pod restarts, which the planner does before its next member starts there.
const maxPastIDs = 8

// retired is e's record once the name is carried by another member: e's ID joins the past.
func (e ledgerEntry) retired() []string {
	past := slices.Clone(e.Past)
	if e.ID != "" && !slices.Contains(past, e.ID) {
		past = append(past, e.ID)
	}
	return past[max(0, len(past)-maxPastIDs):]
}

// hadID: id is the ID the name carries, or one it carried before.
func (e ledgerEntry) hadID(id string) bool {
	return e.ID == id || slices.Contains(e.Past, id)
}

func (l ledger) encode() string {
	b, err := json.Marshal(l)
	if err != nil {
		panic(fmt.Sprintf("sync: encoding the ledger cannot fail: %v", err))
	}
	return string(b)
}

// decodeLedger reads the annotation; a missing or unreadable one is an empty ledger, which
// the durable copy in status makes up for.
func decodeLedger(s string) ledger {
	l := ledger{}
	if s != "" && json.Unmarshal([]byte(s), &l) != nil {
		return ledger{}
	}
	return l
}

func ledgerFromStatus(rs []v1alpha1.LedgerRecord) ledger {
	l := ledger{}
	for _, r := range rs {
		l[r.Name] = ledgerEntry{ID: r.ID, Incarnation: r.Incarnation, Established: r.Established, Past: r.PastIDs}
	}
	return l
}

// records is the ledger as status keeps it, sorted by name.
func (l ledger) records() []v1alpha1.LedgerRecord {
	out := make([]v1alpha1.LedgerRecord, 0, len(l))
	for name, e := range l {
		out = append(out, v1alpha1.LedgerRecord{Name: name, ID: e.ID, Incarnation: e.Incarnation, Established: e.Established, PastIDs: e.Past})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	if len(out) == 0 {
		return nil
	}
	return out
}

// mergeLedgers keeps, per name, the later of two records: the higher incarnation, else the
// one that knows the member ID. Both are written by the same sync, so they differ only when
// one was lost or not yet applied; the later one is never less safe. Establishment is kept
// when both speak of the same member, and every past ID either knows.
func mergeLedgers(a, b ledger) ledger {
	out := ledger{}
	for name, e := range a {
		out[name] = e
	}
	for name, e := range b {
		o, ok := out[name]
		switch {
		case !ok || e.Incarnation > o.Incarnation || e.Incarnation == o.Incarnation && o.ID == "" && e.ID != "":
			e.Past = pastOf(e, o.retired())
			out[name] = e
		case e.Incarnation == o.Incarnation && e.ID == o.ID:
			o.Established = o.Established || e.Established
			o.Past = pastOf(o, e.Past)
			out[name] = o
		default:
			o.Past = pastOf(o, e.retired())
			out[name] = o
		}
	}
	return out
}

// pastOf is e's past IDs with more added: each once, never e's own ID, the newest kept.
func pastOf(e ledgerEntry, more []string) []string {
	past := slices.Clone(e.Past)
	for _, id := range more {
		if id != e.ID && !slices.Contains(past, id) {
			past = append(past, id)
		}
	}
	if len(past) == 0 {
		return nil
	}
	return past[max(0, len(past)-maxPastIDs):]
}

// joinState lists every member exactly as etcd's membership has it, with the incarnation
// and establishment the ledger keeps; new is only for a cluster that has never answered.
// rebaseline, after a new cluster ID was accepted on purpose, takes the members' new IDs as
// the same members: a restore gives every member a new ID, and its data is the one to keep.
func (v *view) joinState(rebaseline bool) (joinstate.State, ledger) {
	next := ledger{}
	for name, e := range v.ledger {
		next[name] = e
	}
	st := joinstate.State{Token: clusterToken(v.c), ClusterState: joinstate.StateExisting, ClusterID: v.clusterID}
	if v.obs.Etcd.Asked && v.obs.Etcd.ClusterID != 0 {
		// The one etcd answers as: on record, or accepted on purpose (rebaseline).
		st.ClusterID = fmt.Sprintf("%x", v.obs.Etcd.ClusterID)
	}
	for _, m := range v.members {
		id := fmt.Sprintf("%x", m.ID)
		e, seen := next[m.name]
		switch {
		case !seen:
			e = ledgerEntry{ID: id}
		case e.ID == "" || rebaseline:
			// The seed was written down before etcd gave it an ID, or a restore renamed all.
			e.ID = id
		case e.ID != id:
			// Same name, new member: a replacement, whose pod must start from an empty dir.
			e = ledgerEntry{ID: id, Incarnation: e.Incarnation + 1, Past: e.retired()}
		}
		e.Established = e.Established || (m.Started() && !m.IsLearner)
		next[m.name] = e
		peer := peerURLOf(v.c, m.name, v.cfg.ClusterDomain, v.tls.desired.peer == peerTLS)
		if len(m.PeerURLs) > 0 {
			peer = m.PeerURLs[0]
		}
		st.Members = append(st.Members, joinstate.Member{Name: m.name, PeerURL: peer, Incarnation: e.Incarnation, Established: e.Established, Learner: m.IsLearner})
	}
	sortJoinMembers(st.Members)
	return st, next
}

// lastKnownJoinState rebuilds the join state without etcd, for a hold that finds the join
// ConfigMap gone: the members status last saw, with the ledger's incarnations. Pods cannot
// even start without the ConfigMap; with it they start as they would have before it was lost.
func (v *view) lastKnownJoinState() joinstate.State {
	st := joinstate.State{Token: clusterToken(v.c), ClusterState: joinstate.StateExisting, ClusterID: v.clusterID}
	for _, m := range v.obs.Cluster.Status.Members {
		e := v.ledger[m.Name]
		st.Members = append(st.Members, joinstate.Member{Name: m.Name, PeerURL: peerURLOf(v.c, m.Name, v.cfg.ClusterDomain, v.tls.desired.peer == peerTLS), Incarnation: e.Incarnation, Established: e.Established, Learner: m.IsLearner})
	}
	sortJoinMembers(st.Members)
	return st
}

func sortJoinMembers(ms []joinstate.Member) {
	sort.Slice(ms, func(i, j int) bool { return ms[i].Name < ms[j].Name })
}
