package hooks

import (
	"crypto/sha256"
	gosync "sync"
	"time"

	"etcdops.dev/etcdops/sync"
)

// certMemo remembers each cluster's certificate problems while the check's inputs (the
// Secrets' bytes, the cluster's names) stay and the answer still stands: parsing the key
// pairs and verifying the chains on every sync cost a fifth of the hook's CPU with TLS. The
// zero value is ready; it is safe for concurrent use.
type certMemo struct {
	mu      gosync.Mutex
	answers map[string]certAnswer
}

type certAnswer struct {
	inputs      [sha256.Size]byte
	problems    map[string]string
	from, until time.Time
}

// maxCertAnswers bounds the answers kept; past it they are all dropped (clusters deleted
// leave theirs behind, and one check per cluster is what the memo saves).
const maxCertAnswers = 10000

// problems is check's answer at now, the one kept for cluster key when it has the same inputs
// and still stands. The map returned is shared: callers must not change it.
func (m *certMemo) problems(key string, check sync.CertificateCheck, now time.Time) map[string]string {
	m.mu.Lock()
	a, ok := m.answers[key]
	m.mu.Unlock()
	if ok && a.inputs == check.Inputs && !now.Before(a.from) && now.Before(a.until) {
		return a.problems
	}
	problems, from, until := check.Run(now)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.answers == nil || len(m.answers) >= maxCertAnswers {
		m.answers = map[string]certAnswer{}
	}
	m.answers[key] = certAnswer{inputs: check.Inputs, problems: problems, from: from, until: until}
	return problems
}
