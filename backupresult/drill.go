package backupresult

import (
	"encoding/json"
	"fmt"
)

// Outcomes of a restore drill.
const (
	// DrillPassed: the backup restored, and the restored copy holds what the live cluster
	// held at the revision compared.
	DrillPassed = "Passed"
	// DrillMismatch: the backup restored, but the restored copy differs from the live cluster.
	DrillMismatch = "Mismatch"
	// DrillRestoreFailed: the backup could not be restored (a snapshot or a chunk refused, a
	// gap, the replay diverged, the storage unreachable).
	DrillRestoreFailed = "RestoreFailed"
	// DrillError: the drill could not compare (no member of the live cluster to read); it says
	// nothing of the backup.
	DrillError = "Error"
)

// Drill is what a restore drill reports: the member tool writes it to the container's
// termination message, and the planner reads it into status.backup.lastDrill.
type Drill struct {
	// Outcome is one of DrillPassed, DrillMismatch, DrillRestoreFailed, DrillError.
	Outcome string `json:"outcome"`
	// Message says what was compared, or what differs or failed.
	Message string `json:"message,omitempty"`
	// Lineage is the lineage restored from; Snapshot the snapshot restored (s3://... or a
	// path), and Chunks the chunks of changes replayed after it.
	Lineage  string `json:"lineage,omitempty"`
	Snapshot string `json:"snapshot,omitempty"`
	Chunks   int    `json:"chunks,omitempty"`
	// RestoredRevision is the revision restored; Revision the revision compared at (they
	// differ when the restored copy was brought forward, or compared against a newer
	// revision of a live cluster compacted past it).
	RestoredRevision int64 `json:"restoredRevision,omitempty"`
	Revision         int64 `json:"revision,omitempty"`
	// Keys counts the restored copy's keys at the revision compared, and Digest is its digest
	// (SHA-256, hex, over every key's name, value, create and modification revision, version
	// and lease, in key order); LiveDigest is the live cluster's at the revision it was read at.
	Keys       int64  `json:"keys,omitempty"`
	Digest     string `json:"digest,omitempty"`
	LiveDigest string `json:"liveDigest,omitempty"`
	// Member is the hex ID of the live member read.
	Member string `json:"member,omitempty"`
	// RestoreSeconds is how long the restore took: fetching, checking, restoring the snapshot
	// and replaying the changes after it.
	RestoreSeconds float64 `json:"restoreSeconds,omitempty"`
}

// EncodeDrill renders d as one line of JSON that fits a termination message; a long message
// is shortened to fit.
func EncodeDrill(d Drill) string {
	b, _ := json.Marshal(d)
	if len(b) > MaxMessage {
		d.Message = d.Message[:max(0, len(d.Message)-(len(b)-MaxMessage)-3)] + "..."
		b, _ = json.Marshal(d)
	}
	return string(b)
}

// DecodeDrill parses a drill's termination message.
func DecodeDrill(s string) (Drill, error) {
	var d Drill
	if err := json.Unmarshal([]byte(s), &d); err != nil {
		return Drill{}, fmt.Errorf("drill result: %w", err)
	}
	if d.Outcome == "" {
		return Drill{}, fmt.Errorf("drill result: no outcome in %q", s)
	}
	return d, nil
}
