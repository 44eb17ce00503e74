package harness

import (
	"errors"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The Eviction API against a budget of maxUnavailable 1 over a 3-pod StatefulSet: one
// eviction is allowed, a second is refused while the first pod is down, and evictions are
// refused while the budget says maxUnavailable 0 (the hook's own step) and while a changed
// budget is not yet counted. A Pending pod is evicted without the budget.
func TestEvictionHonoursTheBudget(t *testing.T) {
	s := NewStore("ns")
	c := NewStatefulSets(s, t.TempDir())
	d := NewDisruptions(s)
	three := int32(3)
	sel := map[string]string{"app": "etcd"}
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "e"}, Spec: appsv1.StatefulSetSpec{
		Replicas: &three, PodManagementPolicy: appsv1.ParallelPodManagement,
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd", Image: "v1"}}}},
	}}
	one := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "e"},
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &one, Selector: &metav1.LabelSelector{MatchLabels: sel}}}
	for _, o := range []Object{sts, pdb} {
		if err := s.Create(o); err != nil {
			t.Fatal(err)
		}
	}
	c.reconcileAll()
	readyAll(t, s)
	refused := func(pod string) {
		t.Helper()
		if err := d.Evict(pod); !errors.Is(err, ErrBudget) {
			t.Fatalf("evicting %s: %v, want refused by the budget", pod, err)
		}
		assertNotDeleting(t, s, pod)
	}
	refused("e-0") // the controller has not counted the budget yet
	d.countAll()
	budget := func() policyv1.PodDisruptionBudgetStatus {
		o, _ := s.Get("PodDisruptionBudget", "e")
		return o.(*policyv1.PodDisruptionBudget).Status
	}
	if st := budget(); st.DisruptionsAllowed != 1 || st.CurrentHealthy != 3 || st.DesiredHealthy != 2 || st.ExpectedPods != 3 {
		t.Fatalf("budget status %+v, want 1 allowed of 3 healthy, 2 desired, 3 expected", st)
	}
	if err := d.Evict("e-0"); err != nil {
		t.Fatalf("evicting e-0 with one disruption allowed: %v", err)
	}
	assertDeleting(t, s, "e-0")
	if st := budget(); len(st.DisruptedPods) != 1 || st.DisruptedPods["e-0"].Time.IsZero() {
		t.Fatalf("budget status %+v after evicting e-0, want e-0 listed in disruptedPods", st)
	}
	refused("e-1") // the eviction took the one disruption, before any recount
	d.countAll()
	if st := budget(); len(st.DisruptedPods) != 0 {
		t.Fatalf("budget status %+v once e-0 is terminating, want disruptedPods empty", st)
	}
	refused("e-1") // e-0 is terminating: two healthy, two desired

	// e-0 is gone and back, Ready: one disruption allowed again.
	s.Remove("Pod", "e-0")
	c.reconcileAll()
	readyAll(t, s)
	d.countAll()
	if st := budget(); st.DisruptionsAllowed != 1 {
		t.Fatalf("budget status %+v after e-0 came back, want 1 allowed", st)
	}

	// A step of the hook's takes a member down: maxUnavailable 0.
	o, _ := s.Get("PodDisruptionBudget", "e")
	pdb = o.(*policyv1.PodDisruptionBudget)
	zero := intstr.FromInt32(0)
	pdb.Spec.MaxUnavailable = &zero
	if err := s.Update(pdb); err != nil {
		t.Fatal(err)
	}
	refused("e-2") // generation moved on, the count is for the old one
	d.countAll()
	refused("e-2")

	// A Pending pod is evicted whatever the budget says.
	o, _ = s.Get("Pod", "e-1")
	p := o.(*corev1.Pod)
	p.Status = corev1.PodStatus{Phase: corev1.PodPending}
	if err := s.UpdateStatus(p); err != nil {
		t.Fatal(err)
	}
	d.countAll()
	if err := d.Evict("e-1"); err != nil {
		t.Fatalf("evicting the Pending e-1: %v", err)
	}
	assertDeleting(t, s, "e-1")
}

// A budget by minAvailable counts the selected pods, and a Running pod that is not Ready is
// evicted only while the budget has its healthy pods (IfHealthyBudget).
func TestEvictionMinAvailableAndUnreadyPods(t *testing.T) {
	s := NewStore("ns")
	d := NewDisruptions(s)
	sel := map[string]string{"app": "etcd"}
	for _, name := range []string{"a", "b", "c"} {
		if err := s.Create(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: sel},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd"}}}}); err != nil {
			t.Fatal(err)
		}
	}
	readyAll(t, s)
	two := intstr.FromInt32(2)
	if err := s.Create(&policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "b"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &two, Selector: &metav1.LabelSelector{MatchLabels: sel}}}); err != nil {
		t.Fatal(err)
	}
	notReady := func(name string) {
		o, _ := s.Get("Pod", name)
		p := o.(*corev1.Pod)
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
		if err := s.UpdateStatus(p); err != nil {
			t.Fatal(err)
		}
	}
	notReady("a")
	d.countAll()
	// Two healthy, two desired: the unready a may go, the healthy b may not.
	if err := d.Evict("b"); !errors.Is(err, ErrBudget) {
		t.Fatalf("evicting b: %v, want refused", err)
	}
	if err := d.Evict("a"); err != nil {
		t.Fatalf("evicting the unready a with the budget healthy: %v", err)
	}
	notReady("b")
	d.countAll()
	if err := d.Evict("c"); !errors.Is(err, ErrBudget) {
		t.Fatalf("evicting c: %v, want refused", err)
	}
	if err := d.Evict("b"); !errors.Is(err, ErrBudget) {
		t.Fatalf("evicting the unready b with the budget short: %v, want refused", err)
	}
	assertDeleting(t, s, "a")
}

func assertNotDeleting(t *testing.T, s *Store, name string) {
	t.Helper()
	if o, ok := s.Get("Pod", name); !ok || o.GetDeletionTimestamp() != nil {
		t.Fatalf("pod %s deleted after a refused eviction", name)
	}
}

// The disruption controller counts a pod listed in disruptedPods unhealthy until it
// terminates, and forgets an eviction whose pod never started terminating after two minutes.
func TestStillDisrupted(t *testing.T) {
	now := time.Now()
	pod := func(name string, terminating bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if terminating {
			p.DeletionTimestamp = &metav1.Time{Time: now}
		}
		return p
	}
	listed := map[string]metav1.Time{
		"recent":      metav1.NewTime(now.Add(-time.Minute)),
		"old":         metav1.NewTime(now.Add(-3 * time.Minute)),
		"terminating": metav1.NewTime(now.Add(-time.Second)),
		"gone":        metav1.NewTime(now.Add(-time.Second)),
	}
	got := stillDisrupted(listed, []*corev1.Pod{pod("recent", false), pod("old", false), pod("terminating", true), pod("other", false)}, now)
	if len(got) != 1 || got["recent"].Time.IsZero() {
		t.Errorf("still disrupted: %v, want only the recent eviction of a pod not yet terminating", got)
	}
}
