package hooks

import (
	"github.com/prometheus/client_golang/prometheus"

	"etcdops.dev/etcdops/sync"
)

// The backups as a whole, as status records them (sync.BackupMetrics): the last snapshot
// against its schedule, and the last restore of each kind, a restore drill's and a restored
// cluster's seed's. Whether the last drill passed is the BackupVerified condition.
var (
	descBackupLastSuccess = clusterDesc("backup_last_success_timestamp_seconds", "Unix time the last backup succeeded; absent before the first.")
	descBackupInterval    = clusterDesc("backup_schedule_interval_seconds", "Time between the two schedule times after the last backup (spec.backup.schedule); absent while suspended.")
	descRestoreDuration   = clusterDesc("restore_duration_seconds", "How long the last restore of the kind took (drill: a restore drill's; bootstrap: the seed's of a cluster restored from a backup).", "kind")
	descRestoreSucceeded  = clusterDesc("restore_succeeded", "1 when the last restore of the kind succeeded, 0 when it failed.", "kind")
)

func describeBackups(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBackupLastSuccess, descBackupInterval, descRestoreDuration, descRestoreSucceeded} {
		ch <- d
	}
}

// collectBackups emits m's backup series through gauge.
func collectBackups(m sync.ClusterMetrics, gauge func(d *prometheus.Desc, v float64, labels ...string)) {
	if b := m.Backup; b != nil {
		if !b.LastSuccess.IsZero() {
			gauge(descBackupLastSuccess, float64(b.LastSuccess.UnixNano())/1e9)
		}
		if b.ScheduleInterval > 0 {
			gauge(descBackupInterval, b.ScheduleInterval.Seconds())
		}
	}
	for _, r := range m.Restores {
		gauge(descRestoreSucceeded, boolValue(r.Succeeded), r.Kind)
		if r.Duration > 0 {
			gauge(descRestoreDuration, r.Duration.Seconds(), r.Kind)
		}
	}
}
