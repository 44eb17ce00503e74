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
	"etcdops.dev/etcdops/internal/etcdtest"
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
		done <- Run(ctx, []string{"stream-backup", "--endpoints=" + ep, "--cluster=e", "--dir=" + store,
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
	want := fmt.Sprintf("-%019d.delta", last)
	for i := 0; !strings.Contains(stdout.String(), want); i++ {
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
		if p.StoredRevision == last && p.Revision == last && p.Behind() < time.Second && !p.StoredTime.IsZero() && p.LastError == "" {
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
	snaps, err := s.List(context.Background())
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
