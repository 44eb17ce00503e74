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
	"k8s.io/apimachinery/pkg/types"

	"etcdops.dev/etcdops/cmd/etcdops-member/membertool"
)

// Volume expansion, the parts that cannot run here: the external resizer and the kubelet's
// file system resize, played by Resizer, and the API server's authorisation of a Job pod's
// claim patches, played by storeClaims.

// DefaultStorageClass is the class every claim without one gets, as the DefaultStorageClass
// admission plugin gives it; NewEnv creates it allowing expansion.
const DefaultStorageClass = "standard"

// Resizer plays the CSI external resizer and the kubelet's file system resize: a claim that
// asks for more than it has is marked Resizing, and Delay (scaled) later the volume has grown.
// With a class that grows file systems online the claim then has the capacity asked for. With
// one whose driver grows them only when the node mounts the volume again (SetOfflineResize),
// the claim is FileSystemResizePending until a pod other than the one that had it mounted
// runs on it, as the kubelet resizes the file system while it mounts the volume for a new pod.
type Resizer struct {
	Store     *Store
	Delay     time.Duration
	TimeScale float64

	started map[string]time.Time // claim → when it was marked Resizing
	// mounted: claim → UID of the pod that had it mounted when it became
	// FileSystemResizePending ("" when none did).
	mounted map[string]types.UID
}

// Run reconciles claims on every change until ctx ends.
func (r *Resizer) Run(ctx context.Context) {
	r.started, r.mounted = map[string]time.Time{}, map[string]types.UID{}
	runOnChange(ctx, r.Store, 100*time.Millisecond, r.reconcile)
}

func (r *Resizer) reconcile() {
	for _, o := range r.Store.List("PersistentVolumeClaim") {
		pvc := o.(*corev1.PersistentVolumeClaim)
		want := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
		have := pvc.Status.Capacity[corev1.ResourceStorage]
		if want.Cmp(have) <= 0 {
			delete(r.started, pvc.Name)
			delete(r.mounted, pvc.Name)
			continue
		}
		at, ok := r.started[pvc.Name]
		mountedBy, pending := r.mounted[pvc.Name]
		now := metav1.NewTime(time.Now().Truncate(time.Second))
		switch {
		case !ok:
			r.started[pvc.Name] = time.Now()
			pvc.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: corev1.PersistentVolumeClaimResizing, Status: corev1.ConditionTrue, LastTransitionTime: now}}
		case time.Since(at) < max(time.Duration(float64(r.Delay)*r.TimeScale), 10*time.Millisecond):
			continue
		case pending:
			if uid, running := r.podOn(pvc.Name); !running || uid == mountedBy {
				continue
			}
			r.grown(pvc, want)
		case offlineResize(r.Store, pvc):
			uid, _ := r.podOn(pvc.Name)
			r.mounted[pvc.Name] = uid
			pvc.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: corev1.PersistentVolumeClaimFileSystemResizePending, Status: corev1.ConditionTrue, LastTransitionTime: now,
				Message: "Waiting for user to (re-)start a pod to finish file system resize of volume on node."}}
		default:
			r.grown(pvc, want)
		}
		_ = r.Store.UpdateStatus(pvc)
	}
}

func (r *Resizer) grown(pvc *corev1.PersistentVolumeClaim, want resource.Quantity) {
	pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: want}
	pvc.Status.Conditions = nil
	delete(r.started, pvc.Name)
	delete(r.mounted, pvc.Name)
}

// podOn is the UID of the pod, not terminating, that mounts the claim, and whether it runs.
func (r *Resizer) podOn(claim string) (types.UID, bool) {
	for _, o := range r.Store.List("Pod") {
		p := o.(*corev1.Pod)
		if p.DeletionTimestamp != nil {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim {
				return p.UID, p.Status.Phase == corev1.PodRunning
			}
		}
	}
	return "", false
}

// offlineResizeParameter, "true" among a StorageClass's parameters, makes its claims' file
// systems grow only when the volume is mounted again (Resizer).
const offlineResizeParameter = "harness.etcdops.dev/offline-resize"

func offlineResize(s *Store, pvc *corev1.PersistentVolumeClaim) bool {
	if pvc.Spec.StorageClassName == nil {
		return false
	}
	o, ok := s.Get("StorageClass", *pvc.Spec.StorageClassName)
	return ok && o.(*storagev1.StorageClass).Parameters[offlineResizeParameter] == "true"
}

// SetOfflineResize makes the default StorageClass's driver grow file systems only when the
// volume is mounted again, or online.
func SetOfflineResize(s *Store, offline bool) {
	o, ok := s.Get("StorageClass", DefaultStorageClass)
	if !ok {
		return
	}
	sc := o.(*storagev1.StorageClass)
	sc.Parameters = nil
	if offline {
		sc.Parameters = map[string]string{offlineResizeParameter: "true"}
	}
	_ = s.Update(sc)
}

// SetExpansion creates or updates the default StorageClass, allowing expansion or not; its
// parameters stay.
func SetExpansion(s *Store, allow bool) {
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: DefaultStorageClass,
		Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
		Provisioner: "harness.etcdops.dev/hostpath", AllowVolumeExpansion: &allow}
	if o, ok := s.Get("StorageClass", DefaultStorageClass); ok {
		sc.Parameters = o.(*storagev1.StorageClass).Parameters
	}
	if err := s.Update(sc); err != nil {
		_ = s.Create(sc)
	}
}

// storeClaims is membertool.Claims against the store, as a Job pod running as account sees
// the API server: allowed a verb on a claim or a pod only by a RoleBinding of that account to
// a Role granting it (for that object's name, when the rule lists names), and refused an
// expansion the claim's class does not allow (the PersistentVolumeClaimResize admission plugin).
type storeClaims struct {
	store   *Store
	account string
}

func (c storeClaims) allowed(resource, verb, name string) error {
	for _, o := range c.store.List("RoleBinding") {
		rb := o.(*rbacv1.RoleBinding)
		if !slices.ContainsFunc(rb.Subjects, func(s rbacv1.Subject) bool { return s.Kind == "ServiceAccount" && s.Name == c.account }) {
			continue
		}
		if r, ok := c.store.Get("Role", rb.RoleRef.Name); ok && rb.RoleRef.Kind == "Role" {
			for _, rule := range r.(*rbacv1.Role).Rules {
				if slices.Contains(rule.Resources, resource) && slices.Contains(rule.Verbs, verb) && slices.Contains(rule.APIGroups, "") &&
					(len(rule.ResourceNames) == 0 || slices.Contains(rule.ResourceNames, name)) {
					return nil
				}
			}
		}
	}
	if _, ok := c.store.Get("ServiceAccount", c.account); c.account == "" || !ok {
		return fmt.Errorf("%w: the pod has no service account token", membertool.ErrClaimRefused)
	}
	return fmt.Errorf("%w: %s %q is forbidden: User \"system:serviceaccount:%s:%s\" cannot %s resource %q", membertool.ErrClaimRefused, resource, name, c.store.Namespace, c.account, verb, resource)
}

func (c storeClaims) claim(namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	o, ok := c.store.Get("PersistentVolumeClaim", name)
	if !ok || namespace != c.store.Namespace {
		return nil, fmt.Errorf("%w: persistentvolumeclaims %q not found", membertool.ErrClaimNotFound, name)
	}
	return o.(*corev1.PersistentVolumeClaim), nil
}

func (c storeClaims) Requested(_ context.Context, namespace, name string) (resource.Quantity, error) {
	if err := c.allowed("persistentvolumeclaims", "get", name); err != nil {
		return resource.Quantity{}, err
	}
	pvc, err := c.claim(namespace, name)
	if err != nil {
		return resource.Quantity{}, err
	}
	return pvc.Spec.Resources.Requests[corev1.ResourceStorage], nil
}

func (c storeClaims) Request(_ context.Context, namespace, name string, size resource.Quantity) error {
	if err := c.allowed("persistentvolumeclaims", "patch", name); err != nil {
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

// Create creates the claim, unbound: the StatefulSet controller's provisioning binds it when
// it creates the pod that uses it, as a class of volumeBindingMode WaitForFirstConsumer does.
func (c storeClaims) Create(_ context.Context, claim *corev1.PersistentVolumeClaim) error {
	// The API server authorizes a create without the object's name: a rule that lists names
	// does not grant it.
	if err := c.allowed("persistentvolumeclaims", "create", ""); err != nil {
		return err
	}
	if claim.Namespace != c.store.Namespace {
		return fmt.Errorf("%w: namespace %s", membertool.ErrClaimRefused, claim.Namespace)
	}
	if _, ok := c.store.Get("PersistentVolumeClaim", claim.Name); ok {
		return fmt.Errorf("%w: persistentvolumeclaims %q already exists", membertool.ErrClaimExists, claim.Name)
	}
	pvc := claim.DeepCopy()
	if pvc.Spec.StorageClassName == nil {
		pvc.Spec.StorageClassName = ptr(DefaultStorageClass)
	}
	pvc.Status.Phase = corev1.ClaimPending
	return c.store.Create(pvc)
}

// DeletePod deletes the pod under the UID precondition, as the API server does.
func (c storeClaims) DeletePod(_ context.Context, namespace, name string, uid types.UID) error {
	if err := c.allowed("pods", "delete", name); err != nil {
		return err
	}
	if namespace != c.store.Namespace || !c.store.DeleteUID("Pod", name, uid) {
		return fmt.Errorf("%w: pods %q with uid %s not found", membertool.ErrPodGone, name, uid)
	}
	return nil
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

// Password reads a credential Secret's password, as the auth Job's pod may (membertool.Secrets).
func (c storeClaims) Password(_ context.Context, namespace, name string) (string, error) {
	if err := c.allowed("secrets", "get", name); err != nil {
		return "", err
	}
	o, ok := c.store.Get("Secret", name)
	if !ok || namespace != c.store.Namespace {
		return "", fmt.Errorf("%w: secrets %q not found", membertool.ErrSecretNotFound, name)
	}
	pw := o.(*corev1.Secret).Data["password"]
	if len(pw) == 0 {
		return "", fmt.Errorf("secret %q has no password", name)
	}
	return string(pw), nil
}

// CreateCredential creates a credential Secret, as the auth Job's pod may.
func (c storeClaims) CreateCredential(_ context.Context, namespace, name, user, password string, owner metav1.OwnerReference) error {
	if err := c.allowed("secrets", "create", ""); err != nil {
		return err
	}
	if namespace != c.store.Namespace {
		return fmt.Errorf("%w: namespace %s", membertool.ErrClaimRefused, namespace)
	}
	if _, ok := c.store.Get("Secret", name); ok {
		return fmt.Errorf("%w: secrets %q already exists", membertool.ErrSecretExists, name)
	}
	return c.store.Create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, OwnerReferences: []metav1.OwnerReference{owner}},
		Type: corev1.SecretTypeBasicAuth, Data: map[string][]byte{"username": []byte(user), "password": []byte(password)}})
}
