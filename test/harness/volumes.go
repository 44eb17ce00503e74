package harness

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/cmd/etcdops-member/membertool"
)

// Volume expansion, the parts that cannot run here: the external resizer and the kubelet's
// file system resize, played by Resizer, and the API server's authorisation of a Job pod's
// claim patches, played by storeClaims.

// DefaultStorageClass is the class every claim without one gets, as the DefaultStorageClass
// admission plugin gives it; NewEnv creates it allowing expansion.
const DefaultStorageClass = "standard"

// Resizer plays the CSI external resizer and the kubelet's online file system resize: a claim
// that asks for more than it has is marked Resizing, and Delay (scaled) later has the
// capacity asked for. Drivers that need the pod restarted for the file system
// (FileSystemResizePending) are not modelled.
type Resizer struct {
	Store     *Store
	Delay     time.Duration
	TimeScale float64

	started map[string]time.Time // claim → when it was marked Resizing
}

// Run reconciles claims on every change until ctx ends.
func (r *Resizer) Run(ctx context.Context) {
	r.started = map[string]time.Time{}
	runOnChange(ctx, r.Store, 100*time.Millisecond, r.reconcile)
}

func (r *Resizer) reconcile() {
	for _, o := range r.Store.List("PersistentVolumeClaim") {
		pvc := o.(*corev1.PersistentVolumeClaim)
		want := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
		have := pvc.Status.Capacity[corev1.ResourceStorage]
		if want.Cmp(have) <= 0 {
			delete(r.started, pvc.Name)
			continue
		}
		at, ok := r.started[pvc.Name]
		switch {
		case !ok:
			r.started[pvc.Name] = time.Now()
			pvc.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: corev1.PersistentVolumeClaimResizing, Status: corev1.ConditionTrue,
				LastTransitionTime: metav1.NewTime(time.Now().Truncate(time.Second))}}
		case time.Since(at) >= max(time.Duration(float64(r.Delay)*r.TimeScale), 10*time.Millisecond):
			pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: want}
			pvc.Status.Conditions = nil
			delete(r.started, pvc.Name)
		default:
			continue
		}
		_ = r.Store.UpdateStatus(pvc)
	}
}

// SetExpansion creates or updates the default StorageClass, allowing expansion or not.
func SetExpansion(s *Store, allow bool) {
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: DefaultStorageClass,
		Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
		Provisioner: "harness.etcdops.dev/hostpath", AllowVolumeExpansion: &allow}
	if err := s.Update(sc); err != nil {
		_ = s.Create(sc)
	}
}

// storeClaims is membertool.Claims against the store, as a Job pod running as account sees
// the API server: allowed a verb on claims only by a RoleBinding of that account to a Role
// granting it, and refused an expansion the claim's class does not allow (the
// PersistentVolumeClaimResize admission plugin).
type storeClaims struct {
	store   *Store
	account string
}

func (c storeClaims) allowed(verb string) error {
	for _, o := range c.store.List("RoleBinding") {
		rb := o.(*rbacv1.RoleBinding)
		if !slices.ContainsFunc(rb.Subjects, func(s rbacv1.Subject) bool { return s.Kind == "ServiceAccount" && s.Name == c.account }) {
			continue
		}
		if r, ok := c.store.Get("Role", rb.RoleRef.Name); ok && rb.RoleRef.Kind == "Role" {
			for _, rule := range r.(*rbacv1.Role).Rules {
				if slices.Contains(rule.Resources, "persistentvolumeclaims") && slices.Contains(rule.Verbs, verb) && slices.Contains(rule.APIGroups, "") {
					return nil
				}
			}
		}
	}
	if _, ok := c.store.Get("ServiceAccount", c.account); c.account == "" || !ok {
		return fmt.Errorf("%w: the pod has no service account token", membertool.ErrClaimRefused)
	}
	return fmt.Errorf("%w: User \"system:serviceaccount:%s:%s\" cannot %s resource \"persistentvolumeclaims\"", membertool.ErrClaimRefused, c.store.Namespace, c.account, verb)
}

func (c storeClaims) claim(namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	o, ok := c.store.Get("PersistentVolumeClaim", name)
	if !ok || namespace != c.store.Namespace {
		return nil, fmt.Errorf("%w: persistentvolumeclaims %q not found", membertool.ErrClaimNotFound, name)
	}
	return o.(*corev1.PersistentVolumeClaim), nil
}

func (c storeClaims) Requested(_ context.Context, namespace, name string) (resource.Quantity, error) {
	if err := c.allowed("get"); err != nil {
		return resource.Quantity{}, err
	}
	pvc, err := c.claim(namespace, name)
	if err != nil {
		return resource.Quantity{}, err
	}
	return pvc.Spec.Resources.Requests[corev1.ResourceStorage], nil
}

func (c storeClaims) Request(_ context.Context, namespace, name string, size resource.Quantity) error {
	if err := c.allowed("patch"); err != nil {
		return err
	}
	pvc, err := c.claim(namespace, name)
	if err != nil {
		return err
	}
	class := ""
	if pvc.Spec.StorageClassName != nil {
		class = *pvc.Spec.StorageClassName
	}
	var allow *bool
	if sc, ok := c.store.Get("StorageClass", class); ok {
		allow = sc.(*storagev1.StorageClass).AllowVolumeExpansion
	}
	if allow == nil || !*allow {
		return fmt.Errorf("%w: persistentvolumeclaims %q is forbidden: only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize", membertool.ErrClaimRefused, name)
	}
	if have := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; size.Cmp(have) < 0 {
		return fmt.Errorf("%w: spec.resources.requests.storage: Forbidden: field can not be less than previous value", membertool.ErrClaimRefused)
	}
	pvc.Spec.Resources.Requests[corev1.ResourceStorage] = size
	return c.store.Update(pvc)
}

// claimsKey carries a Job pod's view of the claims API to the member tool run in-process.
type claimsKey struct{}

func withClaims(ctx context.Context, c membertool.Claims) context.Context {
	return context.WithValue(ctx, claimsKey{}, c)
}

func claimsOf(ctx context.Context) membertool.Claims {
	c, _ := ctx.Value(claimsKey{}).(membertool.Claims)
	return c
}
