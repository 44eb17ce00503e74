package membertool

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"etcdops.dev/etcdops/backupresult"
	"etcdops.dev/etcdops/internal/etcdbin"
	"etcdops.dev/etcdops/joinstate"
)

// The drill command restores the newest backup with the etcd binary it is given, reports the
// verdict to the termination log and exits 0 on a verdict; a restore that cannot run (no
// backup yet) is reported and exits retryable, so that its Job tries again.
func TestDrillReportsToTheTerminationLog(t *testing.T) {
	bin, err := etcdbin.Path(etcdbin.Pinned["v3.7"])
	if err != nil {
		t.Skipf("etcd %s cannot be built from the Go module proxy, so the drill cannot run: %v", etcdbin.Pinned["v3.7"], err)
	}
	ep, _ := startSeed(t)
	dir := t.TempDir()
	store := filepath.Join(dir, "claim", "ns", "e")
	termLog := filepath.Join(dir, "termination-log")
	lineage := ep2lineage(t, ep)
	drill := func() (int, string, backupresult.Drill) {
		code, out, errOut := run("drill", "--endpoints="+ep, "--cluster=e", "--cluster-id="+lineage, "--dir="+store, "--etcd="+bin,
			"--work-dir="+t.TempDir(), "--termination-log="+termLog, "--max-bandwidth=1048576")
		msg, err := os.ReadFile(termLog)
		if err != nil {
			t.Fatal(err)
		}
		d, err := backupresult.DecodeDrill(string(msg))
		if err != nil {
			t.Fatal(err)
		}
		return code, out + errOut, d
	}
	if code, out, d := drill(); code != ExitRetryable || d.Outcome != backupresult.DrillRestoreFailed || !strings.Contains(d.Message, "no snapshot") {
		t.Fatalf("drill before any backup: exit %d, %s, %+v", code, out, d)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for _, k := range []string{"a", "b", "c"} {
		if _, err := cli.Put(context.Background(), k, "v-"+k); err != nil {
			t.Fatal(err)
		}
	}
	if code, _, errOut := run("backup", "--endpoints="+ep, "--member=e-0", "--cluster=e", "--dir="+store, "--work-dir="+t.TempDir(),
		"--termination-log="+filepath.Join(dir, "backup-log")); code != ExitOK {
		t.Fatalf("backup: exit %d: %s", code, errOut)
	}
	code, out, d := drill()
	if code != ExitOK || d.Outcome != backupresult.DrillPassed || d.Lineage != lineage || d.Digest == "" || d.Digest != d.LiveDigest || d.Keys != 3 {
		t.Fatalf("drill: exit %d, %s, %+v", code, out, d)
	}
	oneLine(t, "drill", out, "drill e: passed: restored "+store+"/lineages/"+lineage+"/e-")

	if code, _, errOut := run("drill", "--endpoints="+ep, "--cluster=e", "--dir="+store); code != ExitUsage || !strings.Contains(errOut, "--cluster-id") {
		t.Fatalf("drill without --cluster-id: exit %d, %s", code, errOut)
	}
}

// A seed whose restore fails says why in its termination message, for the planner, and exits
// for the kubelet to start it again; one that restores says how long it took.
func TestLaunchReportsItsRestore(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(dir, "claim")
	termLog := filepath.Join(dir, "termination-log")
	joinFile := filepath.Join(dir, "join-state.json")
	state := joinstate.State{Token: "ns/e/uid-2", ClusterState: joinstate.StateNew,
		Members: []joinstate.Member{{Name: "e-0", PeerURL: "http://127.0.0.1:2380", Incarnation: 0}},
		Restore: &joinstate.Restore{Member: "e-0", Backup: "latest"}}
	if err := os.WriteFile(joinFile, []byte(joinstate.Encode(state)), 0o600); err != nil {
		t.Fatal(err)
	}
	launch := []string{"launch", "--join-state=" + joinFile, "--name=e-0", "--data-dir=" + filepath.Join(dir, "volume", "data"), "--etcd=/usr/local/bin/etcd",
		"--termination-log=" + termLog, "--restore-dir=" + store, "--"}
	if code, _, errOut := run(launch...); code != ExitRetryable {
		t.Fatalf("launch with nothing to restore: exit %d: %s", code, errOut)
	}
	if msg, _ := os.ReadFile(termLog); !strings.HasPrefix(string(msg), joinstate.RestoreFailed) || !strings.Contains(string(msg), "no snapshot") {
		t.Fatalf("termination message of a failed restore: %q", msg)
	}

	ep, _ := startSeed(t)
	if code, _, errOut := run("backup", "--endpoints="+ep, "--member=e-0", "--cluster=e", "--dir="+store, "--work-dir="+t.TempDir(),
		"--termination-log="+filepath.Join(dir, "backup-log")); code != ExitOK {
		t.Fatalf("backup: exit %d: %s", code, errOut)
	}
	if code, _, errOut := run(launch...); code != ExitOK {
		t.Fatalf("launch with a snapshot to restore: exit %d: %s", code, errOut)
	}
	msg, _ := os.ReadFile(termLog)
	if p, ok := joinstate.ParseRestored(string(msg)); !ok || p.Took <= 0 {
		t.Fatalf("termination message after the restore %q: %+v", msg, p)
	}
}
