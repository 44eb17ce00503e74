package sync

import (
	"fmt"
	"math"
	"time"

	batchv1 "k8s.io/api/batch/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/joinstate"
)

// Resync intervals, in seconds: short while something is about to change, long when steady.
const (
	resyncSoon   = 5
	resyncHold   = 10
	resyncSteady = 60
)

// Plan decides the one next step for an EtcdCluster from one observation and renders the
// complete desired children.
//
// The phases run in the order of the workflow and the first that decides wins, so each later
// phase may assume that the earlier ones found nothing to do:
//
//  1. finalizing          ordered teardown
//  2. invalid spec        report; children unchanged
//  3. paused              report; children unchanged
//  4. bootstrap           Services, join state and a StatefulSet of one seed
//  5. unknown etcd state  hold; children unchanged
//  6. member Job          wait for the one in flight; back off after a failure
//  7. fix                 quorum lost or NOSPACE (report only), a member without its pod,
//     a learner (promote or remove), a pod without its member, a failed member (replace)
//  8. config drift        roll the highest outdated pod once the pods above are up, leader
//     moved away first
//  9. scale out           add a learner at the lowest free ordinal
//  10. scale in           remove the highest member, leader moved away first
//  11. upgrade            roll the highest outdated pod, like config drift
//
// Every decision is checked against the invariants before it is returned (checkInvariants).
func Plan(cfg Config, obs Observed) Decision {
	c := v1alpha1.Defaulted(obs.Cluster)
	if obs.Finalizing {
		// 1. Deletion overrides everything, whatever state the cluster is in.
		return finalize(&obs, &c)
	}
	if err := v1alpha1.Validate(c); err != nil {
		// 2. An invalid spec must not change a running cluster: what exists stays as it is.
		return report(cfg, &obs, &c, v1alpha1.PhaseInvalid, err.Error(), "InvalidSpec")
	}
	if c.Spec.Paused {
		// 3. Paused means no change of any kind, only status.
		return report(cfg, &obs, &c, v1alpha1.PhasePaused, "paused by spec.paused", "")
	}
	if isBootstrapping(&obs) {
		// 4. No cluster yet: there is no membership to observe, only a seed to start.
		return bootstrap(cfg, &obs, &c)
	}
	v := newView(cfg, &obs, &c)
	if reason := unknownState(v); reason != "" {
		// 5. Nothing can be concluded about membership: never shrink, remove or replace on it.
		return v.decision(v.hold(reason, reason))
	}
	// 6 to 11: one step on a cluster whose state is known.
	p := &planner{view: v}
	return v.decision(p.decide())
}

// 1. finalize tears down in order: member Jobs first (no membership change may run into the
// teardown), then the StatefulSet until its pods are gone, then the Services, the join
// ConfigMap and the PodDisruptionBudget. Finalized only once nothing is observed. Volume
// claims follow spec.storageSpec.whenDeleted through the StatefulSet's retention policy.
func finalize(obs *Observed, c *v1alpha1.EtcdCluster) Decision {
	ch := obs.Children
	pods := 0
	for i := range obs.Pods {
		if _, ok := ownPod(c, &obs.Pods[i]); ok {
			pods++
		}
	}
	var keep Children
	var reason string
	switch {
	case len(ch.Jobs) > 0:
		keep = Children{StatefulSets: ch.StatefulSets, Services: ch.Services, ConfigMaps: ch.ConfigMaps, PDBs: ch.PDBs}
		reason = fmt.Sprintf("deleting %d member Job(s)", len(ch.Jobs))
	case len(ch.StatefulSets) > 0 || pods > 0:
		keep = Children{Services: ch.Services, ConfigMaps: ch.ConfigMaps, PDBs: ch.PDBs}
		reason = fmt.Sprintf("deleting the StatefulSet; %d pod(s) left", pods)
	case len(ch.Services)+len(ch.ConfigMaps)+len(ch.PDBs) > 0:
		reason = "deleting the Services, the join ConfigMap and the PodDisruptionBudget"
	default:
		a := Action{Type: Teardown, Reason: "teardown complete"}
		return Decision{Status: newStatus(obs, c, v1alpha1.PhaseDeleting, a), Action: a, Finalized: true}
	}
	a := Action{Type: Teardown, Reason: reason}
	return Decision{
		Children:           observedChildren(keep),
		Status:             newStatus(obs, c, v1alpha1.PhaseDeleting, a),
		Action:             a,
		ResyncAfterSeconds: resyncSoon,
	}
}

// report answers a sync that must change nothing (invalid spec, paused): the observed
// children exactly as they are (not even a missing Service is added) and a status that says
// why, with membership as far as etcd answered. degradedBy, when set, makes the reason a
// Degraded one.
func report(cfg Config, obs *Observed, c *v1alpha1.EtcdCluster, phase v1alpha1.Phase, reason, degradedBy string) Decision {
	v := newView(cfg, obs, c)
	s := v.hold(reason, "")
	if degradedBy != "" {
		s.degraded, s.degradedBy = reason, degradedBy
	}
	s.resync = resyncSteady
	d := v.decision(s)
	d.Children = observedChildren(obs.Children)
	d.Status.Phase = phase
	return d
}

// isBootstrapping: no cluster has answered yet and nothing beyond the seed was ever asked
// for. Bootstrap is repeated until the seed answers, so a partly applied first answer is
// completed and the seed's children always follow the current spec. A join state that says
// "existing" means a cluster did answer once, even if status has lost its ID: bootstrapping
// again would forget that its seed is established.
func isBootstrapping(obs *Observed) bool {
	if obs.Cluster.Status.ClusterID != "" || obs.Etcd.Asked {
		return false
	}
	for _, cm := range obs.Children.ConfigMaps {
		if st, err := joinstate.Decode([]byte(cm.Data[joinstate.ConfigMapKey])); err == nil && st.ClusterState == joinstate.StateExisting {
			return false
		}
	}
	for _, s := range obs.Children.StatefulSets {
		if s.Spec.Replicas != nil && *s.Spec.Replicas > 1 {
			return false
		}
	}
	for i := range obs.Pods {
		if ord, ok := ownPod(&obs.Cluster, &obs.Pods[i]); ok && ord > 0 {
			return false
		}
	}
	return true
}

// bootstrap renders the first children: the Services, the join state naming one seed that
// forms a new cluster, and a StatefulSet of one.
func bootstrap(cfg Config, obs *Observed, c *v1alpha1.EtcdCluster) Decision {
	seed := PodName(c.Name, 0)
	state := joinstate.State{
		Token:        clusterToken(c),
		ClusterState: joinstate.StateNew,
		Members:      []joinstate.Member{{Name: seed, PeerURL: PeerURL(c, seed, cfg.ClusterDomain)}},
	}
	children := []Child{
		headlessService(c),
		clientService(c),
		joinConfigMap(c, state, ledger{seed: {}}),
		podDisruptionBudget(c, 1),
		statefulSet(c, renderPodSpec(cfg, c), 1, 0),
	}
	sortChildren(children)
	action := Action{Type: Bootstrap, Member: seed, Reason: "no cluster yet: starting seed " + seed}
	st := newStatus(obs, c, v1alpha1.PhaseCreating, action)
	setCondition(&st, obs, c, v1alpha1.ConditionProgressing, true, Bootstrap.String(), action.Reason)
	return Decision{Children: children, Status: st, Action: action, ResyncAfterSeconds: resyncSoon}
}

// clusterToken is unique per cluster incarnation: a deleted and re-created EtcdCluster of the
// same name gets a new UID, so its members can never be mistaken for the old ones.
func clusterToken(c *v1alpha1.EtcdCluster) string {
	return fmt.Sprintf("%s/%s/%s", c.Namespace, c.Name, c.UID)
}

// unknownState says why etcd's state cannot be trusted, or "" when it can.
func unknownState(v *view) string {
	e := v.obs.Etcd
	switch {
	case !e.Asked:
		return "etcd not reachable: " + e.Err
	case e.Inconsistent != "":
		return "etcd answers inconsistently: " + e.Inconsistent
	case v.stranger != "":
		return "etcd lists a member that is not one of this cluster's pods: " + v.stranger
	case len(v.members) == 0:
		return "etcd lists no members"
	}
	return ""
}

// planner runs phases 6 to 11 over one view.
type planner struct {
	*view
	// keep are observed Jobs returned unchanged: the one in flight, or one whose outcome is
	// still to be seen or waited out.
	keep []*batchv1.Job
	// failures counts failed Jobs of the step named retry, dropped after their backoff; the
	// same step, planned again, runs as the next attempt.
	failures int
	retry    string
}

// step is what phases 6 to 11 decided.
type step struct {
	action    Action
	replicas  int
	partition int
	job       *memberJob
	// keep are observed Jobs returned unchanged.
	keep []*batchv1.Job
	// hold returns the observed children unchanged instead of rendering them.
	hold     bool
	resync   float64
	degraded string // why the cluster is Degraded, beyond unhealthy members
	// degradedBy is the Degraded condition's reason when degraded is set; "Blocked" if empty.
	degradedBy string
}

func (p *planner) decide() step {
	phases := []func() (step, bool){
		p.memberJob,        // 6
		p.quorumLost,       // 7
		p.noSpace,          // 7
		p.memberWithoutPod, // 7
		p.learner,          // 7
		p.podWithoutMember, // 7
		p.failedMember,     // 7
		p.configDrift,      // 8
		p.scaleOut,         // 9
		p.scaleIn,          // 10
		p.upgrade,          // 11
	}
	s := p.base(Action{Type: Steady, Reason: fmt.Sprintf("%d healthy members, spec applied", len(p.members))}, resyncSteady)
	for _, phase := range phases {
		if decided, ok := phase(); ok {
			s = decided
			break
		}
	}
	s.keep = p.keep
	return s
}

// 6. A member Job in flight is returned unchanged and waited for; one that succeeded is
// dropped once membership shows its effect; one that failed is kept through its backoff,
// then dropped so that the step is planned again as the next attempt.
func (p *planner) memberJob() (step, bool) {
	var waiting *step
	for _, j := range p.jobs {
		verb, who := j.Labels[LabelAction], j.Labels[LabelMember]
		state, at := stateOf(j)
		var s step
		switch state {
		case jobRunning:
			s = p.wait(who, fmt.Sprintf("%s %s: Job %s running", verb, who, j.Name), resyncSoon)
		case jobSucceeded:
			if p.effectShows(j) {
				continue
			}
			s = p.wait(who, fmt.Sprintf("%s %s: Job %s done, membership does not show it yet", verb, who, j.Name), resyncSoon)
		case jobFailed:
			failures := attemptOf(j) + 1
			if failures >= maxJobAttempts {
				s = p.wait(who, fmt.Sprintf("%s %s failed %d times; delete Job %s to try once more", verb, who, failures, j.Name), resyncHold)
				s.action.Type = Hold
				s.degraded = s.action.Reason
				break
			}
			// The reason names the retry time, not the time left, so status stays the same
			// from sync to sync while waiting.
			// The resync is rounded up to whole seconds: never before the retry time (that sync
			// would only wait again), and never 0, which Metacontroller reads as its default.
			if retryAt := at.Add(jobBackoff(failures - 1)); retryAt.After(p.obs.Now) {
				resync := math.Ceil(retryAt.Sub(p.obs.Now).Seconds())
				s = p.wait(who, fmt.Sprintf("%s %s: Job %s failed (%d of %d), retrying at %s", verb, who, j.Name, failures, maxJobAttempts, retryAt.UTC().Format(time.RFC3339)), resync)
				s.degraded = s.action.Reason
				break
			}
			p.failures, p.retry = failures, verb+"/"+who
			continue
		}
		p.keep = append(p.keep, j)
		if waiting == nil {
			waiting = &s
		}
	}
	if waiting == nil {
		return step{}, false
	}
	// One membership change at a time: nothing else starts while a Job is outstanding.
	return *waiting, true
}

// effectShows reports whether membership reflects a succeeded Job.
func (p *planner) effectShows(j *batchv1.Job) bool {
	who := j.Labels[LabelMember]
	ord, _ := Ordinal(p.c.Name, who)
	m := p.byOrd[ord]
	switch j.Labels[LabelAction] {
	case verbAddLearner:
		return m != nil
	case verbPromote:
		return m == nil || !m.IsLearner
	case verbRemove:
		id := j.Annotations[AnnotationMemberID]
		for _, m := range p.members {
			if fmt.Sprintf("%x", m.ID) == id {
				return false
			}
		}
		return true
	}
	// A leader move has no lasting effect to check: leadership may move again on its own.
	return true
}

// 7a. Lost quorum: no membership change can commit, and guessing is how data is lost. Only a
// person restores from a snapshot or forces a new cluster from the most up-to-date member.
func (p *planner) quorumLost() (step, bool) {
	voters, healthy := len(p.voters()), p.healthyVoters()
	if hasQuorum(voters, healthy) {
		return step{}, false
	}
	reason := fmt.Sprintf("quorum lost: %d of %d voters healthy; no membership change can commit: restore from a snapshot, or restart the most up-to-date member once with --force-new-cluster", healthy, voters)
	return p.hold(reason, reason), true
}

// 7b. A NOSPACE alarm stops writes until space is reclaimed (compact, defragment each
// member, disarm). Replacing members would copy the same data, so only report it.
func (p *planner) noSpace() (step, bool) {
	for _, m := range p.members {
		if hasAlarm(m.Member, "NOSPACE") {
			reason := "NOSPACE alarm raised by " + m.name + ": compact, defragment each member, then disarm the alarm"
			s := p.wait(m.name, reason, resyncHold)
			s.degraded = reason
			return s, true
		}
	}
	return step{}, false
}

// 7c. A member whose ordinal the StatefulSet does not reach has no pod: a scale-out was
// interrupted between adding the member and growing the StatefulSet. Finish it.
func (p *planner) memberWithoutPod() (step, bool) {
	top := p.maxMemberOrdinal()
	if top < p.replicas {
		return step{}, false
	}
	return p.scaleTo(top+1, PodName(p.c.Name, top), fmt.Sprintf("member %s has no pod: growing the StatefulSet to %d", PodName(p.c.Name, top), top+1)), true
}

// 7d. A learner is promoted once caught up, removed when stuck, waited for otherwise. It is
// handled before anything else can add a member: etcd allows one learner.
func (p *planner) learner() (step, bool) {
	ls := p.learners()
	if len(ls) == 0 {
		return step{}, false
	}
	l := ls[0]
	if p.c.Spec.StorageSpec != nil && l.pod != nil && !isTerminating(l.pod) && p.outdated(l.pod) && p.canReplace(l.ordinal) {
		// Config update early: the joining member starts from the current spec rather than
		// being replaced again right after it joined. A learner does not vote: safe. Without a
		// volume its data would not survive the pod (see 7e): it is rolled once promoted.
		return p.replacePod(l.ordinal, l.name, "learner "+l.name+" runs an outdated pod: recreating it from the current spec"), true
	}
	if p.leader != nil && isCaughtUp(l.Member, p.leader.Member) {
		if !canPromote(len(p.voters()), p.healthyVoters()) {
			return p.wait(l.name, "learner "+l.name+" caught up, but promoting it now would leave the larger cluster without a healthy quorum", resyncHold), true
		}
		return p.runJob(memberJob{verb: verbPromote, member: l.name, id: l.ID}, PromoteLearner, "learner "+l.name+" caught up with the leader"), true
	}
	if why := p.stuck(l); why != "" {
		return p.runJob(memberJob{verb: verbRemove, member: l.name, id: l.ID}, RemoveMember, "learner "+l.name+" is stuck ("+why+"): removing it"), true
	}
	// No raft indexes in the reason: they move on every sync and status would churn.
	progress := "not started"
	if l.Started() {
		progress = "started, behind the leader"
	}
	return p.wait(l.name, "learner "+l.name+" catching up ("+progress+")", resyncSoon), true
}

// 7e. A pod without a member: a member was removed to be replaced or rolled (finish it: the
// member is added back as a learner, with a new incarnation), or a scale-in between the
// removal and the shrink, or a learner was given up (undo: shrink to the members, keeping the
// slot a missing member is added back into).
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
		return p.addLearner(free, fmt.Sprintf("pod %s has no member: adding it back as a learner", name)), true
	}
	keep := p.maxMemberOrdinal() + 1
	if missing {
		keep = max(keep, free+1)
	}
	if p.replicas <= keep {
		return step{}, false
	}
	return p.scaleTo(keep, PodName(p.c.Name, keep), fmt.Sprintf("pods from %s on hold no member: shrinking the StatefulSet to %d", PodName(p.c.Name, keep), keep)), true
}

// 7f. An unhealthy voter on an outdated pod is first recreated from the current spec (that
// alone may fix it, and its volume keeps the data). A failed voter is replaced while quorum
// holds: leadership is moved away and the member removed. Its pod then has no member and is
// added back as a learner (7e) with a new incarnation, so it starts from an empty data dir.
// An unhealthy member that may still recover is waited for.
func (p *planner) failedMember() (step, bool) {
	var waiting *step
	voters := p.voters()
	for i := len(voters) - 1; i >= 0; i-- {
		m := voters[i]
		if m.Healthy {
			continue
		}
		if p.c.Spec.StorageSpec != nil && m.pod != nil && !isTerminating(m.pod) && p.outdated(m.pod) && p.canReplace(m.ordinal) {
			// Config update early: it is down anyway, and the current spec may be its fix.
			return p.replacePod(m.ordinal, m.name, "member "+m.name+" unhealthy on an outdated pod: recreating it from the current spec"), true
		}
		why := p.failed(m)
		if why == "" {
			if waiting == nil {
				reason := "member " + m.name + " unhealthy: waiting for it to recover"
				s := p.wait(m.name, reason, resyncHold)
				switch {
				case m.pod == nil || isTerminating(m.pod):
					s.action.Reason = "member " + m.name + " unhealthy: its pod is being recreated"
				case cannotStart(m.pod) != "":
					// A replacement would fail the same way: the spec or the nodes must change.
					s.action.Reason = "member " + m.name + " unhealthy: its pod cannot start (" + cannotStart(m.pod) + ")"
					s.degraded = s.action.Reason
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
		if !canRemoveVoter(len(voters), p.healthyVoters()) {
			return p.wait(m.name, "member "+m.name+" failed ("+why+"), but removing it would leave no healthy quorum", resyncHold), true
		}
		return p.runJob(memberJob{verb: verbRemove, member: m.name, id: m.ID}, RemoveMember, "member "+m.name+" failed ("+why+"): removing it to replace it"), true
	}
	if waiting != nil {
		return *waiting, true
	}
	return step{}, false
}

// failed says why an unhealthy member is beyond waiting for, or "".
func (p *planner) failed(m *member) string {
	switch {
	case hasAlarm(m.Member, "CORRUPT"):
		return "CORRUPT alarm"
	case m.pod == nil || isTerminating(m.pod) || cannotStart(m.pod) != "":
		// Its pod is being (re)created, with the same volume and identity; or it cannot start,
		// and neither could a replacement.
		return ""
	case isCrashLooping(m.pod):
		return "its pod keeps crashing"
	case p.waitedTooLong(m.name):
		return "unhealthy for " + stuckAfter.String()
	}
	return ""
}

// stuck says why a learner is beyond waiting for, or "". Only time counts: a learner's pod
// often crash-looped before the learner was added (it had no member to start as), and
// kubelet's back-off delays its first good start.
func (p *planner) stuck(l *member) string {
	if p.waitedTooLong(l.name) {
		return "not caught up after " + stuckAfter.String()
	}
	return ""
}

// waitedTooLong: the last status already reported waiting on this member, long enough ago.
func (p *planner) waitedTooLong(name string) bool {
	a := p.obs.Cluster.Status.Action
	return a != nil && a.Type == Wait.String() && a.Member == name && !a.Since.IsZero() &&
		p.obs.Now.Sub(a.Since.Time) >= stuckAfter
}

// 8. Config drift: a pod whose configuration differs from the spec is rolled, highest
// outdated ordinal first. Everything is healthy here: the fix phase waited otherwise.
func (p *planner) configDrift() (step, bool) {
	for _, pod := range p.pods {
		if !isTerminating(pod) && p.drifted(pod) {
			return p.roll("config drift")
		}
	}
	return step{}, false
}

// 11. Upgrade: only the etcd version differs (Validate allowed the path); rolled like drift.
func (p *planner) upgrade() (step, bool) {
	return p.roll("upgrade to " + p.c.Spec.Version)
}

// roll replaces the highest-ordinal outdated pod, once the pods above it are replaced and
// up: one pod at a time, each decided here with quorum and leadership checked, never left to
// the StatefulSet controller. Leadership is moved away first; with a volume the pod is
// recreated and the member restarts on its data; without one the member is removed and added
// back through a learner on a pod recreated in between (7e), because its data would not
// survive the pod.
func (p *planner) roll(why string) (step, bool) {
	target := -1
	for ord, pod := range p.pods {
		if !isTerminating(pod) && p.outdated(pod) && ord > target {
			target = ord
		}
	}
	if target < 0 {
		return step{}, false
	}
	name := PodName(p.c.Name, target)
	if busy, state := p.replacing(target); state != "" {
		return p.wait(busy, why+": "+name+" is next, waiting while "+state, resyncSoon), true
	}
	m := p.byOrd[target]
	if m == nil {
		// No member lives there: recreating the pod disturbs nobody.
		return p.replacePod(target, name, why+": recreating "+name+", which holds no member"), true
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
			s.degraded = reason
			return s, true
		}
		if !canRemoveVoter(voters, others) {
			return p.wait(name, why+": removing "+name+" would leave no healthy quorum", resyncHold), true
		}
		return p.runJob(memberJob{verb: verbRemove, member: name, id: m.ID}, RemoveMember, why+": "+name+" has no volume, so it is removed and added back from the current spec"), true
	}
	if !canDisruptVoter(voters, others) {
		return p.wait(name, why+": recreating "+name+" would leave no healthy quorum", resyncHold), true
	}
	return p.replacePod(target, name, why+": recreating "+name+" from the current spec"), true
}

// 9. Scale out: a learner for the lowest free ordinal below the size; the StatefulSet grows
// once etcd has it (7c), and it is promoted once caught up (7d). A free ordinal below the
// size with enough members means one sits beyond the size (a replacement met a scale-in):
// its slot is filled first and the member beyond is removed after (10), so redundancy never
// drops, and no pod is left over without a member, failing and counting against the
// disruption budget.
func (p *planner) scaleOut() (step, bool) {
	ord, missing := p.freeOrdinal()
	if !missing {
		return step{}, false
	}
	reason := fmt.Sprintf("%d of %d members: adding %s as a learner", len(p.members), p.size, PodName(p.c.Name, ord))
	if len(p.members) >= p.size {
		reason = fmt.Sprintf("ordinal %d is free below the size: adding %s before removing the member beyond the size", ord, PodName(p.c.Name, ord))
	}
	return p.addLearner(ord, reason), true
}

func (p *planner) addLearner(ord int, reason string) step {
	name := PodName(p.c.Name, ord)
	return p.runJob(memberJob{verb: verbAddLearner, member: name, peerURL: PeerURL(p.c, name, p.cfg.ClusterDomain)}, AddLearner, reason)
}

// 10. Scale in: a member beyond the size goes, the highest first, leadership moved away
// first; the StatefulSet then shrinks (7e).
func (p *planner) scaleIn() (step, bool) {
	voters := p.voters()
	if len(voters) == 0 || voters[len(voters)-1].ordinal < p.size {
		return step{}, false
	}
	m := voters[len(voters)-1]
	why := fmt.Sprintf("%d of %d members", len(voters), p.size)
	if m == p.leader {
		if s, ok := p.moveLeader(m, why+": "+m.name+" goes next and leads"); ok {
			return s, true
		}
	}
	if !canRemoveVoter(len(voters), p.healthyVoters()-1) {
		return p.wait(m.name, why+": removing "+m.name+" would leave no healthy quorum", resyncHold), true
	}
	return p.runJob(memberJob{verb: verbRemove, member: m.name, id: m.ID}, RemoveMember, why+": removing "+m.name), true
}

// moveLeader hands leadership to the lowest-ordinal healthy voter before the leader's pod or
// membership is disrupted; false when no voter can take it.
func (p *planner) moveLeader(from *member, why string) (step, bool) {
	to := p.leaderTarget(from)
	if to == nil {
		return step{}, false
	}
	return p.runJob(memberJob{verb: verbMoveLeader, member: to.name, id: to.ID}, MoveLeader, why+": moving leadership to "+to.name), true
}

// base keeps the StatefulSet as it is, except that outdated pods stay protected.
func (p *planner) base(a Action, resync float64) step {
	replicas := p.replicas
	if p.sts == nil {
		replicas = p.maxMemberOrdinal() + 1
	}
	return step{action: a, replicas: replicas, partition: p.protectivePartition(), resync: resync}
}

func (p *planner) wait(member, reason string, resync float64) step {
	return p.base(Action{Type: Wait, Member: member, Reason: reason}, resync)
}

func (p *planner) scaleTo(replicas int, member, reason string) step {
	s := p.base(Action{Type: ScaleStatefulSet, Member: member, Reason: reason}, resyncSoon)
	s.replicas = replicas
	return s
}

// replacePod lowers the partition to ord, so the StatefulSet recreates that pod, and only
// that one, from the current template.
func (p *planner) replacePod(ord int, member, reason string) step {
	s := p.base(Action{Type: ReplacePod, Member: member, Reason: reason}, resyncSoon)
	s.partition = ord
	return s
}

// runJob starts a member Job. Its endpoints are every voter's client URL: stable while the
// membership is, so a replayed sync renders the same Job under the same name.
func (p *planner) runJob(j memberJob, t ActionType, reason string) step {
	for _, m := range p.voters() {
		j.endpoints = append(j.endpoints, ClientURL(p.c, m.name, p.cfg.ClusterDomain))
	}
	j.attempt = p.attemptFor(j)
	s := p.base(Action{Type: t, Member: j.member, Reason: reason}, resyncSoon)
	s.job = &j
	return s
}

// attemptFor numbers a Job among the failed attempts of the same step: from a failed Job
// dropped in this sync, else from the last status when it reported the same step.
func (p *planner) attemptFor(j memberJob) int {
	if p.retry == j.verb+"/"+j.member {
		return p.failures
	}
	if a := p.obs.Cluster.Status.Action; a != nil && a.Member == j.member && a.Type == actionOfVerb(j.verb).String() {
		return int(p.obs.Cluster.Status.JobFailures)
	}
	return 0
}

func actionOfVerb(verb string) ActionType {
	switch verb {
	case verbAddLearner:
		return AddLearner
	case verbPromote:
		return PromoteLearner
	case verbRemove:
		return RemoveMember
	}
	return MoveLeader
}
