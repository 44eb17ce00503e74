package sync

import (
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
)

// ClusterMetrics is what one sync tells about a cluster, for the hook's /metrics: plain
// values, derived from the observation and the decision alone.
type ClusterMetrics struct {
	Namespace, Name string
	// Finalized: the cluster is gone; its series go too.
	Finalized bool
	// Size is the number of voters the spec asks for.
	Size int
	// Voters and Learners are the members etcd lists (the last known membership while etcd's
	// answer cannot be used); HealthyVoters only counts what etcd answered in this sync.
	Voters, HealthyVoters, Learners int
	// QuorumSize is how many voters a change needs; 0 before there is any.
	QuorumSize int
	// LeaderKnown: etcd answered in this sync and a member leads.
	LeaderKnown bool
	// Action is the current action's type, ActionSince when it was first decided.
	Action      ActionType
	ActionSince time.Time
	// JobFailures counts the failed member Jobs of the current step.
	JobFailures int
	// QuotaBytes is the backend quota every member enforces (--quota-backend-bytes, else
	// etcd's default); 0 when the quota is disabled or cannot be read.
	QuotaBytes int64
	// Members are the members that answered, by ordinal.
	Members []MemberMetrics
	// Alarms counts the members raising each alarm; every alarm of AlarmNames is present.
	Alarms map[string]int
	// Conditions are the status conditions, in status order.
	Conditions []metav1.Condition
	// Backup is what spec.backup's alerts read; nil without spec.backup (backupmetrics.go).
	Backup *BackupMetrics
	// Restores are the last restore of each kind the cluster knows of (backupmetrics.go).
	Restores []RestoreMetrics
}

// MemberMetrics is one member that answered the hook.
type MemberMetrics struct {
	Ordinal     int
	DBSizeBytes int64
}

// AlarmNames are etcd's alarms (etcdserverpb.AlarmType, NONE aside): a closed list, so an
// alarm label never takes a value from outside it.
var AlarmNames = []string{"NOSPACE", "CORRUPT"}

// defaultQuotaBytes is etcd's backend quota when --quota-backend-bytes is 0 or unset (2 GiB).
const defaultQuotaBytes = 2 << 30

// Metrics derives a sync's metrics from its observation and decision.
func Metrics(obs Observed, d Decision) ClusterMetrics {
	c := v1alpha1.Defaulted(obs.Cluster)
	st := d.Status
	m := ClusterMetrics{
		Namespace: c.Namespace, Name: c.Name, Finalized: d.Finalized,
		Size:        int(*c.Spec.Size),
		Action:      d.Action.Type,
		JobFailures: int(st.JobFailures),
		QuotaBytes:  quotaBytes(c.Spec.EtcdOptions),
		Alarms:      map[string]int{},
		Conditions:  st.Conditions,
	}
	if st.Action != nil {
		m.ActionSince = st.Action.Since.Time
	}
	m.Backup, m.Restores = backupMetrics(obs, &c, st)
	for _, ms := range st.Members {
		if ms.IsLearner {
			m.Learners++
		} else {
			m.Voters++
		}
	}
	if m.Voters > 0 {
		m.QuorumSize = etcdstate.Quorum(m.Voters)
	}
	for _, a := range AlarmNames {
		m.Alarms[a] = 0
	}
	// Status keeps the last known membership when etcd's answer cannot be used; health and
	// leadership count only when it was.
	if !etcdUnknown(st) {
		m.LeaderKnown = st.Leader != ""
		for _, ms := range st.Members {
			if !ms.IsLearner && ms.Healthy {
				m.HealthyVoters++
			}
		}
		for _, em := range obs.Etcd.Members {
			ord, ok := Ordinal(c.Name, em.Name)
			if !ok || !em.Reachable {
				continue
			}
			m.Members = append(m.Members, MemberMetrics{Ordinal: ord, DBSizeBytes: em.DBSize})
			for _, a := range em.Alarms {
				if _, known := m.Alarms[a]; known {
					m.Alarms[a]++
				}
			}
		}
		// An alarm of member 0 is no member's, and the one that most needs a person.
		for _, a := range obs.Etcd.Alarms {
			if _, known := m.Alarms[a.Type]; known && a.MemberID == 0 {
				m.Alarms[a.Type]++
			}
		}
	}
	return m
}

// etcdUnknown: the status says etcd did not answer in a way the planner could use.
func etcdUnknown(st v1alpha1.EtcdClusterStatus) bool {
	for _, c := range st.Conditions {
		if c.Type == v1alpha1.ConditionAvailable {
			return c.Reason == ReasonEtcdUnknown
		}
	}
	return true
}

// quotaBytes reads --quota-backend-bytes from the etcd options as etcd does (the last one
// given wins; 0 means the default; negative disables the quota).
func quotaBytes(opts []string) int64 {
	q := int64(0)
	for _, o := range opts {
		if v, ok := strings.CutPrefix(o, "--quota-backend-bytes="); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0
			}
			q = n
		}
	}
	switch {
	case q < 0:
		return 0
	case q == 0:
		return defaultQuotaBytes
	}
	return q
}

// ActionTypes lists every action type, in declaration order: the values of the action label.
func ActionTypes() []ActionType {
	out := make([]ActionType, len(actionNames))
	for i := range actionNames {
		out[i] = ActionType(i)
	}
	return out
}
