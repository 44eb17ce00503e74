// Package e2e runs the operator's whole loop against real etcd members: the real hook over
// HTTP, the real planner, membership operations and member tool, with Metacontroller,
// Kubernetes' controllers and the kubelet played by test/harness. Each scenario injects a
// change or a fault while a recorded workload runs, checks the invariants after every sync,
// checks the workload's history for linearizability and the watch guarantees, looks for a
// fork once the cluster has settled, and adds one row to the figures table printed at the
// end (go test -v shows it).
package e2e

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
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
	out      = flag.String("e2e.out", "", "where a history that fails its check is written, with its visualisation (default $TMPDIR/etcdops-e2e)")
)

// outDir is where failing histories go: they must outlive the test, so not t.TempDir.
func outDir() string {
	if *out != "" {
		return *out
	}
	return filepath.Join(os.TempDir(), "etcdops-e2e")
}

// Figure is one row of the table.
type Figure struct {
	Scenario          string
	Syncs             int
	MembershipChanges int
	LeaderChanges     int
	FailedOps         int
	AckedWrites       int
	WorstLatency      time.Duration
	Converge          time.Duration
	Lost              int
	OperatorQuorum    int
	Panics            int
	// ExpectedPanic is why the scenario expects etcd to panic; empty when it does not.
	ExpectedPanic string
	Ops           int
	Linearizable  bool
	// Injected: the scenario breaks linearizability on purpose, and the checker must say so.
	Injected    bool
	WatchEvents int
	CheckTime   time.Duration
	Forks       int
}

// add sums another window into f, as the soak does.
func (f *Figure) add(g Figure) {
	f.Syncs += g.Syncs
	f.MembershipChanges += g.MembershipChanges
	f.LeaderChanges += g.LeaderChanges
	f.FailedOps += g.FailedOps
	f.AckedWrites += g.AckedWrites
	f.WorstLatency = max(f.WorstLatency, g.WorstLatency)
	f.Converge += g.Converge
	f.Lost += g.Lost
	f.OperatorQuorum += g.OperatorQuorum
	f.Panics += g.Panics
	f.Ops += g.Ops
	f.Linearizable = f.Linearizable && g.Linearizable
	f.WatchEvents += g.WatchEvents
	f.CheckTime += g.CheckTime
	f.Forks += g.Forks
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

// shortScenario is what go test -short runs of this package, unless -run names others: one
// scenario that goes through the whole loop (a seed, learners added and promoted, members
// removed, the StatefulSet grown and shrunk) under the workload, with every check, in seconds.
const shortScenario = "^TestScale$"

// scenariosAtOnce is how many scenarios run at once unless -parallel says otherwise. They
// spend most of their time waiting at the simulated cluster's pace (pods starting, probes,
// resyncs, faults held), about one core's work of two: four at once took the package from
// 837 s to 518 s on 2 cores, each scenario 7 % longer (go test -json ./test/e2e, with and
// without -parallel 4).
const scenariosAtOnce = 4

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() && flag.Lookup("test.run").Value.String() == "" {
		flag.Set("test.run", shortScenario)
	}
	if !flagGiven("test.parallel") {
		flag.Set("test.parallel", strconv.Itoa(max(scenariosAtOnce, runtime.GOMAXPROCS(0))))
	}
	code := m.Run()
	printFigures(os.Stdout)
	os.Exit(code)
}

// flagGiven says whether the command line set the flag name.
func flagGiven(name string) bool {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

func topLevel(scenario string) string {
	test, _, _ := strings.Cut(scenario, "/")
	return test
}

func printFigures(w io.Writer) {
	figMu.Lock()
	defer figMu.Unlock()
	if len(figures) == 0 {
		return
	}
	// The top-level tests run in parallel: group each one's rows, in the order they ran.
	slices.SortStableFunc(figures, func(a, b Figure) int {
		return strings.Compare(topLevel(a.Scenario), topLevel(b.Scenario))
	})
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-52s %5s %8s %8s %6s %6s %8s %8s %4s %7s %6s %6s %4s %6s %7s %5s\n",
		"scenario", "syncs", "members±", "leaders±", "failed", "acked", "worst", "converge", "lost", "opQloss", "panics",
		"ops", "lin", "watch", "checker", "forks")
	fmt.Fprintln(w, strings.Repeat("-", 149))
	var expected []string
	for _, f := range figures {
		lin := "yes"
		if !f.Linearizable {
			lin = "no"
		}
		if f.Injected {
			lin += "*"
		}
		panics := fmt.Sprint(f.Panics)
		if f.ExpectedPanic != "" {
			panics += "*"
			expected = append(expected, fmt.Sprintf("  %s: %s", f.Scenario, f.ExpectedPanic))
		}
		fmt.Fprintf(w, "%-52s %5d %8d %8d %6d %6d %8s %8s %4d %7d %6s %6d %4s %6d %7s %5d\n",
			f.Scenario, f.Syncs, f.MembershipChanges, f.LeaderChanges, f.FailedOps, f.AckedWrites,
			f.WorstLatency.Round(time.Millisecond), f.Converge.Round(10*time.Millisecond), f.Lost, f.OperatorQuorum, panics,
			f.Ops, lin, f.WatchEvents, f.CheckTime.Round(time.Millisecond), f.Forks)
	}
	fmt.Fprintln(w, "members±: membership changes; leaders±: leader changes; failed: client operations that failed (each append is")
	fmt.Fprintln(w, "retried); acked: appended keys acknowledged; worst: longest time to acknowledge an append; lost: acknowledged")
	fmt.Fprintln(w, "appends missing at the end; opQloss: quorum losses not explained by injected faults; panics: etcd members that")
	fmt.Fprintln(w, "crashed in a panic of etcd itself (* expected, see below); ops: client operations checked for linearizability;")
	fmt.Fprintln(w, "lin: the history is linearizable (* a violation injected on purpose, which the checker must catch); watch: watch")
	fmt.Fprintln(w, "events checked; checker: time porcupine took; forks: members that disagree on the cluster ID or the key space's")
	fmt.Fprintln(w, "hash at one revision, or that answered from outside the ledger.")
	if len(expected) > 0 {
		fmt.Fprintln(w, "expected panics:")
		for _, e := range expected {
			fmt.Fprintln(w, e)
		}
	}
}
