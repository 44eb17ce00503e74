package sync

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/backupresult"
)

// Restore drills (spec.backup.verify) prove the backups by restoring them: on its schedule, a
// member Job restores the newest snapshot of the cluster's lineage and its stored changes as a
// real restore does, into a scratch directory, and compares every key with a follower
// (etcdops-member drill, backup.Drill). The restore must run the release a restore of this
// cluster would run: the Job runs the etcd pods' own image, with the member tool copied in by
// an init container as in the etcd pods. Its report comes back as its pod's termination
// message and goes into status.backup.lastDrill and the BackupVerified condition.
//
// A drill is a backup Job in every rule the planner keeps: one at a time with every other
// backup Job, after the fixes, and waited for by the normal phases while it runs, never by a
// fix; it changes nothing on the live cluster. It comes after every other normal phase but the
// TLS wait: a drill proves what is stored, which a roll or a scale does not change.

const (
	verbDrill = "drill"
	// drillDeadline bounds a drill Job: fetching a large backup, replaying its changes and
	// reading the live cluster at the bandwidth bound take minutes, not an hour.
	drillDeadline = 3600
)

// Reasons of the BackupVerified condition.
const (
	ReasonDrillPassed        = "DrillPassed"
	ReasonDrillMismatch      = "DrillMismatch"
	ReasonDrillRestoreFailed = "DrillRestoreFailed"
	ReasonDrillError         = "DrillError"
	ReasonNoDrillYet         = "NoDrillYet"
)

// drillSchedule is spec.backup.verify's schedule, parsed; nil without one (or an invalid one,
// which Validate refuses).
func (v *view) drillSchedule() cron.Schedule {
	b := v.c.Spec.Backup
	if b == nil || b.Verify == nil {
		return nil
	}
	sched, err := v1alpha1.ParseSchedule(b.Verify.Schedule)
	if err != nil {
		return nil
	}
	return sched
}

// drillTrigger is why a drill is due: a schedule time, or an on-demand request.
type drillTrigger struct {
	scheduled time.Time
	request   string
}

// label is the trigger as a label value: the schedule time, or a hash of the request.
func (t drillTrigger) label() string {
	if t.request != "" {
		return "request-" + shortHash(t.request)
	}
	return "scheduled-" + t.scheduled.UTC().Format("20060102T150405Z")
}

func (t drillTrigger) String() string {
	if t.request != "" {
		return fmt.Sprintf("requested (%s=%s)", v1alpha1.AnnotationDrillNow, t.request)
	}
	return "scheduled for " + t.scheduled.UTC().Format(time.RFC3339)
}

// dueDrill is the drill due now, if any: a request the last status has not taken, or the
// latest schedule time of spec.backup.verify since the last one a drill was started for (the
// cluster's creation before any). Missed times are not made up: one drill catches up.
func (v *view) dueDrill() (drillTrigger, bool) {
	sched := v.drillSchedule()
	if sched == nil {
		return drillTrigger{}, false
	}
	last := v.obs.Cluster.Status.Backup
	if req := v.c.Annotations[v1alpha1.AnnotationDrillNow]; req != "" && (last == nil || last.LastDrillRequest != req) {
		return drillTrigger{request: req}, true
	}
	from := v.c.CreationTimestamp.Time
	if last != nil && last.LastDrillScheduleTime != nil {
		from = last.LastDrillScheduleTime.Time
	}
	t, ok := latestTick(sched.Next, from, v.obs.Now)
	return drillTrigger{scheduled: t}, ok
}

// stored: something of the cluster's lineage is stored for a drill to restore.
func (v *view) stored() bool {
	b := v.obs.Cluster.Status.Backup
	return b != nil && (b.LastSuccessful != nil || b.Continuous != nil && b.Continuous.StoredRevision > 0)
}

// drillDue: a restore drill whose schedule time has fallen, once the cluster's ID is known (it
// names the lineage) and something is stored. Before that the schedule time stays due: the
// first drill runs once the first backup is in.
func (p *planner) drillDue() (step, bool) {
	t, ok := p.dueDrill()
	id := p.knownClusterID()
	if !ok || id == "" || !p.stored() {
		return step{}, false
	}
	voters := p.voters()
	if len(voters) == 0 {
		return step{}, false
	}
	eps, name := p.readEndpoints(voters)
	s := p.base(Action{Type: RestoreDrill, Member: name, Reason: fmt.Sprintf("restore drill %s: the newest backup of lineage %s restored and compared with %s",
		t, id, name)}, resyncSoon)
	s.job = &memberJob{verb: verbDrill, member: voters[len(voters)-1].name, endpoints: eps, backupFor: t.label(), clusterID: id,
		image: p.spec.template.Spec.Containers[0].Image, clientSecret: p.tls.clientSecret,
		// The snapshot and the copy restored from it, side by side.
		scratch: scratchLimit(2 * p.largestDB())}
	rec := p.backupRecord().changed()
	if t.request != "" {
		rec.LastDrillRequest = t.request
	} else {
		at := metav1.NewTime(t.scheduled)
		rec.LastDrillScheduleTime = &at
	}
	s.backup = rec
	return s, true
}

// drillJob handles an observed drill Job in the Job stage, as backupJob does a backup's: one
// running is waited for (by the normal phases only); one done is recorded in
// status.backup.lastDrill and dropped. A failed one is not retried before the next schedule
// time: its pod was retried already.
func (p *planner) drillJob(j *batchv1.Job, rec *backupRecord) (s step, keep bool) {
	state, at := stateOf(j)
	var d backupresult.Drill
	var ok bool
	switch state {
	case jobRunning:
		return p.wait(j.Labels[LabelMember], "restore drill: Job "+j.Name+" running", resyncSoon), true
	case jobSucceeded:
		if d, ok = p.drillResult(j, corev1.PodSucceeded); !ok && p.elapsedSince(at) < backupResultWait {
			return p.wait(j.Labels[LabelMember], "restore drill: Job "+j.Name+" done, its pod's report not seen yet", resyncSoon), true
		}
		if !ok {
			d = backupresult.Drill{Outcome: backupresult.DrillError, Message: "the Job succeeded, but its pod's report was not seen"}
		}
	case jobFailed:
		if d, ok = p.drillResult(j, corev1.PodFailed); !ok {
			d = backupresult.Drill{Outcome: backupresult.DrillError, Message: jobFailureMessage(j)}
		}
		if pod := p.evictedPod(j); pod != nil {
			d = backupresult.Drill{Outcome: backupresult.DrillError, Message: "its pod was evicted: " + strings.TrimSpace(pod.Status.Message)}
		}
	}
	r := &v1alpha1.DrillRecord{Job: j.Name, Time: metav1.NewTime(at), Result: d.Outcome, Message: d.Message, Lineage: d.Lineage, Snapshot: d.Snapshot,
		RestoredRevision: d.RestoredRevision, Revision: d.Revision, Keys: d.Keys, Digest: d.Digest}
	if d.RestoreSeconds > 0 {
		r.RestoreDuration = &metav1.Duration{Duration: time.Duration(d.RestoreSeconds * float64(time.Second)).Round(time.Millisecond)}
	}
	rec.changed().LastDrill = r
	return step{}, false
}

// drillResult reads the report of a pod of drill Job j that ended in phase.
func (p *planner) drillResult(j *batchv1.Job, phase corev1.PodPhase) (backupresult.Drill, bool) {
	for _, msg := range p.jobReports(j, phase) {
		if d, err := backupresult.DecodeDrill(msg); err == nil {
			return d, true
		}
	}
	return backupresult.Drill{}, false
}

// jobReports are the termination messages of the pods of backup Job j (a backup's or a
// drill's) that ended in phase, newest pod first.
func (p *planner) jobReports(j *batchv1.Job, phase corev1.PodPhase) []string {
	var pods []*corev1.Pod
	for i := range p.obs.Pods {
		pod := &p.obs.Pods[i]
		if pod.Labels[LabelBackupOf] == p.c.Name && pod.Labels[batchv1.JobNameLabel] == j.Name && pod.Status.Phase == phase {
			pods = append(pods, pod)
		}
	}
	slices.SortFunc(pods, func(a, b *corev1.Pod) int { return strings.Compare(b.Name, a.Name) })
	var out []string
	for _, pod := range pods {
		for _, cs := range pod.Status.ContainerStatuses {
			if t := cs.State.Terminated; t != nil && t.Message != "" {
				out = append(out, t.Message)
			}
		}
	}
	return out
}

// drillArgs are the drill command's flags beyond the common ones.
func drillArgs(c *v1alpha1.EtcdCluster, clusterID string) []string {
	b := c.Spec.Backup
	args := []string{"--cluster=" + c.Name, "--cluster-id=" + clusterID, "--etcd=" + etcdBinary, "--work-dir=" + backupWorkDir,
		"--termination-log=/dev/termination-log", fmt.Sprintf("--timeout=%ds", drillDeadline-60)}
	args = append(args, destinationArgs(c, "", b.Destination)...)
	if q := b.MaxBandwidth; q != nil {
		args = append(args, fmt.Sprintf("--max-bandwidth=%d", q.Value()))
	}
	return args
}

// drillPod makes a Job a drill's: the etcd pods' image, so that the restore replays with the
// release that runs the cluster, with the member tool copied in by an init container as in
// the etcd pods, and both images' pull secrets; the destination mounted read-only; a bounded
// scratch directory for the restored copy.
func drillPod(cfg Config, c *v1alpha1.EtcdCluster, j memberJob, labels, podLabels map[string]string, spec, podSpec, container object) {
	labels[LabelBackupFor] = j.backupFor
	podLabels[LabelBackupOf] = c.Name
	spec["activeDeadlineSeconds"] = drillDeadline
	container["image"] = j.image
	podSpec["initContainers"] = []any{object{
		"name": installContainer, "image": cfg.ToolImage, "command": []string{"/etcdops-member", "install", "--to=" + toolPath},
		"volumeMounts":    []volumeMount{{Name: volumeTools, MountPath: toolDir}},
		"securityContext": containerSecurityContext(),
		"resources":       toolResources(c, v1alpha1.ToolMemberJob),
	}}
	// It pulls etcd's image and the operator's, as the etcd pods do.
	if refs := pullSecrets(c, true); len(refs) > 0 {
		podSpec["imagePullSecrets"] = refs
	}
	vols, mounts := destinationVolumes(c.Spec.Backup.Destination, true)
	vols = append(vols, volume{Name: volumeTools, EmptyDir: &emptyDir{}}, volume{Name: volumeBackupWork, EmptyDir: &emptyDir{SizeLimit: j.scratch}})
	mounts = append(mounts, volumeMount{Name: volumeTools, MountPath: toolDir}, volumeMount{Name: volumeBackupWork, MountPath: backupWorkDir})
	addVolumes(podSpec, container, vols, mounts)
}

// drillResync brings the resync forward to the next drill.
func (v *view) drillResync(a *answer) {
	if sched := v.drillSchedule(); sched != nil {
		a.resync = min(a.resync, max(1, math.Ceil(sched.Next(v.obs.Now).Sub(v.obs.Now).Seconds())))
	}
}

// drillCondition sets the BackupVerified condition of a cluster with spec.backup.verify, from
// the last drill: True when it passed, False when its backup differed from the cluster or could
// not be restored, Unknown when it could not compare, or before the first.
func (v *view) drillCondition(a *answer) {
	st := &a.st
	b := v.c.Spec.Backup
	if b == nil || b.Verify == nil {
		return
	}
	cond := v.condition(v1alpha1.ConditionBackupVerified, metav1.ConditionUnknown, ReasonNoDrillYet, "no restore drill has finished yet")
	if st.Backup != nil && st.Backup.LastDrill != nil {
		d := st.Backup.LastDrill
		msg := "drill " + d.Job + " at " + d.Time.UTC().Format(time.RFC3339) + ": " + d.Message
		switch d.Result {
		case v1alpha1.DrillPassed:
			cond.Status, cond.Reason = metav1.ConditionTrue, ReasonDrillPassed
		case v1alpha1.DrillMismatch:
			cond.Status, cond.Reason = metav1.ConditionFalse, ReasonDrillMismatch
		case v1alpha1.DrillRestoreFailed:
			cond.Status, cond.Reason = metav1.ConditionFalse, ReasonDrillRestoreFailed
		default:
			cond.Reason = ReasonDrillError
		}
		cond.Message = msg
	}
	setConditionValue(st, v.obs, cond)
}
