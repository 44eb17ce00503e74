package controlplane

import (
	"context"
	"fmt"
	"slices"
	"strings"
	gosync "sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/harness"
)

// invariants checks, while a cluster's scenarios run, what the end-to-end tier's monitor checks
// after every sync (test/README.md), from what the real API server and etcd itself say:
//
//   - at most one of the cluster's Jobs in flight (neither Complete nor Failed), at every
//     change of its Jobs: a watch delivers them in the API server's order, so two in flight
//     are seen together even for a moment;
//   - at most one learner, every 50ms, from the members' own etcd servers
//     (harness.APINode.View: the membership of the member that applied the most);
//   - no voter removed unless the remaining voters that are up have quorum: before a remove
//     Job's pod runs its etcd call;
//   - the StatefulSet never below a voter: at every change of the StatefulSet and every 50ms;
//   - no quorum lost: every 50ms, a quorum of the voters runs, but while a step takes it
//     away on purpose (allowQuorumLoss: the StatefulSet deleted by hand, a teardown);
//   - none of the cluster's Jobs refused by the API server's RBAC: the Roles the planner
//     renders must let its Jobs do all they need.
//
// What it cannot see: a second Job created and deleted between two watch events would be
// folded by the watch (a Job never lives that short); etcd's membership is read every 25ms per
// member, so a learner added and removed within that is not counted.
type invariants struct {
	c    *Cluster
	jobs cache.Indexer
	sets cache.Indexer

	mu         gosync.Mutex
	violations []string
	seen       map[string]bool
	// lossAllowed: a step takes the cluster's quorum away on purpose.
	lossAllowed bool
}

// allowQuorumLoss says whether a step takes the cluster's quorum away on purpose.
func (inv *invariants) allowQuorumLoss(allowed bool) {
	inv.mu.Lock()
	inv.lossAllowed = allowed
	inv.mu.Unlock()
}

// sampleEvery is how often the membership and the StatefulSet are compared.
const sampleEvery = 50 * time.Millisecond

// startInvariants watches c's Jobs and StatefulSet and samples its membership until the test
// ends.
func startInvariants(c *Cluster) *invariants {
	inv := &invariants{c: c, seen: map[string]bool{}}
	ctx, cancel := context.WithCancel(c.Plane.ctx)
	jobs := informers.NewSharedInformerFactoryWithOptions(c.Plane.Client, 0, informers.WithNamespace(c.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sync.LabelCluster + "=" + c.Name }))
	sets := informers.NewSharedInformerFactoryWithOptions(c.Plane.Client, 0, informers.WithNamespace(c.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + c.Name }))
	jobInf, setInf := jobs.Batch().V1().Jobs().Informer(), sets.Apps().V1().StatefulSets().Informer()
	inv.jobs, inv.sets = jobInf.GetIndexer(), setInf.GetIndexer()
	onJob := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { inv.checkJobs() },
		UpdateFunc: func(any, any) { inv.checkJobs() },
	}
	onSet := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { inv.checkStatefulSet(c.Node.View(c.Name)) },
		UpdateFunc: func(any, any) { inv.checkStatefulSet(c.Node.View(c.Name)) },
	}
	if _, err := jobInf.AddEventHandler(onJob); err != nil {
		c.Plane.t.Fatal(err)
	}
	if _, err := setInf.AddEventHandler(onSet); err != nil {
		c.Plane.t.Fatal(err)
	}
	jobs.Start(ctx.Done())
	sets.Start(ctx.Done())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(sampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				inv.sample()
			}
		}
	}()
	c.Plane.t.Cleanup(func() {
		cancel()
		<-done
		jobs.Shutdown()
		sets.Shutdown()
	})
	return inv
}

// violate records a broken invariant once (a sample would otherwise repeat it) with the time.
func (inv *invariants) violate(format string, args ...any) {
	what := fmt.Sprintf("%s/%s: ", inv.c.Namespace, inv.c.Name) + fmt.Sprintf(format, args...)
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if inv.seen[what] {
		return
	}
	inv.seen[what] = true
	inv.violations = append(inv.violations, time.Now().Format("15:04:05.000")+" "+what)
	inv.c.Plane.logf("INVARIANT BROKEN %s", what)
}

// sample compares the membership with the StatefulSet, and counts the learners.
func (inv *invariants) sample() {
	v := inv.c.Node.View(inv.c.Name)
	if len(v.Members) == 0 {
		return
	}
	if v.Learners() > 1 {
		inv.violate("%d learners at once: %+v", v.Learners(), v.Members)
	}
	inv.checkQuorum(v)
	inv.checkStatefulSet(v)
}

// checkQuorum: a quorum of the voters runs, unless a step takes it away on purpose.
func (inv *invariants) checkQuorum(v harness.View) {
	inv.mu.Lock()
	allowed := inv.lossAllowed
	inv.mu.Unlock()
	var down []string
	for _, m := range v.Members {
		if !m.IsLearner && !m.Running {
			down = append(down, m.Name)
		}
	}
	if voters := v.Voters(); !allowed && voters-len(down) < etcdstate.Quorum(voters) {
		inv.violate("quorum lost: %d of %d voters run, down: %s", voters-len(down), voters, strings.Join(down, ", "))
	}
}

// checkJobs: at most one of the cluster's Jobs is in flight.
func (inv *invariants) checkJobs() {
	var running []string
	for _, o := range inv.jobs.List() {
		j := o.(*batchv1.Job)
		if j.DeletionTimestamp == nil && !jobFinished(j) {
			running = append(running, j.Name)
		}
	}
	if len(running) > 1 {
		slices.Sort(running)
		inv.violate("%d Jobs in flight at once: %s", len(running), strings.Join(running, ", "))
	}
}

// jobFinished: the Job is Complete or Failed, as the planner reads it.
func jobFinished(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// checkStatefulSet: the StatefulSet's replicas reach every voter's ordinal.
func (inv *invariants) checkStatefulSet(v harness.View) {
	o, ok, err := inv.sets.GetByKey(inv.c.Namespace + "/" + inv.c.Name)
	if err != nil || !ok {
		return
	}
	sts := o.(*appsv1.StatefulSet)
	if sts.Spec.Replicas == nil || sts.DeletionTimestamp != nil {
		return
	}
	for _, m := range v.Members {
		if ord, ok := sync.Ordinal(inv.c.Name, m.Name); ok && !m.IsLearner && ord >= int(*sts.Spec.Replicas) {
			inv.violate("the StatefulSet has %d replicas (generation %d) while %s is a voter", *sts.Spec.Replicas, sts.Generation, m.Name)
		}
	}
}

// beforeJob checks a remove Job of this cluster before it calls etcd: the voters that remain
// must have quorum among those up.
func (inv *invariants) beforeJob(job string, args []string) {
	if len(args) < 2 || args[1] != "remove" {
		return
	}
	var id, member string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--id="); ok {
			id = strings.TrimPrefix(strings.ToLower(v), "0x")
		}
		if v, ok := strings.CutPrefix(a, "--member="); ok {
			member = v
		}
	}
	if _, ok := sync.Ordinal(inv.c.Name, member); !ok {
		return
	}
	v := inv.c.Node.View(inv.c.Name)
	remaining, up, target := 0, 0, false
	for _, m := range v.Members {
		if fmt.Sprintf("%x", m.ID) == id {
			target = !m.IsLearner
			continue
		}
		if !m.IsLearner {
			remaining++
			if m.Running {
				up++
			}
		}
	}
	if target && up < etcdstate.Quorum(remaining) {
		inv.violate("Job %s removes voter %s (%s) while only %d of the %d remaining voters are up", job, member, id, up, remaining)
	}
}

// jobDone checks a Job pod's end: one of this cluster's Jobs refused by RBAC lacks a
// permission the planner should have given it.
func (inv *invariants) jobDone(job string, err error) {
	if err != nil && strings.HasPrefix(job, inv.c.Name+"-") && strings.Contains(err.Error(), "forbidden") {
		inv.violate("Job %s was refused by the API server: %v", job, err)
	}
}

// since returns the violations after the first n, and how many there are now.
func (inv *invariants) since(n int) ([]string, int) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return slices.Clone(inv.violations[n:]), len(inv.violations)
}

// invariantMarks are how many violations each of the plane's clusters had so far.
func (p *Plane) invariantMarks() map[*Cluster]int {
	p.clustersMu.Lock()
	defer p.clustersMu.Unlock()
	out := map[*Cluster]int{}
	for _, c := range p.clusters {
		_, out[c] = c.inv.since(0)
	}
	return out
}

// reportInvariants fails t with every violation of the plane's clusters since marks.
func (p *Plane) reportInvariants(t *testing.T, marks map[*Cluster]int) {
	p.clustersMu.Lock()
	clusters := slices.Clone(p.clusters)
	p.clustersMu.Unlock()
	for _, c := range clusters {
		broken, _ := c.inv.since(marks[c])
		for _, v := range broken {
			t.Errorf("invariant broken at %s", v)
		}
	}
}

// ownJobPod: a Job pod of the cluster (Job names begin with the cluster's; Beside keeps them
// apart).
func ownJobPod(c *Cluster, p *corev1.Pod) bool {
	return strings.HasPrefix(p.Labels[batchv1.JobNameLabel], c.Name+"-")
}

// ownPodSelector selects the cluster's member pods.
func ownPodSelector(c *Cluster) labels.Selector {
	return labels.SelectorFromSet(labels.Set{sync.LabelCluster: c.Name})
}
