package sync

import (
	"encoding/json"
	"fmt"
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
