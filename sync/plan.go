package sync

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
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
// phase may assume that the earlier ones found nothing to do. They are numbered once, in
// order: 1 to 5 in Plan's body below (teardown, an invalid spec, a pause, the bootstrap, and
// an etcd state that cannot be trusted), 6 in plan (the Job stage), and 7 on in the phase
// table of planner.change (sync/planner.go), the one list of them, each entry with its file
// and what it decides.
//
// Every decision is checked against the invariants before it is returned (invariants.go),
// and carries the Events that tell what changed from the status it started from (events.go).
func Plan(cfg Config, obs Observed) Decision {
	d := decide(cfg, obs)
	d.Events = events(&obs.Cluster.Status, &d.Status)
	return d
}

// decide runs the phases in order; the first that decides wins.
func decide(cfg Config, obs Observed) Decision {
	c := v1alpha1.Defaulted(obs.Cluster)
	if obs.Finalizing {
		if c.DeletionTimestamp == nil {
			// 1. A finalize call for a cluster nobody deleted tears nothing down.
			return refuseTeardown(&obs)
		}
		// 1. Deletion overrides everything, whatever state the cluster is in.
		return finalize(&obs, &c)
	}
	if err := validate(&obs, c); err != nil {
		// 2. An invalid spec must not change a running cluster: what exists stays as it is.
		return report(cfg, &obs, &c, v1alpha1.PhaseInvalid, err.Error(), ReasonInvalidSpec)
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
	if v.unknown != "" {
		// 5. Nothing can be concluded about membership: never shrink, remove or replace on it.
		if s, ok := v.rollForward(v.unknown); ok {
			return v.decision(s)
		}
		s := v.hold(v.unknown, v.unknown)
		s.degradedBy = v.unknownBy
		if v.unknownBy == ReasonEtcdForked {
			s = v.confirmFork(s)
		}
		return v.decision(s)
	}
	// 6 on: one step on a cluster whose state is known (plan).
	return v.decision(plan(v))
}

// finalize tears down in order: member Jobs and the continuous backup first (no membership
// change may run into the teardown; the stream stops before etcd does), then the
// PodDisruptionBudget, then the StatefulSet until its pods are gone, then the Services and the
// join ConfigMap. Finalized only once nothing is observed. The claims
// are retained until then; with spec.storageSpec.whenDeleted: Delete, the StatefulSet is
// first told to take them along (its retention policy), and deleted once its controller has
// seen that, so the garbage collector deletes them after the pods.
func finalize(obs *Observed, c *v1alpha1.EtcdCluster) Decision {
	ch := obs.Children
	pods := len(ownPods(obs))
	var keep Children
	var reason string
	var claimsAlong []Child
	// The expand-claim Jobs' account goes last, with the Services: a Job being deleted may
	// still run under it.
	rest := Children{Services: ch.Services, ConfigMaps: ch.ConfigMaps, PDBs: ch.PDBs, Accounts: ch.Accounts, Roles: ch.Roles, RoleBindings: ch.RoleBindings}
	switch {
	case len(ch.Jobs) > 0:
		keep = rest
		keep.StatefulSets = ch.StatefulSets
		reason = fmt.Sprintf("deleting %d member Job(s)", len(ch.Jobs))
	case len(ch.StatefulSets) > 0 && len(ch.PDBs) > 0:
		// The PodDisruptionBudget goes before the StatefulSet: it counts against the pods'
		// controller, and pods left without one make the disruption controller fail on every
		// change of them while the budget lasts.
		keep = rest
		keep.PDBs = nil
		keep.StatefulSets = ch.StatefulSets
		reason = "deleting the PodDisruptionBudget before the StatefulSet"
	case len(ch.StatefulSets) > 0 && c.Spec.StorageSpec != nil && c.Spec.StorageSpec.WhenDeleted == v1alpha1.PVCDelete && !claimsGoAlong(ch.StatefulSets):
		keep = rest
		claimsAlong = withClaimsDeleted(ch.StatefulSets)
		reason = "spec.storageSpec.whenDeleted is Delete: setting the StatefulSet to delete the claims with it, before it is deleted"
	case len(ch.StatefulSets) > 0 || pods > 0:
		keep = rest
		keep.PDBs = nil
		reason = fmt.Sprintf("deleting the StatefulSet; %d pod(s) left", pods)
	case len(ch.Services)+len(ch.ConfigMaps)+len(ch.PDBs)+len(ch.Accounts)+len(ch.Roles)+len(ch.RoleBindings) > 0:
		reason = "deleting the Services, the join ConfigMap and the claims' account"
	case len(ch.Deployments) > 0:
		reason = "deleting the continuous backup"
	default:
		a := Action{Type: Teardown, Reason: "teardown complete"}
		d := Decision{Status: newStatus(obs, c, v1alpha1.PhaseDeleting, a), Action: a, Finalized: true}
		return checkedTeardown(obs, c, d)
	}
	a := Action{Type: Teardown, Reason: reason}
	children := append(observedChildren(keep), claimsAlong...)
	sortChildren(children)
	d := Decision{
		Children:           children,
		Status:             newStatus(obs, c, v1alpha1.PhaseDeleting, a),
		Action:             a,
		ResyncAfterSeconds: resyncSoon,
	}
	return checkedTeardown(obs, c, d)
}

// ReasonNotBeingDeleted is the hold's reason when Metacontroller asks to finalize a cluster
// whose deletion nobody asked for.
const ReasonNotBeingDeleted = "finalize refused: the EtcdCluster is not being deleted " +
	"(no metadata.deletionTimestamp); Metacontroller calls finalize also when a cluster stops " +
	"matching its CompositeController's labelSelector (a changed etcdops.dev/shard label or " +
	"selector), so every child is kept: put the label or the selector back as it was"

// refuseTeardown answers a finalize call for a cluster that is not being deleted: Metacontroller
// calls finalize also for a parent that stops matching its CompositeController's labelSelector
// while it carries that controller's finalizer (a relabelled cluster, a narrowed shard), and a
// teardown there would delete a live cluster's members. Every observed child is kept as it
// is, finalized stays false, and the status keeps all it said but for the action, a hold
// that says why (its Event too).
func refuseTeardown(obs *Observed) Decision {
	a := Action{Type: Hold, Reason: ReasonNotBeingDeleted}
	st := obs.Cluster.Status
	since := metav1.NewTime(obs.Now)
	if sameAction(st.Action, a) {
		since = st.Action.Since
	}
	st.Action = &v1alpha1.Action{Type: a.Type.String(), Reason: a.Reason, Since: since}
	return Decision{Children: observedChildren(obs.Children), Status: st, Action: a, ResyncAfterSeconds: resyncHold}
}

// claimsGoAlong: every StatefulSet deletes its claims with it, and its controller has seen so
// (it sets the claims' owner references then).
func claimsGoAlong(sets []appsv1.StatefulSet) bool {
	for _, s := range sets {
		p := s.Spec.PersistentVolumeClaimRetentionPolicy
		if p == nil || p.WhenDeleted != appsv1.DeletePersistentVolumeClaimRetentionPolicyType || s.Status.ObservedGeneration < s.Generation {
			return false
		}
	}
	return true
}

// withClaimsDeleted are the observed StatefulSets, unchanged but for the claims' retention:
// deleted with the StatefulSet.
func withClaimsDeleted(sets []appsv1.StatefulSet) []Child {
	var out []Child
	for i := range sets {
		c := unchanged("apps/v1", "StatefulSet", sets[i].ObjectMeta, &sets[i])
		c.Object = retentionSet{observed: c.Object.(observedObject), retention: claimRetention{WhenDeleted: "Delete", WhenScaled: "Retain"}}
		out = append(out, c)
	}
	return out
}

// checkedTeardown returns a finalize decision that keeps the teardown's invariants, or a hold
// that keeps every observed child and says which invariant the teardown broke.
func checkedTeardown(obs *Observed, c *v1alpha1.EtcdCluster, d Decision) Decision {
	if err := checkTeardown(obs, d); err != nil {
		a := Action{Type: Hold, Reason: "internal: " + err.Error()}
		return Decision{Children: observedChildren(obs.Children), Status: newStatus(obs, c, v1alpha1.PhaseDeleting, a), Action: a, ResyncAfterSeconds: resyncHold}
	}
	return d
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
	s.resync, s.phase = resyncSteady, phase
	d := v.decision(s)
	d.Children = observedChildren(obs.Children)
	return d
}

// validate checks the spec, the version against the lowest etcd version the cluster runs
// (gateVersion: status, the answering members, every pod's image): neither a lost status nor a
// member that does not answer may let a spec skip a minor release or downgrade.
func validate(obs *Observed, c v1alpha1.EtcdCluster) error {
	c.Status.CurrentVersion = gateVersion(obs)
	if err := v1alpha1.Validate(c); err != nil {
		return err
	}
	if err := checkTLSChange(obs, &c); err != nil {
		return err
	}
	return restoreInPlace(obs, &c)
}

// isBootstrapping: no cluster has answered yet and nothing beyond the seed was ever asked
// for. Bootstrap is repeated until the seed answers, so a partly applied first answer is
// completed and the seed's children follow the current spec (its pod too, unless seedHeld).
// A join state that says "existing", or a recorded cluster ID or ledger, means a cluster did
// answer once, even if status has lost its ID: bootstrapping again would forget that its seed
// is established.
func isBootstrapping(obs *Observed) bool {
	if obs.Cluster.Status.ClusterID != "" || len(obs.Cluster.Status.Ledger) > 0 || obs.Etcd.Asked {
		return false
	}
	for _, cm := range obs.Children.ConfigMaps {
		if cm.Annotations[AnnotationClusterID] != "" {
			return false
		}
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
		Restore:      restoreJoin(c, seed),
	}
	v := newView(cfg, obs, c)
	action := Action{Type: Bootstrap, Member: seed, Reason: "no cluster yet: starting seed " + seed}
	if f := fromBackup(c); f != nil {
		action.Reason = "no cluster yet: starting seed " + seed + " from snapshot " + f.Name
	}
	partition, resync := 0, float64(resyncSoon)
	held := seedHeld(v)
	cannotStart := ""
	if pod := v.pods[0]; pod != nil && !isTerminating(pod) && !v.outdated(pod) {
		// An outdated seed is recreated from the current spec, which may be its fix.
		cannotStart = v.cannotStart(pod)
	}
	switch {
	case held:
		// The StatefulSet keeps pod 0 on the template it runs; a pod that is gone or going
		// is recreated from the current one (protectivePartition's rule).
		partition, resync = 1, resyncHold
		action = Action{Type: Hold, Member: seed, Reason: "seed " + seed + " has run etcd on a pod without a volume but has not answered the hook; " +
			"recreating it for the changed spec would lose its data, so the change waits until the seed answers"}
	case cannotStart != "":
		// The children are rendered all the same: they are what the seed needs once it can.
		resync = resyncHold
		action = Action{Type: Hold, Member: seed, Reason: "no cluster yet: seed " + seed + " cannot start (" + cannotStart + ")"}
	}
	children := []Child{
		headlessService(c, v.labels),
		clientService(c, v.labels),
		joinConfigMap(c, v.labels, state, ledger{seed: {}}, "", restoredAnnotation(obs, c), bootstrapDurable(c)),
		podDisruptionBudget(c, v.labels, 1, false),
		statefulSet(c, v.claimTemplate(), v.labels, v.spec, 1, partition, retainClaims),
	}
	client := v.clientStatus()
	children = append(children, v.clientConfigMap(client))
	children = append(children, claimsAccess(c, v.labels, v.accessOrdinals(1))...)
	sortChildren(children)
	st := newStatus(obs, c, v1alpha1.PhaseCreating, action)
	if f := fromBackup(c); f != nil {
		st.RestoredFrom = f.Name
		recordRestoredRevision(obs, c, &st)
	}
	st.TLS = v.tlsStatus()
	st.Client = client
	st.V2LogIndex = bootstrapDurable(c).v2LogIndex
	if held || cannotStart != "" {
		degradedBy := ReasonNoVolumeToRoll
		if !held {
			degradedBy = ReasonPodCannotStart
		}
		setConditionValue(&st, obs, v.condition(v1alpha1.ConditionAvailable, metav1.ConditionUnknown, ReasonEtcdUnknown, action.Reason))
		setCondition(&st, obs, c, v1alpha1.ConditionProgressing, false, ReasonBlocked, action.Reason)
		setCondition(&st, obs, c, v1alpha1.ConditionDegraded, true, degradedBy, action.Reason)
	} else {
		setCondition(&st, obs, c, v1alpha1.ConditionProgressing, true, Bootstrap.String(), action.Reason)
	}
	d := Decision{Children: children, Status: st, Action: action, ResyncAfterSeconds: resync}
	if err := checkBootstrap(obs, d); err != nil {
		a := Action{Type: Hold, Reason: "internal: " + err.Error()}
		return Decision{Children: observedChildren(obs.Children), Status: newStatus(obs, c, v1alpha1.PhaseCreating, a), Action: a, ResyncAfterSeconds: resyncHold}
	}
	return d
}

// seedHeld: the seed's pod is live on an outdated template, has no volume, and its etcd has
// run there, so the pod may hold data that clients wrote while the hook could not reach it
// (an unreachable member may be healthy) or that restarts of its container keep. Recreating
// the pod for the new spec would lose that data on the hook's view alone; as for a single
// member without a volume after bootstrap (NoVolumeToRoll), the pod is not rolled. A seed
// whose etcd never ran (Pending, an image that cannot be pulled) holds nothing and gets the
// current spec.
func seedHeld(v *view) bool {
	pod := v.pods[0]
	return v.c.Spec.StorageSpec == nil && pod != nil && !isTerminating(pod) && v.outdated(pod) && etcdHasRun(pod)
}

// clusterToken is unique per cluster incarnation: a deleted and re-created EtcdCluster of the
// same name gets a new UID, so its members can never be mistaken for the old ones.
func clusterToken(c *v1alpha1.EtcdCluster) string {
	return c.Namespace + "/" + c.Name + "/" + string(c.UID)
}

// unknownStateReason says why etcd's state cannot be trusted, and the Degraded reason for
// it; "" when it can.
func unknownStateReason(v *view) (reason, degradedBy string) {
	if r := v.safe.recovery; r != nil && !knownRecoveryPhase(r.Phase) {
		// A newer hook's phase: what it allows next is not this build's to guess. Its fences
		// and force stay as the join ConfigMap has them.
		return fmt.Sprintf("status.recovery is in phase %q, which this hook does not know (written by a newer one?): nothing is changed until a hook that knows it, or a person, ends the recovery (docs/runbooks-quorum.md, a recovery phase this hook does not know)", r.Phase), ReasonRecoveryPhaseUnknown
	}
	e := v.obs.Etcd
	forked := slices.Clone(e.Forked)
	var conflicts []string
	if e.Inconsistent != "" {
		conflicts = append(conflicts, e.Inconsistent)
	}
	for _, u := range v.strangeUnlisted() {
		forked = append(forked, u.Endpoint)
		conflicts = append(conflicts, fmt.Sprintf("%s answers as member %x, which is not in the member list and was never this pod's", u.Endpoint, u.MemberID))
	}
	switch {
	case !e.Asked:
		return "etcd not reachable: " + e.Err + v.refusals(), ReasonEtcdUnreachable
	case len(forked) > 0:
		slices.Sort(forked)
		return fmt.Sprintf("etcd answers as more than one membership (%s): %s; no membership change until a person resolves it (docs/runbooks-cluster.md, two memberships answer)",
			strings.Join(slices.Compact(forked), ", "), strings.Join(conflicts, "; ")), ReasonEtcdForked
	case e.Inconsistent != "":
		return "etcd answers inconsistently: " + e.Inconsistent, ReasonEtcdInconsistent
	case v.stranger != "":
		return "etcd lists a member that is not one of this cluster's pods: " + v.stranger, ReasonStrangerMember
	case len(v.members) == 0:
		return "etcd lists no members", ReasonEtcdInconsistent
	}
	if got := fmt.Sprintf("%x", e.ClusterID); v.clusterID != "" && got != v.clusterID && v.c.Annotations[v1alpha1.AnnotationAcceptClusterID] != got {
		return fmt.Sprintf("etcd answers as cluster %s, but this EtcdCluster is cluster %s: a restore or another cluster's members, not an update; "+
			"nothing is changed until the annotation %s=%s accepts the new cluster on purpose", got, v.clusterID, v1alpha1.AnnotationAcceptClusterID, got), ReasonClusterIDChanged
	}
	return "", ""
}

// forkConfirmAfter is how long after the first sync that saw a second membership another must
// see one too before it is reported: the syncs of one event come in quick succession, and a
// sighting of one observation alone may be etcd mid-election or the hook's caches lagging.
const forkConfirmAfter = 5 * time.Second

// confirmFork turns hold s on a second membership answering into what is reported. Every sync
// that sees one holds: no membership change rests on a view that may be two clusters'. But
// one observation can see two leaders while leadership moves (the Status calls of one sync
// answer at slightly different moments), or another cluster's pod on an IP reused while the
// pods the hook was sent are a moment old; the next sync sees neither. So EtcdForked is
// reported only once a sync at least forkConfirmAfter after the first that saw it sees it
// too (status.forkSeenSince); until then the Degraded condition stays as the last sync left it.
func (v *view) confirmFork(s step) step {
	prev := v.obs.Cluster.Status.ForkSeenSince
	seen := metav1.NewTime(v.obs.Now)
	if prev != nil {
		seen = *prev
	}
	s.forkSeen = &seen
	if prev != nil && v.obs.Now.Sub(prev.Time) >= forkConfirmAfter {
		return s
	}
	s.action.Reason = v.unknown + "; seen at this sync only: nothing is changed, and it is reported (EtcdForked) if the next sync sees it too"
	s.degraded, s.degradedBy = "", ""
	for _, c := range v.obs.Cluster.Status.Conditions {
		if c.Type == v1alpha1.ConditionDegraded && c.Status == metav1.ConditionTrue && c.Reason != ReasonEtcdForked {
			s.degraded, s.degradedBy = c.Message, c.Reason
		}
	}
	s.resync = resyncSoon
	return s
}

// refusals says which pods' launchers refuse to start etcd, and why: when etcd cannot be
// reached, that is often the reason (claims lost, another cluster's volumes), and a hold that
// only said "not reachable" would hide it.
func (v *view) refusals() string {
	var out []string
	for _, ord := range slices.Sorted(maps.Keys(v.pods)) {
		if why := launcherRefusal(v.pods[ord]); why != "" {
			out = append(out, v.pods[ord].Name+": "+why)
		}
	}
	if len(out) == 0 {
		return ""
	}
	return "; launchers refuse to start etcd: " + strings.Join(out, "; ")
}

// strangeUnlisted are the answers from outside the member list that are not a removed member
// still running. etcd stops a removed member only once it hears of its removal, so for a
// while (for good while it is cut off from its peers) it answers under the ID it had: one the
// ledger recorded for its pod, the last or an earlier one (a member replaced on the same pod).
// Any other ID at a pod's address is a membership of its own.
func (v *view) strangeUnlisted() []etcdstate.Unlisted {
	var out []etcdstate.Unlisted
	for _, u := range v.obs.Etcd.Unlisted {
		if e, ok := v.ledger[u.Endpoint]; !ok || !e.hadID(fmt.Sprintf("%x", u.MemberID)) {
			out = append(out, u)
		}
	}
	return out
}

// removedStopGrace is how long a removed member may go on answering before it is taken to
// run on for good: one that reaches its peers hears of its removal within a heartbeat or two
// and stops, and the hook's view of it may lag by a sync or two.
const removedStopGrace = time.Minute

// removedRunning is the member ID of a member removed from the cluster whose etcd still runs on
// the pod at ord and answers the hook there longer than removedStopGrace after its removal
// (status.history), false when none does: the pod's new member cannot start until that pod
// restarts. A removal the history does not record (made behind the planner's back, or its
// record lost) gives no time to count from: its pod is not restarted on that account; should
// its new member then not start, the learner's own removal as stuck is recorded, and counts.
func (v *view) removedRunning(ord int) (uint64, bool) {
	name := PodName(v.c.Name, ord)
	for _, u := range v.obs.Etcd.Unlisted {
		if e, ok := v.ledger[name]; ok && u.Endpoint == name && e.hadID(fmt.Sprintf("%x", u.MemberID)) {
			if at, ok := v.removedAt(name); !ok || v.obs.Now.Sub(at) < removedStopGrace {
				return 0, false
			}
			return u.MemberID, true
		}
	}
	return 0, false
}

// removedAt is when the last removal of member name finished, as status.history records it,
// or began while its result is not recorded yet (the sync that first sees it done writes it).
func (v *view) removedAt(name string) (time.Time, bool) {
	hist := v.obs.Cluster.Status.History
	for i := len(hist) - 1; i >= 0; i-- {
		if r := hist[i]; r.Type == RemoveMember.String() && r.Member == name {
			if r.Finished != nil {
				return r.Finished.Time, true
			}
			return r.Started.Time, true
		}
	}
	return time.Time{}, false
}

// rollForward is the one change a hold may make: when etcd cannot be reached and no pod of the
// cluster is Ready, nothing serves and no quorum is left to lose, so the highest outdated pod
// may be recreated from the current spec, one at a time. A pod only the node controller marked
// not Ready may still serve: it counts as Ready. That is how a cluster, typically of
// one member, comes back after a change that stopped its pods and was then reverted: holding
// on would keep the pods on the change that broke them. Only with volumes (a pod's data
// survives its recreation) and only when etcd was simply not reached (not when it answered in
// a way that cannot be trusted).
func (v *view) rollForward(reason string) (step, bool) {
	if v.obs.Etcd.Asked || v.sts == nil || v.c.Spec.StorageSpec == nil {
		return step{}, false
	}
	for _, p := range v.pods {
		if mayServe(p) || isTerminating(p) {
			return step{}, false
		}
	}
	target := v.highestOutdated()
	if target < 0 || target >= v.replicas {
		return step{}, false
	}
	name := PodName(v.c.Name, target)
	s := v.hold(reason+"; no pod is Ready, so "+name+" is recreated from the current spec: nothing serves and no quorum is left to lose", reason)
	s.degradedBy = ReasonEtcdUnreachable
	s.action.Type, s.action.Member = ReplacePod, name
	s.rollForward, s.partition = true, target
	s.resync = resyncSoon
	return s, true
}
