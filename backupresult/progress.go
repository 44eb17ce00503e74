package backupresult

import (
	"encoding/json"
	"fmt"
	"time"
)

// ProgressPath is where the continuous backup serves its Progress, on its metrics port.
const ProgressPath = "/progress"

// Progress is the continuous backup's recovery point as the stream itself sees it: what it
// stored, and how long changes have waited. Behind is measured on the stream's own clock, so
// that whoever reads it needs no clock in step with the stream's.
type Progress struct {
	// StoredRevision: every change up to it is stored (a chunk's last revision, or the
	// revision of the snapshot the chain starts from). 0 before the stream found or took one.
	StoredRevision int64 `json:"storedRevision"`
	// StoredTime is when this stream stored its newest chunk or snapshot; zero when it has
	// stored nothing since it started (it resumed a chain stored before).
	StoredTime time.Time `json:"storedTime,omitzero"`
	// Revision is the cluster's revision as the watch last reported it.
	Revision int64 `json:"revision"`
	// CaughtUpTime is the last time the stream held no change unstored while its watch was
	// up; its start until then.
	CaughtUpTime time.Time `json:"caughtUpTime"`
	// BehindSeconds is how long it has not been caught up, when served: 0 while caught up.
	// Changes wait up to the interval by design; an idle cluster is never behind.
	BehindSeconds float64 `json:"behindSeconds"`
	// LastError is the last failure the stream resumed from, and when.
	LastError     string    `json:"lastError,omitempty"`
	LastErrorTime time.Time `json:"lastErrorTime,omitzero"`
	// Lineage is the lineage the stream writes: the etcd cluster ID, hex; empty until it has
	// claimed one.
	Lineage string `json:"lineage,omitempty"`
	// SupersededBy, once another writer claimed the lineage after this stream, names that
	// writer; the stream stores nothing more and stays up, idle. SupersededTime is when it
	// found out.
	SupersededBy   string    `json:"supersededBy,omitempty"`
	SupersededTime time.Time `json:"supersededTime,omitzero"`
}

// Behind is BehindSeconds as a duration.
func (p Progress) Behind() time.Duration {
	return time.Duration(p.BehindSeconds * float64(time.Second))
}

// maxProgress bounds a progress answer read back: a few hundred bytes, an error included.
const maxProgress = 16 << 10

// DecodeProgress parses a progress answer.
func DecodeProgress(b []byte) (Progress, error) {
	var p Progress
	if len(b) > maxProgress {
		return Progress{}, fmt.Errorf("backup progress: %d bytes, more than %d", len(b), maxProgress)
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return Progress{}, fmt.Errorf("backup progress: %w", err)
	}
	return p, nil
}
