package membertool

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"etcdops.dev/etcdops/backupresult"
	"etcdops.dev/etcdops/joinstate"
	"etcdops.dev/etcdops/launcher"
)

// The backup command reports to the termination log, and launch restores what it stored.
func TestBackupThenLaunchRestores(t *testing.T) {
	ep, id := startSeed(t)
	dir := t.TempDir()
	store := filepath.Join(dir, "claim", "ns", "e")
	termLog := filepath.Join(dir, "termination-log")
	code, out, errOut := run("backup", "--endpoints="+ep, "--member=e-0", "--cluster=e", "--dir="+store,
		"--work-dir="+t.TempDir(), "--termination-log="+termLog, "--keep=2", "--max-bandwidth=67108864")
	if code != ExitOK {
		t.Fatalf("backup: exit %d: %s", code, errOut)
	}
	oneLine(t, "backup", out, "stored "+store+"/e-")
	msg, err := os.ReadFile(termLog)
	if err != nil {
		t.Fatal(err)
	}
	r, err := backupresult.Decode(string(msg))
	if err != nil || r.Error != "" || r.Revision < 1 || r.Size == 0 || r.MemberID == "" || !strings.HasPrefix(r.Object, store+"/e-") {
		t.Fatalf("termination log %s: %+v %v", msg, r, err)
	}
	if r.MemberID != fmt.Sprintf("%x", id) {
		t.Fatalf("member %s, want %x", r.MemberID, id)
	}

	// Nobody answers: a one-line reason in the termination log, and a retryable exit.
	code, _, errOut = run("backup", "--endpoints=http://127.0.0.1:1", "--member=e-0", "--cluster=e", "--dir="+store,
		"--work-dir="+t.TempDir(), "--termination-log="+termLog, "--timeout=2s")
	if code != ExitRetryable {
		t.Fatalf("backup with nobody answering: exit %d", code)
	}
	oneLine(t, "backup failure", errOut, "no member can give a snapshot")
	if msg, _ := os.ReadFile(termLog); !strings.Contains(string(msg), `"error":"no member can give a snapshot`) {
		t.Fatalf("termination log of a failure: %s", msg)
	}

	joinFile := filepath.Join(dir, "join-state.json")
	dataDir := filepath.Join(dir, "volume", "data")
	state := joinstate.State{Token: "ns/e/uid-2", ClusterState: joinstate.StateNew,
		Members: []joinstate.Member{{Name: "e-0", PeerURL: "http://127.0.0.1:2380", Incarnation: 0}},
		Restore: &joinstate.Restore{Member: "e-0", Backup: "latest"}}
	if err := os.WriteFile(joinFile, []byte(joinstate.Encode(state)), 0o600); err != nil {
		t.Fatal(err)
	}
	launch := []string{"--join-state=" + joinFile, "--name=e-0", "--data-dir=" + dataDir, "--etcd=/usr/local/bin/etcd", "--restore-dir=" + store, "--"}
	argv, d, restored, err := LaunchArgv(launch)
	if err != nil || argv == nil || !d.Restore {
		t.Fatalf("launch with a restore: %v %+v %v", argv, d, err)
	}
	// The container ends once, telling the planner what it restored; the restart starts etcd.
	if _, ok := joinstate.RestoredRevision(restored); !ok || !strings.Contains(restored, store) {
		t.Fatalf("termination message after the restore %q", restored)
	}
	if _, d, restored, err := LaunchArgv(launch); err != nil || d.Restore || restored != "" || d.Kind != launcher.Start {
		t.Fatalf("launch after the restore: %+v %q %v", d, restored, err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "member", "snap", "db")); err != nil {
		t.Fatalf("restored data dir: %v", err)
	}
	if v, err := launcher.Inspect(dataDir); err != nil || v.Restored != state.Token {
		t.Fatalf("volume after restore: %+v %v", v, err)
	}

	// The command itself: after the restore it exits cleanly with the revision in its
	// termination message, without starting etcd (the restart does).
	other := filepath.Join(dir, "volume2", "data")
	code, _, errOut = run("launch", "--join-state="+joinFile, "--name=e-0", "--data-dir="+other, "--etcd=/nonexistent/etcd",
		"--restore-dir="+store, "--termination-log="+termLog, "--")
	msg, _ = os.ReadFile(termLog)
	want, _ := joinstate.RestoredRevision(restored)
	if rev, ok := joinstate.RestoredRevision(string(msg)); code != ExitOK || !ok || rev != want {
		t.Fatalf("launch with a restore: exit %d, termination message %q (LaunchArgv said %q), stderr %q", code, msg, restored, errOut)
	}
}
