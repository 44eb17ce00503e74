package sync

import (
	"fmt"

	"etcdops.dev/etcdops/etcdstate"
)

// Rolls and scaling: the normal phases that bring the pods and the membership to the spec
// (18 to 21 of planner.change), one pod or one member at a time.

// configDrift: a pod whose configuration differs from the spec is rolled, highest
// outdated ordinal first. Everything is healthy here: the fix phase waited otherwise.
func (p *planner) configDrift() (step, bool) {
	if !p.anyDrifted() {
		return step{}, false
	}
	return p.roll(p.tlsChange("config drift"))
}

// roll replaces the highest-ordinal outdated pod, once the pods above it are replaced and
// up: one pod at a time, each decided here with quorum and leadership checked, never left to
// the StatefulSet controller. A cluster of two first grows its temporary third member (see
// view.surging). Leadership is moved away first; with a volume the pod is recreated and the
// member restarts on its data; without one the member is removed and added back through a
// learner on a pod recreated in between (podWithoutMember), because its data would not survive the pod.
func (p *planner) roll(why string) (step, bool) {
	target := p.highestOutdated()
	if target < 0 {
		return step{}, false
	}
	name := PodName(p.c.Name, target)
	if p.obs.RollWait != "" {
		return p.wait("", why+": "+name+" is next, waiting for the hook's bound on clusters rolling at once: "+p.obs.RollWait, resyncSteady), true
	}
	if busy, state := p.replacementBlocker(target); state != "" {
		return p.wait(busy, why+": "+name+" is next, waiting while "+state, resyncSoon), true
	}
	m := p.byOrd[target]
	if m == nil {
		// No member lives there: recreating the pod disturbs nobody.
		return p.replacePod(target, name, why+": recreating "+name+", which holds no member"), true
	}
	if len(p.members) < p.target {
		return p.scaleOut()
	}
	if m == p.leader && len(p.voters()) > 1 {
		if s, ok := p.moveLeader(m, why+": "+name+" is next and leads"); ok {
			return s, true
		}
	}
	voters, others := len(p.voters()), p.healthyVoters()-1
	if p.c.Spec.StorageSpec == nil {
		if voters == 1 {
			reason := why + ": " + name + " is the only member and has no volume; recreating it would lose the data (scale to 3 first)"
			s := p.wait(name, reason, resyncSteady)
			s.degraded, s.degradedBy = reason, ReasonNoVolumeToRoll
			return s, true
		}
		if !etcdstate.QuorumAfterRemoval(voters, others) {
			return p.wait(name, why+": removing "+name+" would leave no healthy quorum", resyncHold), true
		}
		return p.runJob(memberJob{verb: verbRemove, member: name, id: m.ID}, RemoveMember, why+": "+name+" has no volume, so it is removed and added back from the current spec"), true
	}
	if !etcdstate.QuorumWhileOneIsDown(voters, others) {
		return p.wait(name, why+": recreating "+name+" would leave no healthy quorum", resyncHold), true
	}
	return p.replacePod(target, name, why+": recreating "+name+" from the current spec"), true
}

// scaleOut: a learner for the lowest free ordinal below the target; the StatefulSet grows
// once etcd has it (memberWithoutPod), and it is promoted once caught up (learner). A free ordinal below the
// size with enough members means one sits beyond the size (a replacement met a scale-in):
// its slot is filled first and the member beyond is removed after (scaleIn), so redundancy never
// drops, and no pod is left over without a member, failing and counting against the
// disruption budget.
func (p *planner) scaleOut() (step, bool) {
	ord, missing := p.freeOrdinal()
	if !missing {
		return step{}, false
	}
	name := PodName(p.c.Name, ord)
	reason := fmt.Sprintf("%d of %d members: adding %s as a learner", len(p.members), p.size, name)
	switch {
	case p.target > p.size:
		reason = fmt.Sprintf("a cluster of %d cannot lose a member to a roll without losing quorum: adding %s as a temporary member, removed once the roll is done", p.size, name)
	case len(p.members) >= p.size:
		reason = fmt.Sprintf("ordinal %d is free below the size: adding %s before removing the member beyond the size", ord, name)
	}
	return p.addLearner(ord, reason), true
}

// addLearner adds the member at ord as a learner, once its claim holds the data (joinVolume).
func (p *planner) addLearner(ord int, reason string) step {
	name := PodName(p.c.Name, ord)
	if s, ok := p.joinVolume(ord, name+" (to be added)"); ok {
		return s
	}
	return p.runJob(memberJob{verb: verbAddLearner, member: name, peerURL: p.newMemberPeerURL(ord)}, AddLearner, reason)
}

// scaleIn: a member beyond the target goes, the highest first, leadership moved away
// first; the StatefulSet then shrinks (podWithoutMember).
func (p *planner) scaleIn() (step, bool) {
	voters := p.voters()
	if len(voters) == 0 || voters[len(voters)-1].ordinal < p.target {
		return step{}, false
	}
	m := voters[len(voters)-1]
	why := fmt.Sprintf("%d of %d members", len(voters), p.size)
	if p.size == 2 && len(voters) == 3 && m.ordinal == 2 {
		why = "the roll is done"
	}
	if m == p.leader {
		if s, ok := p.moveLeader(m, why+": "+m.name+" goes next and leads"); ok {
			return s, true
		}
	}
	if !etcdstate.QuorumAfterRemoval(len(voters), p.healthyVoters()-1) {
		return p.wait(m.name, why+": removing "+m.name+" would leave no healthy quorum", resyncHold), true
	}
	return p.runJob(memberJob{verb: verbRemove, member: m.name, id: m.ID}, RemoveMember, why+": removing "+m.name), true
}

// upgrade: only the etcd version differs (Validate allowed the path); rolled like drift.
func (p *planner) upgrade() (step, bool) {
	if p.versionWait != "" {
		return p.wait("", "upgrade to "+p.c.Spec.Version+" waits: "+p.versionWait, resyncSteady), true
	}
	return p.roll("upgrade to " + p.c.Spec.Version)
}
