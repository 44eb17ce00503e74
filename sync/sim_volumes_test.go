package sync

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// Volumes in the simulator: with storage, the StatefulSet creates a claim per ordinal at its
// claim template's size, bound at once with that capacity. A claim whose request grows is
// grown by the storage system in two ticks (ControllerResizing, then the capacity), as an
// external resizer would with a driver that grows file systems online. The claims' class,
// "standard", allows expansion unless the story says otherwise.

// simClass is the StorageClass every simulated claim names.
const simClass = "standard"

// simClaim is one claim as the API server holds it.
type simClaim struct {
	requested, capacity resource.Quantity
	resizing            bool
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

// resizeClaims is the storage system's resizer: one tick to start, one to finish.
func (w *simWorld) resizeClaims() {
	for _, c := range w.volumes.claims {
		switch {
		case c.requested.Cmp(c.capacity) <= 0:
		case !c.resizing:
			c.resizing = true
		default:
			c.capacity, c.resizing = c.requested, false
		}
	}
}

// expandClaim is the expand-claim Job: the claim's request raised, never lowered.
func (w *simWorld) expandClaim(j *simJob) {
	ord, _ := Ordinal(w.cluster.Name, j.member)
	c := w.volumes.claims[ord]
	if j.claim != ClaimName(w.cluster.Name, ord) {
		w.t.Fatalf("expand-claim Job %s names claim %s for member %s", j.name, j.claim, j.member)
	}
	if c == nil {
		j.state = jobFailed
		w.stats.jobFailures++
		return
	}
	size := resource.MustParse(j.size)
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
	}
}

// volumesLine is the claims in one line: ordinal requested/capacity, * while resizing.
func (w *simWorld) volumesLine() string {
	var parts []string
	for _, ord := range sortedInts(w.volumes.claims) {
		c := w.volumes.claims[ord]
		mark := ""
		if c.resizing {
			mark = "*"
		}
		parts = append(parts, fmt.Sprintf("%d:%s/%s%s", ord, c.requested.String(), c.capacity.String(), mark))
	}
	return "claims: " + strings.Join(parts, " ") + fmt.Sprintf(" (template %s)", w.volumes.template.String())
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
			w.t.Fatalf("status says %s's claim asks for %s and has %s; it asks for %s and has %s", m.Name, m.Volume.Requested, m.Volume.Capacity, c.requested.String(), c.capacity.String())
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
