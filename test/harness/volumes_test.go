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
	o, _ := s.Get("PersistentVolumeClaim", "data-etcd-0")
	pvc := o.(*corev1.PersistentVolumeClaim)
	pvc.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("2Gi")
	_ = s.Update(pvc)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go (&Resizer{Store: s, Delay: 300 * time.Millisecond, TimeScale: 1}).Run(ctx)
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
