package sync

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/joinstate"
)

// BackupMetrics are a cluster's backups as its alerts read them: the last snapshot's time
// against the schedule (docs/monitoring.md).
type BackupMetrics struct {
	// LastSuccess is when the last backup succeeded; zero before the first.
	LastSuccess time.Time
	// ScheduleInterval is the time between the two schedule times that follow the last
	// success (the cluster's creation before one): a backup is overdue once twice that has
	// passed. 0 while the schedule is suspended.
	ScheduleInterval time.Duration
}

// RestoreMetrics is the last restore of one kind.
type RestoreMetrics struct {
	// Kind is RestoreKindDrill (a restore drill's) or RestoreKindBootstrap (the seed of a cluster
	// bootstrapped from a backup).
	Kind string
	// Succeeded: it restored; false: it failed.
	Succeeded bool
	// Duration is how long it took; 0 when not known.
	Duration time.Duration
}

// Kinds of restore.
const (
	RestoreKindDrill     = "drill"
	RestoreKindBootstrap = "bootstrap"
)

// backupMetrics reads the backup metrics from the status a sync leaves and the pods it saw.
func backupMetrics(obs Observed, c *v1alpha1.EtcdCluster, st v1alpha1.EtcdClusterStatus) (*BackupMetrics, []RestoreMetrics) {
	var restores []RestoreMetrics
	if fromBackup(c) != nil {
		switch {
		case st.RestoredRevision != 0:
			r := RestoreMetrics{Kind: RestoreKindBootstrap, Succeeded: true}
			if st.RestoreDuration != nil {
				r.Duration = st.RestoreDuration.Duration
			}
			restores = append(restores, r)
		case seedRestoreFailed(&obs, c):
			restores = append(restores, RestoreMetrics{Kind: RestoreKindBootstrap})
		}
	}
	b := c.Spec.Backup
	if b == nil {
		return nil, restores
	}
	m := &BackupMetrics{}
	from := c.CreationTimestamp.Time
	if rec := st.Backup; rec != nil {
		if rec.LastSuccessfulTime != nil {
			m.LastSuccess = rec.LastSuccessfulTime.Time
			from = m.LastSuccess
		}
		if d := rec.LastDrill; d != nil {
			switch {
			case d.Result == v1alpha1.DrillRestoreFailed:
				restores = append(restores, RestoreMetrics{Kind: RestoreKindDrill})
			case d.RestoreDuration != nil:
				restores = append(restores, RestoreMetrics{Kind: RestoreKindDrill, Succeeded: true, Duration: d.RestoreDuration.Duration})
			}
		}
	}
	if sched, err := v1alpha1.ParseSchedule(b.Schedule); err == nil && !b.Suspend {
		next := sched.Next(from)
		m.ScheduleInterval = sched.Next(next).Sub(next)
	}
	return m, restores
}

// seedRestoreFailed: a pod of the cluster last ended its etcd container because its restore
// failed (joinstate.RestoreFailed), the seed of a cluster that has not restored yet.
func seedRestoreFailed(obs *Observed, c *v1alpha1.EtcdCluster) bool {
	for i := range obs.Pods {
		p := &obs.Pods[i]
		cs := etcdStatus(p)
		if p.Labels[LabelCluster] != c.Name || cs == nil || cs.State.Running != nil {
			continue
		}
		for _, t := range []*corev1.ContainerStateTerminated{cs.State.Terminated, cs.LastTerminationState.Terminated} {
			if t != nil && strings.HasPrefix(t.Message, joinstate.RestoreFailed) {
				return true
			}
		}
	}
	return false
}
