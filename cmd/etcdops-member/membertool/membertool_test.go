package membertool

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"etcdops.dev/etcdops/internal/defraghold"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"etcdops.dev/etcdops/internal/etcdtest"
	"etcdops.dev/etcdops/joinstate"
	"etcdops.dev/etcdops/launcher"
)

// startSeed starts a one-member etcd on loopback and returns its client URL and member ID.
func startSeed(t *testing.T) (string, uint64) {
	t.Helper()
	client := etcdtest.FreeURL(t)
	e := etcdtest.Start(t, etcdtest.Config("e-0", t.TempDir(), etcdtest.FreeURL(t), client))
	return client.String(), uint64(e.Server.MemberID())
}

// run runs the tool in-process and returns its exit code and output.
func run(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := Run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// oneLine fails unless s is exactly one line containing want.
func oneLine(t *testing.T, what, s, want string) {
	t.Helper()
	if strings.Count(s, "\n") != 1 || !strings.Contains(s, want) {
		t.Errorf("%s: want one line containing %q, got %q", what, want, s)
	}
}

func TestMembershipCommands(t *testing.T) {
	endpoint, seedID := startSeed(t)
	common := []string{"--endpoints=" + endpoint, "--timeout=2s"}
	with := func(cmd string, args ...string) []string { return append(append([]string{cmd}, common...), args...) }
	learnerURL := etcdtest.FreeURL(t)
	learnerPeer := learnerURL.String()

	code, out, errOut := run(with("add-learner", "--member=e-1", "--peer-url="+learnerPeer)...)
	if code != ExitOK {
		t.Fatalf("add-learner: exit %d: %s", code, errOut)
	}
	oneLine(t, "add-learner", out, ": done (id ")
	id := out[strings.Index(out, "(id ")+4 : strings.Index(out, ")")]

	code, out, _ = run(with("add-learner", "--member=e-1", "--peer-url="+learnerPeer)...)
	if code != ExitOK {
		t.Fatalf("add-learner again: exit %d", code)
	}
	oneLine(t, "add-learner again", out, "already done (id "+id+")")

	// The learner never starts, so it never catches up: retried until --timeout, then 1.
	start := time.Now()
	code, _, errOut = run(with("promote", "--member=e-1", "--id="+id)...)
	if code != ExitRetryable || time.Since(start) > 5*time.Second {
		t.Fatalf("promote of a learner that never started: exit %d after %v", code, time.Since(start))
	}
	oneLine(t, "promote", errOut, "not caught up")

	otherURL := etcdtest.FreeURL(t)
	code, _, errOut = run(with("add-learner", "--member=e-2", "--peer-url="+otherURL.String())...)
	if code != ExitRefused {
		t.Fatalf("second learner: exit %d, want refused", code)
	}
	oneLine(t, "second learner", errOut, "refused")

	moved := etcdtest.FreeURL(t)
	for _, c := range []struct{ url, want string }{{learnerPeer, "already done"}, {moved.String(), "done"}, {moved.String(), "already done"}} {
		code, out, errOut = run(with("update-peer-url", "--member=e-1", "--id="+id, "--peer-url="+c.url)...)
		if code != ExitOK {
			t.Fatalf("update-peer-url to %s: exit %d: %s", c.url, code, errOut)
		}
		oneLine(t, "update-peer-url", out, ": "+c.want)
	}

	for _, want := range []string{"done", "already done"} {
		code, out, errOut = run(with("remove", "--member=e-1", "--id="+id)...)
		if code != ExitOK {
			t.Fatalf("remove: exit %d: %s", code, errOut)
		}
		oneLine(t, "remove", out, ": "+want)
	}

	seed := strconv.FormatUint(seedID, 16)
	code, out, _ = run(with("move-leader", "--member=e-0", "--id="+seed)...)
	if code != ExitOK {
		t.Fatalf("move-leader to the leader: exit %d", code)
	}
	oneLine(t, "move-leader", out, "already done")

	code, _, errOut = run(with("remove", "--member=e-0", "--id="+seed)...)
	if code != ExitRefused {
		t.Fatalf("remove the last voter: exit %d", code)
	}
	oneLine(t, "remove the last voter", errOut, "refused")

	code, out, errOut = run(with("compact", "--member=e-0")...)
	if code != ExitOK {
		t.Fatalf("compact: exit %d: %s", code, errOut)
	}
	oneLine(t, "compact", out, "(revision ")
	code, out, errOut = run(with("defragment", "--member=e-0", "--id="+seed)...)
	if code != ExitOK {
		t.Fatalf("defragment: exit %d: %s", code, errOut)
	}
	oneLine(t, "defragment", out, ": done")
	code, out, errOut = run(with("disarm", "--member=e-0", "--alarm=NOSPACE", "--id="+seed)...)
	if code != ExitOK {
		t.Fatalf("disarm: exit %d: %s", code, errOut)
	}
	oneLine(t, "disarm", out, "already done")
}

// TestDisarmNamesAMember: the tool disarms only the alarm of a member it is given. Without
// --id, or with member ID 0, it refuses, and a CORRUPT alarm of member 0 (what etcd raises
// when the members' hashes disagree and no majority says which one is wrong, raised here
// through etcd's own Alarm API) stays active, as does etcd's refusal of writes.
func TestDisarmNamesAMember(t *testing.T) {
	client := etcdtest.FreeURL(t)
	e := etcdtest.Start(t, etcdtest.Config("e-0", t.TempDir(), etcdtest.FreeURL(t), client))
	seed := strconv.FormatUint(uint64(e.Server.MemberID()), 16)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.Server.Alarm(ctx, &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: 0, Alarm: pb.AlarmType_CORRUPT}); err != nil {
		t.Fatalf("etcd refused a CORRUPT alarm of member 0: %v", err)
	}
	common := []string{"disarm", "--endpoints=" + client.String(), "--member=e-0", "--alarm=CORRUPT", "--timeout=2s"}
	if code, _, errOut := run(common...); code != ExitUsage {
		t.Errorf("disarm without --id: exit %d (%s), want %d", code, errOut, ExitUsage)
	}
	code, _, errOut := run(append(common, "--id=0")...)
	if code != ExitRefused {
		t.Errorf("disarm of member 0: exit %d, want %d", code, ExitRefused)
	}
	oneLine(t, "disarm of member 0", errOut, "without a member")
	code, out, errOut := run(append(common, "--id="+seed)...)
	if code != ExitOK {
		t.Fatalf("disarm of e-0: exit %d: %s", code, errOut)
	}
	oneLine(t, "disarm of e-0, which has no alarm", out, "already done")
	alarms := e.Server.Alarms()
	if len(alarms) != 1 || alarms[0].MemberID != 0 || alarms[0].Alarm != pb.AlarmType_CORRUPT {
		t.Errorf("alarms after the refused disarms: %v, want the CORRUPT alarm of member 0", alarms)
	}
}

// TestProbe: the liveness probe passes while etcd's health answers 200, fails while it does
// not, and fails while a quorum recovery waits for this member to restart.
func TestProbe(t *testing.T) {
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) }))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	joinFile, dataDir := filepath.Join(dir, "join.json"), filepath.Join(dir, "volume", "data")
	mount := func(s joinstate.State) {
		if err := os.WriteFile(joinFile, []byte(joinstate.Encode(s)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	probe := func() int {
		code, _, _ := run("probe", "--join-state="+joinFile, "--data-dir="+dataDir, "--name=e-0", "--health="+srv.URL+"/livez")
		return code
	}
	mount(joinstate.State{Token: "t", ClusterState: "existing", Members: []joinstate.Member{{Name: "e-0", PeerURL: "http://e-0:2380", Established: true}}})
	if code := probe(); code != ExitOK {
		t.Errorf("healthy: exit %d", code)
	}
	status = http.StatusServiceUnavailable
	if code := probe(); code != ExitRetryable {
		t.Errorf("etcd unhealthy: exit %d", code)
	}
	status = http.StatusOK
	mount(joinstate.State{Token: "t", ClusterState: "existing", Members: []joinstate.Member{{Name: "e-0", PeerURL: "http://e-0:2380", Established: true}},
		Recovery: &joinstate.Recovery{Survivor: "e-0", Token: "r1"}})
	if code := probe(); code != ExitRetryable {
		t.Errorf("recovery pending: exit %d, want a failed probe so the kubelet restarts etcd", code)
	}
	if err := os.MkdirAll(filepath.Dir(dataDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(launcher.RecoveredPath(dataDir), []byte("r1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := probe(); code != ExitOK {
		t.Errorf("recovery applied: exit %d", code)
	}
	if code, _, _ := run("probe", "--join-state="+joinFile); code != ExitUsage {
		t.Errorf("probe without --health: exit %d", code)
	}
}

// TestProbeDuringDefragmentation runs the liveness probe against a real member whose backend
// is held as a defragmentation holds it (defraghold: a real one of a test-sized database ends
// in milliseconds): /livez does not answer, so the probe fails, unless it is told where etcd's
// metrics are, which report the defragmentation. A member whose /livez fails with no
// defragmentation in flight still fails the probe.
func TestProbeDuringDefragmentation(t *testing.T) {
	metrics := etcdtest.FreeURL(t)
	cfg := etcdtest.Config("e-0", t.TempDir(), etcdtest.FreeURL(t), etcdtest.FreeURL(t))
	cfg.ListenMetricsUrls = []url.URL{metrics}
	e := etcdtest.Start(t, cfg)
	missing := filepath.Join(t.TempDir(), "no-join-state.json")
	probe := func(base string, extra ...string) (int, string) {
		args := append([]string{"probe", "--join-state=" + missing, "--data-dir=" + t.TempDir(), "--name=e-0", "--health=" + base + "/livez", "--timeout=1s"}, extra...)
		code, _, errOut := run(args...)
		return code, errOut
	}
	if code, errOut := probe(metrics.String()); code != ExitOK {
		t.Fatalf("before the defragmentation: exit %d: %s", code, errOut)
	}
	release, err := defraghold.Hold(e.Server)
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := probe(metrics.String()); code != ExitRetryable {
		t.Errorf("defragmenting, without --defrag-metrics: exit %d, want the failure a restart follows", code)
	}
	code, errOut := probe(metrics.String(), "--defrag-metrics="+metrics.String()+"/metrics")
	if code != ExitOK || !strings.Contains(errOut, "defragmenting") {
		t.Errorf("defragmenting, with --defrag-metrics: exit %d (%q), want alive", code, errOut)
	}
	release()
	if code, errOut := probe(metrics.String(), "--defrag-metrics="+metrics.String()+"/metrics"); code != ExitOK {
		t.Errorf("after the defragmentation: exit %d: %s", code, errOut)
	}

	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			fmt.Fprintln(w, "# TYPE etcd_disk_defrag_inflight gauge\netcd_disk_defrag_inflight 0")
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(hung.Close)
	if code, _ := probe(hung.URL, "--defrag-metrics="+hung.URL+"/metrics"); code != ExitRetryable {
		t.Errorf("unhealthy with no defragmentation in flight: exit %d, want a failure", code)
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"frobnicate"},
		{"promote", "--endpoints=http://127.0.0.1:1", "--member=e-1"},
		{"promote", "--endpoints=http://127.0.0.1:1", "--member=e-1", "--id=xyz"},
		{"add-learner", "--endpoints=http://127.0.0.1:1", "--member=e-1", "--id=1"},
		{"defragment", "--endpoints=http://127.0.0.1:1", "--member=e-1"},
		{"disarm", "--endpoints=http://127.0.0.1:1", "--member=e-1"},
		{"update-peer-url", "--endpoints=http://127.0.0.1:1", "--member=e-1", "--id=1"},
		{"update-peer-url", "--endpoints=http://127.0.0.1:1", "--member=e-1", "--peer-url=http://e-1:2380"},
		{"install"},
		{"launch", "--name=e-0", "--", "--name=other"},
	} {
		if code, _, _ := run(args...); code != ExitUsage {
			t.Errorf("%q: exit %d, want %d", args, code, ExitUsage)
		}
	}
}

func TestInstall(t *testing.T) {
	to := filepath.Join(t.TempDir(), "opt", "etcdops", "etcdops-member")
	code, _, errOut := run("install", "--to="+to)
	if code != ExitOK {
		t.Fatalf("install: exit %d: %s", code, errOut)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(to)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(to)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) || info.Mode().Perm()&0o111 == 0 {
		t.Fatalf("installed copy differs (%v) or is not executable (%v)", !bytes.Equal(got, want), info.Mode())
	}
}

func TestLaunch(t *testing.T) {
	dir := t.TempDir()
	joinFile := filepath.Join(dir, "join-state.json")
	dataDir := filepath.Join(dir, "volume", "data")
	args := []string{"--join-state=" + joinFile, "--name=e-1", "--data-dir=" + dataDir, "--etcd=/usr/local/bin/etcd", "--", "--listen-client-urls=http://0.0.0.0:2379"}

	// Not in the join state: exit 1 so that the kubelet restarts the pod; nothing is exec'd.
	state := joinstate.State{Token: "t", ClusterState: joinstate.StateExisting, Members: []joinstate.Member{{Name: "e-0", PeerURL: "http://e-0:2380", Incarnation: 1, Established: true}}}
	if err := os.WriteFile(joinFile, []byte(joinstate.Encode(state)), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := run(append([]string{"launch"}, args...)...)
	if code != ExitRetryable {
		t.Fatalf("launch before the join state lists the member: exit %d", code)
	}
	oneLine(t, "launch wait", errOut, "not in the join state")

	state.Members = append(state.Members, joinstate.Member{Name: "e-1", PeerURL: "http://e-1:2380", Incarnation: 3})
	if err := os.WriteFile(joinFile, []byte(joinstate.Encode(state)), 0o600); err != nil {
		t.Fatal(err)
	}
	argv, d, restored, err := LaunchArgv(args)
	if err != nil || d.Kind != launcher.Start || restored != "" {
		t.Fatalf("LaunchArgv: %+v %v", d, err)
	}
	want := []string{"/usr/local/bin/etcd", "--listen-client-urls=http://0.0.0.0:2379", "--name=e-1", "--data-dir=" + dataDir,
		"--initial-cluster=e-0=http://e-0:2380,e-1=http://e-1:2380", "--initial-cluster-state=existing", "--initial-cluster-token=t"}
	if !slices.Equal(argv, want) {
		t.Fatalf("argv\n got %q\nwant %q", argv, want)
	}
	marker, err := os.ReadFile(launcher.MarkerPath(dataDir))
	if err != nil || string(marker) != fmt.Sprintln(3) {
		t.Fatalf("marker %q %v, want 3", marker, err)
	}
}

// TestLaunchRefusalReachesTheTerminationLog: a refusal exits 3 and leaves its reason in the
// termination log, where the kubelet reads the container's termination message; here a
// cluster re-created under the same name finds its predecessor's data.
func TestLaunchRefusalReachesTheTerminationLog(t *testing.T) {
	dir := t.TempDir()
	joinFile, termLog := filepath.Join(dir, "join-state.json"), filepath.Join(dir, "termination-log")
	dataDir := filepath.Join(dir, "volume", "data")
	args := []string{"launch", "--join-state=" + joinFile, "--name=e-0", "--data-dir=" + dataDir, "--etcd=/usr/local/bin/etcd", "--termination-log=" + termLog}
	state := joinstate.State{Token: "ns/e/uid-1", ClusterState: joinstate.StateNew, Members: []joinstate.Member{{Name: "e-0", PeerURL: "http://e-0:2380"}}}
	if err := os.WriteFile(joinFile, []byte(joinstate.Encode(state)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, d, _, err := LaunchArgv(args[1:]); err != nil || d.Kind != launcher.Start {
		t.Fatalf("first cluster: %+v %v", d, err)
	}
	if err := os.MkdirAll(filepath.Join(dataDir, "member"), 0o700); err != nil {
		t.Fatal(err)
	}
	state.Token = "ns/e/uid-2"
	if err := os.WriteFile(joinFile, []byte(joinstate.Encode(state)), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := run(args...)
	if code != ExitRefused {
		t.Fatalf("re-created cluster on the old volume: exit %d: %s", code, errOut)
	}
	oneLine(t, "launch refuse", errOut, "ns/e/uid-1")
	msg, err := os.ReadFile(termLog)
	if err != nil || !strings.HasPrefix(string(msg), joinstate.Refused+joinstate.ForeignCluster+"ns/e/uid-1") {
		t.Fatalf("termination log %q %v", msg, err)
	}
}

// TestProbeRecordsAVoter: a healthy probe of a real etcd that reports itself no learner notes
// on the volume that its member is a voter (launcher.RecordEstablished), so that a lost data
// dir is refused before the join state says so.
func TestProbeRecordsAVoter(t *testing.T) {
	metrics := etcdtest.FreeURL(t)
	cfg := etcdtest.Config("e-0", t.TempDir(), etcdtest.FreeURL(t), etcdtest.FreeURL(t))
	cfg.ListenMetricsUrls = []url.URL{metrics}
	etcdtest.Start(t, cfg)
	dataDir := filepath.Join(t.TempDir(), "volume", "data")
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(launcher.MarkerPath(dataDir), []byte("3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "no-join-state.json")
	code, _, errOut := run("probe", "--join-state="+missing, "--data-dir="+dataDir, "--name=e-0",
		"--health="+metrics.String()+"/livez", "--defrag-metrics="+metrics.String()+"/metrics")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if v, err := launcher.Inspect(dataDir); err != nil || !v.Established {
		t.Fatalf("after a healthy probe of a voter: %+v %v (%s)", v, err, errOut)
	}
}

// TestReady runs the readiness probe against real members: a voter is ready; a learner that
// serves local reads is not (it refuses what clients of the Service send), until it is
// promoted and the join state it reads says so too; a member the join state lists as a
// learner is not, whatever etcd says (one that has just joined does not know yet); an etcd
// that does not answer is not.
func TestReady(t *testing.T) {
	seedPeer, seedClient, seedMetrics := etcdtest.FreeURL(t), etcdtest.FreeURL(t), etcdtest.FreeURL(t)
	cfg := etcdtest.Config("e-0", t.TempDir(), seedPeer, seedClient)
	cfg.ListenMetricsUrls = []url.URL{seedMetrics}
	etcdtest.Start(t, cfg)
	joinFile := filepath.Join(t.TempDir(), "join.json")
	mount := func(learner bool) {
		st := joinstate.State{Token: "t", ClusterState: "existing", Members: []joinstate.Member{
			{Name: "e-0", PeerURL: seedPeer.String(), Established: true},
			{Name: "e-1", PeerURL: "http://e-1:2380", Learner: learner},
		}}
		if err := os.WriteFile(joinFile, []byte(joinstate.Encode(st)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ready := func(name string, metrics url.URL) (int, string) {
		code, _, errOut := run("ready", "--readyz="+metrics.String()+"/readyz?exclude=linearizable_read", "--metrics="+metrics.String()+"/metrics",
			"--join-state="+joinFile, "--name="+name, "--timeout=2s")
		return code, errOut
	}
	mount(true)
	if code, errOut := ready("e-0", seedMetrics); code != ExitOK {
		t.Fatalf("a voter: exit %d: %s", code, errOut)
	}
	if code, errOut := ready("e-1", seedMetrics); code != ExitRetryable || !strings.Contains(errOut, "lists e-1 as a learner") {
		t.Fatalf("listed as a learner, etcd saying voter: exit %d: %s; want not ready", code, errOut)
	}
	if code, errOut := ready("e-9", seedMetrics); code != ExitRetryable || !strings.Contains(errOut, "not in the join state") {
		t.Fatalf("not in the join state: exit %d: %s; want not ready", code, errOut)
	}

	learnerPeer, learnerClient, learnerMetrics := etcdtest.FreeURL(t), etcdtest.FreeURL(t), etcdtest.FreeURL(t)
	code, out, errOut := run("add-learner", "--endpoints="+seedClient.String(), "--member=e-1", "--peer-url="+learnerPeer.String())
	if code != ExitOK {
		t.Fatalf("add-learner: exit %d: %s", code, errOut)
	}
	id := out[strings.Index(out, "(id ")+4 : strings.Index(out, ")")]
	lcfg := etcdtest.Config("e-1", t.TempDir(), learnerPeer, learnerClient)
	lcfg.ListenMetricsUrls = []url.URL{learnerMetrics}
	lcfg.InitialCluster = "e-0=" + seedPeer.String() + ",e-1=" + learnerPeer.String()
	lcfg.ClusterState = "existing"
	etcdtest.Start(t, lcfg)
	mount(false)
	if code, errOut := ready("e-1", learnerMetrics); code != ExitRetryable || !strings.Contains(errOut, "learner") {
		t.Fatalf("a learner: exit %d: %s; want not ready, as a learner", code, errOut)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, _, errOut = run("promote", "--endpoints="+seedClient.String(), "--member=e-1", "--id="+id, "--timeout=2s")
		if code == ExitOK || time.Now().After(deadline) {
			break
		}
	}
	if code != ExitOK {
		t.Fatalf("promote: exit %d: %s", code, errOut)
	}
	for {
		code, errOut = ready("e-1", learnerMetrics)
		if code == ExitOK || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code != ExitOK {
		t.Fatalf("promoted: exit %d: %s", code, errOut)
	}
	if code, _ := ready("e-0", etcdtest.FreeURL(t)); code != ExitRetryable {
		t.Errorf("no etcd: exit %d", code)
	}
	if code, _, _ := run("ready", "--readyz=http://127.0.0.1:1/readyz", "--join-state="+joinFile, "--name=e-0"); code != ExitUsage {
		t.Errorf("without --metrics: exit %d", code)
	}
}

// TestReadyBeforeTheLearnerCheck: where etcd's /readyz has no non_learner check (before
// v3.5.19), the probe reads etcd_server_is_learner from the metrics, and only then.
func TestReadyBeforeTheLearnerCheck(t *testing.T) {
	var learner atomic.Int32
	var metricsRead atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			if _, ok := r.URL.Query()["verbose"]; !ok {
				t.Errorf("readyz asked without verbose: %s", r.URL)
			}
			fmt.Fprint(w, "[+]serializable_read ok\n[+]data_corruption ok\nok\n")
		case "/metrics":
			metricsRead.Add(1)
			fmt.Fprintf(w, "# TYPE etcd_server_is_learner gauge\netcd_server_is_learner %d\n", learner.Load())
		}
	}))
	defer srv.Close()
	joinFile := filepath.Join(t.TempDir(), "join.json")
	st := joinstate.State{Token: "t", ClusterState: "existing", Members: []joinstate.Member{{Name: "e-0", PeerURL: "http://e-0:2380"}}}
	if err := os.WriteFile(joinFile, []byte(joinstate.Encode(st)), 0o600); err != nil {
		t.Fatal(err)
	}
	ready := func() (int, string) {
		code, _, errOut := run("ready", "--readyz="+srv.URL+"/readyz?exclude=linearizable_read", "--metrics="+srv.URL+"/metrics",
			"--join-state="+joinFile, "--name=e-0", "--timeout=2s")
		return code, errOut
	}
	if code, errOut := ready(); code != ExitOK || metricsRead.Load() != 1 {
		t.Fatalf("a voter: exit %d (%s), metrics read %d times", code, errOut, metricsRead.Load())
	}
	learner.Store(1)
	if code, errOut := ready(); code != ExitRetryable || !strings.Contains(errOut, "learner") {
		t.Fatalf("a learner by the metric: exit %d: %s; want not ready", code, errOut)
	}
}
