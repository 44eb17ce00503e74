package harness

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/cmd/etcdops-member/membertool"
)

func newClaim(t *testing.T, s *Store) {
	t.Helper()
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data-etcd-0"}}
	pvc.Spec.StorageClassName = ptr(DefaultStorageClass)
	pvc.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	if err := s.Create(pvc); err != nil {
		t.Fatal(err)
	}
	pvc.Status.Phase = corev1.ClaimBound
	pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	if err := s.UpdateStatus(pvc); err != nil {
		t.Fatal(err)
	}
}

func requested(s *Store) string {
	o, _ := s.Get("PersistentVolumeClaim", "data-etcd-0")
	q := o.(*corev1.PersistentVolumeClaim).Spec.Resources.Requests[corev1.ResourceStorage]
	return q.String()
}

// TestStoreClaimsAuthorise: a Job pod patches a claim only with a token whose account a
// RoleBinding ties to a Role granting the verb on claims, and only when the claim's class
// allows expansion and the size grows, as the API server decides.
func TestStoreClaimsAuthorise(t *testing.T) {
	ctx := context.Background()
	s := NewStore("ns")
	SetExpansion(s, true)
	newClaim(t, s)
	two := resource.MustParse("2Gi")
	if err := (storeClaims{store: s}).Request(ctx, "ns", "data-etcd-0", two); !errors.Is(err, membertool.ErrClaimRefused) {
		t.Errorf("without a token: %v, want refused", err)
	}
	acct := storeClaims{store: s, account: "etcd-claims"}
	_ = s.Create(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "etcd-claims"}})
	_ = s.Create(&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "etcd-claims"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"get"}}}})
	_ = s.Create(&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "etcd-claims"}, RoleRef: rbacv1.RoleRef{Kind: "Role", Name: "etcd-claims"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "etcd-claims", Namespace: "ns"}}})
	if q, err := acct.Requested(ctx, "ns", "data-etcd-0"); err != nil || q.String() != "1Gi" {
		t.Errorf("get with the Role: %v %v, want 1Gi", q.String(), err)
	}
	if err := acct.Request(ctx, "ns", "data-etcd-0", two); !errors.Is(err, membertool.ErrClaimRefused) {
		t.Errorf("patch without the verb: %v, want refused", err)
	}
	o, _ := s.Get("Role", "etcd-claims")
	role := o.(*rbacv1.Role)
	role.Rules[0].Verbs = append(role.Rules[0].Verbs, "patch")
	_ = s.Update(role)
	SetExpansion(s, false)
	if err := acct.Request(ctx, "ns", "data-etcd-0", two); !errors.Is(err, membertool.ErrClaimRefused) || requested(s) != "1Gi" {
		t.Errorf("a class without expansion: %v, claim %s; want refused, 1Gi", err, requested(s))
	}
	SetExpansion(s, true)
	if err := acct.Request(ctx, "ns", "data-etcd-0", two); err != nil || requested(s) != "2Gi" {
		t.Errorf("allowed: %v, claim %s; want 2Gi", err, requested(s))
	}
	if err := acct.Request(ctx, "ns", "data-etcd-0", resource.MustParse("1Gi")); !errors.Is(err, membertool.ErrClaimRefused) || requested(s) != "2Gi" {
		t.Errorf("a smaller size: %v, claim %s; want refused, 2Gi", err, requested(s))
	}
	if _, err := acct.Requested(ctx, "ns", "data-etcd-9"); !errors.Is(err, membertool.ErrClaimNotFound) {
		t.Errorf("a missing claim: %v, want not found", err)
	}
}

// TestResizerGrowsAClaim: a claim that asks for more is marked Resizing, then has the capacity
// after the delay.
func TestResizerGrowsAClaim(t *testing.T) {
	s := NewStore("ns")
	newClaim(t, s)
	growWithResizer(t, s, 300*time.Millisecond)
	sawResizing := false
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		o, _ := s.Get("PersistentVolumeClaim", "data-etcd-0")
		pvc := o.(*corev1.PersistentVolumeClaim)
		for _, c := range pvc.Status.Conditions {
			sawResizing = sawResizing || c.Type == corev1.PersistentVolumeClaimResizing
		}
		if q := pvc.Status.Capacity[corev1.ResourceStorage]; q.String() == "2Gi" {
			if !sawResizing || len(pvc.Status.Conditions) != 0 {
				t.Errorf("grown; saw Resizing %v, conditions now %v; want Resizing first, none after", sawResizing, pvc.Status.Conditions)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("the claim did not grow in 5s")
}

// TestStoreDeletePod: a Job pod deletes a pod only with a Role granting delete on pods (on
// that pod's name, when the rule lists names), and only the pod of the UID it names (the API server's precondition); another pod of that name,
// or none, is ErrPodGone and stays.
func TestStoreDeletePod(t *testing.T) {
	ctx := context.Background()
	s := NewStore("ns")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "etcd-0"}}
	if err := s.Create(pod); err != nil {
		t.Fatal(err)
	}
	acct := storeClaims{store: s, account: "etcd-claims"}
	_ = s.Create(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "etcd-claims"}})
	_ = s.Create(&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "etcd-claims"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"get", "patch", "delete"}}}})
	_ = s.Create(&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "etcd-claims"}, RoleRef: rbacv1.RoleRef{Kind: "Role", Name: "etcd-claims"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "etcd-claims", Namespace: "ns"}}})
	deleting := func() bool {
		o, _ := s.Get("Pod", "etcd-0")
		return o.GetDeletionTimestamp() != nil
	}
	if err := acct.DeletePod(ctx, "ns", "etcd-0", pod.UID); !errors.Is(err, membertool.ErrClaimRefused) || deleting() {
		t.Errorf("without delete on pods: %v, deleting %v; want refused, kept", err, deleting())
	}
	o, _ := s.Get("Role", "etcd-claims")
	role := o.(*rbacv1.Role)
	role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"delete"}, ResourceNames: []string{"etcd-1"}})
	_ = s.Update(role)
	if err := acct.DeletePod(ctx, "ns", "etcd-0", pod.UID); !errors.Is(err, membertool.ErrClaimRefused) || deleting() {
		t.Errorf("delete on pod etcd-1 only: %v, deleting %v; want refused, kept", err, deleting())
	}
	role.Rules[1].ResourceNames = append(role.Rules[1].ResourceNames, "etcd-0")
	_ = s.Update(role)
	if err := acct.DeletePod(ctx, "ns", "etcd-0", "another-uid"); !errors.Is(err, membertool.ErrPodGone) || deleting() {
		t.Errorf("another UID: %v, deleting %v; want ErrPodGone, kept", err, deleting())
	}
	if err := acct.DeletePod(ctx, "ns", "etcd-0", pod.UID); err != nil || !deleting() {
		t.Errorf("its UID: %v, deleting %v; want deleted", err, deleting())
	}
	if err := acct.DeletePod(ctx, "ns", "etcd-1", pod.UID); !errors.Is(err, membertool.ErrPodGone) {
		t.Errorf("no such pod: %v, want ErrPodGone", err)
	}
	if err := acct.DeletePod(ctx, "ns", "etcd-9", pod.UID); !errors.Is(err, membertool.ErrClaimRefused) {
		t.Errorf("a pod the Role does not name: %v, want refused, as RBAC refuses before it looks", err)
	}
}

// TestResizerOffline: with a class whose driver grows file systems only on a remount, the
// grown claim is FileSystemResizePending, its capacity unchanged, while the pod that had it
// mounted runs; once another pod runs on it, it has the capacity and no condition.
func TestResizerOffline(t *testing.T) {
	s := NewStore("ns")
	SetExpansion(s, true)
	SetOfflineResize(s, true)
	newClaim(t, s)
	mounting := func() *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "etcd-0"}}
		p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-etcd-0"}}}}
		if err := s.Create(p); err != nil {
			t.Fatal(err)
		}
		p.Status.Phase = corev1.PodRunning
		_ = s.UpdateStatus(p)
		return p
	}
	mounting()
	growWithResizer(t, s, 100*time.Millisecond)
	claim := func() (string, []corev1.PersistentVolumeClaimCondition) {
		o, _ := s.Get("PersistentVolumeClaim", "data-etcd-0")
		pvc := o.(*corev1.PersistentVolumeClaim)
		q := pvc.Status.Capacity[corev1.ResourceStorage]
		return q.String(), pvc.Status.Conditions
	}
	pending := func() bool {
		_, conds := claim()
		return len(conds) == 1 && conds[0].Type == corev1.PersistentVolumeClaimFileSystemResizePending
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && !pending() {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if c, conds := claim(); !pending() || c != "1Gi" {
		t.Fatalf("capacity %s, conditions %v; want 1Gi and FileSystemResizePending while the pod runs", c, conds)
	}
	s.Delete("Pod", "etcd-0")
	s.Remove("Pod", "etcd-0")
	mounting()
	for time.Now().Before(deadline) {
		if c, conds := claim(); c == "2Gi" {
			if len(conds) != 0 {
				t.Errorf("grown, with conditions %v left", conds)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	c, conds := claim()
	t.Fatalf("after the pod was recreated: capacity %s, conditions %v; want 2Gi", c, conds)
}

// growWithResizer asks claim data-etcd-0 for 2Gi and runs a resizer of delay until the test
// ends.
func growWithResizer(t *testing.T, s *Store, delay time.Duration) {
	t.Helper()
	o, _ := s.Get("PersistentVolumeClaim", "data-etcd-0")
	pvc := o.(*corev1.PersistentVolumeClaim)
	pvc.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("2Gi")
	_ = s.Update(pvc)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go (&Resizer{Store: s, Delay: delay, TimeScale: 1}).Run(ctx)
}
