package hooks

import (
	"crypto/sha256"
	"encoding/json"
	"reflect"
	"slices"
	gosync "sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// statusMemo remembers, per cluster, the statuses this hook answered last, so that a sync
// handed a parent whose status is one of the older ones plans from the newest. Metacontroller
// hands a sync the parent as its cache holds it, which can be a write behind: the sync right
// after a step starts often gets the status from before the step, and Metacontroller writes
// that sync's status over the newer one all the same (AtomicStatusUpdate reads the object
// again and sets the status it is given). Planned from the stale one, a step's start record
// in status.history, which nothing else holds for a step without a Job (a pod replacement),
// was lost for good.
//
// A status is known by a digest of its JSON, status.observedGeneration left out (Metacontroller
// sets it): the parent's status is what an answer said, as it came back through the API
// server. A status the memo does not know (another hook replica's answer, or one from before
// this process) is planned from as handed; so is any after statusMemoTTL, past any cache's
// lag. The memo is dropped when a sync hands the newest status and changes nothing: an idle
// cluster costs nothing here. The zero value is ready; it is safe for concurrent use.
type statusMemo struct {
	mu      gosync.Mutex
	answers map[types.UID]*statusAnswers
}

type statusAnswers struct {
	// newest is the status answered last, as JSON (observedGeneration left out); digests
	// are those of the statuses answered or handed before it, older ones later.
	newest  []byte
	digests [][sha256.Size]byte
	at      time.Time
}

const (
	// statusMemoDepth is how many older statuses are known as older.
	statusMemoDepth = 8
	// statusMemoTTL bounds how long after an answer a status handed in is compared with it.
	statusMemoTTL = 2 * time.Minute
	// maxStatusMemos bounds the clusters remembered; past it all are dropped (clusters deleted
	// mid-step leave theirs behind).
	maxStatusMemos = 10000
)

// statusJSON is st as an answer writes it and the API server returns it, observedGeneration
// left out, and its digest.
func statusJSON(st v1alpha1.EtcdClusterStatus) ([]byte, [sha256.Size]byte) {
	st.ObservedGeneration = 0
	// A struct of strings, numbers, times and quantities: marshalling it cannot fail.
	raw, _ := json.Marshal(st)
	return raw, sha256.Sum256(raw)
}

// statusBase is the status a sync plans from: the status handed in, and, when this hook
// answered a newer one, that one put in its place.
type statusBase struct {
	handed v1alpha1.EtcdClusterStatus
	// digest is the digest of the status planned from, when known; put says it was put in.
	digest *[sha256.Size]byte
	put    bool
}

// newest puts into c the newest status answered for it when c carries an older one, and
// returns what c's status now is.
func (m *statusMemo) newest(c *v1alpha1.EtcdCluster, now time.Time) statusBase {
	base := statusBase{handed: c.Status}
	if m.newer(c.UID, now, nil) == nil {
		// An idle cluster: no digest taken.
		return base
	}
	_, handed := statusJSON(c.Status)
	base.digest = &handed
	newest := m.newer(c.UID, now, &handed)
	var st v1alpha1.EtcdClusterStatus
	if newest == nil || json.Unmarshal(newest, &st) != nil {
		// Not older than the newest (or, which cannot be, what json.Marshal wrote does not
		// read back): the status handed in stands.
		return base
	}
	st.ObservedGeneration = c.Status.ObservedGeneration
	c.Status = st
	d := sha256.Sum256(newest)
	base.digest, base.put = &d, true
	return base
}

// newer is the newest status answered for uid within statusMemoTTL of now, when the status
// of digest handed is one answered or handed before it (any status, for a nil handed); nil
// otherwise. Its bytes are never changed: answered replaces them.
func (m *statusMemo) newer(uid types.UID, now time.Time, handed *[sha256.Size]byte) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.answers[uid]
	if a == nil || now.Sub(a.at) > statusMemoTTL || handed != nil && !slices.Contains(a.digests, *handed) {
		return nil
	}
	return a.newest
}

// answered records answer, the status of a sync of c planned from base, at now.
func (m *statusMemo) answered(c *v1alpha1.EtcdCluster, base statusBase, answer v1alpha1.EtcdClusterStatus, finalized bool, now time.Time) {
	m.mu.Lock()
	_, known := m.answers[c.UID]
	m.mu.Unlock()
	switch {
	case finalized:
		m.forget(c.UID)
		return
	case !known && reflect.DeepEqual(base.handed, answer):
		// An idle cluster's sync: nothing changed, nothing to remember, no digest taken.
		return
	}
	raw, d := statusJSON(answer)
	if base.digest == nil {
		_, handed := statusJSON(base.handed)
		base.digest = &handed
	}
	switch {
	case d == *base.digest && !base.put:
		// Nothing changed from the status handed in: nothing newer to remember.
		m.forget(c.UID)
		return
	case d == *base.digest:
		// Nothing changed from the newest status, put in: the memo stands.
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.answers[c.UID]
	if a == nil || now.Sub(a.at) > statusMemoTTL {
		if m.answers == nil || len(m.answers) >= maxStatusMemos {
			m.answers = map[types.UID]*statusAnswers{}
		}
		a = &statusAnswers{}
		m.answers[c.UID] = a
	}
	// The status planned from is older than the answer, as is every one before it; the
	// answer's own digest is the newest's, not an older one's.
	a.digests = slices.Insert(slices.DeleteFunc(a.digests, func(x [sha256.Size]byte) bool { return x == *base.digest || x == d }), 0, *base.digest)
	a.digests = a.digests[:min(len(a.digests), statusMemoDepth)]
	a.newest, a.at = raw, now
}

func (m *statusMemo) forget(uid types.UID) {
	m.mu.Lock()
	delete(m.answers, uid)
	m.mu.Unlock()
}
