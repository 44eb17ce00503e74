// Package backupresult is what a backup Job reports: the member tool writes it to the
// container's termination message, and the planner reads it from the Job's pod to record the
// backup in status. Plain values, so that the planner depends on no storage client.
package backupresult

import (
	"encoding/json"
	"fmt"
)

// MaxMessage is the most a termination message holds: the kubelet keeps 4096 bytes.
const MaxMessage = 4096

// Result is one backup's outcome: a stored snapshot, or the reason there is none.
type Result struct {
	// Object is where the snapshot is, for people: s3://bucket/prefix/name or a path.
	Object   string `json:"object,omitempty"`
	Revision int64  `json:"revision,omitempty"`
	Size     int64  `json:"size,omitempty"`
	SHA256   string `json:"sha256,omitempty"`
	// MemberID is the hex ID of the member the snapshot was read from.
	MemberID string `json:"memberID,omitempty"`
	// Lineage is the lineage the snapshot went into: the etcd cluster ID, hex.
	Lineage string `json:"lineage,omitempty"`
	// Deleted counts the snapshots retention removed.
	Deleted int `json:"deleted,omitempty"`
	// Error is why no snapshot was stored; empty on success.
	Error string `json:"error,omitempty"`
}

// Encode renders r as one line of JSON that fits a termination message; a long error is
// shortened to fit.
func Encode(r Result) string {
	b, _ := json.Marshal(r)
	if len(b) > MaxMessage && r.Error != "" {
		r.Error = r.Error[:max(0, len(r.Error)-(len(b)-MaxMessage)-3)] + "..."
		b, _ = json.Marshal(r)
	}
	return string(b)
}

// Decode parses a termination message.
func Decode(s string) (Result, error) {
	var r Result
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return Result{}, fmt.Errorf("backup result: %w", err)
	}
	return r, nil
}
