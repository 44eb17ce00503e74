package gobuild

import (
	"strings"
	"testing"
	"time"
)

func TestLastLines(t *testing.T) {
	if got := LastLines("a\nb\nc\n", 2); got != "b\nc" {
		t.Errorf("LastLines = %q, want the last two lines", got)
	}
	if got := LastLines("a", 5); got != "a" {
		t.Errorf("LastLines = %q, want all of a short text", got)
	}
}

// TestRunReportsTheFailure: a failed build says which go command failed and what it printed.
func TestRunReportsTheFailure(t *testing.T) {
	err := Run(t.TempDir(), time.Minute, "build", "./nonexistent")
	if err == nil || !strings.Contains(err.Error(), "go build ./nonexistent") {
		t.Errorf("Run = %v, want the failed command named", err)
	}
}
