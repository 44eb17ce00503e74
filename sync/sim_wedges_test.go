package sync

import (
	"strings"
	"testing"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// Wedges: states in which a cluster sits a voter short, or frozen, for as long as nothing
// outside changes. None may end quietly: while a voter is missing the cluster is Degraded, and
// the reason names what holds it.

// wedgeStory sets a world up and runs it into one such state.
type wedgeStory struct {
	name string
	run  func(t *testing.T) *simWorld
	// want is in the Degraded condition's message at the end.
	want string
	// wantReason is the Degraded condition's reason at the end.
	wantReason string
	// replaces: the story replaces a member (its data is gone); otherwise none may be removed.
	replaces bool
}

var wedgeStories = []wedgeStory{
	{
		// A restart-pod for an offline resize whose node then fails to grow the file system:
		// the new pod stays Pending; its member's data is intact on the claim.
		name: "remount fails after a restart for a resize",
		run: func(t *testing.T) *simWorld {
			w, _ := created(t, 3, true)
			w.volumes.offline, w.volumes.remountFails = true, true
			w.cluster.Spec.StorageSpec.VolumeSizeRequest = resource.MustParse("2Gi")
			w.cluster.Generation++
			w.steps(180)
			return w
		},
		want:       "its pod cannot start (claim data-etcd-1 reports NodeResizeError",
		wantReason: ReasonPodCannotStart,
	},
	{
		// A replacement pod whose volume never attaches (its node is gone).
		name: "replacement pod whose volume never attaches",
		run: func(t *testing.T) *simWorld {
			w, _ := created(t, 3, true)
			w.pods[2].terminating = true
			w.attaching[2] = true
			w.steps(180)
			return w
		},
		want:       "its pod cannot start (Pending since",
		wantReason: ReasonPodCannotStart,
	},
	{
		// A voter replaced on a lost claim whose class no longer lets it grow to what the
		// voters' claims hold: the member would join on a volume the data does not fit.
		name: "a lost claim that cannot grow to the voters' size",
		run: func(t *testing.T) *simWorld {
			w, _ := created(t, 3, true)
			w.edit(func(w *simWorld) { w.cluster.Spec.StorageSpec.VolumeSizeRequest = resource.MustParse("2Gi") })
			for _, m := range w.members {
				m.live = 1536 << 20
			}
			w.volumes.noExpansion = true
			w.loseClaim(2)
			w.steps(120)
			return w
		},
		want:       "etcd-2 (to be added) waits on its volume",
		wantReason: ReasonVolumeTooSmall,
		replaces:   true,
	},
	{
		// A voter replaced whose learner, on a node that cannot reach its peers, never catches
		// up: given up on as stuck every ten minutes and added back, for ever.
		name: "a replacement's learner that never catches up",
		run: func(t *testing.T) *simWorld {
			w, _ := created(t, 3, true)
			w.pods[2].crash = true
			w.onTick = func() {
				if m := w.memberAt(2); m != nil && m.learner {
					w.pods[2].crash = false
					w.pods[2].down = true // cut off from its peers
				}
			}
			w.steps(250)
			return w
		},
		want:       "learner etcd-2",
		wantReason: ReasonLearnerOverdue,
		replaces:   true,
	},
	{
		// A voter cut off from its peers, not the hook, replaced on its own pod without a
		// volume: its old etcd runs on there, and the Job that would restart the pod has no
		// account without storage.
		name: "a removed member runs on where its replacement is to start",
		run: func(t *testing.T) *simWorld {
			w, _ := created(t, 3, false)
			w.deafen(w.pods[1])
			w.steps(120)
			return w
		},
		want:       "pod etcd-1 still runs member",
		wantReason: ReasonRemovedMemberRunning,
		replaces:   true,
	},
}

// steps runs n steps, whatever they decide.
func (w *simWorld) steps(n int) {
	w.t.Helper()
	for range n {
		w.step()
	}
}

// TestNoQuietWedges runs every wedge story and checks its end: the cluster Degraded with the
// story's reason, naming what holds it, and no member removed that kept its data.
func TestNoQuietWedges(t *testing.T) {
	for _, st := range wedgeStories {
		t.Run(st.name, func(t *testing.T) {
			w := st.run(t)
			voters, _ := w.voters()
			if voters >= int(*w.cluster.Spec.Size) && w.cluster.Status.ReadyMembers >= *w.cluster.Spec.Size {
				t.Fatalf("no voter is missing at the end: the story does not wedge\n%s", w.describe())
			}
			deg := apimeta.FindStatusCondition(w.cluster.Status.Conditions, v1alpha1.ConditionDegraded)
			if deg == nil || deg.Status != metav1.ConditionTrue || deg.Reason != st.wantReason || !strings.Contains(deg.Message, st.want) {
				t.Fatalf("Degraded %+v; want True, %s, naming %q\n%s\nlast actions:\n  %s", deg, st.wantReason, st.want, w.describe(), strings.Join(lastN(w.log, 8), "\n  "))
			}
			if w.stats.removes > 0 && !st.replaces {
				t.Errorf("%d members removed: a member whose pod cannot start kept its data\n%s", w.stats.removes, strings.Join(w.log, "\n"))
			}
		})
	}
}
