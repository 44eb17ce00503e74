package sync

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"etcdops.dev/etcdops/backupresult"
)

// simStream is the continuous backup's pod as the hook reads it: serving its progress (every
// change up to stored is stored, and it has not been caught up for behind), or down.
type simStream struct {
	down   bool
	stored int64
	behind time.Duration
	err    string
	// supersededBy names the writer that claimed the lineage after this stream.
	supersededBy string
}

// streamProgress is what the hook reads: nothing before the Deployment is observed (it does
// not ask), nothing while the pod is down.
func (w *simWorld) streamProgress(observed Children) StreamProgress {
	switch {
	case progressURL(simConfig, &w.cluster, observed) == "":
		return StreamProgress{Err: "the stream's Deployment is not observed yet"}
	case w.stream.down:
		return StreamProgress{Err: "connection refused"}
	}
	s := w.stream
	p := backupresult.Progress{StoredRevision: s.stored, StoredTime: w.now.Add(-min(s.behind, time.Minute)),
		CaughtUpTime: w.now.Add(-s.behind), BehindSeconds: s.behind.Seconds(), LastError: s.err, SupersededBy: s.supersededBy}
	if s.supersededBy != "" {
		p.SupersededTime = w.now.Add(-s.behind)
	}
	return StreamProgress{Known: true, Progress: p}
}

// streamCommand: "stream up <stored>", "stream behind <duration> [error...]", "stream down",
// "stream superseded <duration> <writer...>" (another writer claimed the lineage that long ago).
func (w *simWorld) streamCommand(t *testing.T, line string, args []string) {
	t.Helper()
	if len(args) == 0 {
		t.Fatalf("%q: want up, behind, down or superseded", line)
	}
	switch args[0] {
	case "up":
		n, err := strconv.ParseInt(args[len(args)-1], 10, 64)
		if err != nil || len(args) != 2 {
			t.Fatalf("%q: want the stored revision", line)
		}
		w.stream = simStream{stored: n}
	case "behind":
		d, err := time.ParseDuration(args[min(1, len(args)-1)])
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		w.stream.down, w.stream.behind = false, d
		if len(args) > 2 {
			w.stream.err = strings.Join(args[2:], " ")
		}
	case "down":
		w.stream.down = true
	case "superseded":
		d, err := time.ParseDuration(args[min(1, len(args)-1)])
		if err != nil || len(args) < 3 {
			t.Fatalf("%q: want how long ago and the writer", line)
		}
		w.stream.down, w.stream.behind, w.stream.supersededBy = false, d, strings.Join(args[2:], " ")
	default:
		t.Fatalf("%q: want up, behind, down or superseded", line)
	}
}
