package sync

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/test/prom"
)

func TestLatestTick(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tt := range []struct {
		story, schedule, from, now, want string // want "" when none is due
	}{
		{"nothing due before the first time", "0 * * * *", "2026-12-01T09:00:00Z", "2026-12-01T09:59:59Z", ""},
		{"due at the time itself", "0 * * * *", "2026-12-01T09:00:00Z", "2026-12-01T10:00:00Z", "2026-12-01T10:00:00Z"},
		{"several missed: the latest only", "0 * * * *", "2026-12-01T09:00:00Z", "2026-12-01T13:30:00Z", "2026-12-01T13:00:00Z"},
		{"a year of a per-minute schedule missed", "* * * * *", "2025-12-01T00:00:00Z", "2026-12-01T09:30:30Z", "2026-12-01T09:30:00Z"},
		{"a daily schedule missed for a month", "@daily", "2026-11-01T00:00:00Z", "2026-12-01T09:00:00Z", "2026-12-01T00:00:00Z"},
		{"a yearly schedule: the walk starts from the last taken", "@yearly", "2020-01-01T00:00:00Z", "2026-12-01T09:00:00Z", "2026-01-01T00:00:00Z"},
		{"no time in the last hour, several in the last day", "* 0-3 * * *", "2026-11-30T00:00:00Z", "2026-12-01T09:00:00Z", "2026-12-01T03:59:00Z"},
	} {
		sched, err := v1alpha1.ParseSchedule(tt.schedule)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := latestTick(sched.Next, at(tt.from), at(tt.now))
		switch {
		case tt.want == "" && ok:
			t.Errorf("%s: due at %s, want nothing", tt.story, got)
		case tt.want != "" && (!ok || !got.Equal(at(tt.want))):
			t.Errorf("%s: got %s %v, want %s", tt.story, got, ok, tt.want)
		}
	}
}

// backupWorld is a steady three-member world with backups to a claim, an hour after its
// first backup was due.
func backupWorld(t *testing.T) *simWorld {
	w := newSimWorld(t, 3, true)
	w.run(100)
	keep, hourly, daily := int32(3), int32(24), int32(30)
	w.cluster.Spec.Backup = &v1alpha1.BackupSpec{Schedule: "@hourly",
		Destination: v1alpha1.BackupDestination{PersistentVolumeClaim: &v1alpha1.PVCDestination{ClaimName: "etcd-backups"}},
		Retention:   &v1alpha1.BackupRetention{Keep: &keep, KeepFor: &metav1.Duration{Duration: 168 * time.Hour}, KeepHourly: &hourly, KeepDaily: &daily}}
	w.now = w.now.Add(time.Hour)
	return w
}

func backupJobOf(t *testing.T, d Decision) batchv1.Job {
	t.Helper()
	for _, c := range d.Children {
		if c.Kind == "Job" {
			b, _ := json.Marshal(c.Object)
			var j batchv1.Job
			if err := json.Unmarshal(b, &j); err != nil {
				t.Fatal(err)
			}
			return j
		}
	}
	t.Fatalf("no Job in %s: %s", d.Action.Type, d.Action.Reason)
	return batchv1.Job{}
}

func TestBackupJob(t *testing.T) {
	w := backupWorld(t)
	d := Plan(simConfig, w.observe())
	if d.Action.Type != TakeBackup {
		t.Fatalf("got %s: %s", d.Action.Type, d.Action.Reason)
	}
	j := backupJobOf(t, d)
	pod := j.Spec.Template
	if pod.Labels[LabelBackupOf] != "etcd" || pod.Labels[LabelCluster] != "" {
		t.Errorf("pod labels %v: want %s (so customize relates it) and not %s (the Services and budget select by it)", pod.Labels, LabelBackupOf, LabelCluster)
	}
	if !strings.HasPrefix(j.Labels[LabelBackupFor], "scheduled-2026") || *j.Spec.ActiveDeadlineSeconds != backupDeadline {
		t.Errorf("labels %v, deadline %d", j.Labels, *j.Spec.ActiveDeadlineSeconds)
	}
	cmd := strings.Join(pod.Spec.Containers[0].Command, " ")
	for _, want := range []string{" backup ", "--dir=/var/lib/etcdops/backup/default/etcd ", "--keep=3", "--keep-for=168h0m0s", "--keep-hourly=24", "--keep-daily=30", "--max-bandwidth=33554432", "--work-dir=/var/lib/etcdops/work"} {
		if !strings.Contains(cmd+" ", want) {
			t.Errorf("command %q lacks %q", cmd, want)
		}
	}
	var claim string
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			claim = v.PersistentVolumeClaim.ClaimName
		}
	}
	if claim != "etcd-backups" || len(pod.Spec.Containers[0].VolumeMounts) != 2 {
		t.Errorf("volumes %+v mounts %+v", pod.Spec.Volumes, pod.Spec.Containers[0].VolumeMounts)
	}

	// The same observation later in the same schedule period renders the same Job: a
	// replay, or a sync whose cache lags, never makes a second backup Job.
	w.now = w.now.Add(20 * time.Minute)
	if again := backupJobOf(t, Plan(simConfig, w.observe())); again.Name != j.Name {
		t.Fatalf("the same backup renders as %s and %s", j.Name, again.Name)
	}
	// The next period's backup is another Job.
	w.now = w.now.Add(time.Hour)
	if next := backupJobOf(t, Plan(simConfig, w.observe())); next.Name == j.Name {
		t.Fatalf("two schedule times render the same Job %s", j.Name)
	}
}

func TestBackupCondition(t *testing.T) {
	w := backupWorld(t)
	for range 4 {
		w.step()
	}
	cond := func() metav1.Condition {
		d := Plan(simConfig, w.observe())
		for _, c := range d.Status.Conditions {
			if c.Type == v1alpha1.ConditionBackedUp {
				return c
			}
		}
		t.Fatal("no BackedUp condition")
		return metav1.Condition{}
	}
	if c := cond(); c.Status != metav1.ConditionTrue || c.Reason != "BackupSucceeded" {
		t.Fatalf("after a backup: %+v", c)
	}
	// Two schedule times pass and nothing can run (etcd does not answer).
	w.now = w.now.Add(2 * time.Hour)
	w.etcdOverride = func(s *etcdstate.Snapshot) { *s = etcdstate.Snapshot{Err: "context deadline exceeded"} }
	if c := cond(); c.Status != metav1.ConditionFalse || c.Reason != "BackupOverdue" {
		t.Fatalf("two schedule times later: %+v", c)
	}
	w.cluster.Spec.Backup.Suspend = true
	if c := cond(); c.Reason == "BackupOverdue" {
		t.Fatalf("suspended, yet overdue: %+v", c)
	}
}

func TestRestoreTemplate(t *testing.T) {
	w := newSimWorld(t, 3, true)
	w.cluster.Spec.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: &v1alpha1.FromBackup{Name: "etcd-20261201T090000Z-r42.db",
		BackupDestination: v1alpha1.BackupDestination{S3: &v1alpha1.S3Destination{Endpoint: "https://s3.example.test", Bucket: "backups",
			Prefix: "old/etcd", Region: "eu-west-1", CredentialsSecret: "s3", CASecret: "s3-ca"}}}}
	d := Plan(simConfig, w.observe())
	var sts appsv1.StatefulSet
	for _, c := range d.Children {
		if c.Kind == "StatefulSet" {
			b, _ := json.Marshal(c.Object)
			if err := json.Unmarshal(b, &sts); err != nil {
				t.Fatal(err)
			}
		}
	}
	etcd := sts.Spec.Template.Spec.Containers[0]
	end := slices.Index(etcd.Command, "--")
	want := []string{"--restore-s3-endpoint=https://s3.example.test", "--restore-bucket=backups", "--restore-prefix=old/etcd",
		"--restore-credentials-dir=/etc/etcdops/backup/credentials", "--restore-region=eu-west-1", "--restore-ca-file=/etc/etcdops/backup/ca/ca.crt"}
	if end < len(want) || !slices.Equal(etcd.Command[end-len(want):end], want) {
		t.Fatalf("etcd command %q: want %q before \"--\"", etcd.Command, want)
	}
	mounted := map[string]bool{}
	for _, m := range etcd.VolumeMounts {
		mounted[m.MountPath] = m.ReadOnly
	}
	if !mounted[backupCredentialsDir] || !mounted[backupCADir] {
		t.Fatalf("mounts %+v: want the credentials and CA read-only", etcd.VolumeMounts)
	}
	if d.Status.RestoredFrom != "etcd-20261201T090000Z-r42.db" {
		t.Fatalf("status.restoredFrom %q", d.Status.RestoredFrom)
	}
}

// A cluster restored from a snapshot that lost its status is not taken for a restore asked
// over a running cluster: its StatefulSet carries the restore flags.
func TestRestoreInPlaceKnowsARestoredCluster(t *testing.T) {
	w := newSimWorld(t, 3, true)
	w.run(100)
	w.cluster.Spec.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: &v1alpha1.FromBackup{Name: "latest",
		BackupDestination: v1alpha1.BackupDestination{PersistentVolumeClaim: &v1alpha1.PVCDestination{ClaimName: "b"}}}}
	if d := Plan(simConfig, w.observe()); d.Status.Phase != v1alpha1.PhaseInvalid || !strings.Contains(d.Action.Reason, "never applied in place") {
		t.Fatalf("restore asked over a running cluster: %s %s", d.Status.Phase, d.Action.Reason)
	}

	r := newSimWorld(t, 3, true)
	r.cluster.Spec.Bootstrap = w.cluster.Spec.Bootstrap
	r.backups = []simBackup{{revision: 10}}
	r.run(100)
	r.cluster.Status.RestoredFrom = ""
	if d := Plan(simConfig, r.observe()); d.Status.Phase == v1alpha1.PhaseInvalid {
		t.Fatalf("a restored cluster without status.restoredFrom: %s", d.Action.Reason)
	}
}

// A restore to a revision reaches the seed through the join state.
func TestRestoreJoinCarriesTheTargetRevision(t *testing.T) {
	c := &v1alpha1.EtcdCluster{}
	rev := int64(42)
	c.Spec.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: &v1alpha1.FromBackup{Name: v1alpha1.LatestBackup, Revision: &rev}}
	if r := restoreJoin(c, "e-0"); r == nil || r.Member != "e-0" || r.Backup != v1alpha1.LatestBackup || r.Revision != 42 {
		t.Fatalf("join state restore %+v", r)
	}
	c.Spec.Bootstrap.FromBackup.Revision = nil
	if r := restoreJoin(c, "e-0"); r == nil || r.Revision != 0 {
		t.Fatalf("join state restore without a revision %+v", r)
	}
}

// The continuous backup is one Deployment beside the other children, reaching etcd through
// the client Service; turned off, it goes; a teardown deletes it with the first step.
func TestContinuousBackupDeployment(t *testing.T) {
	w := newSimWorld(t, 3, true)
	w.run(100)
	stream := func(d Decision) (appsv1.Deployment, bool) {
		for _, c := range d.Children {
			if c.Kind == "Deployment" {
				var dep appsv1.Deployment
				b, _ := json.Marshal(c.Object)
				if err := json.Unmarshal(b, &dep); err != nil {
					t.Fatal(err)
				}
				return dep, true
			}
		}
		return appsv1.Deployment{}, false
	}
	if _, ok := stream(Plan(simConfig, w.observe())); ok {
		t.Fatal("a stream without spec.backup.continuous")
	}
	interval := metav1.Duration{Duration: 15 * time.Second}
	w.cluster.Spec.Backup = &v1alpha1.BackupSpec{Schedule: "@daily", Continuous: &v1alpha1.ContinuousBackup{Interval: &interval},
		Destination: v1alpha1.BackupDestination{S3: &v1alpha1.S3Destination{Endpoint: "https://s3.example.test", Bucket: "backups", CredentialsSecret: "s3"}}}
	d := Plan(simConfig, w.observe())
	dep, ok := stream(d)
	if !ok || dep.Name != BackupStreamName(w.cluster.Name) {
		t.Fatalf("no stream Deployment among %d children (%s)", len(d.Children), d.Action.Reason)
	}
	if *dep.Spec.Replicas != 1 || dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Fatalf("replicas %d, strategy %q: want one pod, never two at once", *dep.Spec.Replicas, dep.Spec.Strategy.Type)
	}
	pod := dep.Spec.Template
	if _, ok := pod.Labels[LabelCluster]; ok {
		t.Fatalf("the stream's pod carries %s: the Services and the budget would select it", LabelCluster)
	}
	cmd := strings.Join(pod.Spec.Containers[0].Command, " ")
	for _, want := range []string{"stream-backup", "--endpoints=http://" + ClientServiceName(w.cluster.Name) + ".", "--cluster=" + w.cluster.Name,
		"--s3-endpoint=https://s3.example.test", "--interval=15s", "--max-chunk-bytes=4194304", "--credentials-dir=" + backupCredentialsDir} {
		if !strings.Contains(cmd, want) {
			t.Errorf("stream command %q lacks %q", cmd, want)
		}
	}

	// Its Service selects its pod, on the metrics port the hook reads its progress from.
	svc, ok := childOf(d, "Service", BackupStreamName(w.cluster.Name))
	if !ok {
		t.Fatal("no Service before the stream")
	}
	if b, _ := json.Marshal(svc.Object); !strings.Contains(string(b), `"`+LabelBackupStreamOf+`":"`+w.cluster.Name+`"}`) ||
		!strings.Contains(string(b), `"port":9480`) {
		t.Fatalf("stream Service %s", b)
	}

	// The monitoring we ship scrapes its pod, as the PodMonitor and as the plain Prometheus
	// job (manifests' TestEveryAlertIsScraped checks that these feed the backup alerts).
	checkStreamScraped(t, prom.PodOf(w.cluster.Namespace, pod))

	// Observed, it goes when the spec drops it, and with the teardown's first step.
	w.run(5)
	obs := w.observe()
	if len(obs.Children.Deployments) != 1 {
		t.Fatalf("observed %d Deployments, want the stream", len(obs.Children.Deployments))
	}
	if want := "http://" + BackupStreamName(w.cluster.Name) + "." + w.cluster.Namespace + ".svc.cluster.local:9480/progress"; ProgressURL(simConfig, &w.cluster, obs.Children) != want {
		t.Fatalf("progress read from %q, want %q", ProgressURL(simConfig, &w.cluster, obs.Children), want)
	}
	w.cluster.Spec.Backup.Continuous = nil
	d = Plan(simConfig, w.observe())
	if _, ok := stream(d); ok {
		t.Fatal("the stream kept after spec.backup.continuous was removed")
	}
	if _, ok := childOf(d, "Service", BackupStreamName(w.cluster.Name)); ok {
		t.Fatal("the stream's Service kept after spec.backup.continuous was removed")
	}
	w.cluster.DeletionTimestamp = &metav1.Time{Time: w.now}
	if d := Plan(simConfig, w.observe()); d.Finalized {
		t.Fatal("finalized while the stream's Deployment is observed")
	} else if _, ok := stream(d); ok {
		t.Fatal("the teardown keeps the stream's Deployment")
	}
}

// childOf finds a desired child by kind and name.
func childOf(d Decision, kind, name string) (Child, bool) {
	for _, c := range d.Children {
		if c.Kind == kind && c.Name == name {
			return c, true
		}
	}
	return Child{}, false
}

// checkStreamScraped: manifests/monitoring's PodMonitor and scrape job for the continuous
// backups take the stream's pod, on its metrics port, as job etcdops-backup-stream.
func checkStreamScraped(t *testing.T, pod prom.Pod) {
	t.Helper()
	const job = "etcdops-backup-stream"
	raw, err := os.ReadFile("../manifests/monitoring/backup-stream-podmonitor.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := prom.DecodePodMonitor(raw)
	if err != nil {
		t.Fatal(err)
	}
	if scrapes, err := m.Scrapes(pod); err != nil || len(scrapes) != 1 || scrapes[0].Job != job {
		t.Errorf("PodMonitor %s scrapes the stream's pod %v as %+v (%v), want job %s", m.Metadata.Name, pod, scrapes, err, job)
	}
	raw, err = os.ReadFile("../manifests/monitoring/scrape-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := prom.DecodeScrapeConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(c.ScrapeConfigs, func(j prom.ScrapeJob) bool { return j.JobName == job })
	if i < 0 {
		t.Fatalf("scrape-config.yaml has no job %s", job)
	}
	if ok, err := c.ScrapeConfigs[i].Scrapes(pod); err != nil || !ok {
		t.Errorf("scrape-config.yaml's job %s does not keep the stream's pod %v (%v)", job, pod, err)
	}
}
