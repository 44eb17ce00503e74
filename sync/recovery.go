package sync

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/joinstate"
)

// Quorum recovery, opt-in (spec.recovery.quorumLoss: ForceNewCluster, or the one-shot
// annotation etcdops.dev/force-new-cluster-from): when quorum is lost, one surviving member is
// restarted once with --force-new-cluster, which makes it a cluster of one with its data, and
// the others are rebuilt from it as learners through the normal path. Each step is recorded
// in status.recovery before the next is taken:
//
//	Chosen   the survivor is recorded (the reachable voter with the highest raft index, or
//	         the one the annotation names); nothing else changes yet
//	Forcing  the join state tells the survivor to force a new cluster on its next start, and
//	         fences every other member (their data belongs to the lost quorum; started, two of
//	         them could form it again beside the recovered cluster). The survivor's liveness
//	         probe fails until its volume records the recovery, so the kubelet restarts it
//	Done     etcd lists the survivor alone, with quorum: the others have no member and are
//	         added back with new incarnations, so their old data is wiped
//	Cancelled quorum came back on its own before the survivor restarted
//
// Automatic recovery waits spec.recovery.after with quorum lost, and acts only when the
// kubelet reports every other voter's etcd not running: a voter whose etcd may still run (a
// partitioned node) could come back with a quorum of its own. A terminating pod is no such
// report: a pod evicted from a node that stopped answering stays terminating, its last
// status saying etcd runs, for as long as the node is away.

// Recovery triggers and phases, as status.recovery records them.
const (
	triggerAutomatic  = "Automatic"
	triggerAnnotation = "Annotation"

	recoveryChosen    = "Chosen"
	recoveryForcing   = "Forcing"
	recoveryDone      = "Done"
	recoveryCancelled = "Cancelled"
)

// recoverQuorum is phase 7a's step when quorum is lost: the next step of a recovery that is
// wanted, or ok false.
func (p *planner) recoverQuorum() (step, bool) {
	prev := p.obs.Cluster.Status.Recovery
	if prev != nil && prev.Phase == recoveryForcing {
		s := p.wait(prev.Survivor, fmt.Sprintf("recovering quorum from %s: it restarts with --force-new-cluster once its pod reads the join state; the others are fenced", prev.Survivor), resyncSoon)
		s.action.Type = RecoverQuorum
		s.recoveryJoin = &joinstate.Recovery{Survivor: prev.Survivor, Token: prev.Token}
		return s, true
	}
	trigger, survivor, why := p.recoveryWanted()
	if survivor == nil {
		if why == "" {
			return step{}, false
		}
		return p.blocked("", why, ReasonQuorumLost), true
	}
	id := fmt.Sprintf("%x", survivor.ID)
	if prev != nil && prev.Phase == recoveryChosen && prev.Survivor == survivor.name && prev.ID == id {
		r := *prev
		r.Phase, r.Since = recoveryForcing, metav1.NewTime(p.obs.Now)
		s := p.wait(survivor.name, fmt.Sprintf("recovering quorum from %s (raft index %d): telling it to restart with --force-new-cluster, fencing the others", survivor.name, prev.RaftIndex), resyncSoon)
		s.action.Type = RecoverQuorum
		s.recovery = &r
		s.recoveryJoin = &joinstate.Recovery{Survivor: r.Survivor, Token: r.Token}
		return s, true
	}
	r := &v1alpha1.RecoveryStatus{
		Survivor: survivor.name, ID: id, RaftIndex: survivor.RaftIndex, Trigger: trigger, Phase: recoveryChosen,
		Token: fmt.Sprintf("%s-%d", id, p.obs.Now.Unix()), Since: metav1.NewTime(p.obs.Now),
	}
	s := p.hold(fmt.Sprintf("quorum lost: recovering from %s, the surviving member with the highest raft index (%d); recorded before anything is done", survivor.name, survivor.RaftIndex), "")
	s.action.Type, s.action.Member = RecoverQuorum, survivor.name
	s.degraded, s.degradedBy = s.action.Reason, ReasonQuorumLost
	s.recovery = r
	return s, true
}

// recoveryWanted says whether a recovery is asked for and allowed now, and from which member;
// when it is asked for but not allowed, why names the reason.
func (p *planner) recoveryWanted() (trigger string, survivor *member, why string) {
	if name := p.c.Annotations[v1alpha1.AnnotationForceNewClusterFrom]; name != "" {
		if prev := p.obs.Cluster.Status.Recovery; prev != nil && prev.Trigger == triggerAnnotation && prev.Survivor == name && (prev.Phase == recoveryDone || prev.Phase == recoveryCancelled) {
			// One shot: this annotation was acted on.
			return "", nil, ""
		}
		for _, m := range p.voters() {
			if m.name == name && m.Reachable && m.Started() {
				return triggerAnnotation, m, ""
			}
		}
		return "", nil, fmt.Sprintf("quorum lost; %s=%s asks to recover from %s, which is not a voter that answers", v1alpha1.AnnotationForceNewClusterFrom, name, name)
	}
	r := p.c.Spec.Recovery
	if r == nil || r.QuorumLoss != v1alpha1.QuorumLossForceNewCluster {
		return "", nil, ""
	}
	if types := p.unplacedAlarms(); len(types) > 0 {
		return "", nil, fmt.Sprintf("quorum lost under a %s alarm of member 0: not forcing a new cluster, which would keep the data of a member that may be the corrupt one; find the member whose hash differs first (docs/runbooks.md)",
			strings.Join(types, ", "))
	}
	since := p.quorumLostSince()
	if wait := r.After.Duration - p.obs.Now.Sub(since); wait > 0 {
		return "", nil, fmt.Sprintf("quorum lost since %s; spec.recovery forces a new cluster after %s, at %s, if it stays lost",
			since.UTC().Format(time.RFC3339), r.After.Duration, since.Add(r.After.Duration).UTC().Format(time.RFC3339))
	}
	var best *member
	for _, m := range p.voters() {
		if m.Reachable && m.Started() && (best == nil || m.RaftIndex > best.RaftIndex) {
			best = m
		}
	}
	if best == nil {
		return "", nil, "quorum lost and no voter answers: nothing to recover from"
	}
	for _, m := range p.voters() {
		if m != best && m.pod != nil && !etcdStopped(m.pod) {
			return "", nil, fmt.Sprintf("quorum lost; not forcing a new cluster from %s while %s's etcd may still run (its pod reports it running): it could come back with a quorum of its own",
				best.name, m.name)
		}
	}
	return triggerAutomatic, best, ""
}

// quorumLostSince is when status first reported quorum lost, else now.
func (p *planner) quorumLostSince() time.Time {
	for _, c := range p.obs.Cluster.Status.Conditions {
		if c.Type == v1alpha1.ConditionAvailable && c.Status == metav1.ConditionFalse && c.Reason == ReasonQuorumLost && !c.LastTransitionTime.IsZero() {
			return c.LastTransitionTime.Time
		}
	}
	return p.obs.Now
}

// recoveryProgress records how a recovery in progress ended, whatever else this sync decides:
// Done once etcd lists the survivor alone with quorum, Cancelled once quorum came back with
// the other members still there.
func (p *planner) recoveryProgress() {
	prev := p.obs.Cluster.Status.Recovery
	if prev == nil || (prev.Phase != recoveryChosen && prev.Phase != recoveryForcing) || !etcdstate.HasQuorum(len(p.voters()), p.healthyVoters()) {
		return
	}
	r := *prev
	r.Since = metav1.NewTime(p.obs.Now)
	r.Phase = recoveryCancelled
	if vs := p.voters(); len(vs) == 1 && vs[0].name == prev.Survivor {
		r.Phase = recoveryDone
	}
	p.recovery = &r
}

// etcdStopped: the kubelet reports the pod's etcd container not running (waiting to start,
// or terminated).
func etcdStopped(pod *corev1.Pod) bool {
	cs := etcdStatus(pod)
	return cs == nil || cs.State.Running == nil
}
