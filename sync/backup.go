package sync

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/backupresult"
	"etcdops.dev/etcdops/joinstate"
)

// Backups are member Jobs the planner schedules (backupDue), not a CronJob: a Job the planner starts
// is one at a time with every other member Job by the rule that holds for all of them, never
// runs while a learner joins or a member is being replaced, and is read from the members the
// planner knows healthy. Its result comes back as the termination message of the Job's pod
// (backupresult), which customize relates, and goes into status.backup. Restore is the other
// half: a cluster with spec.bootstrap.fromBackup starts its seed from a snapshot (launcher).

const (
	verbBackup = "backup"
	// LabelBackupOf on a backup Job's pod names the cluster; customize relates such pods so
	// that the planner reads their termination message. (LabelCluster would put the pod
	// behind the cluster's Services and disruption budget.)
	LabelBackupOf = "etcdops.dev/backup-of"
	// LabelBackupFor on a backup Job says what it is for: a schedule time or a request.
	LabelBackupFor = "etcdops.dev/backup-for"
	// backupDeadline bounds a backup Job: a large database read at the bandwidth bound and
	// uploaded takes minutes, not an hour.
	backupDeadline = 3600
	// backupResultWait is how long a succeeded backup Job is kept while its pod's report is
	// not observed yet (the pod and the Job are watched apart); then the backup is recorded
	// without it.
	backupResultWait = time.Minute
)

// Paths in a backup Job's pod, and the restore mounts of an etcd pod.
const (
	backupWorkDir        = "/var/lib/etcdops/work"
	backupCredentialsDir = "/etc/etcdops/backup/credentials"
	backupCADir          = "/etc/etcdops/backup/ca"
	backupClaimDir       = "/var/lib/etcdops/backup"
	backupCAKey          = "ca.crt"
	// volumeBackupWork is the scratch volume of a backup Job, a drill and the stream.
	volumeBackupWork = "backup-work"
)

// scratchFloor is the least a scratch volume is bounded to.
const scratchFloor = 1 << 30

// scratchLimit bounds a scratch volume that holds a snapshot of a database of db bytes:
// twice the database, for one that grows between the observation and the read, rounded up to
// a power of two and at least 1Gi, so that the bound (and with it a backup Job's name and the
// stream's template) stays the same while the database grows within it. The kubelet evicts a
// pod whose scratch outgrows it (docs/backup-setup.md, "Scratch space").
func scratchLimit(db int64) string {
	n := int64(scratchFloor)
	for n/2 < db && n <= math.MaxInt64/2 {
		n *= 2
	}
	return resource.NewQuantity(n, resource.BinarySI).String()
}

// largestDB is the largest database file a member reported: the size a snapshot of the
// cluster takes.
func (v *view) largestDB() int64 {
	var n int64
	for _, m := range v.members {
		n = max(n, m.DBSize)
	}
	return n
}

// backupTrigger is why a backup is due: a schedule time, an on-demand request, a risky step
// it guards (guard.go), or one whose pod was evicted for outgrowing its scratch volume, taken
// again (retry, its label).
type backupTrigger struct {
	scheduled time.Time
	request   string
	guard     *v1alpha1.StepGuard
	retry     string
}

// label is the trigger as a label value: the schedule time, a hash of the request, or of the
// guarded step and when its snapshot was asked for.
func (t backupTrigger) label() string {
	switch {
	case t.retry != "":
		return t.retry
	case t.guard != nil:
		return guardLabel(t.guard)
	case t.request != "":
		return "request-" + shortHash(t.request)
	}
	return "scheduled-" + t.scheduled.UTC().Format("20060102T150405Z")
}

func (t backupTrigger) String() string {
	switch {
	case t.retry != "":
		return "taken again: the database outgrew the scratch volume of the last one"
	case t.guard != nil:
		return "before " + t.guard.Step
	case t.request != "":
		return fmt.Sprintf("requested (%s=%s)", v1alpha1.AnnotationBackupNow, t.request)
	}
	return "scheduled for " + t.scheduled.UTC().Format(time.RFC3339)
}

// dueBackup is the backup due now, if any: a request the last status has not taken, or the
// latest schedule time since the last one taken (the cluster's creation before any).
// Schedule times missed while nothing could run are not made up: one backup catches up.
func (v *view) dueBackup() (backupTrigger, bool) {
	b := v.c.Spec.Backup
	if b == nil {
		return backupTrigger{}, false
	}
	last := v.obs.Cluster.Status.Backup
	if req := v.c.Annotations[v1alpha1.AnnotationBackupNow]; req != "" && (last == nil || last.LastRequest != req) {
		return backupTrigger{request: req}, true
	}
	if b.Suspend || v.schedule == nil {
		return backupTrigger{}, false
	}
	from := v.c.CreationTimestamp.Time
	if last != nil && last.LastScheduleTime != nil {
		from = last.LastScheduleTime.Time
	}
	t, ok := latestTick(v.schedule.Next, from, v.obs.Now)
	return backupTrigger{scheduled: t}, ok
}

// latestTick is the latest time of a schedule after from and at or before now. The walk
// starts no earlier than it must: from an hour ago when a time falls in the last hour, else
// a day, a month, a year, else from from; a schedule is at most once a minute (Validate).
func latestTick(next func(time.Time) time.Time, from, now time.Time) (time.Time, bool) {
	t := next(from)
	if t.After(now) {
		return time.Time{}, false
	}
	for _, back := range []time.Duration{time.Hour, 24 * time.Hour, 31 * 24 * time.Hour, 366 * 24 * time.Hour} {
		start := now.Add(-back)
		if !start.After(t) {
			break
		}
		if n := next(start); !n.After(now) {
			t = n
			break
		}
	}
	for n := next(t); !n.After(now); n = next(n) {
		t = n
	}
	return t, true
}

// backupDue: a backup that is due is taken before a failed member is replaced and before anything
// normal (a roll, a scale) goes on: the normal phases wait for the one Job, and a roll of many
// pods does not put the backup off. Only the fixes come first, so no backup starts while a
// learner joins, a member lacks its pod or a pod its member. A member down does not stop it:
// the snapshot is read from another. A backup running does not hold up a fix either (quorum
// recovery, NOSPACE, a failed member and the learner that replaces it): a repair matters more
// than one snapshot, which at worst fails and is taken at the next schedule time.
func (p *planner) backupDue() (step, bool) {
	t, ok := p.dueBackup()
	retry := !ok && p.stage.backupRetry != ""
	if !ok && !retry || p.stage.retry != (stepKey{}) || p.stage.exhausted != nil || p.stage.backupWait != nil {
		// A failed step due for its retry, or out of retries, goes first: a backup in between
		// would lose its count of attempts. One backup at a time.
		return step{}, false
	}
	if retry {
		// The schedule time or request is recorded already: only the Job is new.
		return p.backupStep(backupTrigger{retry: p.stage.backupRetry}), true
	}
	s := p.backupStep(t)
	if t.request != "" {
		s.backup.LastRequest = t.request
	} else {
		at := metav1.NewTime(t.scheduled)
		s.backup.LastScheduleTime = &at
	}
	return s, true
}

// backupStep starts a backup Job for trigger t, with status.backup as this sync leaves it so
// far in the step, to be changed by the caller.
func (p *planner) backupStep(t backupTrigger) step {
	voters := p.voters()
	eps, name := p.readEndpoints(voters)
	scratch := scratchLimit(p.largestDB())
	reason := "backup " + t.String() + ": snapshot from a follower, " + name + " preferred"
	if t.retry != "" {
		reason = "backup " + t.String() + "; now bounded to " + scratch + ", snapshot from a follower, " + name + " preferred"
	}
	s := p.base(Action{Type: TakeBackup, Member: name, Reason: reason}, resyncSoon)
	s.job = &memberJob{verb: verbBackup, member: voters[len(voters)-1].name, endpoints: eps, backupFor: t.label(), lineage: p.lineageArgs(), clientSecret: p.tls.clientSecret, scratch: scratch}
	s.backup = p.backupRecord().changed()
	return s
}

// readEndpoints are what a backup or a drill Job reads through: every voter's client URL,
// highest ordinal first, so that the Job stays the same while the membership does (the member
// tool asks each and reads from a healthy follower before the leader), and the member it will
// likely read, for the step's reason. voters is not empty.
func (p *planner) readEndpoints(voters []*member) (eps []string, preferred string) {
	secure := p.jobTLS()
	for i := len(voters) - 1; i >= 0; i-- {
		eps = append(eps, clientURLOf(p.c, voters[i].name, p.cfg.ClusterDomain, secure))
	}
	preferred = voters[len(voters)-1].name
	for i := len(voters) - 1; i >= 0; i-- {
		if m := voters[i]; m.Healthy && m != p.leader {
			return eps, m.name
		}
	}
	return eps, preferred
}

// backupRecord is status.backup as the Job stage left it, to be changed.
func (p *planner) backupRecord() *backupRecord {
	return &backupRecord{st: p.stage.backup, prev: p.obs.Cluster.Status.Backup}
}

// backupRecord is status.backup as this sync leaves it so far: st is nil until something is
// recorded, then a copy of prev (the last status's), changed in place.
type backupRecord struct {
	st, prev *v1alpha1.BackupStatus
}

// changed is the record to change: a copy of what it holds so far.
func (r *backupRecord) changed() *v1alpha1.BackupStatus {
	c := &v1alpha1.BackupStatus{}
	switch {
	case r.st != nil:
		*c = *r.st
	case r.prev != nil:
		*c = *r.prev
	}
	r.st = c
	return c
}

// backupJob handles an observed backup Job in the Job stage (memberJobs): one running is waited for; one done is
// recorded in status.backup and dropped (a failed one is not retried before the next
// schedule time: its pod was retried already, backoffLimit times). keep is false when the
// Job is dropped.
func (p *planner) backupJob(j *batchv1.Job, rec *backupRecord) (s step, keep bool) {
	state, at := stateOf(j)
	switch state {
	case jobRunning:
		return p.wait(j.Labels[LabelMember], "backup: Job "+j.Name+" running", resyncSoon), true
	case jobSucceeded:
		r, ok := p.backupResult(j, corev1.PodSucceeded)
		if !ok && p.elapsedSince(at) < backupResultWait {
			return p.wait(j.Labels[LabelMember], "backup: Job "+j.Name+" done, its pod's report not seen yet", resyncSoon), true
		}
		b := rec.changed()
		b.LastSuccessfulTime = &metav1.Time{Time: at}
		b.LastSuccessful = &v1alpha1.BackupRecord{Object: r.Object, Revision: r.Revision, Size: r.Size, SHA256: r.SHA256, Member: p.memberNameOf(r.MemberID), Time: metav1.NewTime(at)}
		guarded(b, j, nil)
	case jobFailed:
		r, _ := p.backupResult(j, corev1.PodFailed)
		reason := r.Error
		if reason == "" {
			reason = jobFailureMessage(j)
		}
		if pod := p.evictedPod(j); pod != nil {
			reason = "its pod was evicted: " + strings.TrimSpace(pod.Status.Message)
		}
		b := rec.changed()
		b.LastFailure = &v1alpha1.BackupFailure{Job: j.Name, Reason: reason, Time: metav1.NewTime(at)}
		guarded(b, j, b.LastFailure)
	}
	return step{}, false
}

// outcomeHandedIn: the status this sync was handed records finished backup or drill Job j's
// outcome, or a later one of its kind (status keeps the last of each).
func (p *planner) outcomeHandedIn(j *batchv1.Job) bool {
	b := p.obs.Cluster.Status.Backup
	_, at := stateOf(j)
	since := func(t *metav1.Time) bool { return t != nil && t.Unix() >= at.Unix() }
	switch {
	case b == nil:
		return false
	case j.Labels[LabelAction] == verbDrill:
		return b.LastDrill != nil && since(&b.LastDrill.Time)
	}
	return since(b.LastSuccessfulTime) || b.LastFailure != nil && since(&b.LastFailure.Time)
}

// evictedPod is the newest pod of backup Job j the kubelet evicted, if any: one whose
// scratch outgrew its bound, or on a node short of space.
func (p *planner) evictedPod(j *batchv1.Job) *corev1.Pod {
	var newest *corev1.Pod
	for i := range p.obs.Pods {
		pod := &p.obs.Pods[i]
		if pod.Labels[LabelBackupOf] == p.c.Name && pod.Labels[batchv1.JobNameLabel] == j.Name &&
			pod.Status.Phase == corev1.PodFailed && pod.Status.Reason == "Evicted" && (newest == nil || newer(pod, newest)) {
			newest = pod
		}
	}
	return newest
}

// newer: a was created after b, or in the same second and named after it.
func newer(a, b *corev1.Pod) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return b.CreationTimestamp.Before(&a.CreationTimestamp)
	}
	return a.Name > b.Name
}

// outgrewScratch: backup Job j failed with a pod evicted, and the database observed now
// needs a larger scratch bound than j had. Its backup is then taken again at once, with that
// bound (backupDue): the schedule time or request it was for is not lost to a database that
// grew between the observation and the read. A Job evicted with a bound the database still
// fits is a failure like any other.
func (p *planner) outgrewScratch(j *batchv1.Job) bool {
	if state, _ := stateOf(j); state != jobFailed || p.evictedPod(j) == nil {
		return false
	}
	want := resource.MustParse(scratchLimit(p.largestDB()))
	for _, vol := range j.Spec.Template.Spec.Volumes {
		if vol.Name == volumeBackupWork && vol.EmptyDir != nil && vol.EmptyDir.SizeLimit != nil {
			return want.Cmp(*vol.EmptyDir.SizeLimit) > 0
		}
	}
	return false
}

// backupResult reads the report of a pod of Job j that ended in phase (a succeeded Job has
// one; the failed pods of a failed Job each tell why).
func (p *planner) backupResult(j *batchv1.Job, phase corev1.PodPhase) (backupresult.Result, bool) {
	for _, msg := range p.jobReports(j, phase) {
		if r, err := backupresult.Decode(msg); err == nil {
			return r, true
		}
	}
	return backupresult.Result{}, false
}

func jobFailureMessage(j *batchv1.Job) string {
	for _, c := range j.Status.Conditions {
		if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
			return strings.TrimSpace(c.Reason + ": " + c.Message)
		}
	}
	return "the Job failed"
}

// memberNameOf names the member of a hex ID, or returns the ID.
func (v *view) memberNameOf(id string) string {
	if n, err := strconv.ParseUint(id, 16, 64); err == nil {
		if m := v.memberByID(n); m != nil {
			return m.name
		}
	}
	return id
}

// backupArgs are the backup command's flags beyond the common ones.
func backupArgs(c *v1alpha1.EtcdCluster) []string {
	b := c.Spec.Backup
	// The report goes where the kubelet reads a container's termination message by default.
	args := []string{"--cluster=" + c.Name, "--work-dir=" + backupWorkDir, "--termination-log=/dev/termination-log", fmt.Sprintf("--timeout=%ds", backupDeadline-60)}
	args = append(args, destinationArgs(c, "", b.Destination)...)
	if r := b.Retention; r != nil {
		if r.Keep != nil {
			args = append(args, fmt.Sprintf("--keep=%d", *r.Keep))
		}
		if r.KeepFor != nil {
			args = append(args, "--keep-for="+r.KeepFor.Duration.String())
		}
		if r.KeepHourly != nil {
			args = append(args, fmt.Sprintf("--keep-hourly=%d", *r.KeepHourly))
		}
		if r.KeepDaily != nil {
			args = append(args, fmt.Sprintf("--keep-daily=%d", *r.KeepDaily))
		}
	}
	if q := b.MaxBandwidth; q != nil {
		args = append(args, fmt.Sprintf("--max-bandwidth=%d", q.Value()))
	}
	return args
}

// destinationArgs name a destination in the member tool's flags, each after prefix.
func destinationArgs(c *v1alpha1.EtcdCluster, prefix string, d v1alpha1.BackupDestination) []string {
	if s := d.S3; s != nil {
		p := s.Prefix
		if p == "" {
			p = v1alpha1.BackupPrefix(c.Namespace, c.Name)
		}
		args := []string{"--" + prefix + "s3-endpoint=" + s.Endpoint, "--" + prefix + "bucket=" + s.Bucket, "--" + prefix + "prefix=" + p,
			"--" + prefix + "credentials-dir=" + backupCredentialsDir}
		if s.Region != "" {
			args = append(args, "--"+prefix+"region="+s.Region)
		}
		if s.CASecret != "" {
			args = append(args, "--"+prefix+"ca-file="+backupCADir+"/"+backupCAKey)
		}
		return args
	}
	dir := d.PersistentVolumeClaim.Path
	if dir == "" {
		dir = v1alpha1.BackupPrefix(c.Namespace, c.Name)
	}
	return []string{"--" + prefix + "dir=" + strings.TrimSuffix(backupClaimDir+"/"+dir, "/")}
}

// destinationVolumes are the volumes and mounts a destination needs: the credentials and CA
// Secrets, or the claim.
func destinationVolumes(d v1alpha1.BackupDestination, readOnly bool) (vols []volume, mounts []volumeMount) {
	if s := d.S3; s != nil {
		vols = append(vols, volume{Name: "backup-credentials", Secret: &secretSource{SecretName: s.CredentialsSecret}})
		mounts = append(mounts, volumeMount{Name: "backup-credentials", MountPath: backupCredentialsDir, ReadOnly: true})
		if s.CASecret != "" {
			vols = append(vols, volume{Name: "backup-ca", Secret: &secretSource{SecretName: s.CASecret}})
			mounts = append(mounts, volumeMount{Name: "backup-ca", MountPath: backupCADir, ReadOnly: true})
		}
		return vols, mounts
	}
	return []volume{{Name: "backup-claim", PersistentVolumeClaim: &claimSource{ClaimName: d.PersistentVolumeClaim.ClaimName, ReadOnly: readOnly}}},
		[]volumeMount{{Name: "backup-claim", MountPath: backupClaimDir, ReadOnly: readOnly}}
}

// backupPod adds to a backup Job what the backup command needs: its destination mounted, a
// work directory for the snapshot, the label customize relates its pod by, a deadline.
func backupPod(c *v1alpha1.EtcdCluster, j memberJob, labels, podLabels map[string]string, spec, podSpec, container object) {
	labels[LabelBackupFor] = j.backupFor
	podLabels[LabelBackupOf] = c.Name
	spec["activeDeadlineSeconds"] = backupDeadline
	vols, mounts := destinationVolumes(c.Spec.Backup.Destination, false)
	vols = append(vols, volume{Name: volumeBackupWork, EmptyDir: &emptyDir{SizeLimit: j.scratch}})
	mounts = append(mounts, volumeMount{Name: volumeBackupWork, MountPath: backupWorkDir})
	addVolumes(podSpec, container, vols, mounts)
}

// addVolumes adds vols to a Job's pod and mounts to its container, after those it has (the
// client certificate's).
func addVolumes(podSpec, container object, vols []volume, mounts []volumeMount) {
	if have, ok := podSpec["volumes"].([]volume); ok {
		vols = append(have, vols...)
	}
	if have, ok := container["volumeMounts"].([]volumeMount); ok {
		mounts = append(have, mounts...)
	}
	podSpec["volumes"], container["volumeMounts"] = vols, mounts
}

// backupResync brings the resync forward to the next schedule time: Metacontroller resyncs on
// its own only every resyncPeriodSeconds.
func (v *view) backupResync(a *answer) {
	b := v.c.Spec.Backup
	if b == nil || b.Suspend || v.schedule == nil {
		return
	}
	a.resync = min(a.resync, max(1, math.Ceil(v.schedule.Next(v.obs.Now).Sub(v.obs.Now).Seconds())))
}

// backupRecord records the outcomes of the backups and drills that the Job stage read.
func (v *view) backupRecord(a *answer) {
	if a.step.backup != nil {
		a.st.Backup = a.step.backup
	}
}

// backupCondition sets the BackedUp condition of a cluster with spec.backup: True while the
// last backup succeeded and the one after it is not overdue, False after a failure or when
// two schedule times passed since the last success, Unknown before the first; then the
// continuous backup's part (streamCondition).
func (v *view) backupCondition(a *answer) {
	st := &a.st
	b := v.c.Spec.Backup
	if b == nil {
		return
	}
	cond := metav1.Condition{Type: v1alpha1.ConditionBackedUp, Status: metav1.ConditionUnknown, Reason: "NoBackupYet",
		Message: "no backup has finished yet", ObservedGeneration: v.c.Generation, LastTransitionTime: metav1.NewTime(v.obs.Now)}
	rec := st.Backup
	switch {
	case rec == nil || rec.LastSuccessfulTime == nil && rec.LastFailure == nil:
	case rec.LastFailure != nil && (rec.LastSuccessfulTime == nil || rec.LastFailure.Time.After(rec.LastSuccessfulTime.Time)):
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "BackupFailed", "Job "+rec.LastFailure.Job+": "+rec.LastFailure.Reason
	case v.overdue(rec.LastSuccessfulTime.Time):
		cond.Status, cond.Reason = metav1.ConditionFalse, "BackupOverdue"
		cond.Message = "no backup since " + rec.LastSuccessfulTime.UTC().Format(time.RFC3339) + ", though two schedule times have passed: the operator could not run one (see the Progressing condition)"
	default:
		cond.Status, cond.Reason = metav1.ConditionTrue, "BackupSucceeded"
		cond.Message = "last backup at " + rec.LastSuccessfulTime.UTC().Format(time.RFC3339)
		if l := rec.LastSuccessful; l != nil && l.Object != "" {
			cond.Message += fmt.Sprintf(": %s, revision %d", l.Object, l.Revision)
		}
	}
	v.streamCondition(st, &cond)
	setConditionValue(st, v.obs, cond)
}

// overdue: not suspended, and two schedule times have passed since last.
func (v *view) overdue(last time.Time) bool {
	return v.schedule != nil && !v.c.Spec.Backup.Suspend && !v.schedule.Next(v.schedule.Next(last)).After(v.obs.Now)
}

// Restore at bootstrap.

// restoreJoin is the join state's restore of a cluster bootstrapped from a snapshot: the seed
// restores it. nil for any other cluster.
func restoreJoin(c *v1alpha1.EtcdCluster, seed string) *joinstate.Restore {
	if f := fromBackup(c); f != nil {
		r := &joinstate.Restore{Member: seed, Backup: f.Name, Lineage: f.Lineage}
		if f.Revision != nil {
			r.Revision = *f.Revision
		}
		if f.Time != nil {
			r.Time = f.Time.UTC().Format(time.RFC3339Nano)
		}
		return r
	}
	return nil
}

// restoredFrom records the snapshot a cluster bootstrapped from a snapshot came from, from
// the join ConfigMap's copy when status lost it.
func (v *view) restoredFrom(a *answer) {
	if a.st.RestoredFrom == "" && fromBackup(v.c) != nil && v.join != nil {
		a.st.RestoredFrom = v.join.Annotations[AnnotationRestoredFrom]
	}
}

// restoredRevision records what the seed of a cluster bootstrapped from a snapshot restored
// (recordRestoredRevision).
func (v *view) restoredRevision(a *answer) { recordRestoredRevision(v.obs, v.c, &a.st) }

// recordRestoredRevision records, on a cluster bootstrapped from a snapshot, the revision its
// seed restored, when it was stored and the lineage, once (restoredPoint).
func recordRestoredRevision(obs *Observed, c *v1alpha1.EtcdCluster, st *v1alpha1.EtcdClusterStatus) {
	if fromBackup(c) == nil || st.RestoredRevision != 0 {
		return
	}
	if p, ok := restoredPoint(obs, c); ok {
		st.RestoredRevision, st.RestoredLineage = p.Revision, p.Lineage
		if !p.Time.IsZero() {
			st.RestoredTime = &metav1.MicroTime{Time: p.Time}
		}
		if p.Took > 0 {
			st.RestoreDuration = &metav1.Duration{Duration: p.Took}
		}
	}
}

// AnnotationRestored on the join ConfigMap of a cluster bootstrapped from a snapshot keeps
// the seed's report of what it restored (joinstate.RestoredMessage), beside status: the seed's
// pod keeps it only until its container ends again, and the pod itself goes when the seed is
// rolled once the cluster has bootstrapped (restoreRendered).
const AnnotationRestored = "etcdops.dev/restored"

// restoredPoint is what the seed of a cluster bootstrapped from a snapshot restored: its etcd
// container ends once after the restore with it in its termination message
// (joinstate.RestoredMessage), which the pod's status keeps until the container ends again,
// and the join ConfigMap after that (AnnotationRestored).
func restoredPoint(obs *Observed, c *v1alpha1.EtcdCluster) (joinstate.RestoredPoint, bool) {
	if p, ok := seedReport(obs, c); ok {
		return joinstate.ParseRestored(p)
	}
	for _, cm := range obs.Children.ConfigMaps {
		if cm.Name == JoinConfigMapName(c.Name) {
			return joinstate.ParseRestored(cm.Annotations[AnnotationRestored])
		}
	}
	return joinstate.RestoredPoint{}, false
}

// restoredAnnotation is the join ConfigMap's AnnotationRestored: the seed's report once seen,
// "" before (and on a cluster not restored).
func restoredAnnotation(obs *Observed, c *v1alpha1.EtcdCluster) string {
	if fromBackup(c) == nil {
		return ""
	}
	if p, ok := restoredPoint(obs, c); ok {
		return joinstate.RestoredMessage(p)
	}
	return ""
}

// seedReport is the seed's termination message that says what it restored, if its pod's
// status still shows it.
func seedReport(obs *Observed, c *v1alpha1.EtcdCluster) (string, bool) {
	for i := range obs.Pods {
		p := &obs.Pods[i]
		cs := etcdStatus(p)
		if p.Labels[LabelCluster] != c.Name || cs == nil {
			continue
		}
		for _, t := range []*corev1.ContainerStateTerminated{cs.State.Terminated, cs.LastTerminationState.Terminated} {
			if t == nil {
				continue
			}
			if _, ok := joinstate.ParseRestored(t.Message); ok {
				return t.Message, true
			}
		}
	}
	return "", false
}

// lineageArgs are the flags that tie a backup Job or the stream to the cluster's lineage: the
// etcd cluster ID its members must answer with (once known: a member of another cluster is
// then never read into this one's lineage), and what the lineage's manifest says of the
// cluster, where it was restored from included (from status, else from the seed's report).
func (v *view) lineageArgs() []string {
	c := v.c
	args := []string{"--namespace=" + c.Namespace}
	if c.UID != "" {
		args = append(args, "--cluster-uid="+string(c.UID))
	}
	if id := v.knownClusterID(); id != "" {
		args = append(args, "--cluster-id="+id)
	}
	if fromBackup(c) == nil {
		return args
	}
	st := &c.Status
	p := joinstate.RestoredPoint{Revision: st.RestoredRevision, Lineage: st.RestoredLineage}
	if st.RestoredTime != nil {
		p.Time = st.RestoredTime.Time
	}
	if p.Revision == 0 {
		p, _ = restoredPoint(v.obs, c)
	}
	if p.Revision == 0 {
		return args
	}
	args = append(args, fmt.Sprintf("--restored-revision=%d", p.Revision))
	if p.Lineage != "" {
		args = append(args, "--restored-lineage="+p.Lineage)
	}
	if !p.Time.IsZero() {
		args = append(args, "--restored-time="+p.Time.UTC().Format(time.RFC3339Nano))
	}
	return args
}

func fromBackup(c *v1alpha1.EtcdCluster) *v1alpha1.FromBackup {
	if b := c.Spec.Bootstrap; b != nil {
		return b.FromBackup
	}
	return nil
}

// restoreRendered is the cluster the pod template is rendered from: c while it bootstraps,
// and c without spec.bootstrap once it has. Only the seed's first start reads the snapshot (a
// restore acts only while the join state says new, launcher.Decide), and the seed's etcd
// answers only once its restore is done, which ends the bootstrap (isBootstrapping). So the
// pods mount the restore source while the seed restores (a failed restore is retried by its
// container's restarts, a seed pod recreated meanwhile mounts it again) and never after: a
// Secret rotated or deleted, or a claim held by another pod, cannot keep a new or
// rescheduled pod from starting. The seed, created with the source, is rolled to the template
// without it like any pod on an outdated template (docs/backup-restore.md, "The restore source"),
// except a lone member without a volume: rolling it would lose its data, and a new pod of it
// would have none to start on, with the source mounted or not, so its template keeps the
// source until it has company.
func restoreRendered(obs *Observed, c *v1alpha1.EtcdCluster) *v1alpha1.EtcdCluster {
	if fromBackup(c) == nil || isBootstrapping(obs) || c.Spec.StorageSpec == nil && *c.Spec.Size == 1 {
		return c
	}
	past := *c
	past.Spec.Bootstrap = nil
	return &past
}

// withRestore gives the etcd container of a cluster bootstrapping from a snapshot the restore
// flags (before the "--" that ends the launcher's own) and the mounts the snapshot is read
// through. Every pod gets them, as they share one template; only the seed of the new
// cluster uses them (launcher.Decide), and only while it bootstraps (restoreRendered).
func withRestore(c *v1alpha1.EtcdCluster, spec *etcdPodSpec) {
	f := fromBackup(c)
	if f == nil {
		return
	}
	etcd := &spec.Containers[0]
	end := slices.Index(etcd.Command, "--")
	etcd.Command = slices.Concat(etcd.Command[:end], destinationArgs(c, "restore-", f.BackupDestination), etcd.Command[end:])
	vols, mounts := destinationVolumes(f.BackupDestination, true)
	spec.Volumes = append(spec.Volumes, vols...)
	etcd.VolumeMounts = append(etcd.VolumeMounts, mounts...)
}

// AnnotationRestoredFrom on the join ConfigMap of a cluster bootstrapped from a snapshot
// names the snapshot, beside status.restoredFrom: with either lost, the cluster is still known
// to have started from it. (The pod template, which carried the restore flags, no longer does
// once the cluster has bootstrapped.)
const AnnotationRestoredFrom = "etcdops.dev/restored-from"

// restoreInPlace refuses spec.bootstrap.fromBackup on a cluster that did not start from it:
// a restore makes a new cluster, so applying it to a running one would either do nothing or
// throw its data away. Started from it means status says so, or the join ConfigMap does, or
// the StatefulSet's pods carry the restore flags (as a hook before the ConfigMap's record left
// them), so that a lost status loses nothing.
//
// spec.bootstrap is fixed at creation (the CRD's rule), so the refusal cannot be answered by
// removing it: the advice names what the API server takes, a new EtcdCluster.
func restoreInPlace(obs *Observed, c *v1alpha1.EtcdCluster) error {
	f := fromBackup(c)
	if f == nil || isBootstrapping(obs) || obs.Cluster.Status.RestoredFrom != "" {
		return nil
	}
	for _, cm := range obs.Children.ConfigMaps {
		if cm.Name == JoinConfigMapName(c.Name) && cm.Annotations[AnnotationRestoredFrom] != "" {
			return nil
		}
	}
	for _, s := range obs.Children.StatefulSets {
		for _, ct := range s.Spec.Template.Spec.Containers {
			if slices.ContainsFunc(ct.Command, func(a string) bool { return strings.HasPrefix(a, "--restore-") }) {
				return nil
			}
		}
	}
	return errors.New("spec.bootstrap.fromBackup is set on a cluster that already runs: a restore creates a new cluster and is never applied in place, and spec.bootstrap is fixed at creation; " +
		"nothing changes while it is set. To keep this cluster's data, snapshot it and restore it into a new EtcdCluster; to start over from the snapshot, delete this EtcdCluster and its claims and create it again (docs/runbooks-backup.md, restore over an existing cluster)")
}
