package sync

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/joinstate"
)

// Claims in the simulator follow the StatefulSet's persistentVolumeClaimRetentionPolicy, as
// the StatefulSet controller and the garbage collector apply it: whenScaled: Delete deletes
// the claim of an ordinal the StatefulSet scales away, whenDeleted: Delete every claim of a
// StatefulSet deleted with its pods (not one deleted orphaning them, which orphans the claims
// too). A deleted claim goes once no pod uses it, as the claim's protection finalizer keeps it.

// deleteStatefulSet is the StatefulSet deleted, by the planner's answer or behind its back;
// orphan: with --cascade=orphan, which leaves its pods and claims.
func (w *simWorld) deleteStatefulSet(orphan bool) {
	if s := w.sts; s != nil && !orphan && s.whenDeleted == "Delete" {
		for ord := range w.data {
			w.doom(ord)
		}
	}
	w.sts, w.orphaned = nil, orphan
}

// scaledAway is the claim of ord, whose pod the StatefulSet deletes as beyond its replicas.
func (w *simWorld) scaledAway(ord int) {
	if w.sts.whenScaled == "Delete" {
		w.doom(ord)
	}
}

func (w *simWorld) doom(ord int) {
	if w.doomedClaims == nil {
		w.doomedClaims = map[int]bool{}
	}
	w.doomedClaims[ord] = true
}

// collectClaims deletes the doomed claims that no pod uses any more, and their data with them.
func (w *simWorld) collectClaims() {
	for ord := range w.doomedClaims {
		if w.pods[ord] == nil {
			delete(w.data, ord)
			delete(w.doomedClaims, ord)
			delete(w.volumes.claims, ord)
		}
	}
}

// recreated is the world after its EtcdCluster was deleted with the claims kept and created
// again under the same name: a new UID, no status, no children, no pods, no etcd running. The
// old cluster's data stays on the claims; a launcher that started etcd on it would revive the
// old cluster under the new one (launch fails the run if one does).
func (w *simWorld) recreated() *simWorld {
	n := newSimWorld(w.t, *w.cluster.Spec.Size, w.storage())
	n.cluster.Spec = w.cluster.Spec // the old world is not used again
	n.cluster.UID = "uid-2"
	n.nextID, n.clusterID, n.data = w.nextID, w.clusterID+1, w.data
	n.lag = w.lag
	return n
}

// TestRecreatedClusterRefusesOldClaims: a cluster deleted with its claims kept and created
// again under the same name, for every size. Every pod that mounts an old claim refuses; the
// planner says so (Degraded, PodCannotStart, naming the other cluster), starts no member Job,
// forces no new cluster though spec.recovery allows it, and the old data stays as it was.
func TestRecreatedClusterRefusesOldClaims(t *testing.T) {
	for _, size := range []int32{1, 3, 5} {
		t.Run(fmt.Sprint("size ", size), func(t *testing.T) {
			old, _ := created(t, size, true)
			ts := metav1.NewTime(old.now)
			old.cluster.DeletionTimestamp, old.faulty = &ts, true
			for i := 0; i < 20 && !old.finalized; i++ {
				old.step()
			}
			before := map[int]simData{}
			for ord, d := range old.data {
				before[ord] = *d
			}
			w := old.recreated()
			w.cluster.Spec.Recovery = &v1alpha1.RecoverySpec{QuorumLoss: v1alpha1.QuorumLossForceNewCluster}
			var d Decision
			for i := 0; i < 40; i++ {
				d = w.step()
				if len(w.jobs) > 0 || len(w.members) > 0 || w.stats.forced > 0 {
					t.Fatalf("sync %d acted on the old claims: %d Jobs, %d members, %d forced\n%s", i, len(w.jobs), len(w.members), w.stats.forced, w.describe())
				}
			}
			if len(w.pods) == 0 {
				t.Fatal("no pod started")
			}
			for ord, p := range w.pods {
				if p.running || !strings.HasPrefix(p.refusal, joinstate.Refused+joinstate.ForeignCluster+"default/etcd/uid-1") {
					t.Errorf("pod %d: running %v, refusal %q", ord, p.running, p.refusal)
				}
			}
			for ord, b := range before {
				if d := w.data[ord]; d == nil || *d != b {
					t.Errorf("claim %d: %+v, was %+v", ord, d, b)
				}
			}
			deg := apimeta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionDegraded)
			if deg == nil || deg.Status != metav1.ConditionTrue || deg.Reason != ReasonPodCannotStart || !strings.Contains(deg.Message, "default/etcd/uid-1") {
				t.Errorf("Degraded: %+v", deg)
			}
		})
	}
}

// claimsDeletedWithCluster sets spec.storageSpec.whenDeleted: Delete on a world with volumes,
// the setting under which a StatefulSet deleted with its pods could take the claims along: the
// random runs' fault "StatefulSet deleted with its pods" must lose nothing all the same.
func (w *simWorld) claimsDeletedWithCluster() {
	if w.storage() {
		w.cluster.Spec.StorageSpec.WhenDeleted = v1alpha1.PVCDelete
		w.cluster.Generation++
	}
}

// TestClaimsFollowRetentionPolicy: claims go with the planner's scale-in and, under
// whenDeleted: Delete, with the cluster's teardown; under Retain they outlive the cluster's
// deletion. Nothing else deletes one: not the StatefulSet deleted, not its replicas dropped.
func TestClaimsFollowRetentionPolicy(t *testing.T) {
	t.Run("scaled away", func(t *testing.T) {
		w, _ := created(t, 3, true)
		w.resize(1)
		if len(w.data) != 1 || w.data[0] == nil {
			t.Fatalf("claims after scaling 3→1: %v", sortedInts(w.data))
		}
	})
	for _, policy := range []v1alpha1.PVCRetention{v1alpha1.PVCRetain, v1alpha1.PVCDelete} {
		t.Run("cluster deleted, "+string(policy), func(t *testing.T) {
			w, _ := created(t, 3, true)
			w.edit(func(w *simWorld) { w.cluster.Spec.StorageSpec.WhenDeleted = policy })
			ts := metav1.NewTime(w.now)
			w.cluster.DeletionTimestamp, w.faulty = &ts, true
			// No world checks: deleting the data with the cluster is the person's decision.
			for i := 0; i < 20 && !w.finalized; i++ {
				w.sync()
				w.tick()
			}
			if !w.finalized || len(w.pods) != 0 {
				t.Fatalf("teardown not done: %s", w.describe())
			}
			if kept := len(w.data); policy == v1alpha1.PVCRetain && kept != 3 || policy == v1alpha1.PVCDelete && kept != 0 {
				t.Fatalf("whenDeleted: %s keeps %d claims", policy, kept)
			}
		})
	}
	// A StatefulSet deleted behind the planner's back, under whenDeleted: Delete, leaves the
	// claims: the policy it is rendered with retains them, and only the teardown sets it to
	// Delete. The planner re-creates it and every member comes back on its data.
	t.Run("StatefulSet deleted behind the planner's back", func(t *testing.T) {
		w, _ := created(t, 3, true)
		w.edit(func(w *simWorld) { w.cluster.Spec.StorageSpec.WhenDeleted = v1alpha1.PVCDelete })
		// Every pod goes with it at once: availability is lost by the person, not the data.
		w.faulty = true
		w.deleteChild("statefulset", false)
		w.run(100)
		if len(w.data) != 3 {
			t.Fatalf("claims %v: a StatefulSet deleted under whenDeleted: Delete took claims along", sortedInts(w.data))
		}
	})
	// Replicas dropped by hand below members that hold data keep their claims: the policy
	// deletes a scaled-away claim only while the planner shrinks past removed members.
	t.Run("replicas dropped by hand", func(t *testing.T) {
		w, _ := created(t, 3, true)
		w.sts.replicas = 1
		w.run(100)
		if len(w.data) != 3 {
			t.Fatalf("claims %v after replicas were dropped to 1 by hand", sortedInts(w.data))
		}
	})
	t.Run("StatefulSet deleted orphaning its pods", func(t *testing.T) {
		w, _ := created(t, 3, true)
		w.edit(func(w *simWorld) { w.cluster.Spec.StorageSpec.WhenDeleted = v1alpha1.PVCDelete })
		w.deleteChild("statefulset", true)
		w.run(100)
		if len(w.data) != 3 {
			t.Fatalf("an orphaning deletion lost claims: %v left", sortedInts(w.data))
		}
	})
}

// TestMemberOnAnotherClustersClaimIsNotReplaced: a voter's pod comes back on a claim that holds
// another cluster's data (a claim bound by hand to an old volume). Its launcher refuses; a
// replacement would mount the same claim and refuse the same way, so the member is reported
// (PodCannotStart) and kept, however long its pod crash-loops.
func TestMemberOnAnotherClustersClaimIsNotReplaced(t *testing.T) {
	w, _ := created(t, 3, true)
	w.faulty = true
	w.data[2] = &simData{id: 0xdead, token: "default/etcd/uid-0"}
	w.pods[2].terminating = true
	var d Decision
	for i := 0; i < 80; i++ {
		d = w.step()
		if d.Action.Type == RemoveMember || len(w.members) != 3 {
			t.Fatalf("sync %d: %s: %s\n%s", i, actionLine(d.Action), strings.Join(lastN(w.log, 5), "\n"), w.describe())
		}
		w.now = w.now.Add(20 * time.Second)
	}
	deg := apimeta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionDegraded)
	if d.Action.Type != Hold || deg == nil || deg.Reason != ReasonPodCannotStart || !strings.Contains(deg.Message, "default/etcd/uid-0") {
		t.Fatalf("last: %s; Degraded %+v", actionLine(d.Action), deg)
	}
	if got := w.data[2]; got.token != "default/etcd/uid-0" || got.id != 0xdead {
		t.Fatalf("the other cluster's data changed: %+v", got)
	}
}

// TestLearnerOnAnotherClustersClaimIsKept: a scale-out whose new ordinal's claim holds another
// cluster's data. The learner's launcher refuses; the learner is reported and kept, not
// removed and added again every grace period.
func TestLearnerOnAnotherClustersClaimIsKept(t *testing.T) {
	w, _ := created(t, 3, true)
	w.data[3] = &simData{id: 0xdead, token: "default/etcd/uid-0"}
	w.cluster.Spec.Size = ptrTo(int32(4))
	w.cluster.Generation++
	var d Decision
	for i := 0; i < 80; i++ {
		d = w.step()
		if d.Action.Type == RemoveMember {
			t.Fatalf("sync %d: %s\n%s", i, actionLine(d.Action), w.describe())
		}
		w.now = w.now.Add(20 * time.Second)
	}
	if d.Action.Type != Hold || !strings.Contains(d.Action.Reason, "learner etcd-3 cannot start (its launcher refuses: "+joinstate.ForeignCluster+"default/etcd/uid-0") {
		t.Fatalf("last: %s", actionLine(d.Action))
	}
}
