package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	gosync "sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
)

// CSIDriver plays, against a real API server, the parts of a CSI driver that cannot run here
// (the control-plane tier): its external provisioner, its external resizer and the kubelet's
// node expansion. The PersistentVolume binder and the volume expansion controller of
// kube-controller-manager are real: the binder hands a claim of the driver's StorageClass over
// by the annotation volume.kubernetes.io/storage-provisioner, and the expansion controller
// leaves a CSI volume's growth to the driver's resizer, which finds its claims by the
// volume's driver, as the external resizer does.
//
//   - Provisioning: each pending claim handed to the driver gets a PersistentVolume of the
//     size asked for (a directory under Root), bound to it by claimRef; the binder binds it.
//     A released volume of reclaim policy Delete is deleted with its directory.
//   - Expansion: a bound claim that asks for more than its volume has is marked Resizing;
//     Delay later the volume has the new capacity and the claim is FileSystemResizePending
//     (allocatedResourceStatuses NodeResizePending), as the external resizer leaves it. Then
//     the kubelet grows the file system: at once when Offline is false, or when a pod other
//     than the one that had the volume mounted runs on it (a driver that grows file systems
//     only on a remount); the claim then has the capacity, without conditions.
type CSIDriver struct {
	Name    string
	Root    string
	Offline bool
	Delay   time.Duration
	Client  kubernetes.Interface
	Logf    func(format string, args ...any)

	claims  listersv1.PersistentVolumeClaimLister
	volumes listersv1.PersistentVolumeLister
	pods    listersv1.PodLister
	kick    chan struct{}

	mu      gosync.Mutex
	resizes map[types.UID]*resize
}

// resize is a claim's expansion under way.
type resize struct {
	since time.Time
	// pendingOn is the pod that had the volume mounted when the file system resize became
	// pending ("" when none did); set once the resizer's part is done.
	pendingOn types.UID
	pending   bool
}

// ProvisionerAnnotation is how kube-controller-manager hands a claim to an external
// provisioner.
const ProvisionerAnnotation = "volume.kubernetes.io/storage-provisioner"

// Start runs the driver until ctx ends; the returned function waits for it to stop.
func (d *CSIDriver) Start(ctx context.Context) (func(), error) {
	if d.Logf == nil {
		d.Logf = func(string, ...any) {}
	}
	if err := os.MkdirAll(d.Root, 0o755); err != nil {
		return nil, err
	}
	d.kick = make(chan struct{}, 1)
	d.resizes = map[types.UID]*resize{}
	f := informers.NewSharedInformerFactory(d.Client, 0)
	d.claims = f.Core().V1().PersistentVolumeClaims().Lister()
	d.volumes = f.Core().V1().PersistentVolumes().Lister()
	d.pods = f.Core().V1().Pods().Lister()
	h := informerHandler{func() {
		select {
		case d.kick <- struct{}{}:
		default:
		}
	}}
	for _, add := range []func() error{
		func() error {
			_, err := f.Core().V1().PersistentVolumeClaims().Informer().AddEventHandler(h)
			return err
		},
		func() error { _, err := f.Core().V1().PersistentVolumes().Informer().AddEventHandler(h); return err },
		func() error { _, err := f.Core().V1().Pods().Informer().AddEventHandler(h); return err },
	} {
		if err := add(); err != nil {
			return nil, err
		}
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("CSI driver %s: the %v informer did not sync", d.Name, typ)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			d.reconcile(ctx)
			select {
			case <-ctx.Done():
			case <-d.kick:
			case <-tick.C:
			}
		}
	}()
	return func() { <-done; f.Shutdown() }, nil
}

func (d *CSIDriver) reconcile(ctx context.Context) {
	claims, err := d.claims.List(labels.Everything())
	if err != nil {
		return
	}
	for _, c := range claims {
		switch {
		case c.Status.Phase == corev1.ClaimPending && c.Annotations[ProvisionerAnnotation] == d.Name && c.Spec.VolumeName == "":
			d.provision(ctx, c)
		case c.Status.Phase == corev1.ClaimBound && d.serves(c.Spec.VolumeName):
			d.expand(ctx, c)
		}
	}
	pvs, err := d.volumes.List(labels.Everything())
	if err != nil {
		return
	}
	for _, pv := range pvs {
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == d.Name && pv.Status.Phase == corev1.VolumeReleased &&
			pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete {
			os.RemoveAll(filepath.Join(d.Root, pv.Name))
			err := d.Client.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pv.UID}})
			if err != nil && !apierrors.IsNotFound(err) {
				d.Logf("CSI %s: deleting volume %s: %v", d.Name, pv.Name, err)
			}
		}
	}
}

// serves reports whether the volume is one of the driver's.
func (d *CSIDriver) serves(volume string) bool {
	pv, err := d.volumes.Get(volume)
	return err == nil && pv.Spec.CSI != nil && pv.Spec.CSI.Driver == d.Name
}

// provision creates the claim's volume, as the external provisioner does.
func (d *CSIDriver) provision(ctx context.Context, c *corev1.PersistentVolumeClaim) {
	name := "pvc-" + string(c.UID)
	if _, err := d.volumes.Get(name); err == nil {
		return
	}
	class := ""
	if c.Spec.StorageClassName != nil {
		class = *c.Spec.StorageClassName
	}
	policy := corev1.PersistentVolumeReclaimDelete
	if sc, err := d.Client.StorageV1().StorageClasses().Get(ctx, class, metav1.GetOptions{}); err == nil && sc.ReclaimPolicy != nil {
		policy = *sc.ReclaimPolicy
	}
	if err := os.MkdirAll(filepath.Join(d.Root, name), 0o755); err != nil {
		d.Logf("CSI %s: %v", d.Name, err)
		return
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": d.Name}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: c.Spec.Resources.Requests[corev1.ResourceStorage]},
			AccessModes:                   c.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: policy,
			StorageClassName:              class,
			VolumeMode:                    c.Spec.VolumeMode,
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: c.Namespace, Name: c.Name, UID: c.UID},
			PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: d.Name, VolumeHandle: name}},
		},
	}
	if _, err := d.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			d.Logf("CSI %s: provisioning %s/%s: %v", d.Name, c.Namespace, c.Name, err)
		}
		return
	}
	d.Logf("CSI %s: provisioned %s for %s/%s", d.Name, name, c.Namespace, c.Name)
}

// expand plays the external resizer and then the kubelet's file system resize for a claim
// that asks for more than it has.
func (d *CSIDriver) expand(ctx context.Context, c *corev1.PersistentVolumeClaim) {
	want := c.Spec.Resources.Requests[corev1.ResourceStorage]
	have := c.Status.Capacity[corev1.ResourceStorage]
	d.mu.Lock()
	r, ok := d.resizes[c.UID]
	d.mu.Unlock()
	if want.Cmp(have) <= 0 {
		if ok {
			d.mu.Lock()
			delete(d.resizes, c.UID)
			d.mu.Unlock()
		}
		return
	}
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	next := c.DeepCopy()
	switch {
	case !ok:
		r = &resize{since: time.Now()}
		d.mu.Lock()
		d.resizes[c.UID] = r
		d.mu.Unlock()
		next.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: corev1.PersistentVolumeClaimResizing, Status: corev1.ConditionTrue, LastTransitionTime: now}}
		next.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{corev1.ResourceStorage: corev1.PersistentVolumeClaimControllerResizeInProgress}
	case time.Since(r.since) < d.Delay:
		return
	case !r.pending:
		if err := d.growVolume(ctx, c.Spec.VolumeName, want); err != nil {
			d.Logf("CSI %s: growing volume %s: %v", d.Name, c.Spec.VolumeName, err)
			return
		}
		r.pendingOn, _ = d.podOn(c)
		r.pending = true
		next.Status.AllocatedResources = corev1.ResourceList{corev1.ResourceStorage: want}
		next.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{corev1.ResourceStorage: corev1.PersistentVolumeClaimNodeResizePending}
		next.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: corev1.PersistentVolumeClaimFileSystemResizePending, Status: corev1.ConditionTrue, LastTransitionTime: now,
			Message: "Waiting for user to (re-)start a pod to finish file system resize of volume on node."}}
	default:
		uid, running := d.podOn(c)
		if !running || d.Offline && uid == r.pendingOn {
			return
		}
		next.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: want}
		next.Status.Conditions = nil
		next.Status.AllocatedResourceStatuses = nil
	}
	if _, err := d.Client.CoreV1().PersistentVolumeClaims(c.Namespace).UpdateStatus(ctx, next, metav1.UpdateOptions{}); err != nil {
		if !apierrors.IsConflict(err) {
			d.Logf("CSI %s: claim %s/%s status: %v", d.Name, c.Namespace, c.Name, err)
		}
		return
	}
	if next.Status.Capacity[corev1.ResourceStorage].Equal(want) {
		d.Logf("CSI %s: %s/%s grown to %s", d.Name, c.Namespace, c.Name, want.String())
	}
}

// growVolume sets the volume's capacity, the controller side of the expansion.
func (d *CSIDriver) growVolume(ctx context.Context, name string, size resource.Quantity) error {
	pv, err := d.Client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if have := pv.Spec.Capacity[corev1.ResourceStorage]; have.Cmp(size) >= 0 {
		return nil
	}
	pv.Spec.Capacity = corev1.ResourceList{corev1.ResourceStorage: size}
	_, err = d.Client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{})
	return err
}

// podOn is the pod, not terminating, that mounts the claim, and whether it runs.
func (d *CSIDriver) podOn(c *corev1.PersistentVolumeClaim) (types.UID, bool) {
	pods, err := d.pods.Pods(c.Namespace).List(labels.Everything())
	if err != nil {
		return "", false
	}
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == c.Name {
				return p.UID, p.Status.Phase == corev1.PodRunning
			}
		}
	}
	return "", false
}
