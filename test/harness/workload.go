package harness

import (
	"context"
	"errors"
	"fmt"
	"sort"
	gosync "sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Workload writes keys one after another for as long as it runs, as an application using
// the cluster would, and remembers every write etcd acknowledged.
type Workload struct {
	env    *Env
	prefix string
	cli    *clientv3.Client
	cancel context.CancelFunc
	done   chan struct{}

	mu     gosync.Mutex
	acked  []string
	failed int
	worst  time.Duration
}

// WriteStats are the workload's figures.
type WriteStats struct {
	Acked  int
	Failed int           // attempts that did not succeed (each is retried)
	Worst  time.Duration // longest time from a write's first attempt to its acknowledgement
}

// StartWorkload starts writing under prefix.
func (e *Env) StartWorkload(prefix string) (*Workload, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.clientURLs(), DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &Workload{env: e, prefix: prefix, cli: cli, cancel: cancel, done: make(chan struct{})}
	go w.run(ctx)
	return w, nil
}

// clientURLs are the client URLs of the running voters, as an application configured with
// the members' DNS names would use them; learners are left out because they serve no writes.
func (e *Env) clientURLs() []string {
	var out []string
	for _, m := range e.Monitor.View().Members {
		if !m.IsLearner {
			out = append(out, fmt.Sprintf("http://%s.%s.%s.svc.%s:2379", m.Name, e.Cluster, e.Namespace, e.Domain))
		}
	}
	if len(out) == 0 {
		out = []string{fmt.Sprintf("http://%s.%s.%s.svc.%s:2379", e.Pod(0), e.Cluster, e.Namespace, e.Domain)}
	}
	return out
}

func (w *Workload) run(ctx context.Context) {
	defer close(w.done)
	for i := 0; ctx.Err() == nil; i++ {
		key := fmt.Sprintf("%s/%07d", w.prefix, i)
		first := time.Now()
		for ctx.Err() == nil {
			wctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err := w.cli.Put(wctx, key, key)
			cancel()
			if err == nil {
				lat := time.Since(first)
				w.mu.Lock()
				w.acked = append(w.acked, key)
				w.worst = max(w.worst, lat)
				w.mu.Unlock()
				break
			}
			if ctx.Err() != nil {
				return
			}
			w.mu.Lock()
			w.failed++
			w.mu.Unlock()
			w.cli.SetEndpoints(w.env.clientURLs()...)
			sleep(ctx, 20*time.Millisecond)
		}
		sleep(ctx, 10*time.Millisecond)
		if i%20 == 0 {
			w.cli.SetEndpoints(w.env.clientURLs()...)
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Stop ends the writes.
func (w *Workload) Stop() WriteStats {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return WriteStats{Acked: len(w.acked), Failed: w.failed, Worst: w.worst}
}

// Verify reads the prefix back (linearizably, retrying for up to timeout) and returns the
// acknowledged keys that are missing or wrong.
func (w *Workload) Verify(timeout time.Duration) ([]string, error) {
	defer w.cli.Close()
	w.cli.SetEndpoints(w.env.clientURLs()...)
	deadline := time.Now().Add(timeout)
	var resp *clientv3.GetResponse
	var err error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err = w.cli.Get(ctx, w.prefix+"/", clientv3.WithPrefix())
		cancel()
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("reading back: %w", err)
	}
	if resp == nil {
		return nil, errors.New("reading back: no answer")
	}
	got := map[string]string{}
	for _, kv := range resp.Kvs {
		got[string(kv.Key)] = string(kv.Value)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var lost []string
	for _, k := range w.acked {
		if got[k] != k {
			lost = append(lost, k)
		}
	}
	sort.Strings(lost)
	return lost, nil
}
