package membertool

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"etcdops.dev/etcdops/backup"
	"etcdops.dev/etcdops/backupresult"
	"etcdops.dev/etcdops/joinstate"
	"etcdops.dev/etcdops/launcher"
	"etcdops.dev/etcdops/membership"
)

// The backup command reports to the termination log, and launch restores what it stored.
func TestBackupThenLaunchRestores(t *testing.T) {
	ep, id := startSeed(t)
	dir := t.TempDir()
	store := filepath.Join(dir, "claim", "ns", "e")
	termLog := filepath.Join(dir, "termination-log")
	code, out, errOut := run("backup", "--endpoints="+ep, "--member=e-0", "--cluster=e", "--dir="+store,
		"--work-dir="+t.TempDir(), "--termination-log="+termLog, "--keep=2", "--max-bandwidth=67108864",
		"--namespace=ns", "--cluster-uid=uid-1")
	if code != ExitOK {
		t.Fatalf("backup: exit %d: %s", code, errOut)
	}
	// Into the lineage of the cluster ID etcd answers with.
	lineage := store + "/lineages/" + ep2lineage(t, ep) + "/"
	oneLine(t, "backup", out, "stored "+lineage+"e-")
	msg, err := os.ReadFile(termLog)
	if err != nil {
		t.Fatal(err)
	}
	r, err := backupresult.Decode(string(msg))
	if err != nil || r.Error != "" || r.Revision < 1 || r.Size == 0 || r.MemberID == "" || !strings.HasPrefix(r.Object, lineage+"e-") || r.Lineage != ep2lineage(t, ep) {
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
	if p, ok := joinstate.ParseRestored(restored); !ok || p.Object != r.Object || p.Revision != r.Revision || p.Lineage != r.Lineage || p.Time.IsZero() {
		t.Fatalf("termination message after the restore %q: %+v", restored, p)
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
	// The same restore, but for how long each took.
	got, _ := joinstate.ParseRestored(string(msg))
	want, _ := joinstate.ParseRestored(restored)
	if got.Took <= 0 || want.Took <= 0 {
		t.Fatalf("launch with a restore: termination message %q, LaunchArgv said %q: want how long the restore took", msg, restored)
	}
	got.Took, want.Took = 0, 0
	if got != want || code != ExitOK {
		t.Fatalf("launch with a restore: exit %d, termination message %q (LaunchArgv said %q), stderr %q", code, msg, restored, errOut)
	}

	// The lineages listed: this one, the cluster that wrote it, and latest's.
	code, out, errOut = run("lineages", "--dir="+store)
	if code != ExitOK || !strings.Contains(out, ep2lineage(t, ep)+" *") || !strings.Contains(out, "ns/e (uid-1)") ||
		!strings.Contains(out, fmt.Sprintf("%d to %d", r.Revision, r.Revision)) {
		t.Fatalf("lineages: exit %d:\n%s%s", code, out, errOut)
	}
	code, out, errOut = run("lineages", "--dir="+store, "--json")
	var listed struct {
		Latest   string
		Lineages []backup.LineageInfo
	}
	if err := json.Unmarshal([]byte(out), &listed); code != ExitOK || err != nil || listed.Latest != r.Lineage || len(listed.Lineages) != 1 ||
		listed.Lineages[0].Manifest == nil || listed.Lineages[0].Manifest.Cluster.UID != "uid-1" {
		t.Fatalf("lineages --json: exit %d, %v:\n%s%s", code, err, out, errOut)
	}
}

// A time to restore to reaches the restore, and the termination message says when the
// revision restored was stored; a time outside what is stored is refused, naming the range.
func TestLaunchRestoresToATime(t *testing.T) {
	ep, _ := startSeed(t)
	dir := t.TempDir()
	store := filepath.Join(dir, "claim")
	termLog := filepath.Join(dir, "termination-log")
	if code, _, errOut := run("backup", "--endpoints="+ep, "--member=e-0", "--cluster=e", "--dir="+store, "--work-dir="+t.TempDir(), "--termination-log="+termLog); code != ExitOK {
		t.Fatalf("backup: exit %d: %s", code, errOut)
	}
	r, err := readResult(termLog)
	if err != nil {
		t.Fatal(err)
	}
	joinFile := filepath.Join(dir, "join-state.json")
	restore := func(at string) (string, error) {
		state := joinstate.State{Token: "ns/e/uid-2", ClusterState: joinstate.StateNew,
			Members: []joinstate.Member{{Name: "e-0", PeerURL: "http://127.0.0.1:2380"}},
			Restore: &joinstate.Restore{Member: "e-0", Backup: "latest", Time: at, Lineage: r.Lineage}}
		if err := os.WriteFile(joinFile, []byte(joinstate.Encode(state)), 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, restored, err := LaunchArgv([]string{"--join-state=" + joinFile, "--name=e-0", "--data-dir=" + filepath.Join(t.TempDir(), "data"),
			"--etcd=/usr/local/bin/etcd", "--restore-dir=" + store, "--"})
		return restored, err
	}
	later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)
	if _, err := restore(later); err == nil || !strings.Contains(err.Error(), "is after the newest change stored") || !strings.Contains(err.Error(), fmt.Sprintf("(revision %d)", r.Revision)) {
		t.Fatalf("restore to %s, after the snapshot: %v", later, err)
	}
	// The snapshot's time is in its name: e-<time>-r<revision>.db.
	taken, err := time.Parse("20060102T150405Z", strings.Split(filepath.Base(r.Object), "-")[1])
	if err != nil {
		t.Fatalf("snapshot name %s: %v", r.Object, err)
	}
	// The name keeps the second; the snapshot was surely stored by its end, not at its start.
	if _, err := restore(taken.Format(time.RFC3339)); err == nil || !strings.Contains(err.Error(), "is before anything stored") {
		t.Fatalf("restore to the start of the snapshot's second %s: %v", taken, err)
	}
	by := taken.Add(time.Second)
	restored, err := restore(by.Format(time.RFC3339))
	p, ok := joinstate.ParseRestored(restored)
	if err != nil || !ok || p.Revision != r.Revision || !p.Time.Equal(by) || p.Lineage != r.Lineage {
		t.Fatalf("restore to the end of the snapshot's second %s: %q %+v %v", by, restored, p, err)
	}
}

// ep2lineage is the lineage of the cluster at ep: its ID as the backup reads it.
func ep2lineage(t *testing.T, ep string) string {
	t.Helper()
	op, err := membership.Dial([]string{ep}, nil, membership.Login{})
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	id, err := op.ClusterID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return backup.LineageOf(id)
}

func readResult(path string) (backupresult.Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return backupresult.Result{}, err
	}
	return backupresult.Decode(string(b))
}
