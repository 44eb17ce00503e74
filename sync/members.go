package sync

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/joinstate"
)

// The membership's fixes: quorum lost, a member and its pod apart, learners, failed voters
// (phases 7, 11, 13, 14 and 16 of planner.change).

// quorumLost: with quorum lost no membership change can commit, and guessing is how data is lost. Only a
// person restores from a snapshot or forces a new cluster from the most up-to-date member.
// Voters only the hook cannot reach may be what is missing: then quorum is unconfirmed, not
// lost, and said so.
func (p *planner) quorumLost() (step, bool) {
	// A member with a CORRUPT alarm that answers still takes part in raft: the alarm stops
	// reads and writes, not membership changes, which is how it is replaced (failedMember).
	corrupt := p.filter(func(m *member) bool { return !m.IsLearner && m.Reachable && hasAlarm(m.Member, "CORRUPT") })
	voters, healthy := len(p.voters()), p.healthyVoters()+len(corrupt)
	if etcdstate.HasQuorum(voters, healthy) {
		return step{}, false
	}
	if silent := p.unansweredVoters(); etcdstate.HasQuorum(voters, healthy+len(silent)) {
		pods := "their pods are Ready"
		if slices.ContainsFunc(silent, func(m *member) bool { return nodeNotReporting(m.pod) }) {
			pods = "their pods are Ready or marked not Ready only by the node controller"
		}
		reason := fmt.Sprintf("quorum not confirmed: %d of %d voters answered healthy; %s did not answer the hook, but %s; nothing is changed until they answer",
			healthy, voters, memberNames(silent), pods)
		s := p.hold(reason, reason)
		s.degradedBy = ReasonQuorumUnconfirmed
		return s, true
	}
	if s, ok := p.recoverQuorum(); ok {
		return s, true
	}
	reason := fmt.Sprintf("quorum lost: %d of %d voters healthy; no membership change can commit: restore from a snapshot, or recover from the most up-to-date member (annotation %s=<member>, or spec.recovery.quorumLoss: ForceNewCluster)",
		healthy, voters, v1alpha1.AnnotationForceNewClusterFrom)
	if types := p.unplacedAlarms(); len(types) > 0 {
		// The most up-to-date member may be the corrupt one: forced, its data would stay.
		reason = fmt.Sprintf("quorum lost: %d of %d voters healthy, under a %s alarm of member 0 (etcd cannot tell which member is at fault); no membership change can commit: find the member whose hash differs before anything is recovered (docs/runbooks.md)",
			healthy, voters, strings.Join(types, ", "))
	}
	s := p.hold(reason, reason)
	s.degradedBy = ReasonQuorumLost
	return s, true
}

// memberWithoutPod: a member whose ordinal the StatefulSet does not reach has no pod: a scale-out was
// interrupted between adding the member and growing the StatefulSet. Finish it.
func (p *planner) memberWithoutPod() (step, bool) {
	if going := p.oldPodsGoing(); len(going) > 0 {
		// Not rendered meanwhile (view.oldPodsGoing says why): growing it is all there is to do.
		return p.wait("", "the StatefulSet was deleted with its pods ("+strings.Join(going, ", ")+
			"): it is created again once they are gone, so that it creates every pod at once", resyncSoon), true
	}
	top := p.maxMemberOrdinal()
	if top < p.replicas {
		return step{}, false
	}
	return p.scaleTo(top+1, PodName(p.c.Name, top), fmt.Sprintf("member %s has no pod: growing the StatefulSet to %d", PodName(p.c.Name, top), top+1)), true
}

// learner: a learner is removed when the cluster no longer wants it (a scale-in met it joining),
// promoted once caught up, removed when stuck, waited for otherwise. It is handled before
// anything else can add a member: etcd allows one learner. A learner is stuck only when its
// pod runs and it still does not catch up: one the hook cannot reach while its pod is Ready,
// or whose pod cannot start, is reported and kept; replacing it would change nothing.
func (p *planner) learner() (step, bool) {
	ls := p.learners()
	if len(ls) == 0 {
		return step{}, false
	}
	l := ls[0]
	if l.ordinal >= p.target {
		return p.runJob(memberJob{verb: verbRemove, member: l.name, id: l.ID}, RemoveMember,
			fmt.Sprintf("learner %s is beyond the size of %d: removing it before it is promoted", l.name, p.size)), true
	}
	if l.pod != nil && !isTerminating(l.pod) && p.outdated(l.pod) && (p.c.Spec.StorageSpec != nil || !l.Started()) && !l.unanswered() && p.canReplace(l.ordinal) {
		// Config update early: the joining member starts from the current spec rather than
		// being replaced again right after it joined. A learner does not vote: safe. A learner
		// that started without a volume would lose its data with the pod (see podWithoutMember): it is rolled
		// once promoted. One only the hook cannot reach is not recreated on that view (below).
		return p.replacePod(l.ordinal, l.name, "learner "+l.name+" runs an outdated pod: recreating it from the current spec"), true
	}
	if id, ok := p.removedRunning(l.ordinal); ok && l.pod != nil && !isTerminating(l.pod) {
		// The pod still runs the member it had before: the learner cannot start there.
		return p.restartRemoved(l.ordinal, id, "learner "+l.name+" can start there"), true
	}
	if s, ok := p.joinVolume(l.ordinal, "learner "+l.name); ok && !l.unanswered() {
		// Added before its claim was (an older hook, a claim lost since): the snapshot may not
		// fit, so the claim grows while it waits.
		return s, true
	}
	if p.leader != nil && isCaughtUp(l.Member, p.leader.Member) {
		if !etcdstate.QuorumAfterPromotion(len(p.voters()), p.healthyVoters()) {
			return p.wait(l.name, "learner "+l.name+" caught up, but promoting it now would leave the larger cluster without a healthy quorum", resyncHold), true
		}
		return p.runJob(memberJob{verb: verbPromote, member: l.name, id: l.ID}, PromoteLearner, "learner "+l.name+" caught up with the leader"), true
	}
	if l.unanswered() {
		why, by := l.unansweredWhy()
		view := "the hook's"
		if by == ReasonNodeNotReporting {
			view = "the node controller's"
		}
		reason := fmt.Sprintf("learner %s has not answered the hook since %s, though %s: it is kept, not removed on %s view alone",
			l.name, p.unansweredSince(l).UTC().Format(time.RFC3339), why, view)
		return p.blocked(l.name, reason, by), true
	}
	if l.pod != nil {
		if why := p.cannotStart(l.pod); why != "" {
			reason := "learner " + l.name + " cannot start (" + why + "): it is kept until its pod can start; fix the spec or the nodes"
			return p.blocked(l.name, reason, ReasonPodCannotStart), true
		}
	}
	if why := p.stuckReason(l); why != "" {
		return p.runJob(memberJob{verb: verbRemove, member: l.name, id: l.ID}, RemoveMember, "learner "+l.name+" is stuck ("+why+"): removing it"), true
	}
	// No raft indexes in the reason: they move on every sync and status would churn.
	progress := "not started"
	switch {
	case l.pod != nil && l.pod.Status.Phase == corev1.PodPending:
		progress = "its pod is Pending"
	case l.Started():
		progress = "started, behind the leader"
	}
	return p.wait(l.name, "learner "+l.name+" catching up ("+progress+")", resyncSoon), true
}

// stuckReason says why a learner is beyond waiting for, or "". Only time counts, and only
// from when its etcd runs (runningSince): a pod still Pending (scheduling, attaching its
// volume, pulling its image) is not the learner's failure. A learner that keeps applying
// entries (a large database takes long) is not stuck either: the wait runs from its last
// progress.
func (p *planner) stuckReason(l *member) string {
	if idle, ok := p.learnerIdle(l); ok && idle >= stuckAfter {
		return "nothing applied for " + stuckAfter.String() + " while running"
	}
	return ""
}

// podWithoutMember: a pod without a member: a member was removed to be replaced or rolled (finish it: the
// member is added back as a learner, with a new incarnation), or a scale-in between the
// removal and the shrink, or a learner was given up (undo: shrink to the members; a missing
// member within the StatefulSet's size is added back first).
//
// A member's data may be started only once per incarnation: without a volume, a pod
// recreated after its member started comes back empty, and the member would start again with
// none of the log the cluster already sent it. So the pod comes first: one going away is
// waited for, an outdated one is recreated from the current spec (its launcher waits, as the
// join state does not list it), and only then is the member added back, once, on the pod it
// keeps. An outdated pod that cannot be recreated yet gets its learner all the same; it is
// rolled later like any member.
func (p *planner) podWithoutMember() (step, bool) {
	free, missing := p.freeOrdinal()
	if missing && free < p.replicas {
		name := PodName(p.c.Name, free)
		pod := p.pods[free]
		switch {
		case pod == nil || isTerminating(pod):
			return p.wait(name, "pod "+name+" has no member and is being recreated: adding it back once the pod is there", resyncSoon), true
		case p.outdated(pod) && p.canReplace(free):
			return p.replacePod(free, name, "pod "+name+" has no member: recreating it from the current spec before adding it back"), true
		}
		if id, ok := p.removedRunning(free); ok {
			return p.restartRemoved(free, id, "its member can be added back there"), true
		}
		return p.addLearner(free, fmt.Sprintf("pod %s has no member: adding it back as a learner", name)), true
	}
	// Every ordinal below free has a member, so keep is at least free: the shrink never
	// drops the slot a missing member is added back into.
	keep := p.maxMemberOrdinal() + 1
	if p.replicas <= keep {
		return step{}, false
	}
	return p.scaleTo(keep, PodName(p.c.Name, keep), fmt.Sprintf("pods from %s on hold no member: shrinking the StatefulSet to %d", PodName(p.c.Name, keep), keep)), true
}

// restartRemoved restarts the pod at ord, on which member id, removed from the cluster, still
// runs (removedRunning): cut off from its peers, its etcd never heard of its removal, and the
// member the pod is for can start only once that etcd stops. The pod is deleted by the UID
// observed, through a restart-pod Job; no member of the cluster runs there, so no quorum is
// touched and etcd is not asked first. Without a volume the Job's account is not rendered: a
// person deletes the pod, which loses nothing either.
func (p *planner) restartRemoved(ord int, id uint64, then string) step {
	name := PodName(p.c.Name, ord)
	why := fmt.Sprintf("pod %s still runs member %x, removed from the cluster: that etcd has not heard of its removal (cut off from its peers)", name, id)
	if p.c.Spec.StorageSpec == nil {
		return p.blocked(name, why+"; delete the pod (kubectl delete pod "+name+") so that "+then, ReasonRemovedMemberRunning)
	}
	return p.runJob(memberJob{verb: verbRestartPod, member: name, podUID: string(p.pods[ord].UID)}, RestartPod, why+": restarting the pod so that "+then)
}

// failedMember: a voter only the hook cannot reach, while its pod is Ready, is unknown, not failed: it
// is reported and never replaced, however long it lasts. An unhealthy voter on an outdated pod
// is first recreated from the current spec (that alone may fix it, and its volume keeps the
// data), leadership moved away first. A failed voter is replaced while quorum holds:
// leadership is moved away and the member removed. Its pod then has no member and is added
// back as a learner (podWithoutMember) with a new incarnation, so it starts from an empty data dir. An
// unhealthy member that may still recover is waited for.
func (p *planner) failedMember() (step, bool) {
	var waiting *step
	voters := p.voters()
	for i := len(voters) - 1; i >= 0; i-- {
		m := voters[i]
		if m.Healthy {
			continue
		}
		if m.unanswered() && !hasAlarm(m.Member, "CORRUPT") {
			if waiting == nil {
				why, by := m.unansweredWhy()
				reason := fmt.Sprintf("member %s has not answered the hook since %s, though %s: it is not replaced on the hook's view alone; check the network between the hook and the pod",
					m.name, p.unansweredSince(m).UTC().Format(time.RFC3339), why)
				if by == ReasonNodeNotReporting {
					reason = fmt.Sprintf("member %s has not answered the hook since %s, though %s: it is not replaced on the node controller's view alone; check the node",
						m.name, p.unansweredSince(m).UTC().Format(time.RFC3339), why)
				}
				s := p.blocked(m.name, reason, by)
				waiting = &s
			}
			continue
		}
		if p.c.Spec.StorageSpec != nil && m.pod != nil && !isTerminating(m.pod) && p.outdated(m.pod) && p.canReplace(m.ordinal) {
			// Config update early: it is down anyway, and the current spec may be its fix.
			if m == p.leader {
				if s, ok := p.moveLeader(m, "unhealthy member "+m.name+" leads and is to be recreated"); ok {
					return s, true
				}
			}
			return p.replacePod(m.ordinal, m.name, "member "+m.name+" unhealthy on an outdated pod: recreating it from the current spec"), true
		}
		why := p.failureReason(m)
		if why == "" {
			if waiting == nil {
				reason := "member " + m.name + " unhealthy: waiting for it to recover"
				s := p.wait(m.name, reason, resyncHold)
				switch {
				case m.pod == nil || isTerminating(m.pod):
					s.action.Reason = "member " + m.name + " unhealthy: its pod is being recreated"
				case p.cannotStart(m.pod) != "":
					// A replacement would fail the same way: the spec, the nodes or the volume
					// must change.
					s = p.blocked(m.name, "member "+m.name+" unhealthy: its pod cannot start ("+p.cannotStart(m.pod)+")", ReasonPodCannotStart)
				}
				waiting = &s
			}
			continue
		}
		if m == p.leader {
			if s, ok := p.moveLeader(m, "failed member "+m.name+" leads"); ok {
				return s, true
			}
		}
		if !etcdstate.QuorumAfterRemoval(len(voters), p.healthyVoters()) {
			return p.wait(m.name, "member "+m.name+" failed ("+why+"), but removing it would leave no healthy quorum", resyncHold), true
		}
		return p.runJob(memberJob{verb: verbRemove, member: m.name, id: m.ID}, RemoveMember, "member "+m.name+" failed ("+why+"): removing it to replace it"), true
	}
	if waiting != nil {
		return *waiting, true
	}
	return step{}, false
}

// failureReason says why an unhealthy member is beyond waiting for, or "". Only etcd's own
// evidence counts: a CORRUPT alarm, a pod that keeps crashing, or a member unhealthy for the
// grace period while its pod is not Ready or it answered with errors. The grace period runs
// from the member's own record (unhealthySince), not from the current action, which any other
// step restarts. It is also the age of its current pod: the wait began when the member went
// unhealthy, perhaps on a pod since recreated (a node gone, its pod deleted), and a new pod
// whose volume is still attaching gets the whole period before its member's data is given up
// on. That age is read from the API server's clock, so it has the skew margin.
func (p *planner) failureReason(m *member) string {
	switch {
	case hasAlarm(m.Member, "CORRUPT"):
		return "CORRUPT alarm"
	case m.pod == nil || isTerminating(m.pod) || p.cannotStart(m.pod) != "":
		// Its pod is being (re)created, with the same volume and identity; or it cannot start,
		// and neither could a replacement on the same claim: its data there is intact.
		return ""
	case strings.HasPrefix(launcherRefusal(m.pod), joinstate.DataLost):
		// Its pod's own report: its claim no longer holds its data, and no wait brings it back.
		return "its launcher refuses: " + launcherRefusal(m.pod)
	case isCrashLooping(m.pod):
		return "its pod keeps crashing"
	case p.defragmenting(m):
		// etcd holds a member's backend for a whole defragmentation, minutes on a large
		// database: unhealthy then is the operator's own maintenance, not a failure. A
		// defragmentation that never ends exhausts its Job's attempts and waits for a person.
		return ""
	}
	if since, ok := p.unhealthySince(m); ok && p.obs.Now.Sub(since) >= stuckAfter && p.elapsedSince(m.pod.CreationTimestamp.Time) >= stuckAfter {
		return "unhealthy for " + stuckAfter.String()
	}
	return ""
}

// defragmenting: the maintenance in progress is defragmenting m (status.maintenance).
func (p *planner) defragmenting(m *member) bool {
	r := p.obs.Cluster.Status.Maintenance
	return r != nil && r.Phase == phaseDefragmenting && r.Member == m.name
}
