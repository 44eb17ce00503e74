package sync

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
)

// Reasons of the Degraded condition when it is True: why the cluster is not as it should be,
// or why the operator cannot go on. A closed list; docs/operate.md explains each.
const (
	ReasonInvalidSpec          = "InvalidSpec"
	ReasonEtcdUnreachable      = "EtcdUnreachable"
	ReasonEtcdInconsistent     = "EtcdInconsistent"
	ReasonStrangerMember       = "StrangerMember"
	ReasonClusterIDChanged     = "ClusterIDChanged"
	ReasonQuorumLost           = "QuorumLost"
	ReasonQuorumUnconfirmed    = "QuorumUnconfirmed"
	ReasonMemberUnanswered     = "MemberUnanswered"
	ReasonMemberUnhealthy      = "MemberUnhealthy"
	ReasonPodCannotStart       = "PodCannotStart"
	ReasonJobFailing           = "JobFailing"
	ReasonJobAttemptsExhausted = "JobAttemptsExhausted"
	ReasonNoSpace              = "NoSpace"
	ReasonNoVolumeToRoll       = "NoVolumeToRoll"
	ReasonBlocked              = "Blocked"
)

// Status never churns: the same observation gives the same status. Times come from
// Observed.Now and are carried over from the last status while nothing changed (an action's
// Since while its type and member stay; a condition's LastTransitionTime while its status
// stays).

// noStorageWarning is the status warning of a cluster without a storageSpec.
const noStorageWarning = "no storageSpec: member data lives in emptyDir volumes and does not survive the loss of a pod; " +
	"a lost member is replaced from the others, but losing a majority of the pods at once loses the data"

// warnings are the status warnings the spec alone calls for, in a fixed order.
func warnings(c *v1alpha1.EtcdCluster) []string {
	var out []string
	if w := v1alpha1.EvenSizeWarning(*c.Spec.Size); w != "" {
		out = append(out, w)
	}
	if c.Spec.StorageSpec == nil {
		out = append(out, noStorageWarning)
	}
	return out
}

// newStatus starts from what the last status knew of etcd, reports the action and warns
// about the spec (c is defaulted).
func newStatus(obs *Observed, c *v1alpha1.EtcdCluster, phase v1alpha1.Phase, a Action) v1alpha1.EtcdClusterStatus {
	prev := obs.Cluster.Status
	since := metav1.NewTime(obs.Now)
	if p := prev.Action; p != nil && p.Type == a.Type.String() && p.Member == a.Member && !p.Since.IsZero() {
		since = p.Since
	}
	return v1alpha1.EtcdClusterStatus{
		Phase:          phase,
		ReadyMembers:   prev.ReadyMembers,
		Members:        prev.Members,
		Leader:         prev.Leader,
		ClusterID:      prev.ClusterID,
		CurrentVersion: prev.CurrentVersion,
		Action:         &v1alpha1.Action{Type: a.Type.String(), Member: a.Member, Reason: a.Reason, Since: since},
		Warnings:       warnings(c),
		Maintenance:    prev.Maintenance,
		Recovery:       prev.Recovery,
		Backup:         prev.Backup,
		RestoredFrom:   prev.RestoredFrom,
	}
}

// setCondition sets one condition, keeping its transition time while its status stays.
func setCondition(st *v1alpha1.EtcdClusterStatus, obs *Observed, c *v1alpha1.EtcdCluster, typ string, on bool, reason, msg string) {
	cond := metav1.Condition{Type: typ, Status: metav1.ConditionFalse, Reason: reason, Message: msg, ObservedGeneration: c.Generation, LastTransitionTime: metav1.NewTime(obs.Now)}
	if on {
		cond.Status = metav1.ConditionTrue
	}
	setConditionValue(st, obs, cond)
}

func setConditionValue(st *v1alpha1.EtcdClusterStatus, obs *Observed, cond metav1.Condition) {
	for _, p := range obs.Cluster.Status.Conditions {
		if p.Type == cond.Type && p.Status == cond.Status && !p.LastTransitionTime.IsZero() {
			cond.LastTransitionTime = p.LastTransitionTime
		}
	}
	for i := range st.Conditions {
		if st.Conditions[i].Type == cond.Type {
			st.Conditions[i] = cond
			return
		}
	}
	st.Conditions = append(st.Conditions, cond)
}

// status reports a step over a view: membership as etcd has it, and the three conditions.
func (v *view) status(s step) v1alpha1.EtcdClusterStatus {
	// Membership as etcd answered, unless the answer cannot be trusted: then status keeps what
	// it knew, above all the cluster ID, which a stranger's answer must not overwrite.
	reason, _ := unknownStateReason(v)
	asked := reason == ""
	// answered: etcd answered at all; the phase follows what it said, trusted or not.
	answered := v.obs.Etcd.Asked && len(v.members) > 0
	voters, healthy := len(v.voters()), v.healthyVoters()
	// Degraded counts voters only: a learner is unhealthy while it joins, by design.
	var unhealthy []string
	for _, m := range v.voters() {
		if !m.Healthy {
			unhealthy = append(unhealthy, m.name)
		}
	}

	phase := v1alpha1.PhaseRunning
	prev := v.obs.Cluster.Status.Phase
	switch {
	case !answered && v.obs.Cluster.Status.ClusterID == "":
		phase = v1alpha1.PhaseCreating
	case !answered || !hasQuorum(voters, healthy+len(v.unansweredVoters())):
		phase = v1alpha1.PhaseUnavailable
	case s.degraded != "" || len(unhealthy) > 0 && (prev != v1alpha1.PhaseCreating || s.action.Type == Hold):
		phase = v1alpha1.PhaseDegraded
	case (prev == v1alpha1.PhaseCreating || prev == "") && voters < v.size:
		// Still growing to its first full size.
		phase = v1alpha1.PhaseCreating
	}
	st := newStatus(v.obs, v.c, phase, s.action)
	if s.maintenance != nil {
		st.Maintenance = s.maintenance
	}
	if s.recovery != nil {
		st.Recovery = s.recovery
	}
	if len(s.keep) > 0 {
		st.JobFailures = int32(attemptOf(s.keep[0]))
		if state, _ := stateOf(s.keep[0]); state == jobFailed {
			st.JobFailures++
		}
	} else if s.job != nil {
		st.JobFailures = int32(s.job.attempt)
	}

	if asked {
		st.Members = nil
		for _, m := range v.members {
			ms := v1alpha1.MemberStatus{
				Name: m.name, ID: fmt.Sprintf("%x", m.ID), Ordinal: int32(m.ordinal),
				IsLearner: m.IsLearner, IsLeader: m.IsLeader, Healthy: m.Healthy,
				Version: v1alpha1.NormalizeVersion(m.Version),
			}
			if m.unanswered() {
				since := metav1.NewTime(v.unansweredSince(m))
				ms.UnansweredSince = &since
			}
			st.Members = append(st.Members, ms)
		}
		st.ReadyMembers = int32(healthy)
		st.Leader = ""
		if v.leader != nil {
			st.Leader = v.leader.name
		}
		st.ClusterID = fmt.Sprintf("%x", v.obs.Etcd.ClusterID)
		if low := lowestVersion(v.obs.Etcd.Members); low != "" {
			st.CurrentVersion = low
		}
	}

	switch {
	case !asked:
		setConditionValue(&st, v.obs, metav1.Condition{Type: v1alpha1.ConditionAvailable, Status: metav1.ConditionUnknown, Reason: "EtcdUnknown", Message: s.action.Reason, ObservedGeneration: v.c.Generation, LastTransitionTime: metav1.NewTime(v.obs.Now)})
	case hasQuorum(voters, healthy):
		setCondition(&st, v.obs, v.c, v1alpha1.ConditionAvailable, true, "QuorumHealthy", fmt.Sprintf("%d of %d voters healthy", healthy, voters))
	case hasQuorum(voters, healthy+len(v.unansweredVoters())):
		setConditionValue(&st, v.obs, metav1.Condition{Type: v1alpha1.ConditionAvailable, Status: metav1.ConditionUnknown, Reason: ReasonQuorumUnconfirmed,
			Message: fmt.Sprintf("%d of %d voters healthy; %d more did not answer the hook but their pods are Ready", healthy, voters, len(v.unansweredVoters())), ObservedGeneration: v.c.Generation, LastTransitionTime: metav1.NewTime(v.obs.Now)})
	default:
		setCondition(&st, v.obs, v.c, v1alpha1.ConditionAvailable, false, "QuorumLost", fmt.Sprintf("%d of %d voters healthy", healthy, voters))
	}
	switch {
	case s.action.Type == Steady || s.action.Type == Hold || s.degraded != "" && s.action.Type == Wait:
		// Blocked is not progressing, even while it waits.
		setCondition(&st, v.obs, v.c, v1alpha1.ConditionProgressing, false, s.action.Type.String(), s.action.Reason)
	default:
		setCondition(&st, v.obs, v.c, v1alpha1.ConditionProgressing, true, s.action.Type.String(), s.action.Reason)
	}
	switch {
	case s.degraded != "":
		reason := s.degradedBy
		if reason == "" {
			reason = ReasonBlocked
		}
		setCondition(&st, v.obs, v.c, v1alpha1.ConditionDegraded, true, reason, s.degraded)
	case asked && len(unhealthy) > 0:
		setCondition(&st, v.obs, v.c, v1alpha1.ConditionDegraded, true, ReasonMemberUnhealthy, "unhealthy: "+strings.Join(unhealthy, ", "))
	default:
		setCondition(&st, v.obs, v.c, v1alpha1.ConditionDegraded, false, "Healthy", "no unhealthy member seen")
	}
	return st
}

// lowestVersion is the lowest etcd version the answering members report, "v"-prefixed; ""
// when none reports one.
func lowestVersion(ms []etcdstate.Member) string {
	var low *version.Version
	for _, m := range ms {
		v, err := version.ParseSemantic(m.Version)
		if err == nil && (low == nil || v.LessThan(low)) {
			low = v
		}
	}
	if low == nil {
		return ""
	}
	return "v" + low.String()
}
