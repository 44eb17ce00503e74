package e2e

import (
	"strings"
	gosync "sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/backup"
	"etcdops.dev/etcdops/test/harness"
	"etcdops.dev/etcdops/test/s3server"
)

// Object storage is versitygw, a real S3 server, over a temporary directory on 127.0.0.1
// (test/s3server).
func realS3(t *testing.T) v1alpha1.BackupDestination {
	srv := s3server.Start(t, "etcd-backups")
	return v1alpha1.BackupDestination{S3: &v1alpha1.S3Destination{Endpoint: srv.Endpoint, Bucket: "etcd-backups", Prefix: "e2e/etcd/",
		Region: s3server.Region, CredentialsSecret: "s3-credentials"}}
}

// addCredentials creates the credentials Secret the backup Jobs and a restoring seed mount.
func addCredentials(t *testing.T, env *harness.Env) {
	err := env.Store.Create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s3-credentials"},
		Data: map[string][]byte{backup.KeyAccessKeyID: []byte(s3server.AccessKey), backup.KeySecretAccessKey: []byte(s3server.SecretKey)}})
	if err != nil {
		t.Fatal(err)
	}
}

func lastBackup(env *harness.Env) *v1alpha1.BackupStatus {
	if p := env.Store.Parent(); p != nil {
		return p.Status.Backup
	}
	return nil
}

// requestBackup asks env for a backup under request and waits until status records it taken:
// a successful backup other than the one recorded before. Status names the request as soon as
// its Job starts, and a backup of earlier (a schedule's, or a risky step's) may be on record
// already, so neither says that this one is done.
func requestBackup(t *testing.T, env *harness.Env, request string) *v1alpha1.BackupRecord {
	t.Helper()
	var before string
	if b := lastBackup(env); b != nil && b.LastSuccessful != nil {
		before = b.LastSuccessful.Object
	}
	env.Store.AnnotateParent(v1alpha1.AnnotationBackupNow, request)
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		b := lastBackup(env)
		return b != nil && b.LastRequest == request && b.LastSuccessful != nil && b.LastSuccessful.Object != before, "the requested backup has not finished"
	}); err != nil {
		t.Fatalf("%v\n%s", err, env.Describe())
	}
	return lastBackup(env).LastSuccessful
}

// TestBackupRestore: a cluster backed up every minute rolls a configuration change while a
// backup falls due, which runs between two of the roll's steps; then, with the writes
// stopped and one more backup taken on request, the whole cluster is deleted (pods, volumes,
// every child) and a new cluster of the same name restores the latest snapshot and holds
// every write the old one acknowledged.
func TestBackupRestore(t *testing.T) {
	t.Parallel()
	dest := realS3(t)
	keep := int32(3)
	s := spec(3)
	s.Backup = &v1alpha1.BackupSpec{Schedule: "* * * * *", Destination: dest, Retention: &v1alpha1.BackupRetention{Keep: &keep}}
	env := newEnv(t, false)
	addCredentials(t, env)

	t.Run("create", func(t *testing.T) {
		env.Create(s)
		if _, err := env.WaitFor(createBound, func() (bool, string) { return env.Monitor.View().Leader != "", "no leader yet" }); err != nil {
			t.Fatal(err)
		}
		measure(t, env, scenario{act: func(*testing.T, *harness.Env) int { return 3 }})
	})

	t.Run("scheduled-backups-during-rolling-change", func(t *testing.T) {
		waitSteady(t, env, 3)
		var during gosync.Int32
		env.AfterJob(func(job string) {
			if strings.Contains(job, "-backup-") {
				if rolled, _ := env.RolledOut(3); !rolled {
					during.Add(1)
				}
			}
		})
		defer env.AfterJob(nil)
		measure(t, env, scenario{act: func(t *testing.T, env *harness.Env) int {
			env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { setSnapshotCount(s, 20000) })
			if _, err := env.WaitFor(changeBound, func() (bool, string) {
				rolled, _ := env.RolledOut(3)
				return !rolled, "the roll has not begun"
			}); err != nil {
				t.Fatal(err)
			}
			// The roll is under way: the schedule's next minute falls due now.
			env.AdvanceHookClock(time.Minute)
			return 3
		}})
		if during.Load() == 0 {
			t.Fatalf("no backup ran while the roll was under way\n%s", env.Describe())
		}
		b := lastBackup(env)
		// In the lineage of the cluster's etcd ID.
		lineage := "s3://etcd-backups/e2e/etcd/lineages/" + env.Store.Parent().Status.ClusterID + "/etcd-"
		if b == nil || b.LastSuccessful == nil || b.LastSuccessful.Revision < 2 || !strings.HasPrefix(b.LastSuccessful.Object, lineage) {
			t.Fatalf("status.backup %+v", b)
		}
		t.Logf("last backup %s at revision %d from %s", b.LastSuccessful.Object, b.LastSuccessful.Revision, b.LastSuccessful.Member)
	})

	t.Run("restore-after-deleting-the-cluster", func(t *testing.T) {
		waitSteady(t, env, 3)
		w, err := env.StartWorkload("/restore")
		if err != nil {
			t.Fatal(err)
		}
		w.AwaitAcked(200, changeBound)
		stats := w.Stop()

		// One backup on request, after the last acknowledged write.
		taken := requestBackup(t, env, "before-delete")
		oldID := env.Store.Parent().Status.ClusterID

		// The whole cluster goes: every pod, volume and child, and the hook that knew it.
		env.Close()

		restored := newEnv(t, false)
		addCredentials(t, restored)
		r := spec(3)
		r.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: &v1alpha1.FromBackup{BackupDestination: dest, Name: v1alpha1.LatestBackup}}
		restored.Create(r)
		if _, err := restored.WaitSteady(3, createBound); err != nil {
			t.Fatalf("the restored cluster is not steady: %v\n%s", err, restored.Describe())
		}
		lost, err := w.VerifyOn(restored, verifyBound)
		if err != nil {
			t.Fatal(err)
		}
		if len(lost) > 0 || stats.Acked == 0 {
			t.Fatalf("%d of %d acknowledged writes missing after the restore of %s, first %s", len(lost), stats.Acked, taken.Object, lost[0])
		}
		st := restored.Store.Parent().Status
		if st.ClusterID == "" || st.ClusterID == oldID || st.RestoredFrom != v1alpha1.LatestBackup {
			t.Fatalf("restored cluster ID %q (old %q), restoredFrom %q", st.ClusterID, oldID, st.RestoredFrom)
		}
		for _, v := range restored.Monitor.Violations() {
			t.Errorf("invariant: %s", v)
		}
		t.Logf("%d acknowledged writes restored from %s (revision %d) into cluster %s", stats.Acked, taken.Object, taken.Revision, st.ClusterID)
	})
}
