// Command failures reads the events of `go test -json` on its input and prints the run as go
// test prints it, then, last, what failed: each failed test's own output and each failed
// package. A long run's log is read from its tail (CI keeps only the end), and with tests
// running in parallel a failure's message otherwise sits far above it. It exits 1 when
// anything failed.
//
//	go test -json ./... | go run ./test/failures       # as `go test ./...` prints
//	go test -json -v ./pkg | go run ./test/failures -v  # every test's output as it comes
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// event is the part of a test2json event read here.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// tailLines is how much of a failed test's output the summary repeats.
const tailLines = 40

func main() {
	verbose := flag.Bool("v", false, "print every test's output as it comes, not only a failed test's")
	flag.Parse()
	if report(os.Stdin, os.Stdout, *verbose) {
		os.Exit(1)
	}
}

// report copies run in to out and says whether anything failed.
func report(in io.Reader, out io.Writer, verbose bool) bool {
	type key struct{ pkg, test string }
	held := map[key][]string{}
	var failedTests []key
	var failedPkgs []string
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			// Not an event (go test prints some errors as plain text): as it is.
			fmt.Fprintln(out, sc.Text())
			continue
		}
		k := key{e.Package, e.Test}
		switch {
		case e.Action == "output" || e.Action == "build-output":
			if e.Test != "" {
				held[k] = append(held[k], e.Output)
			}
			// go test, not verbose, prints no package's PASS line.
			if verbose || e.Test == "" && e.Output != "PASS\n" {
				fmt.Fprint(out, e.Output)
			}
		case e.Action == "fail" && e.Test != "":
			if !verbose {
				fmt.Fprint(out, strings.Join(held[k], ""))
			}
			failedTests = append(failedTests, k)
		case e.Action == "fail":
			failedPkgs = append(failedPkgs, e.Package)
		case e.Action == "pass" || e.Action == "skip":
			delete(held, k)
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(out, "failures: reading the run: %v\n", err)
		return true
	}
	if len(failedTests) == 0 && len(failedPkgs) == 0 {
		return false
	}
	fmt.Fprintln(out, "\n=== what failed: each failed test's last lines (a test whose subtest failed is only named)")
	for _, k := range failedTests {
		if slices.ContainsFunc(failedTests, func(o key) bool { return o.pkg == k.pkg && strings.HasPrefix(o.test, k.test+"/") }) {
			continue
		}
		lines := strings.SplitAfter(strings.Join(held[k], ""), "\n")
		fmt.Fprintf(out, "--- %s %s\n%s", k.pkg, k.test, strings.Join(lines[max(0, len(lines)-tailLines):], ""))
	}
	for _, k := range failedTests {
		fmt.Fprintf(out, "FAIL %s %s\n", k.pkg, k.test)
	}
	for _, p := range failedPkgs {
		fmt.Fprintf(out, "FAIL %s\n", p)
	}
	return true
}
