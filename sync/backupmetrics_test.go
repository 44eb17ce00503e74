package sync

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/joinstate"
)

// TestBackupMetrics: the last backup's time against the schedule, and the last restore of each
// kind, read from status and the seed's pod.
func TestBackupMetrics(t *testing.T) {
	last := time.Date(2026, 1, 1, 6, 0, 5, 0, time.UTC)
	for _, tc := range []struct {
		story    string
		cluster  func(c *v1alpha1.EtcdCluster)
		pod      string // the seed's last termination message
		backup   *BackupMetrics
		restores []RestoreMetrics
	}{
		{"no spec.backup, not restored: nothing", func(*v1alpha1.EtcdCluster) {}, "", nil, nil},
		{"every 6 hours, the last at 06:00", func(c *v1alpha1.EtcdCluster) {
			c.Spec.Backup = simBackupSpec("0 */6 * * *")
			c.Status.Backup = &v1alpha1.BackupStatus{LastSuccessfulTime: &metav1.Time{Time: last}}
		}, "", &BackupMetrics{LastSuccess: last, ScheduleInterval: 6 * time.Hour}, nil},
		{"suspended: no interval to be overdue against", func(c *v1alpha1.EtcdCluster) {
			c.Spec.Backup = simBackupSpec("@hourly")
			c.Spec.Backup.Suspend = true
		}, "", &BackupMetrics{}, nil},
		{"a drill restored in 12s and differed: the restore succeeded", func(c *v1alpha1.EtcdCluster) {
			c.Spec.Backup = simBackupSpec("@daily")
			c.Status.Backup = &v1alpha1.BackupStatus{LastDrill: &v1alpha1.DrillRecord{Result: v1alpha1.DrillMismatch, RestoreDuration: &metav1.Duration{Duration: 12 * time.Second}}}
		}, "", &BackupMetrics{ScheduleInterval: 24 * time.Hour}, []RestoreMetrics{{Kind: RestoreKindDrill, Succeeded: true, Duration: 12 * time.Second}}},
		{"a drill could not restore", func(c *v1alpha1.EtcdCluster) {
			c.Spec.Backup = simBackupSpec("@daily")
			c.Status.Backup = &v1alpha1.BackupStatus{LastDrill: &v1alpha1.DrillRecord{Result: v1alpha1.DrillRestoreFailed}}
		}, "", &BackupMetrics{ScheduleInterval: 24 * time.Hour}, []RestoreMetrics{{Kind: RestoreKindDrill}}},
		{"a seed whose restore fails", func(c *v1alpha1.EtcdCluster) {
			c.Spec.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: &v1alpha1.FromBackup{Name: "latest", BackupDestination: simBackupSpec("@daily").Destination}}
		}, joinstate.RestoreFailed + "snapshot refused", nil, []RestoreMetrics{{Kind: RestoreKindBootstrap}}},
		{"a seed that restored in 3m", func(c *v1alpha1.EtcdCluster) {
			c.Spec.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: &v1alpha1.FromBackup{Name: "latest", BackupDestination: simBackupSpec("@daily").Destination}}
			c.Status.RestoredRevision, c.Status.RestoreDuration = 48377, &metav1.Duration{Duration: 3 * time.Minute}
		}, joinstate.RestoreFailed + "an earlier attempt", nil, []RestoreMetrics{{Kind: RestoreKindBootstrap, Succeeded: true, Duration: 3 * time.Minute}}},
	} {
		t.Run(tc.story, func(t *testing.T) {
			c := v1alpha1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Name: "etcd", Namespace: "default", CreationTimestamp: metav1.NewTime(last.Add(-time.Hour))}}
			tc.cluster(&c)
			obs := Observed{Cluster: c}
			if tc.pod != "" {
				p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "etcd-0", Labels: map[string]string{LabelCluster: "etcd"}}}
				p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "etcd", LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Message: tc.pod}},
					State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}}
				obs.Pods = []corev1.Pod{p}
			}
			b, r := backupMetrics(obs, &c, c.Status)
			if (b == nil) != (tc.backup == nil) || b != nil && *b != *tc.backup {
				t.Errorf("backup %+v, want %+v", b, tc.backup)
			}
			if len(r) != len(tc.restores) || len(r) > 0 && r[0] != tc.restores[0] {
				t.Errorf("restores %+v, want %+v", r, tc.restores)
			}
		})
	}
}
