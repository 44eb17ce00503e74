package harness

import (
	"context"
	"errors"
	"fmt"
	gosync "sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ErrBudget is the Eviction API's refusal (429 Too Many Requests): the pod's
// PodDisruptionBudget allows no disruption now, or has changed since the disruption
// controller last counted it. kubectl drain retries it.
var ErrBudget = errors.New("429 Too Many Requests: Cannot evict pod as it would violate the pod's disruption budget")

// Disruptions plays kube-controller-manager's disruption controller and the API server's
// Eviction subresource for the budgets in the store. The controller counts, on every change,
// each budget's healthy pods (selected, Ready, not terminating) against what it requires:
// minAvailable of the selected pods, or the owning StatefulSet's replicas less maxUnavailable;
// it writes disruptionsAllowed with the generation it counted for. An eviction is refused
// while that count is for an older generation or allows nothing, and otherwise takes one
// disruption off the count, lists the pod in disruptedPods and deletes the pod gracefully;
// the controller counts a listed pod unhealthy and drops it from the list once the pod is
// terminating or gone, or after two minutes (its DeletionTimeout). A pod still Pending is evicted
// without asking the budget, and one Running but not Ready only while the budget's healthy
// pods are enough (unhealthyPodEvictionPolicy IfHealthyBudget, the default), as the API does.
type Disruptions struct {
	Store *Store

	// mu makes one count or one eviction at a time, as the API server's optimistic
	// concurrency on the budget's status does.
	mu gosync.Mutex
}

// NewDisruptions returns the controller and API for the store's budgets.
func NewDisruptions(s *Store) *Disruptions { return &Disruptions{Store: s} }

// Run counts on every change until ctx ends.
func (d *Disruptions) Run(ctx context.Context) {
	runOnChange(ctx, d.Store, 200*time.Millisecond, d.countAll)
}

func (d *Disruptions) countAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, o := range d.Store.List("PodDisruptionBudget") {
		pdb := o.(*policyv1.PodDisruptionBudget)
		st, err := d.count(pdb)
		if err != nil {
			continue
		}
		pdb.Status.ObservedGeneration = pdb.Generation
		pdb.Status.DisruptedPods = st.DisruptedPods
		pdb.Status.CurrentHealthy, pdb.Status.DesiredHealthy = st.CurrentHealthy, st.DesiredHealthy
		pdb.Status.ExpectedPods, pdb.Status.DisruptionsAllowed = st.ExpectedPods, st.DisruptionsAllowed
		_ = d.Store.UpdateStatus(pdb)
	}
}

// count is the disruption controller's arithmetic for one budget, on the store as it is.
func (d *Disruptions) count(pdb *policyv1.PodDisruptionBudget) (policyv1.PodDisruptionBudgetStatus, error) {
	var st policyv1.PodDisruptionBudgetStatus
	pods, err := d.selected(pdb)
	if err != nil {
		return st, err
	}
	st.DisruptedPods = stillDisrupted(pdb.Status.DisruptedPods, pods, time.Now())
	for _, p := range pods {
		if _, listed := st.DisruptedPods[p.Name]; !listed && PodReady(p) {
			st.CurrentHealthy++
		}
	}
	switch {
	case pdb.Spec.MaxUnavailable != nil:
		st.ExpectedPods = d.expectedScale(pods)
		mu, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MaxUnavailable, int(st.ExpectedPods), true)
		if err != nil {
			return st, err
		}
		st.DesiredHealthy = max(0, st.ExpectedPods-int32(mu))
	case pdb.Spec.MinAvailable != nil && pdb.Spec.MinAvailable.Type == intstr.Int:
		st.ExpectedPods = int32(len(pods))
		st.DesiredHealthy = pdb.Spec.MinAvailable.IntVal
	case pdb.Spec.MinAvailable != nil:
		st.ExpectedPods = d.expectedScale(pods)
		ma, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MinAvailable, int(st.ExpectedPods), true)
		if err != nil {
			return st, err
		}
		st.DesiredHealthy = int32(ma)
	default:
		return st, fmt.Errorf("budget %s sets neither minAvailable nor maxUnavailable", pdb.Name)
	}
	st.DisruptionsAllowed = max(0, st.CurrentHealthy-st.DesiredHealthy)
	return st, nil
}

// disruptionTimeout is how long the disruption controller waits for an evicted pod to start
// terminating before it counts the pod again (its DeletionTimeout).
const disruptionTimeout = 2 * time.Minute

// stillDisrupted is the controller's disruptedPods after a count: the pods evicted that have
// not started terminating and whose eviction is recent.
func stillDisrupted(listed map[string]metav1.Time, pods []*corev1.Pod, now time.Time) map[string]metav1.Time {
	var out map[string]metav1.Time
	for _, p := range pods {
		at, ok := listed[p.Name]
		if !ok || p.DeletionTimestamp != nil || !at.Add(disruptionTimeout).After(now) {
			continue
		}
		if out == nil {
			out = map[string]metav1.Time{}
		}
		out[p.Name] = at
	}
	return out
}

// selected are the etcd pods the budget's selector matches.
func (d *Disruptions) selected(pdb *policyv1.PodDisruptionBudget) ([]*corev1.Pod, error) {
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil {
		return nil, err
	}
	var out []*corev1.Pod
	for _, o := range d.Store.List("Pod") {
		if p := o.(*corev1.Pod); !isJobPod(p) && sel.Matches(labels.Set(p.Labels)) {
			out = append(out, p)
		}
	}
	return out, nil
}

// expectedScale is the replicas of the StatefulSets owning the pods, as the controller reads
// them through the scale subresource.
func (d *Disruptions) expectedScale(pods []*corev1.Pod) int32 {
	owners := map[string]bool{}
	var n int32
	for _, p := range pods {
		for _, r := range p.OwnerReferences {
			if r.Kind != "StatefulSet" || owners[r.Name] {
				continue
			}
			owners[r.Name] = true
			if o, ok := d.Store.Get("StatefulSet", r.Name); ok && o.(*appsv1.StatefulSet).Spec.Replicas != nil {
				n += *o.(*appsv1.StatefulSet).Spec.Replicas
			}
		}
	}
	return n
}

// Evict is a POST to the pod's eviction subresource: nil once the pod is being deleted, an
// error wrapping ErrBudget when the budget refuses.
func (d *Disruptions) Evict(pod string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	o, ok := d.Store.Get("Pod", pod)
	if !ok {
		return fmt.Errorf("404 Not Found: pod %q", pod)
	}
	p := o.(*corev1.Pod)
	if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodPending {
		d.Store.Delete("Pod", pod)
		return nil
	}
	var budgets []*policyv1.PodDisruptionBudget
	for _, o := range d.Store.List("PodDisruptionBudget") {
		pdb := o.(*policyv1.PodDisruptionBudget)
		if sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err == nil && sel.Matches(labels.Set(p.Labels)) {
			budgets = append(budgets, pdb)
		}
	}
	switch len(budgets) {
	case 0:
		d.Store.Delete("Pod", pod)
		return nil
	case 1:
	default:
		return fmt.Errorf("500 Internal Server Error: pod %s has more than one PodDisruptionBudget", pod)
	}
	pdb := budgets[0]
	if pdb.Status.ObservedGeneration < pdb.Generation {
		return fmt.Errorf("%w: the disruption budget %s is still being processed by the server", ErrBudget, pdb.Name)
	}
	if !PodReady(p) {
		if pdb.Status.CurrentHealthy < pdb.Status.DesiredHealthy {
			return fmt.Errorf("%w: the disruption budget %s needs %d healthy pods and has %d currently (pod %s is not ready)",
				ErrBudget, pdb.Name, pdb.Status.DesiredHealthy, pdb.Status.CurrentHealthy, pod)
		}
		d.Store.Delete("Pod", pod)
		return nil
	}
	if pdb.Status.DisruptionsAllowed <= 0 {
		return fmt.Errorf("%w: the disruption budget %s needs %d healthy pods and has %d currently",
			ErrBudget, pdb.Name, pdb.Status.DesiredHealthy, pdb.Status.CurrentHealthy)
	}
	pdb.Status.DisruptionsAllowed--
	if pdb.Status.DisruptedPods == nil {
		pdb.Status.DisruptedPods = map[string]metav1.Time{}
	}
	pdb.Status.DisruptedPods[pod] = metav1.Now()
	if err := d.Store.UpdateStatus(pdb); err != nil {
		return err
	}
	d.Store.Delete("Pod", pod)
	return nil
}
