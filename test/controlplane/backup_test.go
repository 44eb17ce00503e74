package controlplane

import (
	"fmt"
	"path"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/backup"
	"etcdops.dev/etcdops/test/harness"
	"etcdops.dev/etcdops/test/s3server"
)

// Backups in the tier go to the real S3 server of the tests (versitygw over a directory on
// 127.0.0.1, test/s3server), as in the end-to-end tier.
const (
	backupBucket      = "etcd-backups"
	backupPrefix      = "controlplane/"
	credentialsSecret = "s3-credentials"
)

// s3Destination is the destination's YAML at indent.
func s3Destination(srv *s3server.Server, indent string) string {
	return fmt.Sprintf("%ss3:\n%s  endpoint: %s\n%s  bucket: %s\n%s  prefix: %s\n%s  region: %s\n%s  credentialsSecret: %s\n",
		indent, indent, srv.Endpoint, indent, backupBucket, indent, backupPrefix, indent, s3server.Region, indent, credentialsSecret)
}

// withTLS adds spec.tls naming the PKI's Secrets to a manifest of manifest()'s form.
func withTLS(manifest string, pki *harness.PKI) string {
	return manifest + fmt.Sprintf("  tls:\n    serverSecret: %s\n    peerSecret: %s\n    clientSecret: %s\n", pki.Server, pki.Peer, pki.Client)
}

// withBackup adds a backup to S3 to a manifest: snapshots on request (the schedule falls once
// a year) and every change streamed within a second (spec.backup.continuous).
func withBackup(manifest string, srv *s3server.Server) string {
	return manifest + "  backup:\n    schedule: \"0 0 1 1 *\"\n    destination:\n" + s3Destination(srv, "      ") +
		"    continuous:\n      interval: 1s\n"
}

// restoredFrom is a manifest of a cluster named name bootstrapped from the destination: from
// the snapshot name of lineage (a cluster ID), replayed to revision when it is not 0.
func restoredFrom(manifest, name string, srv *s3server.Server, lineage, snapshot string, revision int64) string {
	m := strings.Replace(manifest, "  name: etcd\n", "  name: "+name+"\n", 1)
	m += fmt.Sprintf("  bootstrap:\n    fromBackup:\n      lineage: %s\n      name: %s\n", lineage, snapshot)
	if revision != 0 {
		m += fmt.Sprintf("      revision: %d\n", revision)
	}
	return m + s3Destination(srv, "      ")
}

// createS3Credentials creates the Secret the backup Jobs, the stream and a restoring seed mount.
func (c *Cluster) createS3Credentials() {
	c.Plane.t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: credentialsSecret, Namespace: c.Namespace},
		Data: map[string][]byte{backup.KeyAccessKeyID: []byte(s3server.AccessKey), backup.KeySecretAccessKey: []byte(s3server.SecretKey)}}
	if _, err := c.Plane.Client.CoreV1().Secrets(c.Namespace).Create(c.Plane.ctx, s, metav1.CreateOptions{}); err != nil {
		c.Plane.t.Fatal(err)
	}
}

// backedUp is what the backup step leaves for the restores: the workload whose writes they
// must hold, the snapshot taken on request after it stopped, a revision in the middle of its
// writes, and the lineage (the cluster's etcd ID).
type backedUp struct {
	w        *harness.Workload
	snapshot *v1alpha1.BackupRecord
	mid      int64
	lineage  string
}

// backupOnRequest runs the workload on a cluster whose changes stream to S3, notes a revision
// in the middle of its writes, stops it, and asks for a snapshot (the backup-now annotation):
// a backup Job takes it from a member and stores it in the cluster's lineage. It waits for the
// snapshot in status.backup.lastSuccessful and for the stream to have stored every change up to
// the workload's final revision.
func backupOnRequest(t *testing.T, c *Cluster) backedUp {
	w := startWorkloadAfter(t, c, nil)
	checkWorkload(t, w)
	h := w.History()
	final := h.Final
	mid := (h.Initial.Revision + final) / 2
	ec, err := c.Get()
	if err != nil {
		t.Fatal(err)
	}
	// A backup of earlier (a risky step's) may be on record: this one is another.
	before := ""
	if b := ec.Status.Backup; b != nil && b.LastSuccessful != nil {
		before = b.LastSuccessful.Object
	}
	if err := c.Annotate(v1alpha1.AnnotationBackupNow, "before-restores"); err != nil {
		t.Fatal(err)
	}
	took, err := c.WaitFor(2*time.Minute, func(ec *v1alpha1.EtcdCluster) (bool, string) {
		b := ec.Status.Backup
		switch {
		case b == nil || b.LastRequest != "before-restores" || b.LastSuccessful == nil || b.LastSuccessful.Object == before:
			return false, fmt.Sprintf("the requested backup has not been stored: %+v", b)
		case b.Continuous == nil || b.Continuous.StoredRevision < final:
			return false, fmt.Sprintf("the stream has not stored revision %d: %+v", final, b.Continuous)
		}
		return true, ""
	})
	if err != nil {
		t.Fatalf("no backup: %v", err)
	}
	ec, err = c.Get()
	if err != nil {
		t.Fatal(err)
	}
	snap := ec.Status.Backup.LastSuccessful
	lineage := "s3://" + backupBucket + "/" + backupPrefix + "lineages/" + ec.Status.ClusterID + "/" + c.Name + "-"
	if !strings.HasPrefix(snap.Object, lineage) || snap.Revision < final {
		t.Fatalf("status.backup.lastSuccessful %+v: want a snapshot in %s at revision %d or later", snap, lineage, final)
	}
	t.Logf("snapshot %s (revision %d, from %s) stored in %s; the stream stored up to revision %d; writes at revisions %d to %d",
		snap.Object, snap.Revision, snap.Member, took.Round(time.Second), ec.Status.Backup.Continuous.StoredRevision, h.Initial.Revision+1, final)
	return backedUp{w: w, snapshot: snap, mid: mid, lineage: ec.Status.ClusterID}
}

// restores creates, beside the backed-up cluster, two new clusters at once: restored, of 3
// members, from the snapshot taken on request, and rewound, of one member, replayed to the
// revision in the middle of the workload's writes from the lineage's stored changes, by its
// seed's own etcd (the real binary of the default release). Each must hold exactly the
// workload's keys at its revision, key by key with each key's modification revision, every
// append acknowledged at or before it and none after, and report what it restored.
func restores(t *testing.T, c *Cluster, b backedUp, srv *s3server.Server) (restored, rewound *Cluster) {
	restored, rewound = c.Beside("restored"), c.Beside("rewound")
	restored.Apply(restoredFrom(manifest(3, OnlineClass, "1Gi", v1alpha1.PVCDelete), restored.Name, srv, b.lineage, path.Base(b.snapshot.Object), 0))
	rewound.Apply(restoredFrom(manifest(1, OnlineClass, "1Gi", v1alpha1.PVCDelete), rewound.Name, srv, b.lineage, v1alpha1.LatestBackup, b.mid))
	final := b.w.History().Final
	for _, r := range []struct {
		c    *Cluster
		size int
		rev  int64
		from string
	}{{restored, 3, final, path.Base(b.snapshot.Object)}, {rewound, 1, b.mid, v1alpha1.LatestBackup}} {
		waitSteady(t, r.c, r.size, createBound)
		diff, err := b.w.CheckRestoredAt(r.c, r.rev, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if len(diff) > 0 {
			t.Errorf("%s, restored to revision %d: %d differences, first %v", r.c.Name, r.rev, len(diff), diff[:min(5, len(diff))])
		}
		ec, err := r.c.Get()
		if err != nil {
			t.Fatal(err)
		}
		st := ec.Status
		want := r.rev
		if r.c == restored {
			want = b.snapshot.Revision
		}
		if st.RestoredFrom != r.from || st.RestoredRevision != want || st.RestoredLineage != b.lineage || st.ClusterID == "" || st.ClusterID == b.lineage {
			t.Errorf("%s: restoredFrom %q, restoredRevision %d, restoredLineage %q, clusterID %q; want %q, %d, %q and a new cluster ID",
				r.c.Name, st.RestoredFrom, st.RestoredRevision, st.RestoredLineage, st.ClusterID, r.from, want, b.lineage)
		}
		t.Logf("%s: %d members restored to revision %d of lineage %s as cluster %s", r.c.Name, r.size, st.RestoredRevision, b.lineage, st.ClusterID)
	}
	return restored, rewound
}
