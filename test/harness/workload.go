package harness

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	gosync "sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// WorkloadOptions shape a workload; the zero value is the default.
type WorkloadOptions struct {
	// Clients is how many clients share the keys (puts, linearizable gets, compare-and-swap,
	// deletes); 3 when 0.
	Clients int
	// Watchers is how many clients watch every key from the start; 2 when 0.
	Watchers int
	// MaxOps bounds the operations each sharing client issues, so that the history stays
	// small enough to check in a fraction of a second; 1500 when 0.
	MaxOps int
	// SerializableFrom, when set, adds a client that reads the shared keys from that pod
	// alone with serializable reads and records them as linearizable gets: a deliberate
	// violation when the pod is cut off, which the checker must catch.
	SerializableFrom string
}

// Workload is what an application using the cluster does, recorded: an appender writes
// keys of its own one after another and remembers every write etcd acknowledged; clients
// share a few keys with puts, linearizable gets, compare-and-swap transactions and
// deletes; watchers follow every key from the start, reconnecting when their stream ends.
// Every operation goes into the History with its call and return times and what etcd
// answered.
type Workload struct {
	target Target
	// env is the harness's loop the workload runs on, nil on another (SideWrite).
	env    *Env
	prefix string
	opts   WorkloadOptions
	hist   *History
	cancel context.CancelFunc
	done   gosync.WaitGroup
	// watchers run until the watch has reached the final revision.
	stopWatch context.CancelFunc
	watchers  gosync.WaitGroup
	clients   []*clientv3.Client

	mu     gosync.Mutex
	acked  []string
	failed int
	worst  time.Duration
}

// WriteStats are the workload's figures.
type WriteStats struct {
	Acked  int
	Failed int           // operations that did not succeed (each append is retried)
	Worst  time.Duration // longest time from an append's first attempt to its acknowledgement
}

// opTimeout bounds one client operation; past it the outcome is unknown.
const opTimeout = time.Second

// StartWorkload starts the default workload under prefix.
func (e *Env) StartWorkload(prefix string) (*Workload, error) {
	return e.StartWorkloadWith(prefix, WorkloadOptions{})
}

// Target is a cluster a workload runs against, as an application sees it.
type Target interface {
	// ClientConfig is an application's client configuration for the running voters.
	ClientConfig() clientv3.Config
	// ClientURLs are the client URLs of the running voters.
	ClientURLs() []string
	// ClientURL is the client URL of one member, by pod name.
	ClientURL(pod string) string
}

// StartWorkloadWith starts a workload under prefix. It first reads the revision and the
// shared keys, which are the history's initial state: nothing else writes to the cluster.
func (e *Env) StartWorkloadWith(prefix string, o WorkloadOptions) (*Workload, error) {
	w, err := startWorkload(e, prefix, o)
	if err != nil {
		return nil, err
	}
	w.env = e
	e.workloadMu.Lock()
	e.workload = w
	e.workloadMu.Unlock()
	return w, nil
}

// StartWorkloadOn starts a workload under prefix on a cluster outside the harness's loop
// (the control-plane tier's), as StartWorkloadWith does on an Env.
func StartWorkloadOn(t Target, prefix string, o WorkloadOptions) (*Workload, error) {
	return startWorkload(t, prefix, o)
}

func startWorkload(t Target, prefix string, o WorkloadOptions) (*Workload, error) {
	if o.Clients == 0 {
		o.Clients = 3
	}
	if o.Watchers == 0 {
		o.Watchers = 2
	}
	if o.MaxOps == 0 {
		o.MaxOps = 1500
	}
	w := &Workload{target: t, prefix: prefix, opts: o, hist: &History{start: time.Now(), Watchers: make([][]WatchEvent, o.Watchers)}}
	for i := range SharedKeys {
		w.hist.Keys = append(w.hist.Keys, fmt.Sprintf("%s/shared/k%d", prefix, i))
	}
	if err := w.readInitial(); err != nil {
		w.closeClients()
		return nil, err
	}
	run := []func(context.Context, *clientv3.Client){w.appendKeys}
	for i := range o.Clients {
		run = append(run, func(ctx context.Context, cli *clientv3.Client) { w.share(ctx, i+1, cli) })
	}
	if o.SerializableFrom != "" {
		id := o.Clients + 1
		run = append(run, func(ctx context.Context, cli *clientv3.Client) { w.readSerializable(ctx, id, cli) })
	}
	// One client each, so that they spread over the members as separate applications would.
	clients := make([]*clientv3.Client, o.Watchers+len(run))
	for i := range clients {
		cli, err := w.client()
		if err != nil {
			w.closeClients()
			return nil, err
		}
		clients[i] = cli
	}
	watchCtx, stopWatch := context.WithCancel(context.Background())
	w.stopWatch = stopWatch
	for i := range o.Watchers {
		w.watchers.Add(1)
		go w.watch(watchCtx, i, clients[i])
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	for i, f := range run {
		w.done.Add(1)
		go func() {
			defer w.done.Done()
			f(ctx, clients[o.Watchers+i])
		}()
	}
	return w, nil
}

// sideClient is the history's client ID of SideWrite's writes, apart from the workload's own.
const sideClient = 100

// SideWrite puts value at key as a recorded write of the running workload: for a scenario
// that writes beyond the workload (to fill or fragment the database), so that the checker and
// the watches account for every revision. value must be unique to the call; writes are
// sequential, as one client's are.
func (e *Env) SideWrite(key, value string) (Output, error) {
	e.workloadMu.Lock()
	defer e.workloadMu.Unlock()
	w := e.workload
	if w == nil {
		return Output{}, errors.New("no workload runs")
	}
	return w.record(sideClient, w.clients[len(w.clients)-1], Input{Kind: OpAppend, Key: -1, Name: key, Value: value})
}

// RecordedPut puts value at key through cli, a client of the scenario's own, as a recorded
// write of the running workload under client ID id (other than the workload's: from 200 on),
// so that the checker and the watches account for it; value must be unique to the call. A
// client's writes are sequential.
func (e *Env) RecordedPut(id int, cli *clientv3.Client, key, value string) (Output, error) {
	e.workloadMu.Lock()
	w := e.workload
	e.workloadMu.Unlock()
	if w == nil {
		return Output{}, errors.New("no workload runs")
	}
	return w.record(id, cli, Input{Kind: OpAppend, Key: -1, Name: key, Value: value})
}

func (w *Workload) client() (*clientv3.Client, error) {
	cli, err := clientv3.New(w.target.ClientConfig())
	if err != nil {
		return nil, err
	}
	w.clients = append(w.clients, cli)
	return cli, nil
}

func (w *Workload) closeClients() {
	for _, c := range w.clients {
		c.Close()
	}
}

// History returns the recorded history; complete once Stop has returned.
func (w *Workload) History() *History { return w.hist }

// readInitial reads the revision and the shared keys, retrying for up to a while.
func (w *Workload) readInitial() error {
	cli, err := w.client()
	if err != nil {
		return err
	}
	resp, err := readUntil(cli, w.prefix+"/shared/", 30*time.Second)
	if err != nil {
		return fmt.Errorf("reading the initial state: %w", err)
	}
	w.hist.Initial.Revision = resp.Header.Revision
	for _, kv := range resp.Kvs {
		for i, k := range w.hist.Keys {
			if string(kv.Key) == k {
				w.hist.Initial.Keys[i] = kvCell{string(kv.Value), kv.ModRevision}
			}
		}
	}
	return nil
}

// readUntil reads prefix linearizably, retrying until it succeeds or timeout passes.
func readUntil(cli *clientv3.Client, prefix string, timeout time.Duration) (*clientv3.GetResponse, error) {
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var resp *clientv3.GetResponse
		resp, err = cli.Get(ctx, prefix, clientv3.WithPrefix())
		cancel()
		if err == nil {
			return resp, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err == nil {
		err = errors.New("no answer")
	}
	return nil, err
}

// ClientURLs are the client URLs of the running voters, as an application configured with
// the members' DNS names would use them; learners are left out because they serve no writes.
func (e *Env) ClientURLs() []string {
	var out []string
	for _, m := range e.Monitor.View().Members {
		if !m.IsLearner {
			out = append(out, e.ClientURL(m.Name))
		}
	}
	if len(out) == 0 {
		out = []string{e.ClientURL(e.Pod(0))}
	}
	return out
}

func (e *Env) ClientURL(pod string) string {
	return fmt.Sprintf("http://%s.%s.%s.svc.%s:2379", pod, e.Cluster, e.Namespace, e.Domain)
}

// appendKeys writes keys one after another, each retried until acknowledged. Each attempt
// writes its own value, so that a watch event names the attempt it comes from.
func (w *Workload) appendKeys(ctx context.Context, cli *clientv3.Client) {
	for i := 0; ctx.Err() == nil; i++ {
		key := fmt.Sprintf("%s/%07d", w.prefix, i)
		first := time.Now()
		for attempt := 0; ctx.Err() == nil; attempt++ {
			in := Input{Kind: OpAppend, Key: -1, Name: key, Value: fmt.Sprintf("%s#%d", key, attempt)}
			if _, err := w.record(0, cli, in); err == nil {
				w.mu.Lock()
				w.acked = append(w.acked, key)
				w.worst = max(w.worst, time.Since(first))
				w.mu.Unlock()
				break
			}
			cli.SetEndpoints(w.target.ClientURLs()...)
			sleep(ctx, 20*time.Millisecond)
		}
		sleep(ctx, 10*time.Millisecond)
		if i%20 == 0 {
			cli.SetEndpoints(w.target.ClientURLs()...)
		}
	}
}

// sharePace is the pause between two operations of a sharing client: together they add
// about as many writes again as the appender, on two shared cores.
const sharePace = 25 * time.Millisecond

// share issues a random mix of operations on the shared keys, at most MaxOps of them.
// A compare-and-swap expects what this client last saw of the key.
func (w *Workload) share(ctx context.Context, id int, cli *clientv3.Client) {
	rng := rand.New(rand.NewPCG(uint64(id), uint64(w.hist.start.UnixNano())))
	seen := make([]string, SharedKeys)
	for i := 0; i < w.opts.MaxOps && ctx.Err() == nil; i++ {
		k := rng.IntN(SharedKeys)
		in := Input{Key: k, Name: w.hist.Keys[k], Value: fmt.Sprintf("c%d-%d", id, i)}
		switch r := rng.IntN(100); {
		case r < 35:
			in.Kind, in.Value = OpGet, ""
		case r < 60:
			in.Kind = OpPut
		case r < 85:
			in.Kind, in.Expect = OpCAS, seen[k]
		default:
			in.Kind, in.Value = OpDelete, ""
		}
		out, err := w.record(id, cli, in)
		switch {
		case err != nil:
			cli.SetEndpoints(w.target.ClientURLs()...)
			sleep(ctx, 20*time.Millisecond)
		case in.Kind == OpPut || (in.Kind == OpCAS && out.Succeeded):
			seen[k] = in.Value
		case in.Kind == OpDelete:
			seen[k] = ""
		case out.Found:
			seen[k] = out.Value
		default:
			seen[k] = ""
		}
		sleep(ctx, sharePace)
		if i%20 == 0 {
			cli.SetEndpoints(w.target.ClientURLs()...)
		}
	}
}

// readSerializable reads the shared keys from one pod's member alone, serializably, and
// records the reads as linearizable gets.
func (w *Workload) readSerializable(ctx context.Context, id int, cli *clientv3.Client) {
	cli.SetEndpoints(w.target.ClientURL(w.opts.SerializableFrom))
	for i := 0; i < w.opts.MaxOps && ctx.Err() == nil; i++ {
		k := i % SharedKeys
		_, _ = w.record(id, cli, Input{Kind: OpGet, Key: k, Name: w.hist.Keys[k]}, clientv3.WithSerializable())
		sleep(ctx, 10*time.Millisecond)
	}
}

func (w *Workload) do(ctx context.Context, id int, cli *clientv3.Client, in Input) error {
	_, err := w.record(id, cli, in)
	return err
}

// record runs one operation and adds it to the history. A write that got no answer has an
// unknown outcome; a read that got none is left out, as it changed nothing. Stopping the
// workload lets an operation under way finish: cut short, it would take effect or not
// after the final revision is read.
func (w *Workload) record(id int, cli *clientv3.Client, in Input, readOpts ...clientv3.OpOption) (Output, error) {
	octx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	call := w.hist.now()
	out, err := run(octx, cli, in, readOpts)
	ret := w.hist.now()
	if err != nil {
		w.mu.Lock()
		w.failed++
		w.mu.Unlock()
		if in.Kind == OpGet {
			return out, err
		}
		out = Output{Unknown: true, Err: shortError(err)}
		ret = neverReturned
	}
	w.hist.add(Op{Client: id, Input: in, Output: out, Call: call, Return: ret})
	return out, err
}

func shortError(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, "desc = "); i >= 0 {
		s = s[i+len("desc = "):]
	}
	return s
}

// run sends one operation to etcd and reads the answer into an Output.
func run(ctx context.Context, cli *clientv3.Client, in Input, readOpts []clientv3.OpOption) (Output, error) {
	var out Output
	switch in.Kind {
	case OpPut, OpAppend:
		resp, err := cli.Put(ctx, in.Name, in.Value)
		if err != nil {
			return out, err
		}
		out.Revision, out.Member, out.Cluster = resp.Header.Revision, resp.Header.MemberId, resp.Header.ClusterId
	case OpGet:
		resp, err := cli.Get(ctx, in.Name, readOpts...)
		if err != nil {
			return out, err
		}
		out.Revision, out.Member, out.Cluster = resp.Header.Revision, resp.Header.MemberId, resp.Header.ClusterId
		if len(resp.Kvs) > 0 {
			out.Found, out.Value, out.ModRevision = true, string(resp.Kvs[0].Value), resp.Kvs[0].ModRevision
		}
	case OpDelete:
		resp, err := cli.Delete(ctx, in.Name)
		if err != nil {
			return out, err
		}
		out.Revision, out.Member, out.Cluster, out.Deleted = resp.Header.Revision, resp.Header.MemberId, resp.Header.ClusterId, resp.Deleted
	case OpCAS:
		cmp := clientv3.Compare(clientv3.Value(in.Name), "=", in.Expect)
		if in.Expect == "" {
			cmp = clientv3.Compare(clientv3.CreateRevision(in.Name), "=", 0)
		}
		resp, err := cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(in.Name, in.Value)).Else(clientv3.OpGet(in.Name)).Commit()
		if err != nil {
			return out, err
		}
		out.Revision, out.Member, out.Cluster, out.Succeeded = resp.Header.Revision, resp.Header.MemberId, resp.Header.ClusterId, resp.Succeeded
		if !resp.Succeeded {
			if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
				out.Found, out.Value, out.ModRevision = true, string(kvs[0].Value), kvs[0].ModRevision
			}
		}
	default:
		return out, fmt.Errorf("unknown operation %q", in.Kind)
	}
	return out, nil
}

// watch follows every key from the revision after the initial state. When its stream ends
// (the member lost its leader, was stopped or removed) it reconnects from the revision after
// its last event, until the watch is stopped.
func (w *Workload) watch(ctx context.Context, id int, cli *clientv3.Client) {
	defer w.watchers.Done()
	for reconnects := 0; ctx.Err() == nil; reconnects++ {
		from := w.hist.lastSeen(id) + 1
		wch := cli.Watch(clientv3.WithRequireLeader(ctx), "\x00", clientv3.WithFromKey(), clientv3.WithRev(from))
		for resp := range wch {
			if err := resp.Err(); err != nil {
				w.hist.watchError(id, err)
				break
			}
			for _, ev := range resp.Events {
				w.hist.event(id, WatchEvent{Revision: ev.Kv.ModRevision, Delete: ev.Type == clientv3.EventTypeDelete,
					Key: string(ev.Kv.Key), Value: string(ev.Kv.Value), Member: resp.Header.MemberId, Cluster: resp.Header.ClusterId,
					Reconnects: reconnects})
			}
		}
		cli.SetEndpoints(w.target.ClientURLs()...)
		sleep(ctx, 20*time.Millisecond)
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

// AwaitAcked waits until n appends are acknowledged, at most timeout, so that a window that
// converges at once still sees the cluster serve.
func (w *Workload) AwaitAcked(n int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		w.mu.Lock()
		acked := len(w.acked)
		w.mu.Unlock()
		if acked >= n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// watchBound is how long the watchers get to reach the final revision.
const watchBound = 15 * time.Second

// Stop ends the operations, reads the final revision, and lets the watchers reach it.
func (w *Workload) Stop() WriteStats {
	if e := w.env; e != nil {
		e.workloadMu.Lock()
		if e.workload == w {
			e.workload = nil
		}
		e.workloadMu.Unlock()
	}
	w.cancel()
	w.done.Wait()
	w.clients[0].SetEndpoints(w.target.ClientURLs()...)
	if resp, err := readUntil(w.clients[0], w.prefix+"/shared/", watchBound); err == nil {
		w.hist.mu.Lock()
		w.hist.Final = resp.Header.Revision
		w.hist.mu.Unlock()
		deadline := time.Now().Add(watchBound)
		for time.Now().Before(deadline) && !w.watchedTo(resp.Header.Revision) {
			time.Sleep(20 * time.Millisecond)
		}
	} else {
		w.hist.watchError(-1, fmt.Errorf("reading the final revision: %w", err))
	}
	w.stopWatch()
	w.watchers.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return WriteStats{Acked: len(w.acked), Failed: w.failed, Worst: w.worst}
}

func (w *Workload) watchedTo(rev int64) bool {
	for i := range w.opts.Watchers {
		if w.hist.lastSeen(i) < rev {
			return false
		}
	}
	return true
}

// Verify reads the appended keys back (linearizably, retrying for up to timeout) and returns
// the acknowledged keys that are missing. A key holds the value of one of its attempts.
func (w *Workload) Verify(timeout time.Duration) ([]string, error) {
	defer w.closeClients()
	cli := w.clients[0]
	cli.SetEndpoints(w.target.ClientURLs()...)
	resp, err := readUntil(cli, w.prefix+"/", timeout)
	if err != nil {
		return nil, fmt.Errorf("reading back: %w", err)
	}
	got := map[string]bool{}
	for _, kv := range resp.Kvs {
		if strings.HasPrefix(string(kv.Value), string(kv.Key)+"#") {
			got[string(kv.Key)] = true
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var lost []string
	for _, k := range w.acked {
		if !got[k] {
			lost = append(lost, k)
		}
	}
	return lost, nil
}
