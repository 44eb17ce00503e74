package hooks

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"etcdops.dev/etcdops/sync"
)

// TestBackupSeries: the backups' series as the alerts read them (manifests/monitoring), and
// none of them for a cluster without backups or restores.
func TestBackupSeries(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	c := newClusterCollector(func() time.Time { return now })
	c.observe(sync.ClusterMetrics{Namespace: "ns", Name: "backed-up",
		Backup:   &sync.BackupMetrics{LastSuccess: now.Add(-time.Hour), ScheduleInterval: 6 * time.Hour},
		Restores: []sync.RestoreMetrics{{Kind: sync.RestoreKindDrill, Succeeded: true, Duration: 90 * time.Second}, {Kind: sync.RestoreKindBootstrap}}}, now)
	c.observe(sync.ClusterMetrics{Namespace: "ns", Name: "plain"}, now)
	want := `
# HELP etcdops_cluster_backup_last_success_timestamp_seconds Unix time the last backup succeeded; absent before the first.
# TYPE etcdops_cluster_backup_last_success_timestamp_seconds gauge
etcdops_cluster_backup_last_success_timestamp_seconds{name="backed-up",namespace="ns"} 1.7961228e+09
# HELP etcdops_cluster_backup_schedule_interval_seconds Time between the two schedule times after the last backup (spec.backup.schedule); absent while suspended.
# TYPE etcdops_cluster_backup_schedule_interval_seconds gauge
etcdops_cluster_backup_schedule_interval_seconds{name="backed-up",namespace="ns"} 21600
# HELP etcdops_cluster_restore_duration_seconds How long the last restore of the kind took (drill: a restore drill's; bootstrap: the seed's of a cluster restored from a backup).
# TYPE etcdops_cluster_restore_duration_seconds gauge
etcdops_cluster_restore_duration_seconds{kind="drill",name="backed-up",namespace="ns"} 90
# HELP etcdops_cluster_restore_succeeded 1 when the last restore of the kind succeeded, 0 when it failed.
# TYPE etcdops_cluster_restore_succeeded gauge
etcdops_cluster_restore_succeeded{kind="bootstrap",name="backed-up",namespace="ns"} 0
etcdops_cluster_restore_succeeded{kind="drill",name="backed-up",namespace="ns"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "etcdops_cluster_backup_last_success_timestamp_seconds",
		"etcdops_cluster_backup_schedule_interval_seconds", "etcdops_cluster_restore_duration_seconds", "etcdops_cluster_restore_succeeded"); err != nil {
		t.Fatal(err)
	}
}
