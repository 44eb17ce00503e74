package harness

import (
	"context"
	"fmt"
	"path"
	"sort"
	gosync "sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/backup"
)

// Jobs plays the Job controller and the kubelet for Job pods: each attempt is a pod whose
// one container runs the member tool in-process with the Job's arguments; the Job completes
// on the first success and fails once its failures exceed backoffLimit. Retries wait the
// controller's back-off (10s doubling), scaled; ttlSecondsAfterFinished is honoured.
type Jobs struct {
	Store     *Store
	Tools     Tools
	TimeScale float64
	// OnRun sees every attempt when it starts and when it ends, with the tool's output
	// (err is nil on success).
	OnRun func(job string, args []string, started bool, out string, err error)
	// AfterJob runs once an attempt's outcome is in the Job's status.
	AfterJob func(job string)
	// Mounts, when set, materialises a pod's volumes and returns mount path → directory.
	Mounts func(p *corev1.Pod) (map[string]string, error)
	// EtcdBinary, when set, is the etcd binary that stands for a Job container's image: a
	// restore drill runs the etcd pods' image, and its --etcd names that image's binary.
	EtcdBinary func(image string) (string, error)
	// Logf hears of what the controller could not do as asked.
	Logf func(format string, args ...any)

	mu gosync.Mutex
	// drillSeam, when set, is passed to every drill (backup.WithDrillSeam): a test's way to
	// write into a restored copy.
	drillSeam func(ctx context.Context, restored *clientv3.Client) error
	running   map[string]bool // Job name → an attempt is running
	attempts  map[string]int
	retryAt   map[string]time.Time
	finished  map[string]time.Time
	seq       int
}

// NewJobs returns the Job controller.
func NewJobs(s *Store, tools Tools, timeScale float64) *Jobs {
	return &Jobs{Store: s, Tools: tools, TimeScale: timeScale, running: map[string]bool{}, attempts: map[string]int{},
		retryAt: map[string]time.Time{}, finished: map[string]time.Time{}}
}

// SetDrillSeam has every drill from now on call f with a client of its restored copy before
// it compares (backup.WithDrillSeam); nil removes it.
func (c *Jobs) SetDrillSeam(f func(ctx context.Context, restored *clientv3.Client) error) {
	c.mu.Lock()
	c.drillSeam = f
	c.mu.Unlock()
}

func (c *Jobs) logf(format string, args ...any) {
	if c.Logf != nil {
		c.Logf(format, args...)
	}
}

// Running lists the Jobs with an attempt running.
func (c *Jobs) Running() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for name, r := range c.running {
		if r {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Run reconciles Jobs on every change until ctx ends.
func (c *Jobs) Run(ctx context.Context) {
	runOnChange(ctx, c.Store, 100*time.Millisecond, func() { c.reconcile(ctx) })
}

func (c *Jobs) scaled(d time.Duration) time.Duration {
	return max(time.Duration(float64(d)*c.TimeScale), 10*time.Millisecond)
}

func jobDone(j *batchv1.Job) (bool, batchv1.JobConditionType) {
	for _, cond := range j.Status.Conditions {
		if (cond.Type == batchv1.JobComplete || cond.Type == batchv1.JobFailed) && cond.Status == corev1.ConditionTrue {
			return true, cond.Type
		}
	}
	return false, ""
}

func (c *Jobs) reconcile(ctx context.Context) {
	for _, o := range c.Store.List("Job") {
		j := o.(*batchv1.Job)
		if done, _ := jobDone(j); done {
			c.expire(j)
			continue
		}
		c.consider(ctx, j.Name)
	}
}

// consider starts an attempt of Job name when none runs and its back-off is over. It reads
// the Job again under the lock an attempt's end takes: a listing made before an attempt
// completed would otherwise run a completed Job a second time, which no Job controller does.
func (c *Jobs) consider(ctx context.Context, name string) {
	c.mu.Lock()
	o, ok := c.Store.Get("Job", name)
	start := ok && !c.running[name] && !time.Now().Before(c.retryAt[name])
	if start {
		done, _ := jobDone(o.(*batchv1.Job))
		start = !done
	}
	if start {
		c.running[name] = true
		c.seq++
	}
	seq := c.seq
	c.mu.Unlock()
	if start {
		go c.attempt(ctx, o.(*batchv1.Job), seq)
	}
}

// expire deletes a finished Job once its TTL has passed, as the TTL controller does.
func (c *Jobs) expire(j *batchv1.Job) {
	if j.Spec.TTLSecondsAfterFinished == nil {
		return
	}
	c.mu.Lock()
	at, ok := c.finished[j.Name]
	c.mu.Unlock()
	if ok && time.Since(at) >= c.scaled(time.Duration(*j.Spec.TTLSecondsAfterFinished)*time.Second) {
		c.Store.Delete("Job", j.Name)
		c.mu.Lock()
		delete(c.finished, j.Name)
		delete(c.attempts, j.Name)
		c.mu.Unlock()
	}
}

func (c *Jobs) attempt(ctx context.Context, j *batchv1.Job, seq int) {
	podName := fmt.Sprintf("%s-%05d", j.Name, seq)
	pod := &corev1.Pod{ObjectMeta: *j.Spec.Template.ObjectMeta.DeepCopy(), Spec: *j.Spec.Template.Spec.DeepCopy()}
	pod.Name = podName
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[batchv1.JobNameLabel] = j.Name
	pod.Labels[batchv1.ControllerUidLabel] = string(j.UID)
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: j.Name, UID: j.UID, Controller: ptr(true)}}
	pod.Status.Phase = corev1.PodRunning
	_ = c.Store.Create(pod)
	if o, ok := c.Store.Get("Job", j.Name); ok {
		running := o.(*batchv1.Job)
		running.Status.Active = 1
		if running.Status.StartTime == nil {
			now := metav1.NewTime(time.Now().Truncate(time.Second))
			running.Status.StartTime = &now
		}
		_ = c.Store.UpdateStatus(running)
	}

	args, err := jobArgs(j)
	if c.OnRun != nil {
		c.OnRun(j.Name, args, true, "", nil)
	}
	var out, logFile string
	if err == nil {
		args, logFile, err = c.jobPodArgs(pod, args)
	}
	if err == nil {
		// The pod reaches the API server only with its service account's token.
		account := ""
		if t := pod.Spec.AutomountServiceAccountToken; t != nil && *t {
			account = pod.Spec.ServiceAccountName
		}
		jctx := withClaims(ctx, storeClaims{store: c.Store, account: account})
		c.mu.Lock()
		if seam := c.drillSeam; seam != nil && args[1] == "drill" {
			jctx = backup.WithDrillSeam(jctx, seam)
		}
		c.mu.Unlock()
		out, err = c.Tools.Member(jctx, args[1:])
	}
	if ctx.Err() != nil {
		return
	}
	if c.OnRun != nil {
		c.OnRun(j.Name, args, false, out, err)
	}
	phase := corev1.PodSucceeded
	if err != nil {
		phase = corev1.PodFailed
	}
	if o, ok := c.Store.Get("Pod", podName); ok {
		p := o.(*corev1.Pod)
		p.Status.Phase = phase
		if err != nil {
			p.Status.Message = err.Error()
		}
		terminated(p, logFile, err)
		_ = c.Store.UpdateStatus(p)
	}
	c.finishAttempt(j.Name, err)
	if c.AfterJob != nil {
		c.AfterJob(j.Name)
	}
}

func (c *Jobs) finishAttempt(name string, runErr error) {
	o, ok := c.Store.Get("Job", name)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running[name] = false
	if !ok {
		return
	}
	j := o.(*batchv1.Job)
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	backoffLimit := int32(6)
	if j.Spec.BackoffLimit != nil {
		backoffLimit = *j.Spec.BackoffLimit
	}
	if runErr == nil {
		j.Status.Succeeded++
		j.Status.CompletionTime = &now
		j.Status.Conditions = append(j.Status.Conditions,
			batchv1.JobCondition{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastTransitionTime: now},
			batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: now})
		c.finished[name] = time.Now()
	} else {
		j.Status.Failed++
		c.attempts[name]++
		if j.Status.Failed > backoffLimit {
			j.Status.Conditions = append(j.Status.Conditions,
				batchv1.JobCondition{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", LastTransitionTime: now},
				batchv1.JobCondition{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", Message: "Job has reached the specified backoff limit", LastTransitionTime: now})
			c.finished[name] = time.Now()
		} else {
			d := 10 * time.Second
			for i := 1; i < c.attempts[name]; i++ {
				d *= 2
			}
			c.retryAt[name] = time.Now().Add(c.scaled(min(d, 6*time.Minute)))
		}
	}
	j.Status.Active = 0
	_ = c.Store.UpdateStatus(j)
}

// jobArgs is the Job's one container's command line, which must be the member tool's.
func jobArgs(j *batchv1.Job) ([]string, error) {
	cs := j.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		return nil, fmt.Errorf("job %s: want one container, got %d", j.Name, len(cs))
	}
	argv := append(append([]string(nil), cs[0].Command...), cs[0].Args...)
	if len(argv) < 2 || path.Base(argv[0]) != toolBinary {
		return argv, fmt.Errorf("job %s: the harness runs only %s, got %q", j.Name, toolBinary, argv)
	}
	return argv, nil
}
