package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	gosync "sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// HookStarter starts the hook server on the given clock and returns its base URL and how to
// stop it.
type HookStarter func(ctx context.Context, clock *HookClock) (baseURL string, stop func(), err error)

// Options configure one Env.
type Options struct {
	Namespace string
	Cluster   string
	Domain    string
	// TimeScale shrinks Kubernetes-side durations (resync periods, probe periods, crash-loop
	// and Job back-off, Job TTLs) so that scenarios finish in seconds; 1 is real time.
	TimeScale float64
	// PendingFor, when set, is how long each new pod stays Pending before its container starts
	// (Kubelet.PendingFor), in Kubernetes time (scaled by TimeScale).
	PendingFor func(pod string) time.Duration
	// AttachDelay is how much longer a drained pod's replacement stays Pending (Drain), in
	// Kubernetes time: it lands on another node, where its volume must attach first.
	AttachDelay time.Duration
	// MountDelay makes the kubelet refresh mounted ConfigMaps and Secrets late, pod by pod
	// (Kubelet.MountDelay); zero refreshes them on its next pass.
	MountDelay time.Duration
	Tools      Tools
	Hook       HookStarter
	Controller Controller
	// Root is a scratch directory for volumes and pod directories.
	Root string
	// Logf receives one line per event worth telling (syncs, faults, violations).
	Logf func(format string, args ...any)
	// OnSync sees every sync, after the monitor checked it.
	OnSync func(SyncRecord)
	// NoOperator leaves Metacontroller out: the baseline drives the StatefulSet directly.
	NoOperator bool
	// EtcdBinary, when set, makes the kubelet run real etcd processes (Kubelet.EtcdBinary).
	EtcdBinary EtcdBinaryForImage
	// ResizeDelay is how long a claim takes to grow (Resizer), in Kubernetes time.
	ResizeDelay time.Duration
}

// Env is one closed loop: store, Metacontroller, hook, StatefulSet and Job controllers,
// kubelet and monitor, for one EtcdCluster.
type Env struct {
	Cluster   string
	Namespace string
	Domain    string
	Store     *Store
	STS       *StatefulSets
	Jobs      *Jobs
	Kubelet   *Kubelet
	// Disruptions is the disruption controller and the Eviction API (Drain).
	Disruptions *Disruptions
	// Streams runs the continuous backup's Deployment.
	Streams *Streams
	MC      *Metacontroller
	Monitor *Monitor

	opts   Options
	cancel context.CancelFunc
	ctx    context.Context
	wg     gosync.WaitGroup

	stopMC context.CancelFunc

	jobMu     gosync.Mutex
	afterJobs func(job string)

	hookMu    gosync.Mutex
	hookURL   string
	hookStop  func()
	hookClock HookClock

	crash crasher

	// workload is the one running, for SideWrite.
	workloadMu gosync.Mutex
	workload   *Workload

	tlsMu gosync.Mutex
	pki   *PKI // the cluster's certificates, once UseTLS was called
	// login is the etcd user applications log in as, once UseLogin was called.
	login *clientv3.Config
}

var (
	dnsOnce   gosync.Once
	sharedDNS *DNS
	errDNS    error
)

// ClusterDNS starts the process-wide DNS responder once and installs it as the process's
// resolver: net.DefaultResolver is global, so every kubelet of the process shares it.
func ClusterDNS() (*DNS, error) {
	dnsOnce.Do(func() {
		sharedDNS, errDNS = StartDNS(context.Background())
		if errDNS == nil {
			sharedDNS.Install()
		}
	})
	return sharedDNS, errDNS
}

// Start builds and starts an Env; nothing exists in it yet but the hook.
func Start(opts Options) (*Env, error) {
	dns, err := ClusterDNS()
	if err != nil {
		return nil, err
	}
	if opts.TimeScale <= 0 {
		opts.TimeScale = 1
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	for _, d := range []string{"volumes", "pods"} {
		if err := os.MkdirAll(filepath.Join(opts.Root, d), 0o755); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Env{Cluster: opts.Cluster, Namespace: opts.Namespace, Domain: opts.Domain, opts: opts, ctx: ctx, cancel: cancel,
		crash: crasher{hits: map[string]int{}, killed: map[string]bool{}}}
	e.Store = NewStore(opts.Namespace)
	SetExpansion(e.Store, true)
	e.STS = NewStatefulSets(e.Store, filepath.Join(opts.Root, "volumes"))
	e.Kubelet = NewKubelet(e.Store, e.STS, dns, opts.Tools, opts.Domain, opts.Root, opts.TimeScale)
	e.Disruptions = NewDisruptions(e.Store)
	e.Kubelet.PendingFor = opts.PendingFor
	e.Kubelet.Logf = opts.Logf
	e.Kubelet.MountDelay = opts.MountDelay
	e.Kubelet.EtcdBinary = opts.EtcdBinary
	e.Kubelet.OnPanic = func(pod, msg string) {
		e.Monitor.mu.Lock()
		e.Monitor.counts.Panics++
		e.Monitor.panics = append(e.Monitor.panics, pod+": "+msg)
		e.Monitor.mu.Unlock()
	}
	jobTools := opts.Tools
	jobTools.Member = e.crash.killJob(opts.Tools.Member)
	e.Jobs = NewJobs(e.Store, jobTools, opts.TimeScale)
	e.Jobs.Mounts = func(p *corev1.Pod) (map[string]string, error) {
		return e.Kubelet.jobMounts(p, filepath.Join(opts.Root, "pods", p.Name))
	}
	e.Jobs.EtcdBinary, e.Jobs.Logf = e.Kubelet.etcdBinaryFor, opts.Logf
	e.Streams = NewStreams(e.Store, opts.Tools, opts.TimeScale, opts.Logf)
	e.Streams.Mounts = func(p *corev1.Pod) (map[string]string, error) {
		return e.Kubelet.jobMounts(p, filepath.Join(opts.Root, "pods", p.Name))
	}
	e.Monitor = newMonitor(e)
	var jobStart gosync.Map
	e.Jobs.OnRun = func(job string, args []string, started bool, out string, err error) {
		if started {
			jobStart.Store(job, time.Now())
			if running := e.Jobs.Running(); len(running) > 1 {
				e.Monitor.violate("member Jobs running at once: %v", running)
			}
			e.Monitor.beforeJob(job, args)
			e.logf("job %s runs %s", job, strings.Join(args[1:], " "))
			return
		}
		took := time.Duration(0)
		if at, ok := jobStart.Load(job); ok {
			took = time.Since(at.(time.Time)).Round(time.Millisecond)
		}
		var killed killedJob
		if errors.As(err, &killed) {
			// The change was made: it counts, though the Job never said so.
			e.Monitor.jobDone(args, killed.out)
		}
		if err != nil {
			e.logf("job %s failed after %s: %v", job, took, err)
			return
		}
		e.logf("job %s done in %s: %s", job, took, out)
		e.Monitor.jobDone(args, out)
	}
	e.Jobs.AfterJob = func(job string) {
		e.jobMu.Lock()
		f := e.afterJobs
		e.jobMu.Unlock()
		if f != nil {
			f(job)
		}
	}
	if !opts.NoOperator {
		if err := e.StartHook(); err != nil {
			cancel()
			return nil, err
		}
		e.MC = NewMetacontroller(e.Store, opts.Controller, e.currentHookURL, opts.TimeScale)
		e.MC.Clock = &e.hookClock
		e.MC.EtcdState = func() string { return fmt.Sprintf("%+v", e.Monitor.View()) }
		e.MC.Drop = e.crash.loseAnswer
		e.MC.OnSync = func(rec SyncRecord) {
			e.Monitor.afterSync(rec)
			if opts.OnSync != nil {
				opts.OnSync(rec)
			}
			if e.crash.restartHook(rec) {
				if err := e.RestartHook(); err != nil {
					e.Monitor.violate("restarting the hook: %v", err)
				}
			}
		}
	}
	e.spawn(e.STS.Run)
	e.spawn((&Resizer{Store: e.Store, Delay: opts.ResizeDelay, TimeScale: opts.TimeScale}).Run)
	e.spawn(e.Disruptions.Run)
	e.spawn(e.Jobs.Run)
	e.spawn(e.Streams.Run)
	e.spawn(e.Monitor.Run)
	kubeletCtx, stopKubelet := context.WithCancel(context.Background())
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.Kubelet.Run(kubeletCtx)
	}()
	go func() {
		<-ctx.Done()
		stopKubelet()
	}()
	return e, nil
}

func (e *Env) spawn(f func(context.Context)) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		f(e.ctx)
	}()
}

func (e *Env) logf(format string, args ...any) { e.opts.Logf(format, args...) }

func (e *Env) currentHookURL() string {
	e.hookMu.Lock()
	defer e.hookMu.Unlock()
	return e.hookURL
}

// StartHook starts the hook server (again).
func (e *Env) StartHook() error {
	url, stop, err := e.opts.Hook(e.ctx, &e.hookClock)
	if err != nil {
		return fmt.Errorf("starting the hook: %w", err)
	}
	e.hookMu.Lock()
	e.hookURL, e.hookStop = url, stop
	e.hookMu.Unlock()
	return nil
}

// RestartHook stops the hook server and starts a new one: all its in-memory state is lost.
func (e *Env) RestartHook() error {
	e.hookMu.Lock()
	stop := e.hookStop
	e.hookMu.Unlock()
	stop()
	e.logf("hook restarted")
	return e.StartHook()
}

// Create applies the EtcdCluster and starts Metacontroller's loop.
func (e *Env) Create(spec v1alpha1.EtcdClusterSpec) {
	e.Store.CreateParent(&v1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Name: e.Cluster}, Spec: spec})
	if e.MC != nil {
		ctx, cancel := context.WithCancel(e.ctx)
		e.stopMC = cancel
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.MC.Run(ctx)
		}()
	}
}

// AfterJob makes f run each time a Job's attempt has finished and its status is written,
// before the Job controller moves on; nil removes it.
func (e *Env) AfterJob(f func(job string)) {
	e.jobMu.Lock()
	e.afterJobs = f
	e.jobMu.Unlock()
}

// StopOperator stops Metacontroller's loop: nothing syncs the cluster any more, the
// Kubernetes controllers and the members run on.
func (e *Env) StopOperator() {
	if e.stopMC != nil {
		e.stopMC()
	}
}

// RolledOut reports whether the StatefulSet has size pods, all on its current template and
// ready, and returns why not.
func (e *Env) RolledOut(size int) (bool, string) {
	o, ok := e.Store.Get("StatefulSet", e.Cluster)
	if !ok {
		return false, "no StatefulSet"
	}
	sts := o.(*appsv1.StatefulSet)
	if sts.Status.ObservedGeneration != sts.Generation || sts.Spec.Replicas == nil || int(*sts.Spec.Replicas) != size ||
		int(sts.Status.ReadyReplicas) != size || int(sts.Status.UpdatedReplicas) != size ||
		sts.Status.CurrentRevision != sts.Status.UpdateRevision {
		return false, fmt.Sprintf("StatefulSet status %+v", sts.Status)
	}
	for _, p := range e.Pods() {
		if p.DeletionTimestamp != nil {
			return false, "pod terminating " + p.Name
		}
	}
	return true, ""
}

// Close stops everything and kills every member.
func (e *Env) Close() {
	e.cancel()
	e.wg.Wait()
	e.hookMu.Lock()
	stop := e.hookStop
	e.hookMu.Unlock()
	if stop != nil {
		stop()
	}
}

// Pod returns the member pod at ordinal's name.
func (e *Env) Pod(ordinal int) string { return fmt.Sprintf("%s-%d", e.Cluster, ordinal) }

// Kill crashes a member's etcd; the kubelet restarts it after back-off.
func (e *Env) Kill(pod string) error {
	e.Monitor.markFault(pod)
	e.logf("fault: kill %s", pod)
	return e.Kubelet.Kill(pod)
}

// DeleteStatefulSet deletes the cluster's StatefulSet with its pods, as `kubectl delete
// statefulset` does: a fault to every pod, which go down together. Its claims follow its
// retention policy.
func (e *Env) DeleteStatefulSet() {
	for _, p := range e.Pods() {
		e.Monitor.markFault(p.Name)
	}
	e.logf("fault: delete StatefulSet %s with its pods", e.Cluster)
	e.Store.Delete("StatefulSet", e.Cluster)
}

// Drain evicts a pod as `kubectl drain` does, through the Eviction API: refused with an
// error wrapping ErrBudget while the cluster's PodDisruptionBudget allows no disruption,
// otherwise the pod is deleted gracefully, the StatefulSet controller recreates it, and its
// volume takes AttachDelay to attach on the new node. Not a fault: the budget is the
// operator's, so a quorum loss an allowed eviction causes is counted as the operator's.
func (e *Env) Drain(pod string) error {
	if err := e.Disruptions.Evict(pod); err != nil {
		e.logf("drain: eviction of %s refused: %v", pod, err)
		return err
	}
	e.Kubelet.Moved(pod, e.opts.AttachDelay)
	e.logf("drain: %s evicted", pod)
	return nil
}

// Isolate cuts a member's node off until Heal.
func (e *Env) Isolate(pod string) error {
	e.Monitor.markFault(pod)
	e.logf("fault: node of %s down", pod)
	return e.Kubelet.Isolate(pod)
}

// Heal brings an isolated node back.
func (e *Env) Heal(pod string) {
	e.logf("fault healed: node of %s back", pod)
	e.Kubelet.Heal(pod)
}

// Wipe crashes a member and deletes its data dir.
func (e *Env) Wipe(pod string) error {
	e.Monitor.markFault(pod)
	e.logf("fault: wipe the data dir of %s", pod)
	return e.Kubelet.Wipe(pod, "data")
}

// Partition cuts the peer traffic between one member and all others, both ways, with etcd's
// own rafthttp pause (what etcd's functional tests use): raft messages to and from it are
// dropped while its process, its client port and its pod stay up. It models a peer-network
// partition of one member on loopback, where no firewall is available.
func (e *Env) Partition(pod string) error {
	servers, err := embeddedServers(e.Kubelet.servers())
	if err != nil {
		return err
	}
	s, ok := servers[pod]
	if !ok {
		return fmt.Errorf("%s has no running etcd", pod)
	}
	e.Monitor.markFault(pod)
	e.Monitor.mu.Lock()
	e.Monitor.cut[pod] = true
	e.Monitor.mu.Unlock()
	e.logf("fault: partition %s", pod)
	for name, o := range servers {
		if name != pod {
			s.CutPeer(o.MemberID())
			o.CutPeer(s.MemberID())
		}
	}
	return nil
}

// Mend ends Partition for the processes still running.
func (e *Env) Mend(pod string) {
	servers, _ := embeddedServers(e.Kubelet.servers())
	e.Monitor.mu.Lock()
	delete(e.Monitor.cut, pod)
	e.Monitor.mu.Unlock()
	e.logf("fault healed: partition of %s", pod)
	s, ok := servers[pod]
	for name, o := range servers {
		if name == pod {
			continue
		}
		if ok {
			s.MendPeer(o.MemberID())
			o.MendPeer(s.MemberID())
		} else {
			for _, id := range e.memberIDs(pod) {
				o.MendPeer(id)
			}
		}
	}
}

func (e *Env) memberIDs(pod string) []types.ID {
	var out []types.ID
	for _, m := range e.Monitor.View().Members {
		if m.Name == pod {
			out = append(out, types.ID(m.ID))
		}
	}
	return out
}

// Steady reports whether the cluster matches size members: every voter up, no learner,
// StatefulSet rolled out and ready, no Job in flight, and the hook's status says Running
// for the current generation. It returns why not.
func (e *Env) Steady(size int) (bool, string) {
	p := e.Store.Parent()
	if p == nil {
		return false, "no parent"
	}
	if p.Status.ObservedGeneration != p.Generation {
		return false, "generation not observed"
	}
	if p.Status.Phase != v1alpha1.PhaseRunning {
		return false, "phase " + string(p.Status.Phase)
	}
	if a := p.Status.Action; a != nil && a.Type != "Steady" {
		return false, "action " + a.Type + " " + a.Member
	}
	v := e.Monitor.View()
	if v.Voters() != size || v.Learners() != 0 || v.Leader == "" {
		return false, fmt.Sprintf("membership %+v leader %q", v.Members, v.Leader)
	}
	for i, m := range v.Members {
		if !m.Running || m.Name != e.Pod(i) {
			return false, fmt.Sprintf("member %+v", m)
		}
	}
	if ok, why := e.RolledOut(size); !ok {
		return false, why
	}
	for _, o := range e.Store.List("Job") {
		if done, _ := jobDone(o.(*batchv1.Job)); !done {
			return false, "job in flight " + o.GetName()
		}
	}
	return true, ""
}

// WaitSteady waits, checking every 50ms, until Steady(size) holds twice in a row, and
// returns how long it took.
func (e *Env) WaitSteady(size int, timeout time.Duration) (time.Duration, error) {
	return e.waitFor(timeout, func() (bool, string) { return e.Steady(size) })
}

// WaitFor waits, checking every 50ms, until cond holds twice in a row.
func (e *Env) WaitFor(timeout time.Duration, cond func() (bool, string)) (time.Duration, error) {
	return e.waitFor(timeout, cond)
}

func (e *Env) waitFor(timeout time.Duration, cond func() (bool, string)) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	hits := 0
	why := ""
	for time.Now().Before(deadline) {
		var ok bool
		ok, why = cond()
		if ok {
			hits++
			if hits == 2 {
				return time.Since(start), nil
			}
		} else {
			hits = 0
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start), errors.New("timed out: " + why)
}

// Pods returns the etcd pods (not Job pods, not the continuous backup's), sorted by name.
func (e *Env) Pods() []*corev1.Pod {
	var out []*corev1.Pod
	for _, o := range e.Store.List("Pod") {
		if p := o.(*corev1.Pod); !isJobPod(p) && !isStreamPod(p) {
			out = append(out, p)
		}
	}
	return out
}

// PodsSettled reports whether n etcd pods exist, none terminating, all ready.
func (e *Env) PodsSettled(n int) (bool, string) {
	pods := e.Pods()
	if len(pods) != n {
		return false, fmt.Sprintf("%d pods", len(pods))
	}
	for _, p := range pods {
		if p.DeletionTimestamp != nil || !PodReady(p) {
			return false, "pod not ready " + p.Name
		}
	}
	return true, ""
}

// Describe summarises the pods, the StatefulSet and the membership, for failure messages.
func (e *Env) Describe() string {
	var b strings.Builder
	for _, p := range e.Pods() {
		rev := p.Labels[appsv1.ControllerRevisionHashLabelKey]
		var restarts int32
		var waiting string
		if cs := p.Status.ContainerStatuses; len(cs) > 0 {
			restarts = cs[0].RestartCount
			if w := cs[0].State.Waiting; w != nil {
				waiting = w.Reason + ": " + w.Message
			}
		}
		fmt.Fprintf(&b, "pod %s ip=%s ready=%v deleting=%v rev=%s restarts=%d %s\n",
			p.Name, p.Status.PodIP, PodReady(p), p.DeletionTimestamp != nil, rev, restarts, waiting)
	}
	if o, ok := e.Store.Get("StatefulSet", e.Cluster); ok {
		sts := o.(*appsv1.StatefulSet)
		partition := int32(0)
		if ru := sts.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.Partition != nil {
			partition = *ru.Partition
		}
		fmt.Fprintf(&b, "statefulset replicas=%d partition=%d status=%+v\n", *sts.Spec.Replicas, partition, sts.Status)
	}
	fmt.Fprintf(&b, "etcd %+v\n", e.Monitor.View())
	return b.String()
}

// MoveLeader hands leadership to pod's member, as `etcdctl move-leader` does: the request
// goes to the current leader. A person or another tool may do this at any time.
func (e *Env) MoveLeader(pod string) error {
	v := e.Monitor.View()
	var to uint64
	for _, m := range v.Members {
		if m.Name == pod && !m.IsLearner {
			to = m.ID
		}
	}
	if to == 0 || v.Leader == "" {
		return fmt.Errorf("moving leadership to %s: no such voter or no leader in %+v", pod, v)
	}
	if v.Leader == pod {
		return nil
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.ClientURL(v.Leader)}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	e.logf("operator action: move leadership from %s to %s", v.Leader, pod)
	if _, err := cli.MoveLeader(ctx, to); err != nil {
		return fmt.Errorf("moving leadership from %s to %s: %w", v.Leader, pod, err)
	}
	return nil
}
