package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A package whose tests run in parallel, one subtest failing among chatty neighbours.
const sample = `package sample

import (
	"fmt"
	"testing"
)

func TestParent(t *testing.T) {
	t.Parallel()
	t.Run("good", func(t *testing.T) { t.Log("fine") })
	t.Run("bad", func(t *testing.T) { t.Error("the message that matters") })
	for i := range 100 {
		t.Logf("parent chatter %d", i)
	}
}

func TestNeighbour(t *testing.T) {
	t.Parallel()
	for i := range 100 {
		fmt.Println("neighbour chatter", i)
	}
}
`

// goTestJSON runs go test -json on a module holding the sample, with source as its test file.
func goTestJSON(t *testing.T, source string, verbose bool) []byte {
	t.Helper()
	dir := t.TempDir()
	for name, body := range map[string]string{"go.mod": "module sample\n\ngo 1.26\n", "sample_test.go": source} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"test", "-json", "-count=1"}
	if verbose {
		args = append(args, "-v")
	}
	cmd := exec.Command("go", append(args, ".")...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	out, _ := cmd.Output()
	if len(out) == 0 {
		t.Fatal("go test -json printed nothing")
	}
	return out
}

// TestSummaryEndsWithTheFailure: the failed subtest's message is among the last lines, its
// parent is only named, and the passing neighbour's output is not repeated.
func TestSummaryEndsWithTheFailure(t *testing.T) {
	for _, verbose := range []bool{false, true} {
		var out bytes.Buffer
		if !report(bytes.NewReader(goTestJSON(t, sample, verbose)), &out, verbose) {
			t.Fatalf("verbose %v: a failed run reported as passed:\n%s", verbose, out.String())
		}
		summary := out.String()[strings.LastIndex(out.String(), "=== what failed"):]
		for _, want := range []string{"--- sample TestParent/bad\n", "the message that matters", "FAIL sample TestParent/bad\n", "FAIL sample TestParent\n", "FAIL sample\n"} {
			if !strings.Contains(summary, want) {
				t.Errorf("verbose %v: the summary lacks %q:\n%s", verbose, want, summary)
			}
		}
		for _, unwanted := range []string{"parent chatter", "neighbour chatter", "--- sample TestParent\n"} {
			if strings.Contains(summary, unwanted) {
				t.Errorf("verbose %v: the summary has %q:\n%s", verbose, unwanted, summary)
			}
		}
		if strings.Contains(out.String(), "neighbour chatter") != verbose {
			t.Errorf("verbose %v: a passing test's output printed: %v", verbose, !verbose)
		}
	}
}

// TestPassingRunPrintsWhatGoTestPrints: nothing failed, nothing summarized, the package's ok
// line kept.
func TestPassingRunPrintsWhatGoTestPrints(t *testing.T) {
	var out bytes.Buffer
	passing := strings.Replace(sample, `t.Error("the message that matters")`, `t.Log("fine too")`, 1)
	if report(bytes.NewReader(goTestJSON(t, passing, false)), &out, false) {
		t.Fatalf("a passing run reported as failed:\n%s", out.String())
	}
	if s := out.String(); !strings.HasPrefix(s, "ok  \tsample\t") || strings.Contains(s, "what failed") || strings.Contains(s, "chatter") {
		t.Errorf("printed:\n%s", s)
	}
}
