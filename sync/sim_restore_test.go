package sync

import (
	"testing"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// Scratch space and restore sources in the simulator. A backup Job whose snapshot outgrows
// its scratch volume has its pod evicted (outgrows). A Secret or claim the pods mount can be
// deleted (mount-gone NAME): the kubelet then cannot start a pod whose template mounts it,
// which stays ContainerCreating, while a pod already running keeps the files it mounted. A
// cluster restored from a snapshot mounts its source only while it bootstraps
// (restoreRendered): afterwards the source can go, and every pod created or recreated still
// starts.

// outgrows: backup Job j's snapshot, the database file of the largest healthy member, does
// not fit its scratch volume (a drill's: the snapshot and the copy restored from it): the
// kubelet evicts its pod (each of the Job's tries) and the Job fails.
func (w *simWorld) outgrows(j *simJob) bool {
	copies := int64(1)
	if j.verb == verbDrill {
		copies = 2
	}
	for _, m := range w.members {
		if j.scratch > 0 && w.healthy(m) && copies*m.file > j.scratch {
			return true
		}
	}
	return false
}

// mountMissing: pod p's template mounts a Secret or claim that is gone.
func (w *simWorld) mountMissing(p *simPod) bool {
	for _, v := range p.tmpl.Spec.Volumes {
		if v.Secret != nil && w.goneMounts[v.Secret.SecretName] || v.PersistentVolumeClaim != nil && w.goneMounts[v.PersistentVolumeClaim.ClaimName] {
			return true
		}
	}
	return false
}

// TestRestoredPodsStartWithoutTheirSource: for each size, with and without volumes, a cluster
// restored from a snapshot converges, its source (the credentials Secret) is deleted, and then
// every pod is deleted in turn: each comes back and runs, and no pod's template mounts the
// source any more. A lone member without a volume keeps it (restoreRendered): its pod deleted
// would lose its data whatever it mounts.
func TestRestoredPodsStartWithoutTheirSource(t *testing.T) {
	for _, storage := range []bool{true, false} {
		for size := int32(1); size <= 5; size++ {
			w := newSimWorld(t, size, storage)
			w.cluster.UID = "uid-2"
			w.backups = []simBackup{{revision: 100}}
			w.cluster.Spec.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: &v1alpha1.FromBackup{Name: v1alpha1.LatestBackup, BackupDestination: v1alpha1.BackupDestination{
				S3: &v1alpha1.S3Destination{Endpoint: "https://s3.example.test", Bucket: "backups", CredentialsSecret: "s3-credentials"}}}}
			w.run(300)
			w.goneMounts["s3-credentials"] = true
			// A pod of one or two members deleted takes quorum with it until it is back.
			w.faulty = size <= 2
			for ord := range int(size) {
				if !storage && size < 3 {
					break // a member without a volume loses its data with its pod: two are needed beside it
				}
				w.pods[ord].terminating = true
				w.run(300)
				if p := w.pods[ord]; p == nil || !p.running {
					t.Fatalf("size %d, storage %v: pod %d does not run again after it was deleted:\n%s", size, storage, ord, w.describe())
				}
			}
			for ord, p := range w.pods {
				if w.mountMissing(p) && (storage || size > 1) {
					t.Errorf("size %d, storage %v: pod %d still mounts the restore source", size, storage, ord)
				}
			}
		}
	}
}
