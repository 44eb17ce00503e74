package sync

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The PodDisruptionBudget counts a pod as disrupted only once the disruption controller has
// seen it not Ready or terminating. A step of the operator's own that takes a member down
// (a pod replaced, a member removed, leadership moved before either, a defragmentation that
// makes its member unready, a pod deleted for its file system to grow) does so through a Job
// or the StatefulSet controller, which the budget knows nothing of. So while such a step runs
// the budget allows no voluntary disruption at all, and once the member is down, the
// budget's own count of unready pods keeps it closed; afterwards it allows what quorum can
// spare again.
//
// Closing the budget in the answer that starts the step is not enough, for two reasons.
// The hook plans from a view taken before its answer lands: an eviction the open budget
// allows in between takes a member down that the view still counts, and the step takes a
// second (a drain during a roll did, in the end-to-end suite). And Metacontroller applies an
// answer's children by API group, apps and batch before policy: the StatefulSet's lower
// partition or the step's Job lands before the closed budget. So a step that takes a member
// down starts only in a sync that sees the budget closed as the disruption controller
// counted it after closing (budgetFenced); until then the sync closes it and waits. From
// then no eviction goes through, and one that went through before shows in that count.

// budgetClosed: the budget allows no voluntary disruption for step s. Besides a step that
// disrupts, a cluster without volumes closes it while a learner joins: a learner that has
// started holds data only its pod has, and is not established yet, so the launcher cannot tell
// its evicted pod's empty replacement from a new member and starts it again as the same
// member, which etcd does not survive (it panics: tocommit out of range).
//
// Once closed, the budget stays closed until the cluster is steady again or the planner holds
// for a person: a step between two that take members down (a compaction, a wait for a pod)
// does not open it, or a drain would take the member the next step needs, and that step
// would be fenced again and again.
func (v *view) budgetClosed(s step) bool {
	if s.action.Type != Steady && s.action.Type != Hold && closed(v.observedBudget()) {
		return true
	}
	return s.closesBudget || s.disrupts() || v.c.Spec.StorageSpec == nil && len(v.learners()) > 0
}

// disrupts: the step takes a member down, or waits on a Job that does.
func (s step) disrupts() bool {
	if s.action.Type == ReplacePod || s.job != nil && disruptingVerb(s.job.verb) {
		return true
	}
	for _, j := range s.keep {
		if state, _ := stateOf(j); state != jobFailed && disruptingVerb(j.Labels[LabelAction]) {
			return true
		}
	}
	return false
}

// disruptingVerb: a member Job of this verb takes a member down, or prepares to (leadership
// is moved only off a member about to be disturbed).
func disruptingVerb(verb string) bool {
	switch verb {
	case verbRemove, verbMoveLeader, verbDefragment, verbRestartPod:
		return true
	}
	return false
}

// startsDisruption: step s, as rendered with job, is the answer that takes a serving member
// down: it lowers the partition onto a Ready pod, or creates a Job that removes, restarts or
// defragments the member of one. A member already down (a repair) loses the cluster nothing
// more, and leadership moved first takes nothing down (the budget closes with it, and the
// step after it is fenced); a roll forward (no pod serves, no quorum is left) is not fenced.
func (v *view) startsDisruption(s step, job *Child) bool {
	if s.hold {
		return false
	}
	switch {
	case s.action.Type == ReplacePod:
	case s.job == nil || s.job.verb == verbMoveLeader || !disruptingVerb(s.job.verb):
		return false
	default:
		for _, j := range v.jobs {
			if j.Name == job.Name {
				return false
			}
		}
	}
	for _, p := range v.pods {
		if p.Name == s.action.Member {
			return readyToStay(p)
		}
	}
	return false
}

// budgetFenced: the observed budget is closed (minAvailable 100%), the disruption controller
// has counted it since it changed, that count found as many pods healthy as the planner sees
// Ready, and no eviction is pending in it. The API server refuses every eviction from then;
// one it allowed before is in the count (its pod terminating, or listed in disruptedPods
// until the controller sees it go). Otherwise it says why not.
func (v *view) budgetFenced() (bool, string) {
	pdb := v.observedBudget()
	ready := 0
	for _, p := range v.pods {
		if readyToStay(p) {
			ready++
		}
	}
	switch {
	case pdb == nil:
		return false, "the PodDisruptionBudget is not there yet"
	case !closed(pdb):
		return false, "closing the PodDisruptionBudget"
	case pdb.Status.ObservedGeneration < pdb.Generation:
		return false, "the PodDisruptionBudget is closed, the disruption controller has yet to count it"
	case len(pdb.Status.DisruptedPods) > 0:
		return false, fmt.Sprintf("the PodDisruptionBudget lists %d pod(s) evicted and not yet gone", len(pdb.Status.DisruptedPods))
	case int(pdb.Status.CurrentHealthy) < ready:
		return false, fmt.Sprintf("the disruption controller counts %d healthy pod(s) where %d are Ready", pdb.Status.CurrentHealthy, ready)
	}
	return true, ""
}

// observedBudget is the cluster's PodDisruptionBudget as observed, nil when there is none.
func (v *view) observedBudget() *policyv1.PodDisruptionBudget {
	for i := range v.obs.Children.PDBs {
		if b := &v.obs.Children.PDBs[i]; b.Name == PDBName(v.c.Name) {
			return b
		}
	}
	return nil
}

// readyToStay: the pod is Ready and not going away, as the disruption controller counts a
// healthy pod.
func readyToStay(p *corev1.Pod) bool { return isReady(p) && !isTerminating(p) }

// closed: the budget asks for every pod (minAvailable 100%), as the planner closes it.
func closed(pdb *policyv1.PodDisruptionBudget) bool {
	return pdb != nil && pdb.Spec.MinAvailable != nil && *pdb.Spec.MinAvailable == intstr.FromString("100%")
}

// fenced is step s, which would take a member down, held back until budgetFenced: the budget
// closed, nothing else changed, the step's member named, resynced soon. The records that say
// the step started (a switchover request served, the member a maintenance works on) stay as
// status had them.
func (v *view) fenced(s step, why string) step {
	w := s
	w.action = Action{Type: Wait, Member: s.action.Member, Reason: fmt.Sprintf("%s before %v %s: %s", why, s.action.Type, s.action.Member, s.action.Reason)}
	if s.job != nil {
		w.maintenance = nil
		if s.switchover == s.job.switchover {
			w.switchover = nil
		}
	}
	w.job = nil
	w.partition = v.protectivePartition()
	w.closesBudget = true
	w.resync = resyncSoon
	return w
}
