package sync

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/backupresult"
)

// The continuous backup (spec.backup.continuous) runs as a Deployment child of one pod,
// <cluster>-backup-stream, not as a sidecar of each etcd pod: one writer per cluster, so no
// chunk is stored twice, and nothing in the etcd pods' template changes (which would roll
// them) when it is turned on or off. It needs no decision from the planner: it resumes from
// what the destination holds whenever its pod starts, so it is rendered beside the other
// children, and a Deployment of another name is not adopted but deleted: a second writer.
// Its strategy is Recreate, so that a changed template never runs two pods at once.
//
// The recovery point in status comes from the stream: a Service of the same name selects its
// pod, the hook reads the stream's progress through it (progressURL) under a short deadline,
// and the planner records it in status.backup.continuous (streamStatus). Progress that could
// not be read changes nothing but the BackedUp condition, which says so.

const (
	// LabelBackupStreamOf on the stream's pod names the cluster. (LabelCluster would put the
	// pod behind the cluster's Services and disruption budget.)
	LabelBackupStreamOf = "etcdops.dev/backup-stream-of"
	verbStreamBackup    = "stream-backup"
	// StreamMetricsPort serves the stream's metrics (docs/backup-continuous.md, recovery point).
	StreamMetricsPort = 9480
)

// BackupStreamName is the continuous backup's Deployment and the Service before its pod.
func BackupStreamName(cluster string) string { return cluster + "-backup-stream" }

// progressURL is where the hook reads the continuous backup's progress; "" when the cluster
// has none or its Deployment is not observed yet (there is nothing to ask).
func progressURL(cfg Config, c *v1alpha1.EtcdCluster, observed Children) string {
	if b := c.Spec.Backup; b == nil || b.Continuous == nil {
		return ""
	}
	for _, d := range observed.Deployments {
		if d.Name == BackupStreamName(c.Name) {
			return fmt.Sprintf("http://%s.%s.svc.%s:%d%s", BackupStreamName(c.Name), c.Namespace, cfg.ClusterDomain, StreamMetricsPort, backupresult.ProgressPath)
		}
	}
	return ""
}

// backupStreamService selects the stream's pod, for the hook's progress reads and for
// Prometheus.
func (v *view) backupStreamService() Child {
	labels := commonLabels(v.c)
	labels[LabelAction] = verbStreamBackup
	return child("v1", "Service", metadata(v.c, BackupStreamName(v.c.Name), labels), serviceSpec{
		Selector: map[string]string{LabelBackupStreamOf: v.c.Name, LabelManagedBy: ManagedBy},
		Ports:    []servicePort{{Name: "metrics", Port: StreamMetricsPort, TargetPort: StreamMetricsPort, Protocol: "TCP"}},
	})
}

// streamBehindAfter is how long past its interval a change may wait unstored before the
// stream counts as behind.
func (v *view) streamBehindAfter() time.Duration {
	interval := v1alpha1.DefaultContinuousInterval
	if i := v.c.Spec.Backup.Continuous.Interval; i != nil {
		interval = i.Duration
	}
	return interval + v1alpha1.StreamBehindAfter
}

// streamStatus records the stream's progress in status.backup.continuous. Progress not read
// keeps what was recorded and says why in the message; the record goes with
// spec.backup.continuous. BehindSince is set once, when the stream falls behind, so that a
// stream that stays behind does not change status at every sync.
func (v *view) streamStatus(a *answer) {
	st := &a.st
	on := v.c.Spec.Backup != nil && v.c.Spec.Backup.Continuous != nil
	if !on && (st.Backup == nil || st.Backup.Continuous == nil) {
		return
	}
	rec := &v1alpha1.BackupStatus{}
	if st.Backup != nil {
		*rec = *st.Backup
	}
	st.Backup = rec
	if !on {
		if rec.Continuous = nil; *rec == (v1alpha1.BackupStatus{}) {
			st.Backup = nil
		}
		return
	}
	cs := &v1alpha1.ContinuousBackupStatus{}
	if rec.Continuous != nil {
		*cs = *rec.Continuous
	}
	rec.Continuous = cs
	obs := v.obs.BackupStream
	if !obs.Known {
		cs.Message = "progress unknown: " + obs.Err
		return
	}
	p := obs.Progress
	cs.StoredRevision = p.StoredRevision
	if !p.StoredTime.IsZero() {
		// Status keeps seconds: a finer time would read back different and change it again.
		cs.StoredTime = &metav1.Time{Time: p.StoredTime.Truncate(time.Second)}
	}
	cs.SupersededBy = p.SupersededBy
	if p.SupersededBy != "" {
		// Superseded, it is behind by design and for ever: the writer that holds the claim is
		// what matters, and the person who decides which of the two should run.
		cs.BehindSince = nil
		cs.Message = "another writer claimed the lineage after this stream, which stores nothing since " + p.SupersededTime.UTC().Format(time.RFC3339)
		return
	}
	if p.Behind() <= v.streamBehindAfter() {
		cs.BehindSince, cs.Message = nil, ""
		return
	}
	if cs.BehindSince == nil {
		cs.BehindSince = &metav1.Time{Time: v.obs.Now.Add(-p.Behind()).Truncate(time.Second)}
	}
	cs.Message = "changes wait unstored"
	if p.LastError != "" {
		cs.Message += "; the stream's last failure: " + p.LastError
	}
}

// streamCondition is the BackedUp condition with the continuous backup's part: False while
// the stream is behind, Unknown while its progress cannot be read, True once it has stored
// changes though no scheduled backup has finished yet. A failed or overdue snapshot stays
// False whatever the stream does.
func (v *view) streamCondition(st *v1alpha1.EtcdClusterStatus, cond *metav1.Condition) {
	if cond.Status == metav1.ConditionFalse || st.Backup == nil || st.Backup.Continuous == nil {
		return
	}
	cs := st.Backup.Continuous
	switch {
	case cs.SupersededBy != "" && v.obs.BackupStream.Known:
		cond.Status, cond.Reason = metav1.ConditionFalse, "StreamSuperseded"
		cond.Message = fmt.Sprintf("the continuous backup's pod stores nothing: %s claimed its lineage after it (a second stream for this cluster); this pod stored changes up to revision %d. "+
			"Stop the stream that should not run (docs/runbooks-backup.md, a superseded continuous backup)", cs.SupersededBy, cs.StoredRevision)
	case cs.BehindSince != nil:
		cond.Status, cond.Reason = metav1.ConditionFalse, "StreamBehind"
		cond.Message = fmt.Sprintf("the continuous backup has not been caught up since %s (more than %s): changes are stored up to revision %d; %s",
			cs.BehindSince.UTC().Format(time.RFC3339), v.streamBehindAfter(), cs.StoredRevision, cs.Message)
	case !v.obs.BackupStream.Known:
		cond.Status, cond.Reason = metav1.ConditionUnknown, "StreamProgressUnknown"
		cond.Message = "the continuous backup's progress could not be read: " + v.obs.BackupStream.Err
	case cond.Status == metav1.ConditionUnknown && cs.StoredRevision > 0:
		cond.Status, cond.Reason = metav1.ConditionTrue, "StreamCaughtUp"
		cond.Message = fmt.Sprintf("no scheduled backup yet; the continuous backup stores every change, up to revision %d so far", cs.StoredRevision)
	}
}

// backupStream renders the continuous backup's Deployment; false when the spec asks none.
// It reaches etcd through the client Service, so that membership changes leave it as it is.
func (v *view) backupStream() (Child, bool) {
	b := v.c.Spec.Backup
	if b == nil || b.Continuous == nil {
		return Child{}, false
	}
	cs := v.clientStatus()
	// The pod's name names the stream in its lineage's writer claim, for people.
	args := []string{toolName, verbStreamBackup, "--endpoints=" + cs.Service, "--cluster=" + v.c.Name, "--writer=$(POD_NAME)", "--work-dir=" + backupWorkDir,
		fmt.Sprintf("--metrics-addr=:%d", StreamMetricsPort)}
	args = append(args, v.lineageArgs()...)
	args = append(args, destinationArgs(v.c, "", b.Destination)...)
	if c := b.Continuous; c.Interval != nil {
		args = append(args, "--interval="+c.Interval.Duration.String())
	}
	if c := b.Continuous; c.MaxChunkSize != nil {
		args = append(args, fmt.Sprintf("--max-chunk-bytes=%d", c.MaxChunkSize.Value()))
	}
	if q := b.MaxBandwidth; q != nil {
		args = append(args, fmt.Sprintf("--max-bandwidth=%d", q.Value()))
	}
	vols, mounts := destinationVolumes(b.Destination, false)
	vols = append(vols, volume{Name: volumeBackupWork, EmptyDir: &emptyDir{SizeLimit: v.streamScratch()}})
	mounts = append(mounts, volumeMount{Name: volumeBackupWork, MountPath: backupWorkDir})
	if cs.ClientSecret != "" {
		args = append(args, "--cacert="+ClientTLSDir+"/ca.crt", "--cert="+ClientTLSDir+"/tls.crt", "--key="+ClientTLSDir+"/tls.key")
		vols = append(vols, volume{Name: "client-tls", Secret: &secretSource{SecretName: cs.ClientSecret}})
		mounts = append(mounts, volumeMount{Name: "client-tls", MountPath: ClientTLSDir, ReadOnly: true})
	}
	container := object{"name": "stream", "image": v.cfg.ToolImage, "command": args, "securityContext": containerSecurityContext(),
		"env":          []envVar{{Name: "POD_NAME", ValueFrom: envVarSource{FieldRef: fieldRef{FieldPath: "metadata.name"}}}},
		"volumeMounts": mounts, "ports": []object{{"name": "metrics", "containerPort": StreamMetricsPort}},
		"resources": toolResources(v.c, v1alpha1.ToolStream)}
	podLabels := map[string]string{LabelBackupStreamOf: v.c.Name, LabelManagedBy: ManagedBy}
	// The member tool talks to etcd and the storage only, never to the Kubernetes API.
	podSpec := object{
		"containers":                   []any{container},
		"volumes":                      vols,
		"securityContext":              podSecurityContext(),
		"automountServiceAccountToken": false,
	}
	if refs := pullSecrets(v.c, false); len(refs) > 0 {
		podSpec["imagePullSecrets"] = refs
	}
	authLogin(v.c, container, podSpec)
	podMeta := object{"labels": podLabels}
	if authManaged(v.c) {
		// The stream reads root's password when it starts: a new one (the Secret created by
		// the first auth Job) restarts it.
		podMeta["annotations"] = map[string]string{AnnotationLoginDigest: v.obs.Credentials[RootSecretName(v.c.Name)]}
	}
	spec := object{
		"replicas": 1,
		"strategy": object{"type": "Recreate"},
		"selector": object{"matchLabels": podLabels},
		"template": object{
			"metadata": podMeta,
			"spec":     podSpec,
		},
	}
	labels := commonLabels(v.c)
	labels[LabelAction] = verbStreamBackup
	return child("apps/v1", "Deployment", metadata(v.c, BackupStreamName(v.c.Name), labels), spec), true
}

// streamScratch bounds the stream's scratch volume, which holds a chunk and, when a chain
// starts afresh, a snapshot: the bound of the largest database observed, never below the
// bound its observed Deployment has. So its template, and with it its pod, changes only when
// the database doubles past a bound, not when the member with the largest database misses a
// sync. A bound the operator would not render (edited by hand) is not kept.
func (v *view) streamScratch() string {
	limit := resource.MustParse(scratchLimit(v.largestDB()))
	for _, d := range v.obs.Children.Deployments {
		if d.Name != BackupStreamName(v.c.Name) {
			continue
		}
		for _, vol := range d.Spec.Template.Spec.Volumes {
			if vol.Name != volumeBackupWork || vol.EmptyDir == nil || vol.EmptyDir.SizeLimit == nil {
				continue
			}
			if q := *vol.EmptyDir.SizeLimit; isScratchBound(q.Value()) && q.Cmp(limit) > 0 {
				limit = q
			}
		}
	}
	return limit.String()
}

// isScratchBound: n is a bound scratchLimit renders.
func isScratchBound(n int64) bool {
	return n >= scratchFloor && n&(n-1) == 0
}
