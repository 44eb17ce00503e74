package sync

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/joinstate"
)

// checkInvariants checks a step before it is rendered: the rules every change keeps, whatever
// phase decided it. A hold changes nothing and always passes, except a roll-forward, which
// has rules of its own. The checks run in a fixed order, so a step breaking several rules is
// always refused for the same one.
func checkInvariants(v *view, s step) error {
	if s.hold {
		if s.rollForward {
			return checkRollForward(v, s)
		}
		return nil
	}
	// target is the member a destructive change disturbs, if any.
	target, err := checkJob(v, s)
	if err != nil {
		return err
	}
	if err := checkReplicas(v, s); err != nil {
		return err
	}
	exposed := exposedPods(v, s.partition)
	if len(exposed) > 1 {
		return fmt.Errorf("partition %d would replace %d pods at once", s.partition, len(exposed))
	}
	if len(exposed) == 1 {
		replaced, err := checkReplacement(v, s.partition, exposed[0])
		if err != nil {
			return err
		}
		if replaced != nil {
			target = replaced
		}
	}
	forcing, err := checkRecoveryStep(v, s.recovery)
	if err != nil {
		return err
	}
	if n := countChanges(v, s, len(exposed), forcing); n > 1 {
		return fmt.Errorf("%d changes in one sync", n)
	}
	if err := checkGuard(v, s, exposed, forcing); err != nil {
		return err
	}
	if err := checkTLSStep(v, s, exposed); err != nil {
		return err
	}
	return checkDisturbance(v, target)
}

// countChanges counts what the step moves: its Job, the StatefulSet's replicas, the pod its
// partition exposes, the force of a quorum recovery. A sync makes at most one.
func countChanges(v *view, s step, exposed int, forcing bool) int {
	n := exposed
	if s.job != nil {
		n++
	}
	if v.sts != nil && s.replicas != v.replicas {
		n++
	}
	if forcing {
		n++
	}
	return n
}

// checkGuard refuses a risky step taken, with spec.backup, before a snapshot (or a person's
// go-ahead) guards it in status.backup.guard (guard.go): a healthy voter removed, or its pod
// exposed for replacement, while a roll, a scale-in or a minor upgrade is ahead; a survivor
// told to force a new cluster.
func checkGuard(v *view, s step, exposed []int, forcing bool) error {
	if v.c.Spec.Backup == nil {
		return nil
	}
	b := s.backup
	if b == nil {
		b = v.obs.Cluster.Status.Backup
	}
	if forcing && !guardedBy(b, "recovery-"+s.recovery.Token) {
		return fmt.Errorf("forcing a new cluster from %s before a snapshot guards it", s.recovery.Survivor)
	}
	key, _ := v.riskyStep()
	if key == "" || guardedBy(b, key) {
		return nil
	}
	var m *member
	if s.job != nil && s.job.verb == verbRemove {
		ord, _ := Ordinal(v.c.Name, s.job.member)
		m = v.byOrd[ord]
	}
	if len(exposed) == 1 {
		m = v.byOrd[exposed[0]]
	}
	if m != nil && !m.IsLearner && m.Healthy {
		return fmt.Errorf("disturbing %s, a healthy voter, before a snapshot guards %s", m.name, key)
	}
	return nil
}

// readsOnly: a Job of this verb changes nothing in the cluster (a backup, a restore drill).
func readsOnly(verb string) bool { return verb == verbBackup || verb == verbDrill }

// checkJob guards a member Job: never beside another Job but a backup, never a second learner
// or a backup while one joins, and a removal only while the voters keep a healthy quorum. It
// returns the voter the Job disturbs: the one it removes, or the leader it moves leadership
// from.
func checkJob(v *view, s step) (*member, error) {
	if s.job == nil {
		return nil, nil
	}
	// A backup or a drill outstanding changes no membership: a fix may start beside it, never
	// a second backup or drill.
	for _, j := range s.keep {
		if state, _ := stateOf(j); state != jobRunning && readsOnly(j.Labels[LabelAction]) || state == jobSucceeded && j.Annotations[AnnotationSwitchover] != "" {
			continue // a finished backup, drill or switchover, kept until status holds its outcome
		}
		if !readsOnly(j.Labels[LabelAction]) || readsOnly(s.job.verb) {
			return nil, fmt.Errorf("new %s Job while Job %s is outstanding", s.job.verb, j.Name)
		}
	}
	ord, _ := Ordinal(v.c.Name, s.job.member)
	m := v.byOrd[ord]
	switch s.job.verb {
	case verbAddLearner:
		if len(v.learners()) > 0 {
			return nil, errors.New("a second learner")
		}
		if m != nil {
			return nil, fmt.Errorf("adding %s, which is already a member", s.job.member)
		}
	case verbRemove:
		return checkRemoval(v, m, s.job.member)
	case verbBackup:
		if len(v.learners()) > 0 {
			return nil, errors.New("a backup while a learner joins")
		}
	case verbPromote:
		if m == nil || !m.IsLearner {
			return nil, fmt.Errorf("promoting %s, which is not a learner", s.job.member)
		}
	case verbMoveLeader:
		if m == nil || m.IsLearner || !m.Healthy {
			return nil, fmt.Errorf("moving leadership to %s, which is not a healthy voter", s.job.member)
		}
		return v.leader, nil
	}
	return nil, nil
}

// checkRemoval guards removing m (named name): it must be a member, not one only the hook
// cannot reach, and, a voter, leave a healthy quorum. It returns the voter removed.
func checkRemoval(v *view, m *member, name string) (*member, error) {
	if m == nil {
		return nil, fmt.Errorf("removing %s, which is not a member", name)
	}
	if m.unanswered() && !hasAlarm(m.Member, "CORRUPT") && m.ordinal < v.target {
		return nil, fmt.Errorf("removing %s, which only the hook cannot reach (its pod is Ready)", m.name)
	}
	if m.IsLearner {
		return nil, nil
	}
	voters, others := len(v.voters()), v.healthyVoters()
	if m.Healthy {
		others--
	}
	if !etcdstate.QuorumAfterRemoval(voters, others) {
		return nil, fmt.Errorf("removing voter %s would leave %d healthy of %d voters", m.name, others, voters-1)
	}
	return m, nil
}

// checkReplicas guards the StatefulSet's size: never below a member. A StatefulSet re-created
// after it was deleted adopts the pods left behind and deletes those beyond its replicas: a
// member with a live pod must stay within them as well.
func checkReplicas(v *view, s step) error {
	for _, m := range v.members {
		p := v.pods[m.ordinal]
		if m.ordinal >= s.replicas && (s.replicas < v.replicas || v.sts == nil && p != nil && !isTerminating(p)) {
			return fmt.Errorf("a StatefulSet of %d replicas would drop member %s", s.replicas, m.name)
		}
	}
	return nil
}

// exposedPods are the ordinals of the live outdated pods at or above partition: those the
// StatefulSet's rolling update recreates.
func exposedPods(v *view, partition int) []int {
	var exposed []int
	for ord, p := range v.pods {
		if ord >= partition && !isTerminating(p) && v.outdated(p) {
			exposed = append(exposed, ord)
		}
	}
	return exposed
}

// checkReplacement guards recreating the pod at ord: the pods above it replaced and up, its
// member neither one only the hook cannot reach nor a leader another voter could replace,
// and a healthy quorum left while it is down. It returns the healthy voter replaced.
func checkReplacement(v *view, partition, ord int) (*member, error) {
	if _, why := v.replacementBlocker(ord); why != "" {
		return nil, fmt.Errorf("partition %d exposes %s while %s", partition, PodName(v.c.Name, ord), why)
	}
	m := v.byOrd[ord]
	if m == nil {
		return nil, nil
	}
	voters, healthy := len(v.voters()), v.healthyVoters()
	if m.unanswered() {
		return nil, fmt.Errorf("replacing %s, which only the hook cannot reach (its pod is Ready)", m.name)
	}
	if m == v.leader && voters > 1 && v.leaderTarget(m) != nil {
		return nil, fmt.Errorf("replacing leader %s while %s could take leadership", m.name, v.leaderTarget(m).name)
	}
	if m.IsLearner || !m.Healthy {
		return nil, nil
	}
	if !etcdstate.QuorumWhileOneIsDown(voters, healthy-1) {
		return nil, fmt.Errorf("replacing %s would leave %d healthy of %d voters", m.name, healthy-1, voters)
	}
	return m, nil
}

// checkDisturbance guards a change that disturbs a healthy voter: it is decided on a complete
// picture, every other member answered, so none of them is failing unseen. (A failed member's
// removal counts every silent member as unhealthy, which errs on the safe side.) A learner
// does not vote: removing or recreating one costs no quorum, whoever is silent.
func checkDisturbance(v *view, target *member) error {
	if target == nil || !target.Healthy {
		return nil
	}
	for _, m := range v.members {
		if m != target && !m.Reachable {
			return fmt.Errorf("disturbing %s while %s did not answer", target.name, m.name)
		}
	}
	return nil
}

// checkRollForward: a hold may recreate one outdated pod only while etcd was not reached, no
// pod is Ready, the pods keep their data on volumes, and no other pod is exposed.
func checkRollForward(v *view, s step) error {
	switch {
	case v.obs.Etcd.Asked:
		return errors.New("rolling forward while etcd answered")
	case v.c.Spec.StorageSpec == nil:
		return errors.New("rolling forward without volumes")
	case v.sts == nil:
		return errors.New("rolling forward without a StatefulSet")
	}
	exposed := 0
	for ord, p := range v.pods {
		if isReady(p) || nodeNotReporting(p) {
			return fmt.Errorf("rolling forward while %s may serve", p.Name)
		}
		if ord >= s.partition && !isTerminating(p) && v.outdated(p) {
			exposed++
		}
	}
	if exposed != 1 {
		return fmt.Errorf("rolling forward exposes %d pods", exposed)
	}
	return nil
}

// checkTeardown: a finalize decision starts nothing and keeps only what it observed; member
// Jobs go before the StatefulSet, the StatefulSet's pods before the rest; finalized only once
// nothing is left.
func checkTeardown(obs *Observed, d Decision) error {
	observed := map[string]bool{}
	for _, c := range observedChildren(obs.Children) {
		observed[c.Kind+"/"+c.Name] = true
	}
	kinds := map[string]int{}
	for _, c := range d.Children {
		if !observed[c.Kind+"/"+c.Name] {
			return fmt.Errorf("teardown returns %s %s, which was not observed", c.Kind, c.Name)
		}
		kinds[c.Kind]++
	}
	switch {
	case kinds["Job"] > 0:
		return errors.New("teardown keeps a member Job")
	case len(obs.Children.Jobs) > 0 && kinds["StatefulSet"] < len(obs.Children.StatefulSets):
		return errors.New("teardown deletes the StatefulSet while a member Job is left")
	case d.Finalized && (len(d.Children) > 0 || len(observed) > 0 || len(ownPods(obs)) > 0):
		return errors.New("finalized while children or pods are left")
	}
	return nil
}

// checkBootstrap: the first answer starts exactly one seed in a new cluster and no Job, only
// where no cluster ever answered, and never recreates a seed that ran etcd without a volume.
func checkBootstrap(obs *Observed, d Decision) error {
	if obs.Etcd.Asked || obs.Cluster.Status.ClusterID != "" {
		return errors.New("bootstrapping a cluster that answered")
	}
	for _, c := range d.Children {
		switch c.Kind {
		case "Job":
			return errors.New("bootstrap starts a member Job")
		case "StatefulSet":
			spec := c.Object.(apiObject).Spec.(statefulSetSpec)
			if spec.Replicas != 1 {
				return fmt.Errorf("bootstrap StatefulSet of %v replicas", spec.Replicas)
			}
			if seed := liveSeed(obs); seed != nil && obs.Cluster.Spec.StorageSpec == nil && etcdHasRun(seed) && spec.UpdateStrategy.RollingUpdate.Partition == 0 &&
				seed.Annotations[AnnotationSpecHash] != spec.Template.Metadata.Annotations[AnnotationSpecHash] {
				return fmt.Errorf("bootstrap recreates seed %s, which ran etcd without a volume, for a new template", seed.Name)
			}
		case "ConfigMap":
			if c.Name != JoinConfigMapName(obs.Cluster.Name) {
				continue
			}
			st, err := joinstate.Decode([]byte(c.Object.(apiObject).Data[joinstate.ConfigMapKey]))
			if err != nil {
				return err
			}
			if st.ClusterState != joinstate.StateNew || len(st.Members) != 1 {
				return fmt.Errorf("bootstrap join state %s with %d members", st.ClusterState, len(st.Members))
			}
		}
	}
	return nil
}

// liveSeed is the observed pod of ordinal 0 when it is not terminating, or nil.
func liveSeed(obs *Observed) *corev1.Pod {
	for i := range obs.Pods {
		if ord, ok := ownPod(&obs.Cluster, &obs.Pods[i]); ok && ord == 0 && !isTerminating(&obs.Pods[i]) {
			return &obs.Pods[i]
		}
	}
	return nil
}

// ownPods are the observed pods of the cluster.
func ownPods(obs *Observed) []int {
	var out []int
	for i := range obs.Pods {
		if ord, ok := ownPod(&obs.Cluster, &obs.Pods[i]); ok {
			out = append(out, ord)
		}
	}
	return out
}

// checkRecoveryStep checks how a step moves a quorum recovery on from what status recorded;
// forcing says it tells the survivor to force a new cluster. The survivor is told only once
// quorum is lost and the fences have reached every other voter; once told, the fences stand
// until etcd lists the survivor alone or the force has been out of the join ConfigMap long
// enough that no pod can still read it.
func checkRecoveryStep(v *view, next *v1alpha1.RecoveryStatus) (forcing bool, err error) {
	prev := v.safe.recovery
	if next == nil || next == prev {
		return false, nil
	}
	from := ""
	if prev != nil {
		from = prev.Phase
	}
	vs := v.voters()
	alone := len(vs) == 1 && vs[0].name == next.Survivor && etcdstate.HasQuorum(1, v.healthyVoters())
	switch {
	case next.Phase == recoveryForcing && from != recoveryForcing:
		switch {
		case etcdstate.HasQuorum(len(vs), v.healthyVoters()):
			return false, errors.New("forcing a new cluster while quorum holds")
		case from != recoveryFencing || prev.Survivor != next.Survivor || prev.Token != next.Token:
			return false, fmt.Errorf("forcing a new cluster from %s before status recorded its fences", next.Survivor)
		}
		if why, _ := v.fenceUnreached(prev); why != "" {
			return false, fmt.Errorf("forcing a new cluster from %s before its fences reached the others: %s", next.Survivor, why)
		}
		return true, nil
	case from == recoveryForcing && next.Phase != recoveryForcing && next.Phase != recoveryWithdrawing && !(next.Phase == recoveryDone && alone):
		return false, fmt.Errorf("recovery from %s leaves Forcing for %s: its volume may still force a new cluster", next.Survivor, next.Phase)
	case from == recoveryWithdrawing && next.Phase != recoveryWithdrawing && !(next.Phase == recoveryDone && alone) &&
		(v.observedForce(prev) || v.obs.Now.Before(prev.Since.Add(fenceMountDelay))):
		return false, fmt.Errorf("recovery from %s leaves Withdrawing for %s while its pod may still read the force", prev.Survivor, next.Phase)
	}
	return false, nil
}
