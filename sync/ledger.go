package sync

import (
	"encoding/json"
	"fmt"
	"sort"

	"etcdops.dev/etcdops/joinstate"
)

// ledger remembers every member name the cluster has used: the member ID it last had, its
// incarnation and whether it was established. It lives in an annotation of the join
// ConfigMap, so it outlives a member's removal: a member re-added under the same name is told
// apart from its predecessor by its ID and gets the next incarnation.
type ledger map[string]ledgerEntry

type ledgerEntry struct {
	// ID is the etcd member ID in hex; empty until the member is first seen in the membership.
	ID          string `json:"id,omitempty"`
	Incarnation int64  `json:"incarnation"`
	Established bool   `json:"established,omitempty"`
}

func (l ledger) encode() string {
	b, err := json.Marshal(l)
	if err != nil {
		panic(fmt.Sprintf("sync: encoding the ledger cannot fail: %v", err))
	}
	return string(b)
}

// decodeLedger reads the annotation; a missing or unreadable one is an empty ledger, which
// costs only incarnation history, never safety: established is re-derived from membership.
func decodeLedger(s string) ledger {
	l := ledger{}
	if s != "" && json.Unmarshal([]byte(s), &l) != nil {
		return ledger{}
	}
	return l
}

// joinState lists every member exactly as etcd's membership has it, with the incarnation
// and establishment the ledger keeps; new is only for a cluster that has never answered.
func (v *view) joinState() (joinstate.State, ledger) {
	next := ledger{}
	for name, e := range v.ledger {
		next[name] = e
	}
	st := joinstate.State{Token: clusterToken(v.c), ClusterState: joinstate.StateExisting}
	for _, m := range v.members {
		id := fmt.Sprintf("%x", m.ID)
		e, seen := next[m.name]
		switch {
		case !seen:
			e = ledgerEntry{ID: id}
		case e.ID == "":
			// The seed was written down before etcd gave it an ID.
			e.ID = id
		case e.ID != id:
			// Same name, new member: a replacement, whose pod must start from an empty dir.
			e = ledgerEntry{ID: id, Incarnation: e.Incarnation + 1}
		}
		e.Established = e.Established || (m.Started() && !m.IsLearner)
		next[m.name] = e
		peer := PeerURL(v.c, m.name, v.cfg.ClusterDomain)
		if len(m.PeerURLs) > 0 {
			peer = m.PeerURLs[0]
		}
		st.Members = append(st.Members, joinstate.Member{Name: m.name, PeerURL: peer, Incarnation: e.Incarnation, Established: e.Established})
	}
	sortJoinMembers(st.Members)
	return st, next
}

func sortJoinMembers(ms []joinstate.Member) {
	sort.Slice(ms, func(i, j int) bool { return ms[i].Name < ms[j].Name })
}
