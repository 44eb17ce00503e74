package sync

import (
	"fmt"
	"math"
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
//	Chosen      the survivor is recorded (the reachable voter with the highest raft index, or
//	            the one the annotation names), and the join state fences every other member:
//	            their launchers wait instead of starting on data of the lost quorum
//	Fencing     the join ConfigMap carries the fences. A fence in a mounted file reaches a pod
//	            only when its kubelet refreshes the file, a minute or two late, and never
//	            reaches an etcd that already runs; so the survivor is not told to force until
//	            every other voter's pod reports its etcd not running and the fences have stood
//	            for fenceMountDelay since first seen in the ConfigMap
//	Forcing     the join state also tells the survivor to force a new cluster on its next
//	            start. Its liveness probe fails until its volume records the recovery, so the
//	            kubelet restarts it; its launcher still refuses while another member answers
//	            on its peer URL
//	Done        etcd lists the survivor alone, with quorum: the others have no member and are
//	            added back with new incarnations, so their old data is wiped
//	Withdrawing quorum came back under the old membership while the survivor was told to
//	            force: the force is taken out of the join state, but the fences stand until
//	            the survivor's mounted file cannot still carry it (fenceMountDelay)
//	Cancelled   quorum came back before the survivor was told to force, or the withdrawal
//	            is complete
//
// Automatic recovery waits spec.recovery.after with quorum lost, and acts only when the
// kubelet reports every other voter's etcd not running: a voter whose etcd may still run (a
// partitioned node) could come back with a quorum of its own. A terminating pod is no such
// report, nor a pod missing from the observation: a pod evicted from, or force-deleted off, a
// node that stopped answering may still run there.

// Recovery triggers and phases, as status.recovery records them.
const (
	triggerAutomatic  = "Automatic"
	triggerAnnotation = "Annotation"

	recoveryChosen      = "Chosen"
	recoveryFencing     = "Fencing"
	recoveryForcing     = "Forcing"
	recoveryDone        = "Done"
	recoveryWithdrawing = "Withdrawing"
	recoveryCancelled   = "Cancelled"
)

// fenceMountDelay bounds how late a kubelet refreshes a mounted ConfigMap: its sync period
// (1m) plus its cache's time to live (1m by default), with a margin.
const fenceMountDelay = 3 * time.Minute

// recoverQuorum is quorumLost's step when quorum is lost: the next step of a recovery that is
// wanted, or ok false.
func (p *planner) recoverQuorum() (step, bool) {
	cur := p.recovery
	if cur != nil {
		switch cur.Phase {
		case recoveryChosen, recoveryFencing:
			if p.stillWanted(cur) {
				return p.fence(cur), true
			}
		case recoveryForcing:
			s := p.wait(cur.Survivor, fmt.Sprintf("recovering quorum from %s: it restarts with --force-new-cluster once its pod reads the join state, unless another member still answers; the others are fenced", cur.Survivor), resyncSoon)
			s.action.Type = RecoverQuorum
			return s, true
		case recoveryWithdrawing:
			if until := cur.Since.Add(fenceMountDelay); p.obs.Now.Before(until) {
				reason := fmt.Sprintf("quorum lost while the recovery from %s is withdrawn: the others stay fenced until %s, when %s's pod can no longer read the force", cur.Survivor, until.UTC().Format(time.RFC3339), cur.Survivor)
				s := p.blocked(cur.Survivor, reason, ReasonQuorumLost)
				s.resync = p.resyncAt(until)
				return s, true
			}
			// Withdrawn: the survivor's pod no longer reads the force. A new recovery may start.
			cur = p.cancelled(cur)
		}
	}
	trigger, survivor, why := p.recoveryWanted(cur)
	if survivor == nil {
		if cur != nil && (cur.Phase == recoveryChosen || cur.Phase == recoveryFencing) {
			// The survivor was never told to force: dropping the fences is safe.
			cur = p.cancelled(cur)
		}
		// A cancellation is recorded whatever the sync decides.
		recorded := step{}
		if cur != p.recovery {
			recorded.recovery = cur
		}
		if why == "" {
			return recorded, false
		}
		s := p.blocked("", why, ReasonQuorumLost)
		s.records(recorded)
		return s, true
	}
	id := fmt.Sprintf("%x", survivor.ID)
	r := &v1alpha1.RecoveryStatus{
		Survivor: survivor.name, ID: id, RaftIndex: survivor.RaftIndex, Trigger: trigger, Phase: recoveryChosen,
		Token: fmt.Sprintf("%s-%d", id, p.obs.Now.Unix()), Since: metav1.NewTime(p.obs.Now),
	}
	s := p.base(Action{Type: RecoverQuorum, Member: survivor.name, Reason: fmt.Sprintf("quorum lost: recovering from %s, the surviving member with the highest raft index (%d); recorded, and the others fenced, before anything else is done", survivor.name, survivor.RaftIndex)}, resyncSoon)
	s.degraded, s.degradedBy = s.action.Reason, ReasonQuorumLost
	s.recovery = r
	return s, true
}

// cancelled is recovery r cancelled now.
func (p *planner) cancelled(r *v1alpha1.RecoveryStatus) *v1alpha1.RecoveryStatus {
	c := *r
	c.Phase, c.Since = recoveryCancelled, metav1.NewTime(p.obs.Now)
	return &c
}

// stillWanted: the recovery recorded is still asked for, from a survivor that is still the
// voter it was.
func (p *planner) stillWanted(r *v1alpha1.RecoveryStatus) bool {
	switch r.Trigger {
	case triggerAnnotation:
		if p.c.Annotations[v1alpha1.AnnotationForceNewClusterFrom] != r.Survivor {
			return false
		}
	default:
		if rs := p.c.Spec.Recovery; rs == nil || rs.QuorumLoss != v1alpha1.QuorumLossForceNewCluster {
			return false
		}
	}
	for _, m := range p.voters() {
		if m.name == r.Survivor && fmt.Sprintf("%x", m.ID) == r.ID {
			return true
		}
	}
	return false
}

// fence is the step of a recovery whose fences are rendered: Fencing once the join ConfigMap
// is seen to carry them (the clock restarts whenever it is seen without them), Forcing once
// they have reached every other voter.
func (p *planner) fence(cur *v1alpha1.RecoveryStatus) step {
	r := *cur
	if !p.observedFences(&r) {
		if r.Phase != recoveryChosen {
			r.Phase, r.Since = recoveryFencing, metav1.NewTime(p.obs.Now)
		}
		s := p.wait(r.Survivor, fmt.Sprintf("recovering quorum from %s: waiting for the join ConfigMap to carry the fences on the other members", r.Survivor), resyncSoon)
		s.action.Type = RecoverQuorum
		s.degraded, s.degradedBy = s.action.Reason, ReasonQuorumLost
		s.recovery = &r
		return s
	}
	if r.Phase == recoveryChosen {
		r.Phase, r.Since = recoveryFencing, metav1.NewTime(p.obs.Now)
	}
	if why, until := p.fenceUnreached(&r); why != "" {
		s := p.wait(r.Survivor, fmt.Sprintf("recovering quorum from %s: not forcing a new cluster until the fences reach every other member: %s", r.Survivor, why), resyncHold)
		s.action.Type = RecoverQuorum
		s.degraded, s.degradedBy = s.action.Reason, ReasonQuorumLost
		if !until.IsZero() {
			s.resync = p.resyncAt(until)
		}
		s.recovery = &r
		return s
	}
	// The survivor's data is what the new cluster will hold: a snapshot of it first (guard.go).
	guard, wait := p.recoveryGuard(&r)
	if wait {
		if guard.degraded == "" {
			guard.degraded, guard.degradedBy = guard.action.Reason, ReasonQuorumLost
		}
		guard.recovery = &r
		return guard
	}
	r.Phase, r.Since = recoveryForcing, metav1.NewTime(p.obs.Now)
	s := p.wait(r.Survivor, fmt.Sprintf("recovering quorum from %s (raft index %d): the others are fenced; telling it to restart with --force-new-cluster", r.Survivor, r.RaftIndex), resyncSoon)
	s.action.Type = RecoverQuorum
	s.recovery = &r
	s.records(guard)
	return s
}

// resyncAt is the resync that wakes the hook at t: whole seconds, never before it.
func (p *planner) resyncAt(t time.Time) float64 {
	return max(1, math.Ceil(t.Sub(p.obs.Now).Seconds()))
}

// fenceUnreached says which other voters the fences of r may not have reached yet, and when
// the last of them will have been mounted long enough; "" once every one is fenced where its
// etcd runs: its pod reports its etcd not running, and the join ConfigMap has fenced it for
// fenceMountDelay, so that any start reads the fence. A pod that is terminating or missing is
// no such report: its node may have stopped answering, and its etcd may run there still.
func (v *view) fenceUnreached(r *v1alpha1.RecoveryStatus) (why string, until time.Time) {
	var waiting []string
	mounting := 0
	mounted := r.Since.Add(fenceMountDelay)
	for _, m := range v.voters() {
		if m.name == r.Survivor {
			continue
		}
		switch {
		case m.Reachable:
			waiting = append(waiting, m.name+" answers")
		case m.pod == nil:
			waiting = append(waiting, m.name+" has no pod to report its etcd stopped (one deleted off a node that stopped answering may still run there)")
		case isTerminating(m.pod):
			waiting = append(waiting, m.name+"'s pod is terminating (its etcd may run until the pod is gone)")
		case !etcdStopped(m.pod):
			waiting = append(waiting, m.name+"'s pod reports its etcd running")
		case v.obs.Now.Before(mounted):
			waiting = append(waiting, m.name+"'s kubelet may not have mounted the fence yet (until "+mounted.UTC().Format(time.RFC3339)+")")
			mounting++
		}
	}
	if len(waiting) == 0 {
		return "", time.Time{}
	}
	if mounting == len(waiting) {
		// Only time is awaited: the next sync is due when it has passed.
		until = mounted
	}
	return strings.Join(waiting, "; "), until
}

// observedFences: the observed join ConfigMap fences every member but the survivor of r.
func (v *view) observedFences(r *v1alpha1.RecoveryStatus) bool {
	st, ok := v.observedJoinState()
	if !ok {
		return false
	}
	for _, m := range v.members {
		jm, ok := st.Find(m.name)
		if m.name != r.Survivor && (!ok || !jm.Fenced) {
			return false
		}
	}
	return true
}

// observedForce: the observed join ConfigMap still tells the survivor of r to force, or may
// (it is missing or cannot be read).
func (v *view) observedForce(r *v1alpha1.RecoveryStatus) bool {
	st, ok := v.observedJoinState()
	return !ok || st.Recovery != nil && st.Recovery.Token == r.Token
}

func (v *view) observedJoinState() (joinstate.State, bool) {
	if v.join == nil {
		return joinstate.State{}, false
	}
	st, err := joinstate.Decode([]byte(v.join.Data[joinstate.ConfigMapKey]))
	return st, err == nil
}

// recoveryWanted says whether a recovery is asked for and allowed now, and from which member;
// when it is asked for but not allowed, why names the reason.
func (p *planner) recoveryWanted(prev *v1alpha1.RecoveryStatus) (trigger string, survivor *member, why string) {
	if name := p.c.Annotations[v1alpha1.AnnotationForceNewClusterFrom]; name != "" {
		if prev != nil && prev.Trigger == triggerAnnotation && prev.Survivor == name && (prev.Phase == recoveryDone || prev.Phase == recoveryCancelled) {
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
		if m == best {
			continue
		}
		if m.pod == nil {
			return "", nil, fmt.Sprintf("quorum lost; not forcing a new cluster from %s while %s has no pod to report its etcd stopped: one deleted off a node that stopped answering may still run there",
				best.name, m.name)
		}
		if !etcdStopped(m.pod) {
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

// recoveryProgress is how a recovery in progress moves on, whatever else this sync decides;
// nil when it does not. With quorum: Done once etcd lists the survivor alone; otherwise
// Cancelled if the survivor was never told to force, else Withdrawing, and Cancelled only once
// the join ConfigMap has stopped telling it for fenceMountDelay. A withdrawal's clock
// restarts whenever the ConfigMap is seen still telling it, with quorum or without.
func (p *planner) recoveryProgress() *v1alpha1.RecoveryStatus {
	prev := p.safe.recovery
	if prev == nil || prev.Phase == recoveryDone || prev.Phase == recoveryCancelled {
		return nil
	}
	r := *prev
	vs := p.voters()
	quorum := etcdstate.HasQuorum(len(vs), p.healthyVoters())
	alone := len(vs) == 1 && vs[0].name == prev.Survivor
	switch {
	case quorum && alone:
		r.Phase = recoveryDone
	case prev.Phase == recoveryWithdrawing && p.observedForce(prev):
		// Still told to force: the withdrawal's clock restarts.
	case !quorum:
		return nil
	case prev.Phase == recoveryChosen || prev.Phase == recoveryFencing:
		r.Phase = recoveryCancelled
	case prev.Phase == recoveryForcing:
		r.Phase = recoveryWithdrawing
	case prev.Phase == recoveryWithdrawing && !p.obs.Now.Before(prev.Since.Add(fenceMountDelay)):
		r.Phase = recoveryCancelled
	default:
		return nil
	}
	r.Since = metav1.NewTime(p.obs.Now)
	return &r
}

// applyRecovery writes recovery r, as this sync leaves status, into join state st: every
// member but the survivor fenced from Chosen until the recovery is Done or Cancelled, and the
// survivor told to force while Forcing.
func applyRecovery(st *joinstate.State, r *v1alpha1.RecoveryStatus) {
	if r == nil {
		return
	}
	switch r.Phase {
	case recoveryForcing:
		st.Recovery = &joinstate.Recovery{Survivor: r.Survivor, Token: r.Token}
	case recoveryChosen, recoveryFencing, recoveryWithdrawing:
	default:
		return
	}
	for i := range st.Members {
		st.Members[i].Fenced = st.Members[i].Name != r.Survivor
	}
}

// etcdStopped: the kubelet reports the pod's etcd container not running (waiting to start,
// or terminated).
func etcdStopped(pod *corev1.Pod) bool {
	cs := etcdStatus(pod)
	return cs == nil || cs.State.Running == nil
}
