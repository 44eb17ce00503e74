package sync

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// Volumes in the simulator: with storage, the StatefulSet creates a claim per ordinal at its
// claim template's size, bound at once with that capacity. A claim whose request grows is
// grown by the storage system in two ticks (Resizing, then the capacity), as an
// external resizer would with a driver that grows file systems online. The claims' class,
// "standard", allows expansion unless the story says otherwise. With an offline driver
// (offline-resize) the volume grows in the same two ticks but the claim is then
// FileSystemResizePending, its capacity unchanged, until a pod other than the one running
// then mounts it: the kubelet grows the file system while it mounts the volume, so such a pod
// is Pending for a tick before it runs, and the claim has its capacity once it does.

// simClass is the StorageClass every simulated claim names.
const simClass = "standard"

// simClaim is one claim as the API server holds it.
type simClaim struct {
	requested, capacity resource.Quantity
	resizing            bool
	// fsPending: the volume grew, the file system waits for a remount since pendingSince;
	// mountedBy is the UID of the pod that ran on it then ("" when none did).
	fsPending    bool
	pendingSince time.Time
	mountedBy    string
	// resizeFailed: the node failed to grow the file system on a mount (NodeResizeError).
	resizeFailed bool
}

// simVolumes is the storage side of the world.
type simVolumes struct {
	claims map[int]*simClaim
	// template is the StatefulSet's claim template size.
	template resource.Quantity
	// noExpansion: the class does not allow expansion.
	noExpansion bool
	// expansions counts claims patched by expand-claim Jobs.
	expansions int
	// offline: the driver grows a file system only when the volume is mounted again;
	// remountFails: the node fails to grow it then, the claim keeps waiting, and the pod that
	// mounts it stays Pending (mountFails).
	offline, remountFails bool
	// nodeOnline: the file system grows on the node while mounted, a minute after the
	// volume grew: the claim is FileSystemResizePending meanwhile.
	nodeOnline bool
	// restarts counts pods deleted by restart-pod Jobs, created the claims expand-claim Jobs
	// created.
	restarts, created int
}

// claimFor creates the claim of ord from the StatefulSet's template if it has none.
func (w *simWorld) claimFor(ord int) {
	if !w.storage() {
		return
	}
	if w.volumes.claims == nil {
		w.volumes.claims = map[int]*simClaim{}
	}
	if w.volumes.claims[ord] == nil {
		w.volumes.claims[ord] = &simClaim{requested: w.volumes.template, capacity: w.volumes.template}
	}
}

// resizeClaims is the storage system's resizer: one tick to start, one to finish; with an
// offline driver the file system grows once another pod runs on the volume.
func (w *simWorld) resizeClaims() {
	for ord, c := range w.volumes.claims {
		p := w.pods[ord]
		switch {
		case c.requested.Cmp(c.capacity) <= 0:
			c.fsPending = false
		case c.fsPending:
			remounted := p != nil && p.running && p.uid != c.mountedBy
			if remounted || w.volumes.nodeOnline && w.now.Sub(c.pendingSince) >= time.Minute {
				c.capacity, c.fsPending = c.requested, false
			}
		case !c.resizing:
			c.resizing = true
		case w.volumes.offline || w.volumes.nodeOnline:
			c.resizing, c.fsPending, c.pendingSince, c.mountedBy = false, true, w.now, ""
			if p != nil && !p.terminating {
				c.mountedBy = p.uid
			}
		default:
			c.capacity, c.resizing = c.requested, false
		}
	}
}

// remountUntil is when a pod created now at ord runs at the earliest: a tick later while its
// claim waits for the remount that grows its file system, else at since.
func (w *simWorld) remountUntil(ord int, since time.Time) time.Time {
	if c := w.volumes.claims[ord]; c != nil && c.fsPending {
		if at := w.now.Add(simTick); at.After(since) {
			return at
		}
	}
	return since
}

// restartPod is the restart-pod Job: the member's pod deleted if it is still the pod of the
// Job's UID (the API server's delete precondition); another pod, or none, is left alone. It
// asks etcd first, as the tool does (membership.CheckRestart): the member of its --id, while
// still listed, must not lead, and every other voter must be healthy; otherwise it fails.
func (w *simWorld) restartPod(j *simJob) {
	w.mustBeAllowed(j, "pods", "delete", j.member)
	if m := w.memberByID(j.id); j.id != 0 && m != nil && (!w.hasQuorum() || m.id == w.leader || !w.othersHealthy(m)) {
		j.state = jobFailed
		w.stats.jobFailures++
		return
	}
	ord, _ := Ordinal(w.cluster.Name, j.member)
	if p := w.pods[ord]; p != nil && p.uid == j.podUID && !p.terminating {
		p.terminating = true
		w.volumes.restarts++
	}
}

// mustBeAllowed is the API server's RBAC check of a volume Job's request, as its service
// account makes it: the claims Role applied must grant verb on resource, for that name when
// the rule lists names (a create names nothing: the API server authorizes it without the
// object's name, so only a rule without names grants it). A refusal fails the story: the Job
// would fail for good.
func (w *simWorld) mustBeAllowed(j *simJob, resource, verb, name string) {
	if raw := j.role; raw != nil {
		var r rbacv1.Role
		w.decode(raw, &r)
		for _, rule := range r.Rules {
			if slices.Contains(rule.Resources, resource) && slices.Contains(rule.Verbs, verb) && (len(rule.ResourceNames) == 0 || slices.Contains(rule.ResourceNames, name)) {
				return
			}
		}
	}
	w.t.Fatalf("Job %s: the Role %s, as applied before the answer that created the Job, does not let it %s %s %s\n%s", j.name, ClaimsAccountName(w.cluster.Name), verb, resource, name, w.describe())
}

// checkRestarts: with an offline driver, whose restarts are the planner's own disruptions,
// never two voters down at once (unless a story breaks them on purpose).
func (w *simWorld) checkRestarts() {
	if !w.volumes.offline || w.faulty {
		return
	}
	var down []string
	for _, m := range w.members {
		if !m.learner && !w.healthy(m) {
			down = append(down, w.podName(m.ord))
		}
	}
	if len(down) > 1 {
		w.t.Fatalf("%d voters down at once: %v\n%s", len(down), down, w.describe())
	}
}

// expandClaim is the expand-claim Job: the claim's request raised, never lowered; with
// --create a missing claim is created at the size, provisioned at once, and the StatefulSet
// adopts it (claimFor).
func (w *simWorld) expandClaim(j *simJob) {
	ord, _ := Ordinal(w.cluster.Name, j.member)
	c := w.volumes.claims[ord]
	if j.claim != ClaimName(w.cluster.Name, ord) {
		w.t.Fatalf("expand-claim Job %s names claim %s for member %s", j.name, j.claim, j.member)
	}
	w.mustBeAllowed(j, "persistentvolumeclaims", "get", j.claim)
	size := resource.MustParse(j.size)
	if c == nil && j.create {
		w.mustBeAllowed(j, "persistentvolumeclaims", "create", "")
		if w.volumes.claims == nil {
			w.volumes.claims = map[int]*simClaim{}
		}
		w.volumes.claims[ord] = &simClaim{requested: size, capacity: size}
		w.volumes.created++
		return
	}
	w.mustBeAllowed(j, "persistentvolumeclaims", "patch", j.claim)
	if c == nil {
		j.state = jobFailed
		w.stats.jobFailures++
		return
	}
	if c.requested.Cmp(size) < 0 {
		c.requested = size
		w.volumes.expansions++
	}
}

// observedVolumes are the claims and the one class, as Metacontroller sends them.
func (w *simWorld) observedVolumes(obs *Observed) {
	if !w.storage() {
		return
	}
	allow := !w.volumes.noExpansion
	obs.Classes = []storagev1.StorageClass{{ObjectMeta: metav1.ObjectMeta{Name: simClass}, AllowVolumeExpansion: &allow}}
	for _, ord := range sortedInts(w.volumes.claims) {
		c := w.volumes.claims[ord]
		pvc := corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: ClaimName(w.cluster.Name, ord), Namespace: w.cluster.Namespace}}
		pvc.Spec.StorageClassName = ptrTo(simClass)
		pvc.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: c.requested}
		pvc.Status.Phase = corev1.ClaimBound
		pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: c.capacity}
		if c.resizing {
			pvc.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: corev1.PersistentVolumeClaimResizing, Status: corev1.ConditionTrue}}
		}
		if c.fsPending {
			pvc.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: corev1.PersistentVolumeClaimFileSystemResizePending, Status: corev1.ConditionTrue,
				LastTransitionTime: metav1.NewTime(c.pendingSince)}}
		}
		if c.resizeFailed && c.fsPending {
			// What the kubelet reports with RecoverVolumeExpansionFailure (on by default from
			// Kubernetes 1.32); the mount's own failure is an Event on the pod.
			pvc.Status.Conditions = append(pvc.Status.Conditions, corev1.PersistentVolumeClaimCondition{Type: corev1.PersistentVolumeClaimNodeResizeError, Status: corev1.ConditionTrue,
				Message: "resize of the file system failed on the node: exit status 1"})
		}
		obs.Claims = append(obs.Claims, pvc)
	}
}

// volumesConverged: every member's claim has the spec's size, unless its class refuses.
func (w *simWorld) volumesConverged() bool {
	if !w.storage() || w.volumes.noExpansion {
		return true
	}
	for _, m := range w.members {
		if c := w.volumes.claims[m.ord]; c == nil || c.capacity.Cmp(w.cluster.Spec.StorageSpec.VolumeSizeRequest) < 0 {
			return false
		}
	}
	return true
}

// volumeCommand runs the scenario commands about volumes:
//
//	volume-size S        spec.storageSpec.volumeSizeRequest
//	no-expansion         the claims' class does not allow expansion
//	offline-resize       the claims' driver grows file systems only on a remount
//	remount-fails        the node fails to grow a file system on a remount
//	node-resize-online   the claims' file systems grow on the node while mounted, a
//	                     minute after the volume
func (w *simWorld) volumeCommand(t *testing.T, line, cmd string, args []string) {
	switch cmd {
	case "volume-size":
		if len(args) != 1 {
			t.Fatalf("%q: want a size", line)
		}
		w.cluster.Spec.StorageSpec.VolumeSizeRequest = resource.MustParse(args[0])
		w.cluster.Generation++
	case "no-expansion":
		w.volumes.noExpansion = true
	case "offline-resize":
		w.volumes.offline = true
	case "remount-fails":
		w.volumes.remountFails = true
	case "node-resize-online":
		w.volumes.nodeOnline = true
	}
}

// volumesLine is the claims in one line: ordinal requested/capacity, * while resizing, ~
// while the file system waits for a remount; and the pods restarted for it, if any.
func (w *simWorld) volumesLine() string {
	var parts []string
	for _, ord := range sortedInts(w.volumes.claims) {
		c := w.volumes.claims[ord]
		mark := ""
		switch {
		case c.resizing:
			mark = "*"
		case c.fsPending:
			mark = "~"
		}
		parts = append(parts, fmt.Sprintf("%d:%s/%s%s", ord, c.requested.String(), c.capacity.String(), mark))
	}
	line := "claims: " + strings.Join(parts, " ") + fmt.Sprintf(" (template %s)", w.volumes.template.String())
	if w.volumes.restarts > 0 {
		line += fmt.Sprintf(" restarted=%d", w.volumes.restarts)
	}
	return line
}

// checkVolumes: each member's volume status says what its claim held when observed (the
// world has not ticked since).
func (w *simWorld) checkVolumes(d Decision) {
	for _, m := range d.Status.Members {
		c := w.volumes.claims[int(m.Ordinal)]
		if m.Volume == nil || c == nil {
			continue
		}
		if m.Volume.Requested != c.requested.String() || m.Volume.Capacity != c.capacity.String() {
			w.t.Fatalf("status says %s's claim asks for %s and has %s; it asks for %s and has %s (%v)", m.Name, m.Volume.Requested, m.Volume.Capacity, c.requested.String(), c.capacity.String(), d.Action)
		}
	}
}

// TestVolumeExpansion: a grown volumeSizeRequest expands every member's claim, one Job at a
// time, and a member added after gets its claim from the StatefulSet's unchanged template
// and is expanded in turn; a class that does not allow expansion runs no Job and says so.
func TestVolumeExpansion(t *testing.T) {
	t.Run("grown", func(t *testing.T) {
		w, _ := created(t, 3, true)
		w.cluster.Spec.StorageSpec.VolumeSizeRequest = resource.MustParse("2Gi")
		w.cluster.Generation++
		inFlight := 0
		for i := 0; i < 60; i++ {
			d := w.step()
			jobs := 0
			for _, c := range d.Children {
				if c.Kind == "Job" && strings.Contains(c.Name, "-"+verbExpandClaim+"-") {
					jobs++
				}
			}
			inFlight = max(inFlight, jobs)
			if d.Action.Type == Steady && volumesExpanded(d) == metav1.ConditionTrue {
				break
			}
		}
		if inFlight != 1 {
			t.Errorf("at most %d expand-claim Jobs returned at once, want exactly 1", inFlight)
		}
		for ord := range 3 {
			c := w.volumes.claims[ord]
			if c == nil || c.capacity.Cmp(resource.MustParse("2Gi")) != 0 {
				t.Fatalf("claim %d: %+v, want 2Gi; %s", ord, c, w.volumesLine())
			}
		}
		if w.volumes.template.Cmp(resource.MustParse("1Gi")) != 0 {
			t.Errorf("the StatefulSet's claim template changed to %s; it is immutable", w.volumes.template.String())
		}
		*w.cluster.Spec.Size = 5
		w.cluster.Generation++
		for i := 0; i < 80; i++ {
			if d := w.step(); d.Action.Type == Steady && volumesExpanded(d) == metav1.ConditionTrue && len(w.volumes.claims) == 5 {
				break
			}
		}
		for ord := range 5 {
			if c := w.volumes.claims[ord]; c == nil || c.capacity.Cmp(resource.MustParse("2Gi")) != 0 {
				t.Fatalf("after the scale-out, claim %d: %+v, want 2Gi; %s", ord, c, w.volumesLine())
			}
		}
	})
	t.Run("offline", func(t *testing.T) {
		w, _ := created(t, 3, true)
		w.volumes.offline = true
		w.cluster.Spec.StorageSpec.VolumeSizeRequest = resource.MustParse("2Gi")
		w.cluster.Generation++
		var restarted []string
		waiting := false
		var d Decision
		for i := 0; i < 120; i++ {
			d = w.step()
			if d.Action.Type == RestartPod && !slices.Contains(restarted, d.Action.Member) {
				restarted = append(restarted, d.Action.Member)
			}
			msg := volumesExpandedMessage(d)
			waiting = waiting || strings.Contains(msg, "waiting for a pod restart to grow the file system: ") && strings.Contains(msg, "done: ")
			if d.Action.Type == Steady && volumesExpanded(d) == metav1.ConditionTrue {
				break
			}
		}
		if volumesExpanded(d) != metav1.ConditionTrue {
			t.Fatalf("not expanded: %v; %s", d.Action, w.volumesLine())
		}
		// The leader, etcd-0, goes last: leadership is moved away first.
		if want := []string{"etcd-1", "etcd-2", "etcd-0"}; !slices.Equal(restarted, want) {
			t.Errorf("pods restarted in the order %v, want %v", restarted, want)
		}
		if w.volumes.restarts != 3 || w.stats.leaderMoves != 1 {
			t.Errorf("%d pods deleted, %d leader moves; want 3 and 1", w.volumes.restarts, w.stats.leaderMoves)
		}
		if !waiting {
			t.Error("VolumesExpanded never named the members done and those waiting for a restart")
		}
		for _, m := range d.Status.Members {
			if m.Volume == nil || m.Volume.Capacity != "2Gi" || m.Volume.Resizing != "" {
				t.Errorf("status of %s: volume %+v, want done at 2Gi", m.Name, m.Volume)
			}
		}
		for ord := range 3 {
			if c := w.volumes.claims[ord]; c.capacity.Cmp(resource.MustParse("2Gi")) != 0 || c.fsPending {
				t.Fatalf("claim %d: %+v, want 2Gi; %s", ord, c, w.volumesLine())
			}
		}
	})
	t.Run("offline, another pod going", func(t *testing.T) {
		// A pod terminating whose etcd still answers (evicted, say) counts as down: nothing
		// else is restarted until it is back and ready.
		w, _ := created(t, 3, true)
		w.volumes.offline = true
		w.cluster.Spec.StorageSpec.VolumeSizeRequest = resource.MustParse("2Gi")
		w.cluster.Generation++
		// Every claim expanded and waiting past the grace: the next sync would restart
		// etcd-1.
		due := func() bool {
			c := w.volumes.claims[1]
			return w.volumes.expansions == 3 && c.fsPending && w.now.Sub(c.pendingSince) >= fileSystemResizeGrace+clockSkewMargin
		}
		for i := 0; i < 60 && !due(); i++ {
			w.step()
		}
		if !w.volumes.claims[1].fsPending || w.volumes.restarts != 0 {
			t.Fatalf("claim 1 does not wait for a remount, or a pod was restarted: %s", w.volumesLine())
		}
		w.pods[2].terminating = true
		d := w.sync()
		if d.Action.Type != Wait || d.Action.Member != "etcd-2" || !strings.Contains(d.Action.Reason, "pod etcd-2 is terminating") {
			t.Errorf("with etcd-2 terminating: %v; want a Wait on it", d.Action)
		}
		for _, c := range d.Children {
			if c.Kind == "Job" && strings.Contains(c.Name, "-"+verbRestartPod+"-") {
				t.Errorf("Job %s returned while etcd-2 is terminating", c.Name)
			}
		}
	})
	t.Run("refused", func(t *testing.T) {
		w, _ := created(t, 3, true)
		w.volumes.noExpansion = true
		w.cluster.Spec.StorageSpec.VolumeSizeRequest = resource.MustParse("2Gi")
		w.cluster.Generation++
		var d Decision
		for range 10 {
			d = w.step()
		}
		if w.volumes.expansions != 0 || d.Action.Type != Steady {
			t.Errorf("%d claims expanded, action %v; want none and Steady", w.volumes.expansions, d.Action)
		}
		if got := volumesExpandedReason(d); got != ReasonExpansionNotAllowed {
			t.Errorf("VolumesExpanded reason %q, want %s", got, ReasonExpansionNotAllowed)
		}
	})
}

func volumesExpanded(d Decision) metav1.ConditionStatus {
	for _, c := range d.Status.Conditions {
		if c.Type == v1alpha1.ConditionVolumesExpanded {
			return c.Status
		}
	}
	return ""
}

func volumesExpandedReason(d Decision) string {
	for _, c := range d.Status.Conditions {
		if c.Type == v1alpha1.ConditionVolumesExpanded {
			return c.Reason
		}
	}
	return ""
}

func volumesExpandedMessage(d Decision) string {
	for _, c := range d.Status.Conditions {
		if c.Type == v1alpha1.ConditionVolumesExpanded {
			return c.Message
		}
	}
	return ""
}

// othersHealthy: every voter but m is healthy.
func (w *simWorld) othersHealthy(m *simMember) bool {
	for _, o := range w.members {
		if o != m && !o.learner && !w.healthy(o) {
			return false
		}
	}
	return true
}

// diskTooSmall: learner m's claim is smaller than the database it must receive (the leader's,
// in use), so the snapshot does not fit and it cannot catch up. Voters are not bounded here,
// so neither is a learner beyond what the leader's own claim holds: what matters is a new
// member's volume against the data it joins, where that data fits.
func (w *simWorld) diskTooSmall(m, leader *simMember) bool {
	c, lc := w.volumes.claims[m.ord], w.volumes.claims[leader.ord]
	if !w.storage() || c == nil || lc == nil {
		return false
	}
	return c.capacity.Value() < min(leader.live+leader.history, lc.capacity.Value())
}

// loseClaim is a member's claim and volume lost for good (a zone gone, a claim deleted): its
// pod goes too, and the StatefulSet creates both again, the claim from its template.
func (w *simWorld) loseClaim(ord int) {
	delete(w.volumes.claims, ord)
	delete(w.data, ord)
	if p := w.pods[ord]; p != nil {
		p.terminating = true
	}
	if m := w.memberAt(ord); m != nil && !m.learner {
		w.lost++
		w.lostClaims = append(w.lostClaims, m.id)
	}
}

// replacedLost: the member whose claim was lost is gone, replaced by member m, a voter now:
// the data is held where it was lost again.
func (w *simWorld) replacedLost(m *simMember) {
	for i, id := range w.lostClaims {
		if w.memberByID(id) == nil && w.memberAt(m.ord) == m {
			w.lostClaims = append(w.lostClaims[:i], w.lostClaims[i+1:]...)
			w.lost = max(0, w.lost-1)
			return
		}
	}
}

// TestNewMemberVolumeAtSpecSize: once the volumes grew and the data outgrew the claim
// template's size, a member added later (a scale-out, a voter replaced on a lost claim) gets
// its claim at the spec's size before it receives data: created at that size, or grown, by an
// expand-claim Job. On a claim of the template's size its snapshot would not fit: it could
// never catch up, would be removed as stuck every ten minutes and added back on the same claim.
func TestNewMemberVolumeAtSpecSize(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(w *simWorld)
	}{
		{"scale-out", func(w *simWorld) { w.cluster.Spec.Size = ptrTo(int32(5)) }},
		{"replaced on a lost claim", func(w *simWorld) { w.loseClaim(2) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, _ := created(t, 3, true)
			w.edit(func(w *simWorld) { w.cluster.Spec.StorageSpec.VolumeSizeRequest = resource.MustParse("2Gi") })
			for _, m := range w.members {
				m.live = 1536 << 20 // past the template's 1Gi, within 2Gi
			}
			tc.change(w)
			w.cluster.Generation++
			w.run(300)
			for _, line := range w.log {
				if strings.Contains(line, "is stuck") {
					t.Errorf("a learner was given up on: %s", line)
				}
			}
			for _, m := range w.members {
				if c := w.volumes.claims[m.ord]; c == nil || c.capacity.Cmp(resource.MustParse("2Gi")) < 0 {
					t.Errorf("member %s on claim %+v", w.podName(m.ord), c)
				}
			}
		})
	}
}
