package membertool

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	gosync "sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"etcdops.dev/etcdops/backup"
	"etcdops.dev/etcdops/backupresult"
	"etcdops.dev/etcdops/test/etcdtest"
)

// lockedBuffer is a buffer the stream writes while the test reads it.
type lockedBuffer struct {
	mu gosync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// stream-backup takes the first snapshot itself, stores the changes after it, says so one
// line a chunk, and ends cleanly when stopped.
func TestStreamBackupStoresChangesUntilStopped(t *testing.T) {
	ep, _ := startSeed(t)
	store := filepath.Join(t.TempDir(), "claim", "ns", "e")
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	metrics := fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))
	go func() {
		done <- Run(ctx, []string{"stream-backup", "--endpoints=" + ep, "--cluster=e", "--dir=" + store, "--writer=e-stream-1",
			"--work-dir=" + t.TempDir(), "--interval=100ms", "--max-chunk-bytes=65536", "--metrics-addr=" + metrics}, &stdout, &stderr)
	}()
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
	lineage := ep2lineage(t, ep)
	want := fmt.Sprintf("stored %s/lineages/%s/deltas/", store, lineage)
	want2 := fmt.Sprintf("-%019d.", last)
	for i := 0; !strings.Contains(stdout.String(), want) || !strings.Contains(stdout.String(), want2); i++ {
		if i == 300 {
			t.Fatalf("revision %d not stored in 30s: stdout %q, stderr %q", last, stdout.String(), stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		fmt.Sprintf("etcdops_backup_stream_stored_revision{name=\"e\"} %d\n", last),
		fmt.Sprintf("etcdops_backup_stream_watched_revision{name=\"e\"} %d\n", last),
		"etcdops_backup_stream_failures_total{name=\"e\"} 0\n",
		"etcdops_backup_stream_superseded{name=\"e\"} 0\n",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	// Caught up: everything the watch sent is stored, so the stream says it is not behind
	// (within a few of its ticks), and which revision every change is stored up to.
	var p backupresult.Progress
	for i := 0; ; i++ {
		if p, err = getProgress("http://" + metrics + backupresult.ProgressPath); err != nil {
			t.Fatal(err)
		}
		if p.StoredRevision == last && p.Revision == last && p.Behind() < time.Second && !p.StoredTime.IsZero() && p.LastError == "" && p.Lineage == lineage {
			break
		}
		if i == 100 {
			t.Fatalf("progress %+v: want revision %d stored, caught up", p, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != ExitOK {
		t.Fatalf("stopped: exit %d, stderr %q", code, stderr.String())
	}
	s, err := backup.NewDir(store)
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := backup.LineageStore(s, lineage).List(context.Background())
	if err != nil || len(snaps) != 1 {
		t.Fatalf("snapshots %v %v: want the stream's first", snaps, err)
	}
	if stderr.String() != "" {
		t.Fatalf("failures without a fault: %q", stderr.String())
	}
	if code, _, errOut := run("stream-backup", "--endpoints="+ep, "--dir="+store); code != ExitUsage || !strings.Contains(errOut, "--cluster") {
		t.Fatalf("without --cluster: exit %d, %q", code, errOut)
	}
}

func getProgress(url string) (backupresult.Progress, error) {
	resp, err := http.Get(url)
	if err != nil {
		return backupresult.Progress{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return backupresult.Progress{}, err
	}
	return backupresult.DecodeProgress(b)
}

// A second stream of the cluster supersedes the first, which says so in its progress, its
// metrics and its log, and stays up storing nothing until stopped.
func TestStreamBackupSupersededStaysUp(t *testing.T) {
	ep, _ := startSeed(t)
	store := filepath.Join(t.TempDir(), "claim")
	start := func(ctx context.Context, writer string, stdout, stderr io.Writer) (string, chan int) {
		metrics := fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))
		done := make(chan int, 1)
		go func() {
			done <- Run(ctx, []string{"stream-backup", "--endpoints=" + ep, "--cluster=e", "--dir=" + store, "--writer=" + writer,
				"--work-dir=" + t.TempDir(), "--interval=100ms", "--metrics-addr=" + metrics}, stdout, stderr)
		}()
		return metrics, done
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out1, err1, out2, err2 lockedBuffer
	metrics1, done1 := start(ctx, "e-stream-1", &out1, &err1)
	for i := 0; !strings.Contains(out1.String(), "writes lineage"); i++ {
		if i == 300 {
			t.Fatalf("the first stream claimed nothing in 30s: %q %q", out1.String(), err1.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, done2 := start(ctx, "e-stream-2", &out2, &err2)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	var p backupresult.Progress
	for i := 0; p.SupersededBy == ""; i++ {
		if i == 100 {
			t.Fatalf("the first stream not superseded in 20s: progress %+v, stdout %q %q", p, out1.String(), out2.String())
		}
		if _, err := cli.Put(context.Background(), fmt.Sprintf("k%d", i), "v"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		if p, err = getProgress("http://" + metrics1 + backupresult.ProgressPath); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(p.SupersededBy, "e-stream-2") || p.SupersededTime.IsZero() || !strings.Contains(out2.String(), "it supersedes e-stream-1") ||
		!strings.Contains(err1.String(), "superseded by another writer of the lineage") {
		t.Fatalf("progress %+v; the second stream said %q, the first %q", p, out2.String(), err1.String())
	}
	resp, err := http.Get("http://" + metrics1 + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "etcdops_backup_stream_superseded{name=\"e\"} 1\n") {
		t.Fatalf("metrics of the superseded stream:\n%s", body)
	}
	select {
	case code := <-done1:
		t.Fatalf("the superseded stream exited %d", code)
	case <-time.After(500 * time.Millisecond):
	}
	cancel()
	if c1, c2 := <-done1, <-done2; c1 != ExitOK || c2 != ExitOK {
		t.Fatalf("stopped: exits %d and %d", c1, c2)
	}
}
