package e2e

import (
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strings"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/manifests"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/harness"
)

// Scenario timing. TimeScale runs Kubernetes' clocks ten times faster; the waits are bounds,
// not sleeps: every wait polls and returns as soon as its condition holds.
const (
	timeScale   = 0.1
	createBound = 90 * time.Second
	changeBound = 120 * time.Second
	verifyBound = 15 * time.Second
)

// Versions: the embedded etcd is always the v3.7.3 build linked into the test. The spec's
// version only changes the image name, so an "upgrade" exercises the operator's rollout, not
// etcd's own upgrade path.
const (
	baseVersion    = "v3.7.3"
	upgradeVersion = "v3.7.4"
)

func controller(t *testing.T) harness.Controller {
	t.Helper()
	ctrl, err := harness.LoadController(manifests.FS, "metacontroller")
	if err != nil {
		t.Fatal(err)
	}
	return ctrl
}

func namespaceOf(name string) string {
	r := strings.NewReplacer("/", "-", "_", "-", "=", "-", " ", "-")
	return strings.ToLower(r.Replace(name))
}

// newEnv starts a closed loop for one scenario; it is torn down with the test.
func newEnv(t *testing.T, noOperator bool) *harness.Env {
	t.Helper()
	return startEnv(t, envOptions(t, noOperator))
}

// envOptions are the options of every scenario's loop.
func envOptions(t *testing.T, noOperator bool) harness.Options {
	t.Helper()
	logf := func(string, ...any) {}
	if *verbose {
		logf = func(format string, args ...any) { t.Logf(format, args...) }
	}
	return harness.Options{
		Namespace: namespaceOf(t.Name()),
		Cluster:   "etcd",
		Domain:    "cluster.local",
		TimeScale: timeScale,
		Tools:     harness.OperatorTools(),
		// A claim grows in about as long as a cloud disk takes (scaled).
		ResizeDelay: 20 * time.Second,
		Hook:        harness.InProcessHook(sync.Config{ClusterDomain: "cluster.local", ToolImage: "etcdops.dev/etcdops:e2e"}, nil),
		Controller:  controller(t),
		Root:        t.TempDir(),
		Logf:        logf,
		OnSync: func(rec harness.SyncRecord) {
			if *verbose {
				t.Log(harness.SyncLine(rec))
			}
		},
		NoOperator: noOperator,
		// The kubelet is as slow as a real one: mounted ConfigMaps and Secrets refreshed a
		// minute or more late, pod by pod, new pods Pending for their image and volume, and a
		// drained pod's volume attaching on its new node.
		MountDelay:  kubeletMountDelay,
		PendingFor:  kubeletPending(),
		AttachDelay: 30 * time.Second,
	}
}

// kubeletMountDelay is the kubelet's sync period plus its ConfigMap cache's TTL, about a
// minute: how late a changed ConfigMap or Secret reaches the pod of ordinal 0 (15s more per
// higher ordinal; Kubelet.MountDelay).
const kubeletMountDelay = 60 * time.Second

// kubeletPending is how long each new pod stays Pending, in Kubernetes time: 2 to 30
// seconds, drawn from its name and incarnation so that a run is repeatable and the pods of
// one change do not all start together. Most pods wait a few seconds (the image is cached, the
// volume attaches at once) and a few up to half a minute, which keeps the suite within its
// budget: uniform draws doubled its added time.
func kubeletPending() func(pod string) time.Duration {
	var mu gosync.Mutex
	incarnations := map[string]int{}
	return func(pod string) time.Duration {
		mu.Lock()
		incarnations[pod]++
		n := incarnations[pod]
		mu.Unlock()
		h := fnv.New32a()
		fmt.Fprintf(h, "%s/%d", pod, n)
		u := float64(h.Sum32()) / (1 << 32)
		return 2*time.Second + time.Duration(u*u*u*float64(28*time.Second))
	}
}

// startEnv starts a loop; it is torn down with the test.
func startEnv(t *testing.T, opts harness.Options) *harness.Env {
	t.Helper()
	env, err := harness.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Close)
	return env
}

// spec is the cluster every scenario starts from: members on PersistentVolumeClaims, as
// in production. emptyDirSpec keeps data in the pod instead.
func spec(size int32) v1alpha1.EtcdClusterSpec {
	s := emptyDirSpec(size)
	s.StorageSpec = &v1alpha1.StorageSpec{VolumeSizeRequest: resource.MustParse("1Gi")}
	return s
}

func emptyDirSpec(size int32) v1alpha1.EtcdClusterSpec {
	return v1alpha1.EtcdClusterSpec{Size: &size, Version: baseVersion}
}

// minAcked is how many appends each window waits for before it stops its workload.
const minAcked = 20

// windows numbers the windows of this process.
var windows atomic.Int64

// measure runs a scenario's window and adds its row to the figures.
func measure(t *testing.T, env *harness.Env, sc scenario) {
	t.Helper()
	record(window(t, env, sc))
}

// window runs sc.act under a workload, waits until the cluster is steady at the size it
// returns, checks the workload's history (linearizable, watch guarantees), looks for forks,
// and checks and returns the figures.
func window(t *testing.T, env *harness.Env, sc scenario) Figure {
	t.Helper()
	opts := harness.WorkloadOptions{}
	if sc.workload != nil {
		opts = sc.workload(t, env)
	}
	// A prefix of its own: the appender's keys must be this window's, read back at its end.
	w, err := env.StartWorkloadWith(fmt.Sprintf("/e2e/%s/%d", namespaceOf(t.Name()), windows.Add(1)), opts)
	if err != nil {
		t.Fatal(err)
	}
	syncs0 := syncs(env)
	counts0 := env.Monitor.Counts()
	marks := safetyMarks(env)
	start := time.Now()
	size := sc.act(t, env)
	converge := time.Since(start)
	if size > 0 {
		if _, err := env.WaitSteady(size, changeBound); err != nil {
			w.Stop()
			t.Fatalf("not steady at %d members: %v\n%s", size, err, env.Describe())
		}
		converge = time.Since(start)
	}
	w.AwaitAcked(minAcked, verifyBound)
	stats := w.Stop()
	lost, err := w.Verify(verifyBound)
	if err != nil {
		t.Errorf("verifying writes: %v", err)
	}
	dir := filepath.Join(outDir(), namespaceOf(t.Name()))
	if sc.injected != "" && *out == "" {
		// An expected violation is kept only when asked for.
		dir = t.TempDir()
	}
	verdict := w.History().Check(dir)
	forks := env.Forks(w.History())
	counts := env.Monitor.Counts()
	fig := Figure{
		Scenario:          t.Name(),
		Syncs:             syncs(env) - syncs0,
		MembershipChanges: counts.MembershipChanges - counts0.MembershipChanges,
		LeaderChanges:     counts.LeaderChanges - counts0.LeaderChanges,
		FailedOps:         stats.Failed,
		AckedWrites:       stats.Acked,
		WorstLatency:      stats.Worst,
		Converge:          converge,
		Lost:              len(lost),
		OperatorQuorum:    counts.OperatorQuorumLoss - counts0.OperatorQuorumLoss,
		Panics:            counts.Panics - counts0.Panics,
		ExpectedPanic:     sc.expectPanic,
		Ops:               verdict.Ops,
		Linearizable:      verdict.Linearizable,
		Injected:          sc.injected != "",
		WatchEvents:       verdict.WatchEvents,
		CheckTime:         verdict.CheckTime,
		Forks:             len(forks),
	}
	for _, p := range env.Monitor.Panics()[counts0.Panics:] {
		t.Logf("etcd panicked on %s", p)
		if sc.expectPanic == "" || !strings.Contains(p, sc.panicSays) {
			t.Errorf("etcd panicked on %s, and the scenario expects no such panic", p)
		}
	}
	checkHistory(t, sc, verdict)
	for _, f := range forks {
		t.Errorf("fork: %s", f)
	}
	checkSafety(t, env, fig, lost, marks)
	return fig
}

// checkHistory fails the test on every problem the checker found, or, where the scenario
// injects a violation, when the checker found none.
func checkHistory(t *testing.T, sc scenario, v harness.Verdict) {
	t.Helper()
	if v.Ops == 0 {
		t.Errorf("no operation was checked")
	}
	if sc.injected != "" {
		if v.Linearizable {
			t.Errorf("injected violation (%s) not caught: the checker found %d operations linearizable", sc.injected, v.Ops)
			return
		}
		t.Logf("injected violation (%s) caught: %s; history and visualisation in %s", sc.injected, v.Problems[len(v.Problems)-1], v.Written)
		for _, f := range []string{"history.json", "linearization.html"} {
			if _, err := os.Stat(filepath.Join(v.Written, f)); err != nil {
				t.Errorf("the violation was not written: %v", err)
			}
		}
		return
	}
	for _, p := range v.Problems {
		t.Errorf("history: %s", p)
	}
	if v.Written != "" {
		t.Errorf("history and visualisation written to %s", v.Written)
	}
}

func syncs(env *harness.Env) int {
	if env.MC == nil {
		return 0
	}
	return env.MC.Syncs()
}

// marks are how many violations of each kind were known when a scenario started, so that a
// scenario on a shared cluster reports only its own.
type marks struct{ violations, jobChanges, nonIdempotent int }

func safetyMarks(env *harness.Env) marks {
	m := marks{violations: len(env.Monitor.Violations())}
	if env.MC != nil {
		m.jobChanges, m.nonIdempotent = len(env.MC.JobChanges()), len(env.MC.NonIdempotent())
	}
	return m
}

// checkSafety fails the test on any invariant broken during the scenario.
func checkSafety(t *testing.T, env *harness.Env, fig Figure, lost []string, since marks) {
	t.Helper()
	if len(lost) > 0 {
		t.Errorf("%d acknowledged writes lost, first %s", len(lost), lost[0])
	}
	if fig.AckedWrites == 0 {
		t.Errorf("the workload got no write acknowledged")
	}
	if fig.OperatorQuorum > 0 {
		t.Errorf("quorum lost %d time(s) by the operator's own action", fig.OperatorQuorum)
	}
	for _, v := range env.Monitor.Violations()[since.violations:] {
		t.Errorf("invariant: %s", v)
	}
	if env.MC == nil {
		return
	}
	for _, c := range env.MC.JobChanges()[since.jobChanges:] {
		t.Errorf("immutable Job changed: %s", c)
	}
	for _, c := range env.MC.NonIdempotent()[since.nonIdempotent:] {
		t.Errorf("not idempotent: %s", c)
	}
}

// scaleTo edits spec.size.
func scaleTo(env *harness.Env, size int32) {
	env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { s.Size = &size })
}

// waitSteady fails the test when the cluster does not settle at size.
func waitSteady(t *testing.T, env *harness.Env, size int) {
	t.Helper()
	if _, err := env.WaitSteady(size, changeBound); err != nil {
		t.Fatalf("not steady at %d members: %v\n%s", size, err, env.Describe())
	}
}

func leaderOf(t *testing.T, env *harness.Env) string {
	t.Helper()
	v := env.Monitor.View()
	if v.Leader == "" {
		t.Fatal("no leader")
	}
	return v.Leader
}

func followerOf(t *testing.T, env *harness.Env) string {
	t.Helper()
	leader := leaderOf(t, env)
	for _, m := range env.Monitor.View().Members {
		if m.Name != leader && !m.IsLearner {
			return m.Name
		}
	}
	t.Fatal("no follower")
	return ""
}

func memberID(env *harness.Env, pod string) string {
	for _, m := range env.Monitor.View().Members {
		if m.Name == pod {
			return fmt.Sprintf("%x", m.ID)
		}
	}
	return ""
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
