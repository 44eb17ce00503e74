package sync

import "fmt"

// The continuous backup (spec.backup.continuous) runs as a Deployment child of one pod,
// <cluster>-backup-stream, not as a sidecar of each etcd pod: one writer per cluster, so no
// chunk is stored twice, and nothing in the etcd pods' template changes (which would roll
// them) when it is turned on or off. It needs no decision from the planner: it resumes from
// what the destination holds whenever its pod starts, so it is rendered beside the other
// children, and a Deployment of another name is not adopted but deleted: a second writer.
// Its strategy is Recreate, so that a changed template never runs two pods at once.

const (
	// LabelBackupStreamOf on the stream's pod names the cluster. (LabelCluster would put the
	// pod behind the cluster's Services and disruption budget.)
	LabelBackupStreamOf = "etcdops.dev/backup-stream-of"
	verbStreamBackup    = "stream-backup"
	// StreamMetricsPort serves the stream's metrics (docs/backup.md, recovery point).
	StreamMetricsPort = 9480
)

// BackupStreamName is the continuous backup's Deployment.
func BackupStreamName(cluster string) string { return cluster + "-backup-stream" }

// backupStream renders the continuous backup's Deployment; false when the spec asks none.
// It reaches etcd through the client Service, so that membership changes leave it as it is.
func (v *view) backupStream() (Child, bool) {
	b := v.c.Spec.Backup
	if b == nil || b.Continuous == nil {
		return Child{}, false
	}
	cs := v.clientStatus()
	args := []string{toolName, verbStreamBackup, "--endpoints=" + cs.Service, "--cluster=" + v.c.Name, "--work-dir=" + backupWorkDir,
		fmt.Sprintf("--metrics-addr=:%d", StreamMetricsPort)}
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
	vols = append(vols, volume{Name: "backup-work", EmptyDir: &emptyDir{}})
	mounts = append(mounts, volumeMount{Name: "backup-work", MountPath: backupWorkDir})
	if cs.ClientSecret != "" {
		args = append(args, "--cacert="+ClientTLSDir+"/ca.crt", "--cert="+ClientTLSDir+"/tls.crt", "--key="+ClientTLSDir+"/tls.key")
		vols = append(vols, volume{Name: "client-tls", Secret: &secretSource{SecretName: cs.ClientSecret}})
		mounts = append(mounts, volumeMount{Name: "client-tls", MountPath: ClientTLSDir, ReadOnly: true})
	}
	container := object{"name": "stream", "image": v.cfg.ToolImage, "command": args, "securityContext": containerSecurityContext(),
		"volumeMounts": mounts, "ports": []object{{"name": "metrics", "containerPort": StreamMetricsPort}}}
	podLabels := map[string]string{LabelBackupStreamOf: v.c.Name, LabelManagedBy: ManagedBy}
	spec := object{
		"replicas": 1,
		"strategy": object{"type": "Recreate"},
		"selector": object{"matchLabels": podLabels},
		"template": object{
			"metadata": object{"labels": podLabels},
			// The member tool talks to etcd and the storage only, never to the Kubernetes API.
			"spec": object{
				"containers":                   []any{container},
				"volumes":                      vols,
				"securityContext":              podSecurityContext(),
				"automountServiceAccountToken": false,
			},
		},
	}
	labels := commonLabels(v.c)
	labels[LabelAction] = verbStreamBackup
	return child("apps/v1", "Deployment", metadata(v.c, BackupStreamName(v.c.Name), labels), spec), true
}
