package membertool

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"etcdops.dev/etcdops/backup"
	"etcdops.dev/etcdops/joinstate"
	"etcdops.dev/etcdops/test/etcdbin"
	"etcdops.dev/etcdops/test/etcdtest"
)

// launch replays the changes stored after a snapshot with the pod's own etcd, the binary its
// --etcd names: with one that does not exist the restore is refused, naming it, and leaves no
// data dir; with a real one it reaches the revision the join state asks for. The member's peer
// URL is its pod's, TLS and a name only the cluster resolves: the replay server listens on
// loopback alone and needs neither.
func TestLaunchReplaysWithThePodsEtcd(t *testing.T) {
	bin, err := etcdbin.Path(etcdbin.Pinned["v3.7"])
	if err != nil {
		t.Skipf("etcd %s cannot be built from the Go module proxy, so the replay cannot run: %v", etcdbin.Pinned["v3.7"], err)
	}
	ep, _ := startSeed(t)
	dir := t.TempDir()
	store := filepath.Join(dir, "claim", "ns", "e")
	s, err := backup.NewDir(store)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"stream-backup", "--endpoints=" + ep, "--cluster=e", "--dir=" + store, "--work-dir=" + t.TempDir(),
			"--interval=100ms", fmt.Sprintf("--metrics-addr=127.0.0.1:%d", etcdtest.FreePort(t))}, &stdout, &stderr)
	}()
	var snaps []backup.Object
	for i := 0; len(snaps) == 0; i++ {
		if i == 300 {
			t.Fatalf("no snapshot in 30s: %q", stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
		// The stream stores below the lineage of the cluster it watches.
		if ls, err := backup.ListLineages(context.Background(), s); err == nil && len(ls) == 1 {
			snaps, _ = backup.LineageStore(s, ls[0].ID).List(context.Background())
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	var last int64
	for i := range 20 {
		resp, err := cli.Put(context.Background(), fmt.Sprintf("k%d", i), "v")
		if err != nil {
			t.Fatal(err)
		}
		last = resp.Header.Revision
	}
	for i := 0; !strings.Contains(stdout.String(), fmt.Sprintf("-%019d.", last)); i++ {
		if i == 300 {
			t.Fatalf("revision %d not stored in 30s: stdout %q, stderr %q", last, stdout.String(), stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	<-done

	target := snaps[0].Revision + 10
	joinFile := filepath.Join(dir, "join-state.json")
	state := joinstate.State{Token: "ns/e/uid-2", ClusterState: joinstate.StateNew,
		Members: []joinstate.Member{{Name: "e-0", PeerURL: "https://e-0.e.ns.svc.cluster.local:2380"}},
		Restore: &joinstate.Restore{Member: "e-0", Backup: "latest", Revision: target}}
	if err := os.WriteFile(joinFile, []byte(joinstate.Encode(state)), 0o600); err != nil {
		t.Fatal(err)
	}
	termLog := filepath.Join(dir, "termination-log")
	launch := func(etcd, dataDir string) (int, string) {
		code, _, errOut := run("launch", "--join-state="+joinFile, "--name=e-0", "--data-dir="+dataDir, "--etcd="+etcd,
			"--restore-dir="+store, "--termination-log="+termLog, "--")
		return code, errOut
	}

	dataDir := filepath.Join(dir, "volume", "data")
	if code, errOut := launch("/nonexistent/etcd", dataDir); code != ExitRetryable || !strings.Contains(errOut, "start /nonexistent/etcd") {
		t.Fatalf("launch replaying with no etcd binary: exit %d, %q", code, errOut)
	}
	if entries, _ := os.ReadDir(filepath.Dir(dataDir)); len(entries) != 0 {
		t.Fatalf("a refused replay left %v", entries)
	}
	if code, errOut := launch(bin, dataDir); code != ExitOK {
		t.Fatalf("launch replaying with etcd %s: exit %d, %q", bin, code, errOut)
	}
	msg, _ := os.ReadFile(termLog)
	if p, ok := joinstate.ParseRestored(string(msg)); !ok || p.Revision != target {
		t.Fatalf("termination message %q: want revision %d restored", msg, target)
	}
}
