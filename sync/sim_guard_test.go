package sync

import (
	"fmt"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/backupresult"
)

// Backups as a whole in the simulated world: a destination that refuses (every backup Job
// fails, and a drill cannot restore) or holds a backup that restores to something else than
// the cluster held (a drill finds the difference); snapshots from the survivor of a quorum
// recovery, which sees no leader; restore drills.

// simStorage is how the backups' destination behaves.
type simStorage struct {
	// refuses: every store and fetch fails (credentials revoked, the endpoint down).
	refuses bool
	// altered: what is stored restores to other keys than the cluster held.
	altered bool
}

// simBackupSpec is spec.backup to an S3 bucket on schedule.
func simBackupSpec(schedule string) *v1alpha1.BackupSpec {
	return &v1alpha1.BackupSpec{Schedule: schedule, Destination: v1alpha1.BackupDestination{
		S3: &v1alpha1.S3Destination{Endpoint: "https://s3.example.test", Bucket: "backups", CredentialsSecret: "s3-credentials"}}}
}

// readOnlyJob runs a backup or a drill Job; false leaves a plain backup to the usual path.
func (w *simWorld) readOnlyJob(j *simJob, fail func()) bool {
	switch {
	case j.verb == verbDrill && w.outgrows(j):
		j.evicted = true
		fail()
	case j.verb == verbDrill:
		w.drill(j, fail)
	case w.destination.refuses:
		fail()
	case j.survivor:
		w.survivorBackup(j, fail)
	default:
		return false
	}
	if j.state == jobRunning {
		j.state = jobSucceeded
	}
	return true
}

// survivorBackup is a backup from the one member its Job names, which need not have quorum:
// it must run and answer.
func (w *simWorld) survivorBackup(j *simJob, fail func()) {
	if len(j.endpoints) != 1 {
		w.t.Fatalf("a survivor's backup with endpoints %v, want the survivor's alone", j.endpoints)
	}
	host := strings.TrimPrefix(strings.TrimPrefix(j.endpoints[0], "https://"), "http://")
	pod, _, _ := strings.Cut(host, ".")
	ord, _ := Ordinal(w.cluster.Name, pod)
	m, p := w.memberAt(ord), w.pods[ord]
	if m == nil || !m.started || p == nil || !p.running || p.down || j.failNow {
		fail()
		return
	}
	w.backups = append(w.backups, simBackup{revision: m.raft, live: m.live, member: m.id})
}

// drill restores the last backup and compares it with a follower: it reports, and its Job
// fails unless it reached a verdict.
func (w *simWorld) drill(j *simJob, fail func()) {
	switch {
	case j.failNow || !w.hasQuorum() || !w.jobReaches(j):
		j.drill = backupresult.Drill{Outcome: backupresult.DrillError, Message: "the live cluster cannot be read"}
		fail()
	case w.destination.refuses || len(w.backups) == 0:
		j.drill = backupresult.Drill{Outcome: backupresult.DrillRestoreFailed, Message: "restore: s3://backups/default/etcd/: Access Denied"}
		fail()
	default:
		b := w.backups[len(w.backups)-1]
		j.drill = backupresult.Drill{Outcome: backupresult.DrillPassed, Snapshot: fmt.Sprintf("s3://backups/default/etcd/etcd-r%d.db", b.revision),
			RestoredRevision: int64(b.revision), Revision: int64(b.revision), Keys: 100, Digest: "d1", RestoreSeconds: 2.5,
			Message: fmt.Sprintf("its 100 keys match the live cluster's at revision %d", b.revision)}
		if w.destination.altered {
			j.drill.Outcome, j.drill.Message = backupresult.DrillMismatch, `key "/registry/a": its value differs`
		}
	}
}

// drillPod is the pod of finished drill Job j with the report the member tool writes.
func (w *simWorld) drillPod(j batchv1.Job, sj *simJob) corev1.Pod {
	pod := corev1.Pod{}
	pod.Name, pod.Namespace = j.Name+"-x1", w.cluster.Namespace
	pod.Labels = map[string]string{LabelBackupOf: w.cluster.Name, batchv1.JobNameLabel: j.Name}
	pod.Status.Phase = corev1.PodSucceeded
	if sj.state == jobFailed {
		pod.Status.Phase = corev1.PodFailed
	}
	if sj.evicted {
		pod.Status.Reason = "Evicted"
		pod.Status.Message = fmt.Sprintf("Usage of EmptyDir volume %q exceeds the limit %q. ", volumeBackupWork, resource.NewQuantity(sj.scratch, resource.BinarySI).String())
		return pod
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "member", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Message: backupresult.EncodeDrill(sj.drill)}}}}
	return pod
}

// storageCommand: storage refuses|alters|heals.
func (w *simWorld) storageCommand(t *testing.T, line string, args []string) {
	switch strings.Join(args, " ") {
	case "refuses":
		w.destination.refuses = true
	case "alters":
		w.destination.altered = true
	case "heals":
		w.destination = simStorage{}
	default:
		t.Fatalf("%q: want storage refuses|alters|heals", line)
	}
}

// backupLine is status.backup's guard and last drill, for a scenario's output.
func backupLine(st v1alpha1.EtcdClusterStatus) string {
	var b strings.Builder
	if r := st.Backup; r != nil && r.Guard != nil {
		g := r.Guard
		fmt.Fprintf(&b, "  guard: %s", g.Step)
		switch {
		case g.Snapshot != "":
			fmt.Fprintf(&b, " snapshot=%s@%d", g.Snapshot, g.Revision)
		case g.Skipped:
			b.WriteString(" skipped")
		case g.Failure != "":
			fmt.Fprintf(&b, " failed=%q", g.Failure)
		default:
			b.WriteString(" taking")
		}
		if g.Done != nil {
			b.WriteString(" done")
		}
		b.WriteString("\n")
	}
	if r := st.Backup; r != nil && r.LastDrill != nil {
		d := r.LastDrill
		fmt.Fprintf(&b, "  drill: %s %s restored=%d compared=%d keys=%d %q\n", d.Job, d.Result, d.RestoredRevision, d.Revision, d.Keys, d.Message)
	}
	return b.String()
}
