package controlplane

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/test/s3server"
)

// quotaManifest is an EtcdCluster in a namespace with a ResourceQuota: etcd's container has
// resources (the install container takes them), the operator's own pods run on their
// defaults; backups go to S3 with the Secret backup-s3, and restore, when from is set, reads
// the newest snapshot there with the Secret restore-s3.
func quotaManifest(size int, s3 string, restore bool) string {
	m := fmt.Sprintf(`apiVersion: etcdops.dev/v1alpha1
kind: EtcdCluster
metadata:
  name: etcd
spec:
  size: %d
  version: %s
  storageSpec:
    volumeSizeRequest: 1Gi
    storageClassName: %s
    whenDeleted: Delete
  podTemplate:
    spec:
      resources:
        requests: {cpu: 100m, memory: 128Mi}
        limits: {cpu: 500m, memory: 512Mi}
  backup:
    schedule: "@daily"
    destination:
      s3: {endpoint: %q, bucket: backups, region: %s, credentialsSecret: backup-s3}
`, size, v1alpha1.DefaultVersion, OnlineClass, s3, s3server.Region)
	if restore {
		m += fmt.Sprintf(`  bootstrap:
    fromBackup:
      name: latest
      s3: {endpoint: %q, bucket: backups, region: %s, credentialsSecret: restore-s3}
`, s3, s3server.Region)
	}
	return m
}

// TestResourceQuota runs a cluster in a namespace whose ResourceQuota asks every container for
// cpu and memory requests and limits, with no LimitRange to fill them in: the API server's
// quota admission refuses any pod that lacks one. The cluster is created, scaled out, backed
// up (a backup Job) and restored into a new EtcdCluster of the same name, and every pod the
// controllers create from the operator's templates is admitted: no FailedCreate. Then the
// restore's credentials Secret is deleted and pods of the restored cluster are deleted: each
// comes back and starts, as the pods no longer mount the restore source.
func TestResourceQuota(t *testing.T) {
	s3 := s3server.Start(t, "backups")
	p := Start(t)
	p.StartStorage()
	p.StartMetacontroller()
	p.InstallKustomize(p.StartHook())
	c := p.NewCluster("quota", "etcd")
	start := time.Now()
	for _, name := range []string{"backup-s3", "restore-s3"} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name},
			StringData: map[string]string{"AWS_ACCESS_KEY_ID": s3server.AccessKey, "AWS_SECRET_ACCESS_KEY": s3server.SecretKey}}
		if _, err := p.Client.CoreV1().Secrets(c.Namespace).Create(p.ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createQuota(t, c)
	steps(t,
		step{"create-3", func(t *testing.T) {
			c.Apply(quotaManifest(3, s3.Endpoint, false))
			waitSteady(t, c, 3, createBound)
		}},
		step{"scale-5", func(t *testing.T) {
			c.Apply(quotaManifest(5, s3.Endpoint, false))
			waitSteady(t, c, 5, 3*time.Minute)
		}},
		step{"backup", func(t *testing.T) {
			put(t, c, "/quota/before-backup", "kept")
			before := ""
			if ec, err := c.Get(); err == nil && ec.Status.Backup != nil && ec.Status.Backup.LastSuccessful != nil {
				before = ec.Status.Backup.LastSuccessful.Object
			}
			if err := c.Annotate(v1alpha1.AnnotationBackupNow, "quota"); err != nil {
				t.Fatal(err)
			}
			took, err := c.WaitFor(2*time.Minute, func(ec *v1alpha1.EtcdCluster) (bool, string) {
				b := ec.Status.Backup
				switch {
				case b == nil || b.LastRequest != "quota":
					return false, "the backup is not started yet"
				case b.LastFailure != nil:
					return false, "the backup failed: " + b.LastFailure.Reason
				case b.LastSuccessful == nil || b.LastSuccessful.Object == before:
					return false, "the backup is not done yet"
				}
				return c.Steady(5)(ec)
			})
			if err != nil {
				t.Fatalf("the backup was not taken: %v", err)
			}
			ec, _ := c.Get()
			t.Logf("backup %s at revision %d in %s", ec.Status.Backup.LastSuccessful.Object, ec.Status.Backup.LastSuccessful.Revision, took.Round(time.Second))
			ran := false
			for _, j := range c.Jobs() {
				ran = ran || strings.HasPrefix(j.Job, c.Name+"-backup-") && j.Err == nil
			}
			if !ran {
				t.Errorf("no backup Job's pod ran on the node: %+v", c.Jobs())
			}
		}},
		step{"restore", func(t *testing.T) {
			teardown(t, c, v1alpha1.PVCDelete)
			c.Apply(quotaManifest(3, s3.Endpoint, true))
			waitSteady(t, c, 3, createBound)
			ec, err := c.Get()
			if err != nil {
				t.Fatal(err)
			}
			if ec.Status.RestoredFrom != v1alpha1.LatestBackup || ec.Status.RestoredRevision == 0 {
				t.Errorf("restored from %q at revision %d, want latest and the snapshot's revision", ec.Status.RestoredFrom, ec.Status.RestoredRevision)
			}
			if got := get(t, c, "/quota/before-backup"); got != "kept" {
				t.Errorf("the key written before the backup reads %q after the restore, want kept", got)
			}
		}},
		step{"restore-source-deleted", func(t *testing.T) {
			sts, err := c.StatefulSet()
			if err != nil {
				t.Fatal(err)
			}
			if mounts := restoreMounts(sts.Spec.Template.Spec); mounts != "" {
				t.Errorf("the restored cluster's template still mounts its restore source: %s", mounts)
			}
			if err := p.Client.CoreV1().Secrets(c.Namespace).Delete(p.ctx, "restore-s3", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			for _, ord := range []int{0, 2} {
				deletedPod(t, c, c.Pod(ord))
			}
		}},
	)
	for _, w := range c.warningsSince(start) {
		if strings.Contains(w, "FailedCreate") || strings.Contains(w, "quota") || strings.Contains(w, "FailedMount") {
			t.Errorf("a pod was refused or could not start: %s", w)
		}
	}
}

// createQuota creates the namespace's ResourceQuota and waits until the controller has
// counted its usage: until then the API server admits no pod at all.
func createQuota(t *testing.T, c *Cluster) {
	t.Helper()
	q := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "compute"}, Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{
		corev1.ResourceRequestsCPU: resource.MustParse("4"), corev1.ResourceRequestsMemory: resource.MustParse("4Gi"),
		corev1.ResourceLimitsCPU: resource.MustParse("8"), corev1.ResourceLimitsMemory: resource.MustParse("8Gi"),
	}}}
	if _, err := c.Plane.Client.CoreV1().ResourceQuotas(c.Namespace).Create(c.Plane.ctx, q, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for ; time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		got, err := c.Plane.Client.CoreV1().ResourceQuotas(c.Namespace).Get(c.Plane.ctx, q.Name, metav1.GetOptions{})
		if err == nil && len(got.Status.Hard) == len(q.Spec.Hard) {
			return
		}
	}
	t.Fatal("the ResourceQuota's status was not computed within a minute")
}

// restoreMounts names what of a restore source a pod template mounts: the launcher's restore
// flags, and Secret or claim volumes other than the cluster's own.
func restoreMounts(spec corev1.PodSpec) string {
	var out []string
	for _, ct := range spec.Containers {
		for _, a := range ct.Command {
			if strings.HasPrefix(a, "--restore-") {
				out = append(out, a)
			}
		}
	}
	for _, v := range spec.Volumes {
		if s := v.Secret; s != nil && slices.Contains([]string{"restore-s3", "backup-s3"}, s.SecretName) {
			out = append(out, "Secret "+s.SecretName)
		}
	}
	return strings.Join(out, ", ")
}

// withEtcd calls f with a client of c's members and a context bounded to 10 s; an error
// fails the test.
func withEtcd(t *testing.T, c *Cluster, f func(ctx context.Context, cli *clientv3.Client) error) {
	t.Helper()
	cli, err := clientv3.New(c.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(c.Plane.ctx, 10*time.Second)
	defer cancel()
	if err := f(ctx, cli); err != nil {
		t.Fatal(err)
	}
}

func put(t *testing.T, c *Cluster, key, value string) {
	t.Helper()
	withEtcd(t, c, func(ctx context.Context, cli *clientv3.Client) error {
		_, err := cli.Put(ctx, key, value)
		return err
	})
}

func get(t *testing.T, c *Cluster, key string) string {
	t.Helper()
	var value string
	withEtcd(t, c, func(ctx context.Context, cli *clientv3.Client) error {
		resp, err := cli.Get(ctx, key)
		if err == nil && len(resp.Kvs) > 0 {
			value = string(resp.Kvs[0].Value)
		}
		return err
	})
	return value
}
