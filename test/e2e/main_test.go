// Package e2e runs the operator's whole loop against real etcd members: the real hook over
// HTTP, the real planner, membership operations and member tool, with Metacontroller,
// Kubernetes' controllers and the kubelet played by test/harness. Each scenario injects a
// change or a fault while a workload writes, checks the invariants after every sync, and
// adds one row to the figures table printed at the end (go test -v shows it).
package e2e

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	gosync "sync"
	"testing"
	"time"
)

var (
	soak     = flag.Bool("soak", false, "also run the soak: random faults and changes for -soak-time")
	soakTime = flag.Duration("soak-time", 3*time.Minute, "how long the soak injects faults")
	soakSeed = flag.Uint64("soak-seed", 0, "the soak's random seed; 0 picks one and logs it")
	verbose  = flag.Bool("e2e.log", false, "log every sync, Job and fault")
)

// Figure is one row of the table.
type Figure struct {
	Scenario          string
	Syncs             int
	MembershipChanges int
	LeaderChanges     int
	FailedWrites      int
	AckedWrites       int
	WorstLatency      time.Duration
	Converge          time.Duration
	Lost              int
	OperatorQuorum    int
	Panics            int
}

var (
	figMu   gosync.Mutex
	figures []Figure
)

func record(f Figure) {
	figMu.Lock()
	defer figMu.Unlock()
	figures = append(figures, f)
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	printFigures(os.Stdout)
	os.Exit(code)
}

func printFigures(w io.Writer) {
	figMu.Lock()
	defer figMu.Unlock()
	if len(figures) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-52s %6s %8s %8s %7s %7s %9s %9s %5s %7s %7s\n",
		"scenario", "syncs", "members±", "leaders±", "failed", "acked", "worst", "converge", "lost", "opQloss", "panics")
	fmt.Fprintln(w, strings.Repeat("-", 130))
	for _, f := range figures {
		fmt.Fprintf(w, "%-52s %6d %8d %8d %7d %7d %9s %9s %5d %7d %7d\n",
			f.Scenario, f.Syncs, f.MembershipChanges, f.LeaderChanges, f.FailedWrites, f.AckedWrites,
			f.WorstLatency.Round(time.Millisecond), f.Converge.Round(10*time.Millisecond), f.Lost, f.OperatorQuorum, f.Panics)
	}
	fmt.Fprintln(w, "members±: membership changes; leaders±: leader changes; failed: write attempts that failed (each is retried);")
	fmt.Fprintln(w, "worst: longest time to acknowledge a write; lost: acknowledged writes missing at the end; opQloss: quorum")
	fmt.Fprintln(w, "losses not explained by injected faults; panics: etcd members that crashed in a panic of etcd itself.")
}
