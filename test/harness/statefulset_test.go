package harness

import (
	"context"
	"errors"
	"os"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/cmd/etcdops-member/membertool"
)

// The rolling update recreates outdated pods at or above the partition one at a time, from
// the highest ordinal down, each only once the one above is Ready on the new revision.
func TestStatefulSetRollsOnePodAtATimeAbovePartition(t *testing.T) {
	s := NewStore("ns")
	c := NewStatefulSets(s, t.TempDir())
	three, one := int32(3), int32(1)
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "e"}, Spec: appsv1.StatefulSetSpec{
		Replicas:            &three,
		PodManagementPolicy: appsv1.ParallelPodManagement,
		UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: appsv1.RollingUpdateStatefulSetStrategyType,
			RollingUpdate: &appsv1.RollingUpdateStatefulSetStrategy{Partition: &one}},
		Template:             corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd", Image: "v1"}}}},
		VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"}}},
	}}
	if err := s.Create(sts); err != nil {
		t.Fatal(err)
	}
	c.reconcileAll()
	if n := len(s.List("Pod")); n != 3 {
		t.Fatalf("Parallel created %d pods, want 3 at once", n)
	}
	if c.VolumeDir("data-e-2") == "" {
		t.Fatal("no volume for data-e-2")
	}
	readyAll(t, s)

	o, _ := s.Get("StatefulSet", "e")
	sts = o.(*appsv1.StatefulSet)
	sts.Spec.Template.Spec.Containers[0].Image = "v2"
	if err := s.Update(sts); err != nil {
		t.Fatal(err)
	}
	c.reconcileAll()
	assertDeleting(t, s, "e-2")
	s.Remove("Pod", "e-2")
	c.reconcileAll()
	assertDeleting(t, s) // e-2 is back on the new revision but not Ready: e-1 waits
	readyAll(t, s)
	c.reconcileAll()
	assertDeleting(t, s, "e-1")
	s.Remove("Pod", "e-1")
	c.reconcileAll()
	readyAll(t, s)
	c.reconcileAll()
	assertDeleting(t, s) // e-0 is below the partition and keeps the old revision

	// Scaling in deletes the surplus pod and, with whenScaled Delete, its claim once it is gone.
	o, _ = s.Get("StatefulSet", "e")
	sts = o.(*appsv1.StatefulSet)
	two := int32(2)
	sts.Spec.Replicas = &two
	sts.Spec.PersistentVolumeClaimRetentionPolicy = &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{
		WhenScaled: appsv1.DeletePersistentVolumeClaimRetentionPolicyType, WhenDeleted: appsv1.RetainPersistentVolumeClaimRetentionPolicyType}
	if err := s.Update(sts); err != nil {
		t.Fatal(err)
	}
	c.reconcileAll()
	assertDeleting(t, s, "e-2")
	s.Remove("Pod", "e-2")
	c.reconcileAll()
	if _, ok := s.Get("PersistentVolumeClaim", "data-e-2"); ok {
		t.Error("the claim of a scaled-away ordinal survived whenScaled: Delete")
	}
	if _, ok := s.Get("PersistentVolumeClaim", "data-e-1"); !ok {
		t.Error("the claim of a kept ordinal was deleted")
	}
}

// Deleting a StatefulSet deletes its claims with whenDeleted: Delete, also when the policy was
// set after the claims were created, and keeps them with Retain.
func TestStatefulSetDeletedTakesClaimsPerPolicy(t *testing.T) {
	s := NewStore("ns")
	c := NewStatefulSets(s, t.TempDir())
	one := int32(1)
	for _, name := range []string{"keep", "drop"} {
		if err := s.Create(&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: appsv1.StatefulSetSpec{
			Replicas:             &one,
			Template:             corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd", Image: "v1"}}}},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"}}},
			PersistentVolumeClaimRetentionPolicy: &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{
				WhenScaled: appsv1.DeletePersistentVolumeClaimRetentionPolicyType, WhenDeleted: appsv1.RetainPersistentVolumeClaimRetentionPolicyType},
		}}); err != nil {
			t.Fatal(err)
		}
	}
	c.reconcileAll()
	o, _ := s.Get("StatefulSet", "drop")
	sts := o.(*appsv1.StatefulSet)
	sts.Spec.PersistentVolumeClaimRetentionPolicy.WhenDeleted = appsv1.DeletePersistentVolumeClaimRetentionPolicyType
	if err := s.Update(sts); err != nil {
		t.Fatal(err)
	}
	c.reconcileAll()
	dropDir := c.VolumeDir("data-drop-0")
	if dropDir == "" || c.VolumeDir("data-keep-0") == "" {
		t.Fatal("no volumes for the claims")
	}
	s.Delete("StatefulSet", "keep")
	s.Delete("StatefulSet", "drop")
	c.reconcileAll()
	assertDeleting(t, s, "keep-0", "drop-0")
	if _, ok := s.Get("PersistentVolumeClaim", "data-drop-0"); ok {
		t.Error("the claim survived its StatefulSet's deletion with whenDeleted: Delete")
	}
	if _, err := os.Stat(dropDir); !os.IsNotExist(err) {
		t.Errorf("the deleted claim's volume is still there: %v", err)
	}
	if _, ok := s.Get("PersistentVolumeClaim", "data-keep-0"); !ok || c.VolumeDir("data-keep-0") == "" {
		t.Error("the claim of a StatefulSet with whenDeleted: Retain was deleted with it")
	}
}

func readyAll(t *testing.T, s *Store) {
	t.Helper()
	for _, o := range s.List("Pod") {
		p := o.(*corev1.Pod)
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		if err := s.UpdateStatus(p); err != nil {
			t.Fatal(err)
		}
	}
}

// assertDeleting checks that exactly the named pods are marked for deletion.
func assertDeleting(t *testing.T, s *Store, names ...string) {
	t.Helper()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	for _, o := range s.List("Pod") {
		if deleting := o.GetDeletionTimestamp() != nil; deleting != want[o.GetName()] {
			t.Errorf("pod %s deleting=%v, want %v", o.GetName(), deleting, want[o.GetName()])
		}
	}
}

// TestStatefulSetAdoptsAClaimCreatedBefore: a claim an expand-claim Job created before the
// member's pod (unbound, at the size it asked for) is the one the StatefulSet's pod gets,
// provisioned at that size, and not made again from the template.
func TestStatefulSetAdoptsAClaimCreatedBefore(t *testing.T) {
	ctx := context.Background()
	s := NewStore("ns")
	c := NewStatefulSets(s, t.TempDir())
	acct := storeClaims{store: s, account: "etcd-claims"}
	_ = s.Create(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "etcd-claims"}})
	_ = s.Create(&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "etcd-claims"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"get", "patch"}}}})
	_ = s.Create(&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "etcd-claims"}, RoleRef: rbacv1.RoleRef{Kind: "Role", Name: "etcd-claims"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "etcd-claims", Namespace: "ns"}}})
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data-etcd-0", Namespace: "ns"}}
	pvc.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}
	if err := acct.Create(ctx, pvc); !errors.Is(err, membertool.ErrClaimRefused) {
		t.Fatalf("create without the verb: %v, want refused", err)
	}
	o, _ := s.Get("Role", "etcd-claims")
	role := o.(*rbacv1.Role)
	role.Rules[0].Verbs = append(role.Rules[0].Verbs, "create")
	_ = s.Update(role)
	if err := acct.Create(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	if err := acct.Create(ctx, pvc); !errors.Is(err, membertool.ErrClaimExists) {
		t.Fatalf("create again: %v, want exists", err)
	}
	one := int32(1)
	tmpl := corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data"}}
	tmpl.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	if err := s.Create(&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "etcd"}, Spec: appsv1.StatefulSetSpec{
		Replicas:             &one,
		Template:             corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd", Image: "v1"}}}},
		VolumeClaimTemplates: []corev1.PersistentVolumeClaim{tmpl},
	}}); err != nil {
		t.Fatal(err)
	}
	c.reconcileAll()
	o, _ = s.Get("PersistentVolumeClaim", "data-etcd-0")
	got := o.(*corev1.PersistentVolumeClaim)
	if q := got.Status.Capacity[corev1.ResourceStorage]; got.Status.Phase != corev1.ClaimBound || q.String() != "2Gi" || c.VolumeDir("data-etcd-0") == "" {
		t.Fatalf("claim %s with %s, volume %q; want it bound at the 2Gi asked", got.Status.Phase, q.String(), c.VolumeDir("data-etcd-0"))
	}
}
