package sync

import (
	"fmt"
	"slices"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/joinstate"
)

// decision renders a step: the complete children, the status and the resync, after checking
// the step against the invariants. A violation is a bug; it becomes a hold with an
// "internal:" reason, so the cluster is left alone and the bug is visible in status.
func (v *view) decision(s step) Decision {
	if err := checkInvariants(v, s); err != nil {
		// The phase of a sync that must change nothing (an invalid spec, a pause) stays.
		phase := s.phase
		s = v.hold("internal: "+err.Error(), "internal: "+err.Error())
		s.phase = phase
	}
	// The Job is rendered once: its name, a hash of all of it, also goes into status.history.
	var job *Child
	if s.job != nil {
		j := s.job.render(v.cfg, v.c)
		job = &j
	}
	if v.startsDisruption(s, job) {
		if ok, why := v.budgetFenced(); !ok {
			s, job = v.fenced(s, why), nil
		}
	}
	var children []Child
	l := v.ledger
	if s.hold {
		children = v.heldChildren(s)
	} else {
		children, l = v.children(s, job)
		if missing := missingChildren(v.obs.Children, children, v.c.Name); missing != "" {
			s = v.hold("internal: desired children lack observed "+missing, "internal: desired children lack observed "+missing)
			children, l, job = v.heldChildren(s), v.ledger, nil
		}
	}
	sortChildren(children)
	a := v.answer(s, job, l)
	return Decision{
		Children:           children,
		Status:             a.st,
		Action:             s.action,
		Rolls:              v.highestOutdated() >= 0,
		ResyncAfterSeconds: a.resync,
	}
}

// answer fills in the status and the resync of step s in the order of this table, the one
// list of what each part of the planner adds to them (as planner.change is the one list of
// the phases): each entry names its file and what it records. An entry may read what the
// entries before it wrote (the conditions of backups read status.backup), and the conditions
// stand in status in the order they are set here.
func (v *view) answer(s step, job *Child, l ledger) answer {
	a := answer{step: s, job: job, ledger: l, resync: s.resync}
	for _, record := range []func(*answer){
		v.stepStatus,       //  1 status.go: phase, action, history, members; Available, Progressing, Degraded
		v.tlsRecord,        //  2 tls.go: status.tls, what the pods serve and the stage of a TLS change
		v.ledgerRecord,     //  3 ledger.go: status.ledger, the durable copy of the join ConfigMap's ledger
		v.backupRecord,     //  4 backup.go: status.backup, with the finished backups and drills the Job stage read
		v.restoredFrom,     //  5 backup.go: status.restoredFrom, back from the join ConfigMap when status lost it
		v.restoredRevision, //  6 backup.go: what the seed of a restored cluster restored, once
		v.streamStatus,     //  7 stream.go: status.backup.continuous, the stream's progress
		v.backupCondition,  //  8 backup.go: BackedUp, with the stream's part (stream.go)
		v.drillCondition,   //  9 drill.go: BackupVerified, from the last restore drill
		v.volumesCondition, // 10 volumes.go: VolumesExpanded
		v.drillResync,      // 11 drill.go: the resync, no later than the next drill
		v.backupResync,     // 12 backup.go: the resync, no later than the next schedule time
		v.authRecord,       // 13 auth.go: status.auth, what the last auth Job applied and whether auth is on
	} {
		record(&a)
	}
	return a
}

// children renders every child from the spec and the observed membership, with job the
// step's rendered Job if any, and returns the ledger the join ConfigMap now carries.
func (v *view) children(s step, job *Child) ([]Child, ledger) {
	state, l := v.joinState(v.rebaseline())
	applyRecovery(&state, v.recoveryAfter(s))
	children := []Child{
		headlessService(v.c, v.labels),
		clientService(v.c, v.labels),
		joinConfigMap(v.c, v.labels, state, l, fmt.Sprintf("%x", v.obs.Etcd.ClusterID), restoredAnnotation(v.obs, v.c), durable{v2LogIndex: v.v2LogIndexAfter(), recovery: v.recoveryAfter(s)}),
		podDisruptionBudget(v.c, v.labels, len(v.voters()), v.budgetClosed(s)),
		v.clientConfigMap(v.clientStatus()),
	}
	if len(v.oldPodsGoing()) == 0 {
		children = append(children, statefulSet(v.c, v.claimTemplate(), v.labels, v.spec, s.replicas, s.partition, v.claimRetention(s.replicas)))
	}
	children = append(children, claimsAccess(v.c, v.labels, v.accessOrdinals(s.replicas))...)
	for _, j := range s.keep {
		children = append(children, unchanged("batch/v1", "Job", j.ObjectMeta, j))
	}
	if job != nil {
		children = append(children, *job)
	}
	if stream, ok := v.backupStream(); ok {
		children = append(children, stream, v.backupStreamService())
	}
	return append(children, adopted(v.obs.Children, v.c.Name)...), l
}

// ownChild: the planner renders a child of this kind and name for cluster.
func ownChild(cluster, kind, name string) bool {
	switch kind {
	case "ConfigMap":
		return name == JoinConfigMapName(cluster) || name == ClientConfigMapName(cluster)
	case "Service":
		return name == HeadlessServiceName(cluster) || name == ClientServiceName(cluster)
	case "PodDisruptionBudget":
		return name == PDBName(cluster)
	case "StatefulSet":
		return name == StatefulSetName(cluster)
	case "ServiceAccount", "Role", "RoleBinding":
		return name == ClaimsAccountName(cluster)
	case "Deployment":
		return name == BackupStreamName(cluster)
	}
	return false
}

// adopted are the observed ConfigMaps, Services and StatefulSets of names the planner does
// not render (an older or a newer hook's): returned unchanged, never updated and never
// deleted by the operator. Deleting them could break what still uses them: pods of an older
// template mount a ConfigMap, clients dial a Service, and an older StatefulSet owns pods that
// may be members (its deletion takes them down). A PodDisruptionBudget of another name is
// left out, so it goes: a second budget over the same pods makes every eviction fail, and a
// budget holds no data.
func adopted(observed Children, cluster string) []Child {
	var out []Child
	for i := range observed.ConfigMaps {
		if o := &observed.ConfigMaps[i]; !ownChild(cluster, "ConfigMap", o.Name) {
			out = append(out, unchanged("v1", "ConfigMap", o.ObjectMeta, o))
		}
	}
	for i := range observed.Services {
		// The stream's Service serves no client: it goes with the stream's Deployment.
		if o := &observed.Services[i]; !ownChild(cluster, "Service", o.Name) && o.Name != BackupStreamName(cluster) {
			out = append(out, unchanged("v1", "Service", o.ObjectMeta, o))
		}
	}
	for i := range observed.StatefulSets {
		if o := &observed.StatefulSets[i]; !ownChild(cluster, "StatefulSet", o.Name) {
			out = append(out, unchanged("apps/v1", "StatefulSet", o.ObjectMeta, o))
		}
	}
	return out
}

// rebaseline: etcd answers with a cluster ID other than the one on record, which only gets
// this far when the new one was accepted on purpose (unknownStateReason).
func (v *view) rebaseline() bool {
	return v.clusterID != "" && fmt.Sprintf("%x", v.obs.Etcd.ClusterID) != v.clusterID
}

// heldChildren are the observed children unchanged, plus whatever is missing: a hold never
// leaves a cluster without its children (but for a deleted StatefulSet whose pods are still
// going, view.oldPodsGoing). The Services and the PodDisruptionBudget do not
// depend on what a hold cannot judge; the client ConfigMap is rendered from status.client; the join ConfigMap is rebuilt from the last membership
// status recorded and the durable ledger; the StatefulSet from the spec, at the replicas the
// last known members and pods need, with every live outdated pod kept on its template. A
// roll-forward (view.rollForward) lowers the observed StatefulSet's partition onto one pod.
func (v *view) heldChildren(s step) []Child {
	children := observedChildren(v.obs.Children)
	if s.rollForward {
		for i, c := range children {
			if c.Kind == "StatefulSet" && c.Name == StatefulSetName(v.c.Name) {
				children[i] = statefulSet(v.c, v.claimTemplate(), v.labels, v.spec, v.replicas, s.partition, retainClaims)
			}
		}
	}
	have := map[string]bool{}
	for _, c := range children {
		have[c.Kind+"/"+c.Name] = true
	}
	missing := []Child{headlessService(v.c, v.labels), clientService(v.c, v.labels), podDisruptionBudget(v.c, v.labels, v.size, false)}
	missing = append(missing, claimsAccess(v.c, v.labels, v.accessOrdinals(v.lastKnownReplicas()))...)
	if last := v.obs.Cluster.Status.Client; last != nil {
		// Applications read it: rendered again as status last recorded it.
		missing = append(missing, v.clientConfigMap(last))
	}
	if v.join == nil {
		state := v.lastKnownJoinState()
		applyRecovery(&state, v.recoveryAfter(s))
		missing = append(missing, joinConfigMap(v.c, v.labels, state, v.ledger, v.clusterID, restoredAnnotation(v.obs, v.c), durable{v2LogIndex: v.safe.v2LogIndex, recovery: v.recoveryAfter(s)}))
	} else if state, ok := v.observedJoinState(); ok && (v.safe.recovery == nil || knownRecoveryPhase(v.safe.recovery.Phase)) {
		// A hold changes nothing, but a quorum recovery's fences and force follow status (not
		// one in a phase this build does not know: those stay as they are).
		want := withoutRecovery(state)
		applyRecovery(&want, v.recoveryAfter(s))
		if joinstate.Encode(want) != joinstate.Encode(state) {
			for i, c := range children {
				if c.Kind == "ConfigMap" && c.Name == v.join.Name {
					children[i] = joinConfigMap(v.c, v.labels, want, v.ledger, v.join.Annotations[AnnotationClusterID], restoredAnnotation(v.obs, v.c), durable{v2LogIndex: v.safe.v2LogIndex, recovery: v.recoveryAfter(s)})
				}
			}
		}
	}
	if v.sts == nil && len(v.oldPodsGoing()) == 0 {
		missing = append(missing, statefulSet(v.c, v.claimTemplate(), v.labels, v.spec, v.lastKnownReplicas(), v.protectivePartition(), retainClaims))
	}
	for _, c := range missing {
		if !have[c.Kind+"/"+c.Name] {
			children = append(children, c)
		}
	}
	return children
}

// recoveryAfter is the quorum recovery as status records it after step s.
func (v *view) recoveryAfter(s step) *v1alpha1.RecoveryStatus {
	if s.recovery != nil {
		return s.recovery
	}
	return v.safe.recovery
}

// withoutRecovery is st with no quorum recovery and no fences.
func withoutRecovery(st joinstate.State) joinstate.State {
	st.Recovery = nil
	st.Members = slices.Clone(st.Members)
	for i := range st.Members {
		st.Members[i].Fenced = false
	}
	return st
}

// lastKnownReplicas is how many pods the members status last recorded and the pods still
// there need; the size when nothing is known.
func (v *view) lastKnownReplicas() int {
	n := 0
	for _, m := range v.obs.Cluster.Status.Members {
		n = max(n, int(m.Ordinal)+1)
	}
	for ord := range v.pods {
		n = max(n, ord+1)
	}
	if n == 0 {
		return v.size
	}
	return n
}

// missingChildren names an observed child of a name the planner renders for cluster, other
// than a Job, that the desired set lacks: Metacontroller would delete it. Of several, the
// first in the children's order (kind, then name). Children of other names are adopted or
// left to go (adopted).
func missingChildren(observed Children, desired []Child, cluster string) string {
	for _, missing := range []string{
		firstMissing("ConfigMap", observed.ConfigMaps, desired, cluster),
		firstMissing("PodDisruptionBudget", observed.PDBs, desired, cluster),
		firstMissing("Role", observed.Roles, desired, cluster),
		firstMissing("RoleBinding", observed.RoleBindings, desired, cluster),
		firstMissing("ServiceAccount", observed.Accounts, desired, cluster),
		firstMissing("Service", observed.Services, desired, cluster),
		firstMissing("StatefulSet", observed.StatefulSets, desired, cluster),
	} {
		if missing != "" {
			return missing
		}
	}
	return ""
}

// firstMissing is "kind name" of the lowest-named object of objs of a name the planner
// renders that desired lacks, "" when it lacks none.
func firstMissing[T any, P interface {
	*T
	GetName() string
}](kind string, objs []T, desired []Child, cluster string) string {
	first, found := "", false
	for i := range objs {
		name := P(&objs[i]).GetName()
		if ownChild(cluster, kind, name) && (!found || name < first) && !slices.ContainsFunc(desired, func(c Child) bool { return c.Kind == kind && c.Name == name }) {
			first, found = name, true
		}
	}
	if !found {
		return ""
	}
	return kind + " " + first
}

// hold changes nothing: the observed children are returned as they are.
func (v *view) hold(reason, degraded string) step {
	return step{action: Action{Type: Hold, Reason: reason}, hold: true, resync: resyncHold, degraded: degraded}
}
