package sync

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
)

// Online volume expansion. A grown spec.storageSpec.volumeSizeRequest is applied claim by
// claim: the planner reads each member's claim and its StorageClass (related resources) and
// runs one expand-claim Job at a time, which patches the claim's request; the storage system
// and the kubelet grow the volume and its file system. The StatefulSet's claim template is
// immutable, so it keeps the size it was created with: a claim created later from it (a new or
// replaced member) is expanded by the same Job. Nothing here is destructive: a class that does
// not allow expansion only stops the Jobs and shows in the VolumesExpanded condition.
//
// A driver that grows the file system only when the node mounts the volume again leaves the
// claim FileSystemResizePending. The StatefulSet recreates only pods of an outdated revision,
// so the planner restarts such a member's pod itself: a restart-pod Job deletes that pod,
// named by the UID the planner observed, and the StatefulSet creates it again on the grown
// volume, once the claim has waited longer than an online resize takes. It is a disruption
// like a roll's: one member at a time, the leader last with leadership moved first, only
// while every other member is a healthy voter on a ready pod.

// verbExpandClaim patches one member's claim to the size asked for.
const verbExpandClaim = "expand-claim"

// AnnotationClaimSize on an expand-claim Job is the size it asks for, so its effect can be
// checked against the claim.
const AnnotationClaimSize = "etcdops.dev/claim-size"

// verbRestartPod deletes one member's pod, by UID, so that its volume is mounted again.
const verbRestartPod = "restart-pod"

// AnnotationPodUID on a restart-pod Job is the UID of the pod it deletes: once the member's
// pod has another UID, or is gone or going, the Job's effect shows.
const AnnotationPodUID = "etcdops.dev/pod-uid"

// fileSystemResizeGrace is how long a claim is left FileSystemResizePending before its
// member's pod is restarted for it. Drivers that grow file systems online pass through that
// state too, until the kubelet grows the mounted file system, within a minute or so; only one
// that stays there needs the remount.
const fileSystemResizeGrace = 3 * time.Minute

// resizeRequested is status.members[].volume.resizing of a claim that asks for more than it
// has before the storage system reports a condition (Resizing, FileSystemResizePending).
const resizeRequested = "Requested"

// Reasons of the VolumesExpanded condition.
const (
	ReasonVolumesAtSize        = "VolumesAtSize"
	ReasonExpanding            = "Expanding"
	ReasonExpansionNotAllowed  = "ExpansionNotAllowed"
	ReasonStorageClassNotFound = "StorageClassNotFound"
	ReasonClaimsNotObserved    = "ClaimsNotObserved"
)

// ClaimName is the PersistentVolumeClaim the StatefulSet creates for the member at ordinal.
func ClaimName(cluster string, ordinal int) string {
	return volumeData + "-" + PodName(cluster, ordinal)
}

// ClaimsAccountName names the ServiceAccount, Role and RoleBinding that let expand-claim Jobs
// patch the cluster's claims and restart-pod Jobs delete its pods.
func ClaimsAccountName(cluster string) string { return cluster + "-claims" }

// memberVolume is one member's claim as observed.
type memberVolume struct {
	name      string
	claim     *corev1.PersistentVolumeClaim // nil when not observed
	requested resource.Quantity
	capacity  resource.Quantity
	// resizing is where a growing volume stands (VolumeStatus.Resizing), "" when it does not grow.
	resizing string
	// pendingSince is when the claim became FileSystemResizePending (its condition's
	// lastTransitionTime), zero when it is not.
	pendingSince time.Time
	// refused says why the claim cannot be expanded, with its condition reason; "" when it can.
	refused, refusedBy string
}

// short: the claim asks for less than the spec.
func (vol *memberVolume) short(want resource.Quantity) bool {
	return vol.claim != nil && vol.requested.Cmp(want) < 0
}

// volumeOf reads the claim of the member at ordinal and whether its class lets it grow.
func (v *view) volumeOf(ord int) memberVolume {
	vol := memberVolume{name: ClaimName(v.c.Name, ord)}
	for i := range v.obs.Claims {
		if c := &v.obs.Claims[i]; c.Name == vol.name && c.Namespace == v.c.Namespace {
			vol.claim = c
		}
	}
	if vol.claim == nil {
		return vol
	}
	vol.requested = vol.claim.Spec.Resources.Requests[corev1.ResourceStorage]
	vol.capacity = vol.claim.Status.Capacity[corev1.ResourceStorage]
	for _, cond := range vol.claim.Status.Conditions {
		if cond.Status == corev1.ConditionTrue && (cond.Type == corev1.PersistentVolumeClaimResizing || cond.Type == corev1.PersistentVolumeClaimFileSystemResizePending) {
			vol.resizing = string(cond.Type)
		}
		if cond.Status == corev1.ConditionTrue && cond.Type == corev1.PersistentVolumeClaimFileSystemResizePending {
			vol.pendingSince = cond.LastTransitionTime.Time
		}
	}
	if vol.resizing == "" && vol.capacity.Cmp(vol.requested) < 0 && vol.claim.Status.Phase == corev1.ClaimBound {
		vol.resizing = resizeRequested
	}
	class := ""
	if vol.claim.Spec.StorageClassName != nil {
		class = *vol.claim.Spec.StorageClassName
	}
	switch sc := v.storageClass(class); {
	case class == "":
		vol.refused, vol.refusedBy = "claim "+vol.name+" has no StorageClass, so nothing can expand it", ReasonExpansionNotAllowed
	case sc == nil:
		vol.refused, vol.refusedBy = "StorageClass "+class+" of claim "+vol.name+" was not found", ReasonStorageClassNotFound
	case sc.AllowVolumeExpansion == nil || !*sc.AllowVolumeExpansion:
		vol.refused, vol.refusedBy = "StorageClass "+class+" does not allow volume expansion (allowVolumeExpansion)", ReasonExpansionNotAllowed
	}
	return vol
}

func (v *view) storageClass(name string) *storagev1.StorageClass {
	for i := range v.obs.Classes {
		if sc := &v.obs.Classes[i]; sc.Name == name {
			return sc
		}
	}
	return nil
}

// expandVolumes: a member whose claim asks for less than the spec gets an expand-claim Job,
// the lowest ordinal first, one at a time (the Job stage waits for it). It is a normal
// operation: after the fixes, rolls and scaling, so a member is expanded on a healthy
// cluster, and a member added meanwhile is expanded in turn. Claims whose class refuses are
// left alone; the VolumesExpanded condition says so.
func (p *planner) expandVolumes() (step, bool) {
	st := p.c.Spec.StorageSpec
	if st == nil {
		return step{}, false
	}
	for _, m := range p.members {
		vol := p.volumeOf(m.ordinal)
		// The API server lets only a bound claim's request change.
		if !vol.short(st.VolumeSizeRequest) || vol.refused != "" || vol.claim.Status.Phase != corev1.ClaimBound {
			continue
		}
		reason := fmt.Sprintf("volumeSizeRequest %s: expanding claim %s from %s", st.VolumeSizeRequest.String(), vol.name, vol.requested.String())
		return p.runJob(memberJob{verb: verbExpandClaim, member: m.name, claim: vol.name, size: st.VolumeSizeRequest.String()}, ExpandVolume, reason), true
	}
	return p.restartForResize()
}

// awaitsRestart: the claim at ord waits for its volume to be mounted again
// (FileSystemResizePending), and the pod there is the one that ran when the claim began to
// wait. A pod created since was mounted on the grown volume already: if the claim still
// waits, the node's resize is behind or failing, and another restart would not help. A pod
// missing or going mounts the volume anew by itself.
func (v *view) awaitsRestart(ord int) bool {
	vol, pod := v.volumeOf(ord), v.pods[ord]
	return vol.resizing == string(corev1.PersistentVolumeClaimFileSystemResizePending) &&
		pod != nil && !isTerminating(pod) && !pod.CreationTimestamp.Time.After(vol.pendingSince)
}

// restartDue: the claim at ord awaits a restart and has waited for longer than the kubelet
// takes to grow a mounted file system online.
func (v *view) restartDue(ord int) bool {
	return v.awaitsRestart(ord) && v.elapsedSince(v.volumeOf(ord).pendingSince) >= fileSystemResizeGrace
}

// restartForResize: a member whose file system grows only on a remount has its pod deleted
// by a restart-pod Job, followers first by lowest ordinal, the leader last with leadership
// moved away first. Gated like a roll's pod replacement: every pod up and ready and every
// member a healthy voter, so that nothing else is down, and quorum holds while this one is.
// One at a time: the Job stage waits for the Job, and the next member waits until the
// restarted pod is ready again.
func (p *planner) restartForResize() (step, bool) {
	var next *member
	for _, m := range p.members {
		if !p.restartDue(m.ordinal) {
			continue
		}
		if next == nil || next == p.leader {
			next = m
		}
		if m != p.leader {
			break
		}
	}
	if next == nil || next == p.leader && p.othersStillGrow(next) {
		// The leader waits while another claim may still come to wait for a restart: it
		// goes last, and leadership moves once.
		return p.awaitOnlineResize()
	}
	why := "claim " + ClaimName(p.c.Name, next.ordinal) + " grows its file system when mounted again (FileSystemResizePending)"
	if busy, state := p.disruptionBlocker(); state != "" {
		return p.wait(busy, why+": restarting "+next.name+" waits while "+state, resyncSoon), true
	}
	if next == p.leader && len(p.voters()) > 1 {
		if s, ok := p.moveLeader(next, why+": "+next.name+" is to be restarted and leads"); ok {
			return s, true
		}
	}
	if !etcdstate.QuorumWhileOneIsDown(len(p.voters()), p.healthyVoters()-1) {
		return p.wait(next.name, why+": restarting "+next.name+" would leave no healthy quorum", resyncHold), true
	}
	return p.runJob(memberJob{verb: verbRestartPod, member: next.name, id: next.ID, podUID: string(next.pod.UID)}, RestartPod, why+": restarting pod "+next.name), true
}

// awaitOnlineResize waits for the first claim that awaits a restart within the grace (a
// follower's before the leader's, which goes last): the kubelet may still grow its file
// system online. The reason names the time the restart is due, not the time left, so that
// status stays the same from sync to sync.
func (p *planner) awaitOnlineResize() (step, bool) {
	var first *member
	var due time.Time
	for _, m := range p.members {
		if !p.awaitsRestart(m.ordinal) || p.restartDue(m.ordinal) {
			continue
		}
		at := p.volumeOf(m.ordinal).pendingSince.Add(fileSystemResizeGrace + clockSkewMargin)
		if first == nil || first == p.leader && m != p.leader || m != p.leader && at.Before(due) {
			first, due = m, at
		}
	}
	if first == nil {
		return step{}, false
	}
	reason := fmt.Sprintf("claim %s waits for its file system to grow (FileSystemResizePending): restarting pod %s at %s unless the node grows it online first",
		ClaimName(p.c.Name, first.ordinal), first.name, due.UTC().Format(time.RFC3339))
	return p.wait(first.name, reason, math.Max(1, math.Ceil(due.Sub(p.obs.Now).Seconds()))), true
}

// othersStillGrow: a member other than m has a claim still to expand, whose volume still
// grows, or that waits for its file system within the grace: it may yet need a restart.
func (p *planner) othersStillGrow(m *member) bool {
	want := p.c.Spec.StorageSpec.VolumeSizeRequest
	for _, o := range p.members {
		vol := p.volumeOf(o.ordinal)
		growing := vol.short(want) || vol.resizing == string(corev1.PersistentVolumeClaimResizing) || vol.resizing == resizeRequested
		if o != m && vol.refused == "" && (growing || p.awaitsRestart(o.ordinal) && !p.restartDue(o.ordinal)) {
			return true
		}
	}
	return false
}

// disruptionBlocker names the pod that keeps a member's pod from being taken down now, and
// why; "" when nothing does: every pod of the StatefulSet must be there, not terminating and
// ready, with a healthy voter.
func (v *view) disruptionBlocker() (name, why string) {
	for o := 0; o < v.replicas; o++ {
		if why := v.notUp(o); why != "" {
			return PodName(v.c.Name, o), why
		}
	}
	return "", ""
}

// restartedForResize: the member at ord is back after a restart-pod step, on a pod that no
// longer awaits a restart: a healthy voter on a ready pod, or a learner that started (a
// learner's pod is never Ready).
func (v *view) restartedForResize(ord int) bool {
	pod, m := v.pods[ord], v.byOrd[ord]
	back := m != nil && (m.IsLearner && m.Started() || m.Healthy && isReady(pod))
	return pod != nil && !isTerminating(pod) && back && !v.awaitsRestart(ord)
}

// podRestarted reports whether the pod a restart-pod Job deleted is gone: the member's pod
// is missing, terminating, or another pod.
func (p *planner) podRestarted(ord int, uid string) bool {
	pod := p.pods[ord]
	return pod == nil || isTerminating(pod) || string(pod.UID) != uid
}

// expansionRefused says why a member's claim that asks for less than the spec cannot be
// expanded (the first such claim's reason), or "".
func (v *view) expansionRefused() string {
	st := v.c.Spec.StorageSpec
	if st == nil {
		return ""
	}
	for _, m := range v.members {
		if vol := v.volumeOf(m.ordinal); vol.short(st.VolumeSizeRequest) && vol.refused != "" {
			return vol.refused
		}
	}
	return ""
}

// expandedClaim reports whether the claim an expand-claim Job patched asks for its size.
func (p *planner) expandedClaim(claim, size string) bool {
	want, err := resource.ParseQuantity(size)
	if err != nil {
		return true
	}
	for i := range p.obs.Claims {
		if c := &p.obs.Claims[i]; c.Name == claim && c.Namespace == p.c.Namespace {
			got := c.Spec.Resources.Requests[corev1.ResourceStorage]
			return got.Cmp(want) >= 0
		}
	}
	// A claim not observed (its member gone, or the claims not sent) cannot show more.
	return true
}

// volumeStatus is status.members[].volume of the member at ordinal; nil without a claim.
func (v *view) volumeStatus(ord int) *v1alpha1.VolumeStatus {
	if v.c.Spec.StorageSpec == nil {
		return nil
	}
	vol := v.volumeOf(ord)
	if vol.claim == nil {
		return nil
	}
	return &v1alpha1.VolumeStatus{Requested: vol.requested.String(), Capacity: vol.capacity.String(), Resizing: vol.resizing}
}

// volumesCondition sets VolumesExpanded with spec.storageSpec: True once every member's claim
// asks for the spec's size and has it; False, saying which claims wait for what, while they
// grow or when a class refuses; Unknown when members have no claim in sight (the customize
// hook's claims did not arrive).
func (v *view) volumesCondition(a *answer) {
	st := &a.st
	spec := v.c.Spec.StorageSpec
	if spec == nil {
		return
	}
	// The members as etcd listed them; when its answer cannot be trusted, as status last
	// recorded them. Only the claims are judged, which etcd does not change.
	var ords []int
	for _, m := range v.members {
		ords = append(ords, m.ordinal)
	}
	if v.unknown != "" {
		ords = ords[:0]
		for _, m := range v.obs.Cluster.Status.Members {
			ords = append(ords, int(m.Ordinal))
		}
	}
	want := spec.VolumeSizeRequest
	var refused, resizing, restart, pending, unseen, done []string
	refusedBy := ""
	for _, ord := range ords {
		vol := v.volumeOf(ord)
		switch {
		case vol.claim == nil:
			unseen = append(unseen, vol.name)
		case vol.short(want) && vol.refused != "":
			refused = append(refused, vol.refused)
			refusedBy = vol.refusedBy
		case vol.short(want):
			pending = append(pending, vol.name)
		case v.restartDue(ord):
			restart = append(restart, PodName(v.c.Name, ord))
		case vol.resizing == string(corev1.PersistentVolumeClaimFileSystemResizePending) && !v.awaitsRestart(ord):
			resizing = append(resizing, vol.name+" ("+vol.resizing+", its pod restarted)")
		case vol.resizing != "":
			resizing = append(resizing, vol.name+" ("+vol.resizing+")")
		default:
			done = append(done, vol.name)
		}
	}
	status, reason := metav1.ConditionTrue, ReasonVolumesAtSize
	msg := "every member's claim has " + want.String()
	switch {
	case len(refused) > 0:
		status, reason = metav1.ConditionFalse, refusedBy
		msg = fmt.Sprintf("volumeSizeRequest %s cannot be applied: %s; the claims keep their size and nothing else changes", want.String(), strings.Join(slices.Compact(refused), "; "))
	case len(pending)+len(resizing)+len(restart) > 0:
		status, reason = metav1.ConditionFalse, ReasonExpanding
		var parts []string
		if len(pending) > 0 {
			parts = append(parts, "to expand: "+strings.Join(pending, ", "))
		}
		if len(resizing) > 0 {
			parts = append(parts, "resizing: "+strings.Join(resizing, ", "))
		}
		if len(restart) > 0 {
			parts = append(parts, "waiting for a pod restart to grow the file system: "+strings.Join(restart, ", "))
		}
		if len(done) > 0 {
			parts = append(parts, "done: "+strings.Join(done, ", "))
		}
		msg = fmt.Sprintf("expanding to %s; %s", want.String(), strings.Join(parts, "; "))
	case len(unseen) > 0:
		status, reason = metav1.ConditionUnknown, ReasonClaimsNotObserved
		msg = "claims not observed: " + strings.Join(unseen, ", ") + " (the customize hook asks for them)"
	}
	setConditionValue(st, v.obs, v.condition(v1alpha1.ConditionVolumesExpanded, status, reason, msg))
}

// claimsAccess renders, with spec.storageSpec, the ServiceAccount expand-claim and
// restart-pod Jobs run as, a Role that may read and patch the claims and delete the pods of
// the cluster's first ordinals members and nothing else, each by name, and create claims, and
// its binding. A cluster without storage has no claims and gets none of them.
//
// RBAC checks a name against the Role when the request comes, so the Role lists every ordinal
// that has or may soon have a claim or a pod (view.accessOrdinals), not only those a Job
// works on now: Metacontroller applies a sync's children in no set order, and a Role that
// grew only beside the Job that needs it might come after the Job's pod has asked. RBAC
// cannot narrow a create by name (the object has no name until it is created), so creating
// claims, which expand-claim does for a member about to join, is a rule of its own.
func claimsAccess(c *v1alpha1.EtcdCluster, lb childLabels, ordinals int) []Child {
	if c.Spec.StorageSpec == nil && !authManaged(c) {
		return nil
	}
	claims, pods := make([]string, ordinals), make([]string, ordinals)
	for ord := range ordinals {
		claims[ord], pods[ord] = ClaimName(c.Name, ord), PodName(c.Name, ord)
	}
	name := ClaimsAccountName(c.Name)
	meta := metadata(c, name, lb.common)
	return []Child{
		{APIVersion: "v1", Kind: "ServiceAccount", Name: name, Object: object{
			"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta,
			// Only the Job's pod asks for the token.
			"automountServiceAccountToken": false,
		}},
		{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role", Name: name, Object: object{
			"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
			"rules": accessRules(c, claims, pods),
		}},
		{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding", Name: name, Object: object{
			"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
			"roleRef":  object{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
			"subjects": []object{{"kind": "ServiceAccount", "name": name, "namespace": c.Namespace}},
		}},
	}
}

// accessWait: a Job that asks the API server as the claims account (expand-claim,
// restart-pod, auth) waits until the observed Role names its objects. Metacontroller applies
// an answer's children in no set order, so a Role naming a new ordinal or Secret may land
// after the Job's pod has asked, and the refused Job would fail (the control-plane tier saw
// it on a scale-out whose first sync created the new member's claim). "" when the Role names
// them all.
func (v *view) accessWait(j memberJob) string {
	var resource string
	var names []string
	switch j.verb {
	case verbExpandClaim:
		resource, names = "persistentvolumeclaims", []string{j.claim}
	case verbRestartPod:
		resource, names = "pods", []string{j.member}
	case verbAuth:
		resource, names = "secrets", credentialSecrets(v.c)
	default:
		return ""
	}
	role := ClaimsAccountName(v.c.Name)
	var named []string
	for i := range v.obs.Children.Roles {
		if r := &v.obs.Children.Roles[i]; r.Name == role {
			for _, rule := range r.Rules {
				if slices.Contains(rule.Resources, resource) {
					named = append(named, rule.ResourceNames...)
				}
			}
		}
	}
	for _, name := range names {
		if !slices.Contains(named, name) {
			return "Role " + role + " to name " + name
		}
	}
	return ""
}

// accessRules: the claims and pods the expand-claim and restart-pod Jobs act on (with
// storage), and the credential Secrets the auth Job reads and creates (auth.go). Creation
// cannot be limited to names; reading can.
func accessRules(c *v1alpha1.EtcdCluster, claims, pods []string) []object {
	var rules []object
	if c.Spec.StorageSpec != nil {
		rules = append(rules,
			object{"apiGroups": []string{""}, "resources": []string{"persistentvolumeclaims"}, "resourceNames": claims, "verbs": []string{"get", "patch"}},
			object{"apiGroups": []string{""}, "resources": []string{"persistentvolumeclaims"}, "verbs": []string{"create"}},
			object{"apiGroups": []string{""}, "resources": []string{"pods"}, "resourceNames": pods, "verbs": []string{"delete"}})
	}
	if authManaged(c) {
		rules = append(rules,
			object{"apiGroups": []string{""}, "resources": []string{"secrets"}, "resourceNames": credentialSecrets(c), "verbs": []string{"get"}},
			object{"apiGroups": []string{""}, "resources": []string{"secrets"}, "verbs": []string{"create"}})
	}
	return rules
}

// accessOrdinals is how many ordinals the claims Role names: one past the highest of the
// size, the StatefulSet's replicas as observed and as rendered now (replicas), and every
// ordinal with a pod, a member, a claim or a member in status. A scale-out names the new
// ordinals from the sync that raises the size, before the StatefulSet creates their claims;
// a scale-in keeps the removed ones until their claims and pods are gone.
func (v *view) accessOrdinals(replicas int) int {
	n := max(v.size, v.replicas, replicas)
	for ord := range v.pods {
		n = max(n, ord+1)
	}
	for _, m := range v.members {
		n = max(n, m.ordinal+1)
	}
	for _, m := range v.obs.Cluster.Status.Members {
		n = max(n, int(m.Ordinal)+1)
	}
	for i := range v.obs.Claims {
		pod, ok := strings.CutPrefix(v.obs.Claims[i].Name, volumeData+"-")
		if ord, own := Ordinal(v.c.Name, pod); ok && own && v.obs.Claims[i].Namespace == v.c.Namespace {
			n = max(n, ord+1)
		}
	}
	return n
}

// createClaimArgs are expand-claim's flags to create a member's claim as the StatefulSet
// would from its claim template (volumeClaimTemplate), with the label its selector gives it.
func createClaimArgs(c *v1alpha1.EtcdCluster) []string {
	st := c.Spec.StorageSpec
	mode := string(st.AccessModes)
	if mode == "" {
		mode = "ReadWriteOnce"
	}
	args := []string{"--create", "--access-mode=" + mode, "--label=" + LabelCluster + "=" + c.Name}
	if st.StorageClassName != "" {
		args = append(args, "--storage-class="+st.StorageClassName)
	}
	if st.VolumeSizeLimit != nil {
		args = append(args, "--limit="+st.VolumeSizeLimit.String())
	}
	return args
}

// joinVolume: the member to be added at ord, or the learner there, gets a claim that holds the
// data before it receives any. The StatefulSet's claim template keeps the size the cluster was
// created with, and claims grow only in the normal phases: a member added after they grew (a
// scale-out, a voter replaced on a lost claim) would join on the template's size, and a
// database grown past it does not fit: the learner could never catch up. So before the member
// is added, a claim that asks for less than volumeSizeRequest is grown, a missing one is
// created at that size (the StatefulSet adopts a claim of its name) when the template asks for
// less, and the member waits while the volume grows; a file system that grows only on a mount
// has the pod there restarted. who says who waits, for status. false when nothing is to be
// done: no volumes, the claim holds the size, or it cannot be known (the claims were not sent).
func (p *planner) joinVolume(ord int, who string) (step, bool) {
	st := p.c.Spec.StorageSpec
	if st == nil {
		return step{}, false
	}
	want := st.VolumeSizeRequest
	name := PodName(p.c.Name, ord)
	vol := p.volumeOf(ord)
	switch {
	case vol.claim == nil:
		tmpl := p.claimTemplate().VolumeSizeRequest
		if tmpl.Cmp(want) >= 0 || !p.claimsObserved() || slices.Contains(p.stage.done, stepKey{verbExpandClaim, name}) {
			// The StatefulSet creates it at the size asked; or the claims were not sent; or
			// the Job that created it is done and the claim is not observed yet.
			return step{}, false
		}
		reason := fmt.Sprintf("%s waits on its volume: claim %s does not exist, and the StatefulSet's claim template asks for %s, less than volumeSizeRequest %s: creating it at %s first",
			who, vol.name, tmpl.String(), want.String(), want.String())
		return p.runJob(memberJob{verb: verbExpandClaim, member: name, claim: vol.name, size: want.String(), create: true}, ExpandVolume, reason), true
	case vol.short(want):
		switch {
		case vol.refused != "" && vol.capacity.Cmp(p.largestVoterVolume()) >= 0:
			// It cannot grow, but holds as much as any voter's: the data fits as it does there.
			return step{}, false
		case vol.refused != "":
			reason := fmt.Sprintf("%s waits on its volume: claim %s has %s, less than volumeSizeRequest %s and than the voters' claims, and %s", who, vol.name, vol.capacity.String(), want.String(), vol.refused)
			return p.blocked(name, reason, ReasonVolumeTooSmall), true
		case vol.claim.Status.Phase != corev1.ClaimBound:
			// The API server lets only a bound claim grow, and one binds only for its pod.
			return step{}, false
		}
		reason := fmt.Sprintf("%s waits on its volume: claim %s asks for %s, less than volumeSizeRequest %s: expanding it first", who, vol.name, vol.requested.String(), want.String())
		return p.runJob(memberJob{verb: verbExpandClaim, member: name, claim: vol.name, size: want.String()}, ExpandVolume, reason), true
	case vol.claim.Status.Phase != corev1.ClaimBound || vol.capacity.Cmp(want) >= 0:
		// Provisioned at the size asked when its pod binds it; or it has that size.
		return step{}, false
	case p.awaitsRestart(ord):
		// Its file system grows only when the volume is mounted again: the pod there now
		// holds no voter (a pod without a member, or a learner's that has not caught up).
		why := fmt.Sprintf("%s waits on its volume: claim %s grows its file system when mounted again (FileSystemResizePending)", who, vol.name)
		return p.runJob(memberJob{verb: verbRestartPod, member: name, podUID: string(p.pods[ord].UID)}, RestartPod, why+": restarting pod "+name), true
	case vol.resizing == string(corev1.PersistentVolumeClaimFileSystemResizePending):
		// The next mount grows it, before etcd starts.
		return step{}, false
	}
	return p.wait(name, fmt.Sprintf("%s waits on its volume: claim %s grows to %s (%s)", who, vol.name, want.String(), vol.resizing), resyncSoon), true
}

// claimsObserved: Metacontroller sent the claims, as the customize hook asks: at least one
// member's claim is in the request.
func (v *view) claimsObserved() bool {
	for _, m := range v.members {
		if v.volumeOf(m.ordinal).claim != nil {
			return true
		}
	}
	return false
}

// largestVoterVolume is the largest capacity of a voter's claim.
func (v *view) largestVoterVolume() resource.Quantity {
	var top resource.Quantity
	for _, m := range v.voters() {
		if c := v.volumeOf(m.ordinal).capacity; c.Cmp(top) > 0 {
			top = c
		}
	}
	return top
}

// claimTemplate is the storage the StatefulSet's claim template carries: the spec's, but the
// size of the observed StatefulSet's template, which the API server does not let change.
func (v *view) claimTemplate() *v1alpha1.StorageSpec {
	st := v.c.Spec.StorageSpec
	if st == nil || v.sts == nil {
		return st
	}
	for _, t := range v.sts.Spec.VolumeClaimTemplates {
		if q, ok := t.Spec.Resources.Requests[corev1.ResourceStorage]; t.Name == volumeData && ok {
			kept := *st
			kept.VolumeSizeRequest = q
			return &kept
		}
	}
	return st
}
