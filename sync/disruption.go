package sync

// The PodDisruptionBudget counts a pod as disrupted only once the disruption controller has
// seen it not Ready or terminating. A step of the operator's own that takes a member down
// (a pod replaced, a member removed, leadership moved before either, a defragmentation that
// makes its member unready, a pod deleted for its file system to grow) does so only after its answer is applied, and through a Job or
// the StatefulSet controller the budget knows nothing of: a drain that evicts in between is
// allowed a second member. So the answer that starts such a step, and every answer while its
// Job runs, allow no voluntary disruption at all. A changed budget also refuses evictions
// until the disruption controller has processed it (status.observedGeneration), so the
// budget closes as soon as the answer lands. Once the member is down, the budget's own count
// of unready pods keeps it closed; afterwards it allows what quorum can spare again.

// budgetClosed: the budget allows no voluntary disruption for step s. Besides a step that
// disrupts, a cluster without volumes closes it while a learner joins: a learner that has
// started holds data only its pod has, and is not established yet, so the launcher cannot tell
// its evicted pod's empty replacement from a new member and starts it again as the same
// member, which etcd does not survive (it panics: tocommit out of range).
func (v *view) budgetClosed(s step) bool {
	return s.disrupts() || v.c.Spec.StorageSpec == nil && len(v.learners()) > 0
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
