package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"strconv"
	"strings"
	gosync "sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// StatefulSets plays kube-controller-manager's StatefulSet controller for what the product
// relies on: stable ordinals, Parallel pod management, RollingUpdate with a partition
// (outdated pods at or above the partition are recreated one at a time, highest ordinal
// first, each only after the one above it is Running and Ready), one PVC per ordinal and
// claim template, and the PVC retention policy. OrderedReady, maxUnavailable and
// minReadySeconds are not modelled: the operator does not use them.
type StatefulSets struct {
	Store *Store
	// VolumeRoot holds one directory per PVC: the persistent volume.
	VolumeRoot string

	mu        gosync.Mutex
	templates map[string]corev1.PodTemplateSpec // ControllerRevisions, by revision name
	volumes   map[string]string                 // PVC name → directory
}

// NewStatefulSets returns the controller; volumes live under root.
func NewStatefulSets(s *Store, root string) *StatefulSets {
	return &StatefulSets{Store: s, VolumeRoot: root, templates: map[string]corev1.PodTemplateSpec{}, volumes: map[string]string{}}
}

// Run reconciles on every change until ctx ends.
func (c *StatefulSets) Run(ctx context.Context) {
	runOnChange(ctx, c.Store, 200*time.Millisecond, c.reconcileAll)
}

// runOnChange calls f after every store change, and at least every period.
func runOnChange(ctx context.Context, s *Store, period time.Duration, f func()) {
	for ctx.Err() == nil {
		changed := s.Changed()
		f()
		select {
		case <-ctx.Done():
		case <-changed:
		case <-time.After(period):
		}
	}
}

// VolumeDir returns the directory of a PVC, "" when there is none.
func (c *StatefulSets) VolumeDir(pvc string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.volumes[pvc]
}

func (c *StatefulSets) reconcileAll() {
	live := map[string]bool{}
	for _, o := range c.Store.List("StatefulSet") {
		sts := o.(*appsv1.StatefulSet)
		live[sts.Name] = true
		c.reconcile(sts)
	}
	c.collectOrphans(live)
}

// revision names a pod template the way ControllerRevisions do: <sts>-<hash>.
func revision(sts *appsv1.StatefulSet) string {
	b, _ := json.Marshal(sts.Spec.Template)
	h := fnv.New32a()
	h.Write(b)
	return fmt.Sprintf("%s-%x", sts.Name, h.Sum32())
}

func podOrdinal(sts, pod string) (int, bool) {
	rest, ok := strings.CutPrefix(pod, sts+"-")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n >= 0 && strconv.Itoa(n) == rest
}

func (c *StatefulSets) ownedPods(sts *appsv1.StatefulSet) map[int]*corev1.Pod {
	pods := map[int]*corev1.Pod{}
	for _, o := range c.Store.List("Pod") {
		p := o.(*corev1.Pod)
		if !ownedBy(p, sts.UID) {
			continue
		}
		if ord, ok := podOrdinal(sts.Name, p.Name); ok {
			pods[ord] = p
		}
	}
	return pods
}

func ownedBy(o metav1.Object, uid types.UID) bool {
	for _, r := range o.GetOwnerReferences() {
		if r.UID == uid {
			return true
		}
	}
	return false
}

// PodReady: the pod runs, is not terminating, and its Ready condition is true, as the
// disruption controller counts a healthy pod.
func PodReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
		return false
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (c *StatefulSets) reconcile(sts *appsv1.StatefulSet) {
	update := revision(sts)
	c.mu.Lock()
	c.templates[update] = *sts.Spec.Template.DeepCopy()
	c.mu.Unlock()
	current := sts.Status.CurrentRevision
	if current == "" {
		current = update
	}
	replicas := 1
	if sts.Spec.Replicas != nil {
		replicas = int(*sts.Spec.Replicas)
	}
	partition := 0
	if ru := sts.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.Partition != nil {
		partition = int(*ru.Partition)
	}
	pods := c.ownedPods(sts)

	// Parallel: every missing ordinal is created at once, every surplus one deleted at once.
	for ord := 0; ord < replicas; ord++ {
		p, ok := pods[ord]
		if ok && p.Status.Phase == corev1.PodFailed && p.DeletionTimestamp == nil {
			c.Store.Delete("Pod", p.Name)
			continue
		}
		if ok {
			continue
		}
		rev := update
		if ord < partition {
			rev = current
		}
		c.createPod(sts, ord, rev)
	}
	for ord, p := range pods {
		if ord >= replicas && p.DeletionTimestamp == nil {
			c.Store.Delete("Pod", p.Name)
		}
	}
	c.retainOrDeleteScaledClaims(sts, replicas, pods)
	c.markClaimsDeletedWithSet(sts)

	// Rolling update: walk down from the highest ordinal to the partition.
	if sts.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType {
		for ord := replicas - 1; ord >= partition; ord-- {
			p, ok := pods[ord]
			if !ok {
				break
			}
			if p.Labels[appsv1.ControllerRevisionHashLabelKey] != update && p.DeletionTimestamp == nil {
				c.Store.Delete("Pod", p.Name)
				break
			}
			if !PodReady(p) {
				break
			}
		}
	}
	c.writeStatus(sts, replicas, current, update)
}

// retainOrDeleteScaledClaims applies whenScaled as Kubernetes does, through owner
// references: the claim of a pod at or above replicas is owned by that pod while the policy
// says Delete (and released while it says Retain), and goes once the pod is gone if it was
// owned then, whatever the policy says by that time.
func (c *StatefulSets) retainOrDeleteScaledClaims(sts *appsv1.StatefulSet, replicas int, pods map[int]*corev1.Pod) {
	pol := sts.Spec.PersistentVolumeClaimRetentionPolicy
	del := pol != nil && pol.WhenScaled == appsv1.DeletePersistentVolumeClaimRetentionPolicyType
	for _, o := range c.Store.List("PersistentVolumeClaim") {
		pvc := o.(*corev1.PersistentVolumeClaim)
		for _, t := range sts.Spec.VolumeClaimTemplates {
			ord, ok := podOrdinal(t.Name+"-"+sts.Name, pvc.Name)
			if !ok || ord < replicas {
				continue
			}
			owned := pvc.Annotations[deleteWithPod] == "true"
			if _, podLeft := pods[ord]; !podLeft {
				if owned {
					c.deleteClaim(pvc.Name)
				}
				continue
			}
			if owned == del {
				continue
			}
			if del {
				metav1.SetMetaDataAnnotation(&pvc.ObjectMeta, deleteWithPod, "true")
			} else {
				delete(pvc.Annotations, deleteWithPod)
			}
			_ = c.Store.Update(pvc)
		}
	}
}

func (c *StatefulSets) deleteClaim(name string) {
	c.Store.Delete("PersistentVolumeClaim", name)
	c.mu.Lock()
	dir := c.volumes[name]
	delete(c.volumes, name)
	c.mu.Unlock()
	if dir != "" {
		os.RemoveAll(dir)
	}
}

// markClaimsDeletedWithSet keeps the set's claims marked for deletion with it exactly while
// whenDeleted is Delete: the controller moves the claims' owner references to the set, or off
// it, whenever the policy changes, not only when it creates them.
func (c *StatefulSets) markClaimsDeletedWithSet(sts *appsv1.StatefulSet) {
	pol := sts.Spec.PersistentVolumeClaimRetentionPolicy
	del := pol != nil && pol.WhenDeleted == appsv1.DeletePersistentVolumeClaimRetentionPolicyType
	for _, o := range c.Store.List("PersistentVolumeClaim") {
		pvc := o.(*corev1.PersistentVolumeClaim)
		if pvc.Labels[stsLabel] != sts.Name || (pvc.Annotations[deleteWithSet] == "true") == del {
			continue
		}
		if del {
			metav1.SetMetaDataAnnotation(&pvc.ObjectMeta, deleteWithSet, "true")
		} else {
			delete(pvc.Annotations, deleteWithSet)
		}
		_ = c.Store.Update(pvc)
	}
}

// collectOrphans is the garbage collector's part once a StatefulSet is gone: its pods are
// deleted, and its claims too when whenDeleted is Delete (claims of unknown policy stay).
func (c *StatefulSets) collectOrphans(live map[string]bool) {
	for _, o := range c.Store.List("Pod") {
		p := o.(*corev1.Pod)
		if owner := p.Labels[stsLabel]; owner != "" && !live[owner] && p.DeletionTimestamp == nil {
			c.Store.Delete("Pod", p.Name)
		}
	}
	for _, o := range c.Store.List("PersistentVolumeClaim") {
		pvc := o.(*corev1.PersistentVolumeClaim)
		if owner := pvc.Labels[stsLabel]; owner != "" && !live[owner] && pvc.Annotations[deleteWithSet] == "true" {
			c.deleteClaim(pvc.Name)
		}
	}
}

// Labels and annotations the harness's StatefulSet controller keeps on what it creates.
const (
	stsLabel      = "harness.etcdops.dev/statefulset"
	deleteWithSet = "harness.etcdops.dev/delete-with-statefulset"
	// deleteWithPod marks a scaled-away claim owned by its pod (whenScaled: Delete).
	deleteWithPod = "harness.etcdops.dev/delete-with-pod"
)

func (c *StatefulSets) createPod(sts *appsv1.StatefulSet, ord int, rev string) {
	c.mu.Lock()
	tmpl, ok := c.templates[rev]
	c.mu.Unlock()
	if !ok {
		tmpl = sts.Spec.Template
		rev = revision(sts)
	}
	name := fmt.Sprintf("%s-%d", sts.Name, ord)
	for _, t := range sts.Spec.VolumeClaimTemplates {
		claim := fmt.Sprintf("%s-%s", t.Name, name)
		if o, exists := c.Store.Get("PersistentVolumeClaim", claim); !exists {
			c.createClaim(sts, t, claim)
		} else if c.VolumeDir(claim) == "" {
			c.bind(o.(*corev1.PersistentVolumeClaim))
		}
		tmpl.Spec.Volumes = append(tmpl.Spec.Volumes, corev1.Volume{Name: t.Name,
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}})
	}
	p := &corev1.Pod{ObjectMeta: *tmpl.ObjectMeta.DeepCopy(), Spec: *tmpl.Spec.DeepCopy()}
	p.Name = name
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	p.Labels[appsv1.ControllerRevisionHashLabelKey] = rev
	p.Labels[appsv1.StatefulSetPodNameLabel] = name
	p.Labels[appsv1.PodIndexLabel] = strconv.Itoa(ord)
	p.Labels[stsLabel] = sts.Name
	p.Spec.Hostname = name
	p.Spec.Subdomain = sts.Spec.ServiceName
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts.Name, UID: sts.UID, Controller: ptr(true)}}
	p.Status.Phase = corev1.PodPending
	_ = c.Store.Create(p)
}

func (c *StatefulSets) createClaim(sts *appsv1.StatefulSet, t corev1.PersistentVolumeClaim, name string) {
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{stsLabel: sts.Name}}, Spec: *t.Spec.DeepCopy()}
	for k, v := range t.Labels {
		pvc.Labels[k] = v
	}
	// The StatefulSet controller labels claims with the set's selector.
	if sts.Spec.Selector != nil {
		for k, v := range sts.Spec.Selector.MatchLabels {
			pvc.Labels[k] = v
		}
	}
	if pvc.Spec.StorageClassName == nil {
		pvc.Spec.StorageClassName = ptr(DefaultStorageClass)
	}
	dir, err := os.MkdirTemp(c.VolumeRoot, "pv-"+name+"-")
	if err != nil {
		panic(fmt.Sprintf("harness: creating a volume: %v", err))
	}
	pvc.Status.Phase = corev1.ClaimBound
	pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: pvc.Spec.Resources.Requests[corev1.ResourceStorage]}
	c.mu.Lock()
	c.volumes[name] = dir
	c.mu.Unlock()
	_ = c.Store.Create(pvc)
}

// bind provisions a volume for a claim created before its pod (an expand-claim Job's
// --create), as a dynamic provisioner does for the first pod that uses it, at the size asked.
func (c *StatefulSets) bind(pvc *corev1.PersistentVolumeClaim) {
	dir, err := os.MkdirTemp(c.VolumeRoot, "pv-"+pvc.Name+"-")
	if err != nil {
		panic(fmt.Sprintf("harness: creating a volume: %v", err))
	}
	pvc = pvc.DeepCopy()
	pvc.Status.Phase = corev1.ClaimBound
	pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: pvc.Spec.Resources.Requests[corev1.ResourceStorage]}
	c.mu.Lock()
	c.volumes[pvc.Name] = dir
	c.mu.Unlock()
	_ = c.Store.UpdateStatus(pvc)
}

func (c *StatefulSets) writeStatus(sts *appsv1.StatefulSet, replicas int, current, update string) {
	pods := c.ownedPods(sts)
	st := appsv1.StatefulSetStatus{ObservedGeneration: sts.Generation, CurrentRevision: current, UpdateRevision: update}
	allUpdated := true
	for ord, p := range pods {
		if ord >= replicas {
			continue
		}
		st.Replicas++
		if p.Labels[appsv1.ControllerRevisionHashLabelKey] == update {
			st.UpdatedReplicas++
		} else {
			allUpdated = false
			st.CurrentReplicas++
		}
		if PodReady(p) {
			st.ReadyReplicas++
			st.AvailableReplicas++
		}
	}
	if allUpdated && len(pods) >= replicas {
		st.CurrentRevision = update
		st.CurrentReplicas = st.UpdatedReplicas
	}
	sts.Status = st
	_ = c.Store.UpdateStatus(sts)
}
