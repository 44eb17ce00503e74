package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/joinstate"
	"etcdops.dev/etcdops/test/etcdbin"
	"etcdops.dev/etcdops/test/harness"
)

// Real etcd servers of every supported minor release (test/etcdbin: built from the Go
// module proxy on first use, cached), run by the kubelet as processes with the command line
// the planner rendered and the launcher completed. TestRenderedCommandLineAccepted is in the
// default run; the upgrades and the matrix are long and run with -e2e.versions (.ci/run).

var versionsFlag = flag.Bool("e2e.versions", false, "also run the upgrades and the version matrix on real etcd servers of every supported minor release")

// needVersions skips a long version scenario unless -e2e.versions is given.
func needVersions(t *testing.T) {
	t.Helper()
	if !*versionsFlag {
		t.Skip("the upgrades and the version matrix run with -e2e.versions (.ci/run runs them)")
	}
}

// realEtcdOptions are envOptions with the kubelet running real etcd processes of the pods'
// images; the test skips when one of versions cannot be built here.
func realEtcdOptions(t *testing.T, versions ...string) harness.Options {
	t.Helper()
	for _, v := range versions {
		if _, err := etcdbin.Path(v); err != nil {
			t.Skipf("etcd %s cannot be built from the Go module proxy, so this test does not run: %v", v, err)
		}
	}
	opts := envOptions(t, false)
	opts.EtcdBinary = func(image string) (string, error) { return etcdbin.Path(harness.ImageVersion(image)) }
	return opts
}

// representativeOptions are etcd options a user sets, each accepted by every supported
// release.
var representativeOptions = []string{
	"--snapshot-count=5000",
	"--quota-backend-bytes=268435456",
	"--auto-compaction-mode=periodic",
	"--auto-compaction-retention=1h",
	"--max-request-bytes=1572864",
	"--heartbeat-interval=100",
	"--election-timeout=1000",
}

// TestRenderedCommandLineAccepted starts every pinned release with what the planner renders
// and the launcher completes: a one-member cluster with TLS on both ports, user options and
// backups, then a new one restored from its backup. Each must become ready under its probes,
// answer every probe endpoint the pods use with 200, and report its own release; the
// restored one must hold the first one's write.
func TestRenderedCommandLineAccepted(t *testing.T) {
	t.Parallel()
	for _, v := range etcdbin.Versions() {
		t.Run(v, func(t *testing.T) {
			env, dest, pki := realEnvWithTLS(t, v)
			s := spec(1)
			s.Version = v
			s.EtcdOptions = slices.Clone(representativeOptions)
			s.TLS = &v1alpha1.TLSSpec{ServerSecret: pki.Server, PeerSecret: pki.Peer, ClientSecret: pki.Client}
			s.Backup = &v1alpha1.BackupSpec{Schedule: "0 0 1 1 *", Destination: dest}
			env.Create(s)
			steadyOrRefused(t, env, 1)
			wantServing(t, env, "https", "https")
			checkServes(t, env, v)
			put(t, env, "/accepted", v)

			restored := backupAndRestore(t, env, v, dest, "accepted", 1)
			steadyOrRefused(t, restored, 1)
			checkServes(t, restored, v)
			if got := get(t, restored, "/accepted"); got != v {
				t.Errorf("the restored member holds %q under /accepted, want %q", got, v)
			}
		})
	}
}

// backupAndRestore asks env for a backup under request, waits for it, closes env, and creates
// a cluster of size members of release v restored from the newest backup in dest.
func backupAndRestore(t *testing.T, env *harness.Env, v string, dest v1alpha1.BackupDestination, request string, size int32) *harness.Env {
	t.Helper()
	requestBackup(t, env, request)
	env.Close()
	restored := startEnv(t, realEtcdOptions(t, v))
	addCredentials(t, restored)
	r := spec(size)
	r.Version = v
	r.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: &v1alpha1.FromBackup{BackupDestination: dest, Name: v1alpha1.LatestBackup}}
	restored.Create(r)
	return restored
}

// steadyOrRefused waits for the cluster to settle at size, and fails at once when an etcd
// container exits: etcd refused its command line, and the reason is etcd's own.
func steadyOrRefused(t *testing.T, env *harness.Env, size int) {
	t.Helper()
	var exited string
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		for _, p := range env.Pods() {
			if cs := p.Status.ContainerStatuses; len(cs) > 0 && cs[0].RestartCount > plannedRestarts(cs[0]) && cs[0].State.Waiting != nil {
				exited = fmt.Sprintf("%s: %s", p.Name, cs[0].State.Waiting.Message)
				return true, ""
			}
		}
		return env.Steady(size)
	}); err != nil {
		t.Fatalf("not steady at %d members: %v\n%s", size, err, env.Describe())
	}
	if exited != "" {
		t.Fatalf("etcd exited: %s\n%s", exited, env.Describe())
	}
}

// plannedRestarts is 1 for the seed of a restored cluster, whose container ends once after
// the restore to report it (joinstate.Restored), and 0 for any other.
func plannedRestarts(cs corev1.ContainerStatus) int32 {
	if t := cs.LastTerminationState.Terminated; t != nil && strings.HasPrefix(t.Message, joinstate.Restored) {
		return 1
	}
	return 0
}

// checkServes checks that every running member reports release v and answers the probe
// endpoints its pod renders (the readiness probe's readyz and metrics URLs, the liveness
// probe's health and metrics URLs) with 200.
func checkServes(t *testing.T, env *harness.Env, v string) {
	t.Helper()
	versions := env.EtcdVersions()
	for _, p := range env.Pods() {
		if got := versions[p.Name]; got != v {
			t.Errorf("%s reports etcd %q, want %s", p.Name, got, v)
		}
		c := p.Spec.Containers[0]
		var urls []string
		for _, a := range append(slices.Clone(c.ReadinessProbe.Exec.Command), c.LivenessProbe.Exec.Command...) {
			for _, f := range []string{"--readyz=", "--metrics=", "--health=", "--defrag-metrics="} {
				if u, ok := strings.CutPrefix(a, f); ok {
					urls = append(urls, strings.Replace(u, "//127.0.0.1:", "//"+p.Status.PodIP+":", 1))
				}
			}
		}
		if len(urls) != 4 {
			t.Fatalf("%s: probe URLs %q: the readiness probe's --readyz and --metrics, and the liveness probe's --health and --defrag-metrics were not found", p.Name, urls)
		}
		for _, u := range urls {
			code, body := httpGet(u)
			if code != http.StatusOK {
				t.Errorf("etcd %s on %s: GET %s answered %d: %.300s", v, p.Name, u, code, body)
			}
		}
	}
}

func httpGet(u string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(body)
}

func put(t *testing.T, env *harness.Env, key, val string) {
	t.Helper()
	cli, err := env.Client()
	must(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = cli.Put(ctx, key, val)
	must(t, err)
}

func get(t *testing.T, env *harness.Env, key string) string {
	t.Helper()
	cli, err := env.Client()
	must(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := cli.Get(ctx, key)
	must(t, err)
	if len(r.Kvs) == 0 {
		return ""
	}
	return string(r.Kvs[0].Value)
}

// belowUpgradeMinimum is a v3.5 release the operator runs (at least v1alpha1.MinVersion) but
// will not move to v3.6 from (v1alpha1.MinorUpgradeMinimums).
const belowUpgradeMinimum = etcdbin.BelowUpgradeMinimum

// TestUpgrades takes one 3-member cluster along every upgrade path the operator supports,
// on real servers, under the workload: from a v3.5 release below the v3.6 minimum (the move
// to v3.6 refused with its message, nothing moved), a patch upgrade to the newest v3.5, then
// v3.5 to v3.6 and v3.6 to v3.7, each one member at a time with the leader last; then a
// downgrade, refused. The move to v3.7 waits until every member has taken a raft snapshot past
// the v2 requests the v3.5 members wrote (sync/versions.go); the test adds the raft entries
// that takes, with a --snapshot-count of 200 so that it takes little.
func TestUpgrades(t *testing.T) {
	needVersions(t)
	t.Parallel()
	v35, v36, v37 := etcdbin.Pinned["v3.5"], etcdbin.Pinned["v3.6"], etcdbin.Pinned["v3.7"]
	env := startEnv(t, realEtcdOptions(t, belowUpgradeMinimum, v35, v36, v37))
	t.Run("create-"+belowUpgradeMinimum, func(t *testing.T) {
		s := spec(3)
		s.Version = belowUpgradeMinimum
		s.EtcdOptions = []string{"--snapshot-count=" + strconv.Itoa(upgradeSnapshotCount)}
		env.Create(s)
		waitLeader(t, env)
		measure(t, env, scenario{act: func(*testing.T, *harness.Env) int { return 3 }})
		checkServes(t, env, belowUpgradeMinimum)
	})
	t.Run("minor-below-minimum-refused", func(t *testing.T) {
		refused(t, env, v36, "needs every member on v3.5.26 or later", belowUpgradeMinimum)
	})
	for _, step := range []struct {
		from, to string
		// v2Wait: the move waits for the members' raft snapshots.
		v2Wait bool
	}{
		{from: belowUpgradeMinimum, to: v35},
		{from: v35, to: v36},
		{from: v36, to: v37, v2Wait: true},
	} {
		t.Run("upgrade-"+step.from+"-to-"+step.to, func(t *testing.T) {
			upgrade(t, env, step.from, step.to, step.v2Wait)
		})
	}
	t.Run("downgrade-refused", func(t *testing.T) {
		refused(t, env, v36, "is a downgrade from", v37)
	})
}

// upgradeSnapshotCount is TestUpgrades' --snapshot-count.
const upgradeSnapshotCount = 200

// upgrade moves the steady cluster from one release to the next under the workload and
// checks that every member then runs it, one pod at a time (the monitor's invariants) and
// the leader's last: when only one pod was left on the old release's image, its member led.
func upgrade(t *testing.T, env *harness.Env, from, to string, v2Wait bool) {
	t.Helper()
	waitSteady(t, env, 3)
	size := len(env.Pods())
	order := &upgradeOrder{from: from, to: to}
	measure(t, env, scenario{act: func(t *testing.T, env *harness.Env) int {
		stop := order.watch(env)
		t.Cleanup(stop)
		env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { s.Version = to })
		if v2Wait {
			waitForSnapshots(t, env, from)
		}
		if _, err := env.WaitFor(changeBound, func() (bool, string) {
			vs := env.EtcdVersions()
			for _, p := range env.Pods() {
				if vs[p.Name] != to {
					return false, fmt.Sprintf("%s runs %q", p.Name, vs[p.Name])
				}
			}
			return len(vs) == size, fmt.Sprintf("%d members answer", len(vs))
		}); err != nil {
			t.Fatalf("not every member runs %s: %v\n%s", to, err, env.Describe())
		}
		stop()
		return size
	}})
	checkServes(t, env, to)
	if cv := env.Store.Parent().Status.CurrentVersion; cv != to {
		t.Errorf("status.currentVersion %q, want %s", cv, to)
	}
	order.check(t, size)
}

// waitForSnapshots checks that the move waits, every pod still on from, while the members have
// not taken a raft snapshot past the v2 requests of the v3.5 members; then adds the raft entries
// that takes, and stops once the hook no longer waits.
func waitForSnapshots(t *testing.T, env *harness.Env, from string) {
	t.Helper()
	const says = "etcd v3.5 members may have written etcd v2 requests"
	waiting := func() string {
		if a := env.Store.Parent().Status.Action; a != nil && strings.Contains(a.Reason, says) {
			return a.Reason
		}
		return ""
	}
	if _, err := env.WaitFor(changeBound, func() (bool, string) { return waiting() != "", "waiting for the move to wait" }); err != nil {
		t.Fatalf("%v: %s", err, env.Describe())
	}
	t.Logf("the move waits: %s", waiting())
	cli, err := env.Client()
	must(t, err)
	defer cli.Close()
	// The margin and the snapshot count, and as much again, in pairs of entries.
	writes := 0
	for ; waiting() != "" && writes < 2*(upgradeSnapshotCount+1000); writes++ {
		for _, p := range env.Pods() {
			if v := harness.ImageVersion(p.Spec.Containers[0].Image); v != from {
				t.Fatalf("pod %s runs %s while the move waits", p.Name, v)
			}
		}
		// A lease granted and revoked: two raft entries that touch no key, so the workload's
		// history, which watches every key, sees nothing.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		l, err := cli.Grant(ctx, 60)
		if err == nil {
			_, err = cli.Revoke(ctx, l.ID)
		}
		cancel()
		must(t, err)
	}
	if _, err := env.WaitFor(changeBound, func() (bool, string) { return waiting() == "", "waiting for the move to go on" }); err != nil {
		t.Fatalf("still waiting after %d leases: %v", writes, err)
	}
	t.Logf("the move went on after %d leases granted and revoked", writes)
}

// upgradeOrder records, while an upgrade rolls, the order in which the members came back on
// the new release and who led when only one member ran the old one.
type upgradeOrder struct {
	from, to string
	order    []string
	lastOld  string // the one pod left on the old release's image, once the others had the new one
	leader   string // the leader then
	done     chan struct{}
}

func (o *upgradeOrder) watch(env *harness.Env) (stop func()) {
	o.done = make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-o.done:
				return
			case <-tick.C:
			}
			vs := env.EtcdVersions()
			leader := env.Monitor.View().Leader
			var old []string
			for _, p := range env.Pods() {
				if v := vs[p.Name]; v == o.to && !slices.Contains(o.order, p.Name) {
					o.order = append(o.order, p.Name)
				}
				if harness.ImageVersion(p.Spec.Containers[0].Image) == o.from {
					old = append(old, p.Name)
				}
			}
			if len(old) == 1 && o.lastOld == "" && leader != "" {
				o.lastOld, o.leader = old[0], leader
			}
		}
	}()
	var stopped bool
	return func() {
		if !stopped {
			stopped = true
			close(o.done)
			<-finished
		}
	}
}

func (o *upgradeOrder) check(t *testing.T, size int) {
	t.Helper()
	t.Logf("%s to %s: members back on %s in the order %v; the last on %s was %s, with %s leading", o.from, o.to, o.to, o.order, o.from, o.lastOld, o.leader)
	if len(o.order) != size {
		t.Errorf("%d members seen coming back on %s, want %d", len(o.order), o.to, size)
		return
	}
	if o.lastOld == "" || o.lastOld != o.leader || o.order[size-1] != o.lastOld {
		t.Errorf("the leader was not upgraded last: order %v, last on %s %q while %q led", o.order, o.from, o.lastOld, o.leader)
	}
}

// refused asks for version to and checks that the hook refuses it with msg (phase Invalid),
// that no pod is replaced meanwhile, and that every member still runs running; then the spec
// goes back to running and the cluster settles again.
func refused(t *testing.T, env *harness.Env, to, msg, running string) {
	t.Helper()
	waitSteady(t, env, 3)
	pods0 := podUIDs(env)
	env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { s.Version = to })
	var status, said string
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		p := env.Store.Parent()
		b, _ := json.Marshal(p.Status)
		status = string(b)
		for _, c := range p.Status.Conditions {
			if c.Type == "Degraded" && strings.Contains(c.Message, msg) {
				said = c.Message
			}
		}
		return p.Status.Phase == v1alpha1.PhaseInvalid && said != "", "waiting for the hook to refuse " + to
	}); err != nil {
		t.Fatalf("%v; status %s", err, status)
	}
	t.Logf("%s refused: %s", to, said)
	syncs0 := env.MC.Syncs()
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		return env.MC.Syncs() >= syncs0+5, "waiting for syncs"
	}); err != nil {
		t.Fatal(err)
	}
	for name, uid := range podUIDs(env) {
		if pods0[name] != uid {
			t.Errorf("pod %s replaced while %s was refused", name, to)
		}
	}
	for pod, v := range env.EtcdVersions() {
		if v != running {
			t.Errorf("%s runs %s, want %s", pod, v, running)
		}
	}
	env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { s.Version = running })
	waitSteady(t, env, 3)
}

// TestVersionMatrix runs the operator's everyday work on one cluster per supported minor
// release, on real servers of its pinned patch, each act a window under the workload with
// the history checked as everywhere: create, scale 3 to 5 and back, a rolling configuration
// change, TLS turned on, a wiped member replaced, a scheduled defragmentation, and a backup
// restored into a new cluster that must hold every acknowledged write.
func TestVersionMatrix(t *testing.T) {
	needVersions(t)
	t.Parallel()
	for _, v := range etcdbin.Versions() {
		t.Run(v, func(t *testing.T) { versionMatrix(t, v) })
	}
}

// realEnvWithTLS is a loop whose pods run real etcd servers of release v, with backup
// credentials for an S3 destination and the cluster's certificates in place.
func realEnvWithTLS(t *testing.T, v string) (*harness.Env, v1alpha1.BackupDestination, *harness.PKI) {
	t.Helper()
	env := startEnv(t, realEtcdOptions(t, v))
	dest := realS3(t)
	addCredentials(t, env)
	pki, err := harness.NewPKI(env.Namespace, env.Cluster, env.Domain)
	must(t, err)
	must(t, env.UseTLS(pki))
	return env, dest, pki
}

func versionMatrix(t *testing.T, v string) {
	env, dest, pki := realEnvWithTLS(t, v)
	s := spec(3)
	s.Version = v
	minFree := resource.MustParse("1Mi")
	s.Maintenance = &v1alpha1.MaintenanceSpec{Defragment: &v1alpha1.DefragmentSpec{InUseBelowPercent: 50, MinFree: &minFree}}
	s.Backup = &v1alpha1.BackupSpec{Schedule: "0 0 1 1 *", Destination: dest}
	// The applications log in as root from the start: the auth scenario turns auth on under them.
	presetRoot(t, env)
	t.Run("create", func(t *testing.T) {
		env.Create(s)
		waitLeader(t, env)
		measure(t, env, scenario{act: func(*testing.T, *harness.Env) int { return 3 }})
		checkServes(t, env, v)
	})
	for _, sc := range []scenario{
		{name: "scale-out-5", act: func(t *testing.T, env *harness.Env) int { scaleTo(env, 5); return 5 }},
		{name: "scale-in-3", act: func(t *testing.T, env *harness.Env) int { scaleTo(env, 3); return 3 }},
		{name: "rolling-config-change", act: rollingConfigChange(20000)},
		{name: "tls-on", act: func(t *testing.T, env *harness.Env) int {
			env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) {
				s.TLS = &v1alpha1.TLSSpec{ServerSecret: pki.Server, PeerSecret: pki.Peer, ClientSecret: pki.Client}
			})
			return 3
		}},
		// Passwords over TLS: each application's user confined to its prefix, a rotation, off.
		{name: "auth", act: authOnRotateOff},
		{name: "wipe-member", act: wipeMember},
		{name: "scheduled-defragment", act: scheduledDefragment},
	} {
		t.Run(sc.name, func(t *testing.T) {
			waitSteady(t, env, int(*env.Store.Parent().Spec.Size))
			measure(t, env, sc)
			if sc.name == "tls-on" {
				wantServing(t, env, "https", "https")
			}
		})
	}
	t.Run("backup-restore", func(t *testing.T) {
		waitSteady(t, env, 3)
		w, err := env.StartWorkload("/restore")
		must(t, err)
		w.AwaitAcked(100, changeBound)
		stats := w.Stop()
		restored := backupAndRestore(t, env, v, dest, "matrix", 3)
		waitLeader(t, restored)
		measure(t, restored, scenario{act: func(*testing.T, *harness.Env) int { return 3 }})
		lost, err := w.VerifyOn(restored, verifyBound)
		must(t, err)
		if len(lost) > 0 {
			t.Fatalf("%d of %d acknowledged writes missing after the restore, first %s", len(lost), stats.Acked, lost[0])
		}
		checkServes(t, restored, v)
	})
}
