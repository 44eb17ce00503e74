package sync

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// TestRiskyStep names the risky step ahead of a healthy cluster, in the order the normal
// phases take them.
func TestRiskyStep(t *testing.T) {
	for _, tc := range []struct {
		story string
		world func(w *simWorld)
		want  string // the key's prefix; "" for none
	}{
		{"a cluster at its spec has nothing risky ahead", func(*simWorld) {}, ""},
		{"new etcd options roll every member", func(w *simWorld) { w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=5000"} }, "roll-"},
		{"a smaller size removes members", func(w *simWorld) { w.cluster.Spec.Size = ptrTo(int32(1)) }, "scale-in-1"},
		{"a larger size adds them: not risky", func(w *simWorld) { w.cluster.Spec.Size = ptrTo(int32(5)) }, ""},
		{"a minor upgrade", func(w *simWorld) { w.cluster.Spec.Version = "v3.7.3" }, "upgrade-v3.7.3"},
		{"a patch upgrade: not risky", func(w *simWorld) { w.cluster.Spec.Version = "v3.6.17" }, ""},
		{"a roll before a scale-in, as the phases go", func(w *simWorld) {
			w.cluster.Spec.Size = ptrTo(int32(1))
			w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=5000"}
		}, "roll-"},
	} {
		t.Run(tc.story, func(t *testing.T) {
			w, _ := created(t, 3, true)
			tc.world(w)
			obs := w.observe()
			c := v1alpha1.Defaulted(obs.Cluster)
			key, what := newView(simConfig, &obs, &c).riskyStep()
			if tc.want == "" && key != "" || !strings.HasPrefix(key, tc.want) || key != "" && what == "" {
				t.Fatalf("risky step %q (%s), want %q", key, what, tc.want)
			}
		})
	}
}

// TestStepSnapshotFreshness: a snapshot younger than beforeRiskySteps.maxAge guards the step
// without a new one; an older one does not; a person's annotation lets the step go on without.
func TestStepSnapshotFreshness(t *testing.T) {
	for _, tc := range []struct {
		story    string
		age      time.Duration
		maxAge   time.Duration // 0: the default
		annotate bool
		want     ActionType
	}{
		{"four minutes old, the default bound five", 4 * time.Minute, 0, false, ReplacePod},
		{"six minutes old, the default bound five", 6 * time.Minute, 0, false, TakeBackup},
		{"six minutes old, the bound ten", 6 * time.Minute, 10 * time.Minute, false, ReplacePod},
		{"six minutes old, and a person lets the roll go on", 6 * time.Minute, 0, true, ReplacePod},
	} {
		t.Run(tc.story, func(t *testing.T) {
			w, _ := created(t, 3, true)
			w.cluster.Spec.Backup = simBackupSpec("@daily")
			if tc.maxAge > 0 {
				w.cluster.Spec.Backup.BeforeRiskySteps = &v1alpha1.RiskyStepSnapshots{MaxAge: &metav1.Duration{Duration: tc.maxAge}}
			}
			at := metav1.NewTime(w.now.Add(-tc.age))
			w.cluster.Status.Backup = &v1alpha1.BackupStatus{LastSuccessfulTime: &at,
				LastSuccessful: &v1alpha1.BackupRecord{Object: "s3://backups/default/etcd/etcd-r90.db", Revision: 90, Time: at}}
			w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=5000"}
			obs := w.observe()
			c := v1alpha1.Defaulted(obs.Cluster)
			key, _ := newView(simConfig, &obs, &c).riskyStep()
			if tc.annotate {
				w.cluster.Annotations = map[string]string{v1alpha1.AnnotationProceedWithoutSnapshot: key}
			}
			w.closeBudget()
			d := w.step()
			if d.Action.Type != tc.want {
				t.Fatalf("decided %v, want %v", d.Action, tc.want)
			}
			g := d.Status.Backup.Guard
			switch {
			case g == nil || g.Step != key:
				t.Fatalf("guard %+v, want one for %s", g, key)
			case tc.want == TakeBackup && (g.Requested == nil || g.Snapshot != ""):
				t.Fatalf("guard %+v, want a snapshot asked for", g)
			case tc.want == ReplacePod && !tc.annotate && (g.Snapshot != "s3://backups/default/etcd/etcd-r90.db" || !strings.Contains(d.Action.Reason, "guarded by snapshot s3://backups/default/etcd/etcd-r90.db")):
				t.Fatalf("guard %+v, reason %q: want the fresh snapshot named", g, d.Action.Reason)
			case tc.annotate && (!g.Skipped || !strings.Contains(d.Action.Reason, "guarded by no snapshot")):
				t.Fatalf("guard %+v, reason %q: want the go-ahead recorded", g, d.Action.Reason)
			}
		})
	}
}

// TestDrillJobRunsTheClustersEtcd: the drill Job runs the etcd pods' image with the member
// tool an init container copies in, mounts the destination read-only, restores into a
// scratch directory, and its pod is related to the cluster for its report.
func TestDrillJobRunsTheClustersEtcd(t *testing.T) {
	w, _ := created(t, 3, true)
	w.cluster.Spec.Backup = simBackupSpec("@hourly")
	w.cluster.Spec.Backup.Verify = &v1alpha1.BackupVerify{Schedule: "@daily"}
	at := metav1.NewTime(w.now)
	w.cluster.Status.Backup = &v1alpha1.BackupStatus{LastSuccessfulTime: &at, LastScheduleTime: &at,
		LastSuccessful: &v1alpha1.BackupRecord{Object: "s3://backups/default/etcd/etcd-r90.db", Revision: 90, Time: at}}
	w.now = w.now.Add(24 * time.Hour)
	w.cluster.Status.Backup.LastScheduleTime = &metav1.Time{Time: w.now}
	obs := w.observe()
	d := Plan(simConfig, obs)
	if d.Action.Type != RestoreDrill {
		t.Fatalf("decided %v, want a drill", d.Action)
	}
	var job batchv1.Job
	var sts appsv1.StatefulSet
	for _, ch := range d.Children {
		var into any
		switch ch.Kind {
		case "Job":
			into = &job
		case "StatefulSet":
			into = &sts
		default:
			continue
		}
		b, err := json.Marshal(ch.Object)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, into); err != nil {
			t.Fatal(err)
		}
	}
	ps := job.Spec.Template.Spec
	if len(ps.Containers) != 1 || len(sts.Spec.Template.Spec.Containers) == 0 {
		t.Fatalf("no drill Job or no StatefulSet rendered: %+v", d.Children)
	}
	c, image := ps.Containers[0], sts.Spec.Template.Spec.Containers[0].Image
	switch {
	case c.Image != image:
		t.Fatalf("the drill runs image %q, the etcd pods %q", c.Image, image)
	case len(ps.InitContainers) != 1 || ps.InitContainers[0].Image != simConfig.ToolImage || !slices.Contains(ps.InitContainers[0].Command, "--to="+toolPath):
		t.Fatalf("init containers %+v: want the member tool installed from %s", ps.InitContainers, simConfig.ToolImage)
	case c.Command[0] != toolPath || c.Command[1] != verbDrill || !slices.Contains(c.Command, "--etcd="+etcdBinary) || !slices.Contains(c.Command, "--cluster-id=c1"):
		t.Fatalf("command %q", c.Command)
	case job.Spec.Template.Labels[LabelBackupOf] != w.cluster.Name || job.Labels[LabelAction] != verbDrill:
		t.Fatalf("labels %v, pod labels %v", job.Labels, job.Spec.Template.Labels)
	}
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.ReadOnly
	}
	if ro, ok := mounts[backupCredentialsDir]; !ok || !ro {
		t.Fatalf("mounts %v: want the credentials read-only", mounts)
	}
	if ro, ok := mounts[backupWorkDir]; !ok || ro {
		t.Fatalf("mounts %v: want a writable scratch directory", mounts)
	}
	if d.Status.Backup.LastDrillScheduleTime == nil {
		t.Fatalf("status.backup %+v: want the drill's schedule time", d.Status.Backup)
	}
}
