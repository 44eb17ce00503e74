package controlplane

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
	gosync "sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/backup"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/etcdbin"
	"etcdops.dev/etcdops/test/harness"
	"etcdops.dev/etcdops/test/s3server"
)

// withVerify adds restore drills to a manifest of withBackup's form: on request only (the
// schedule falls once a year, and at most one an hour is allowed).
func withVerify(manifest string) string {
	return manifest + "    verify:\n      schedule: \"30 0 1 1 *\"\n"
}

// lineageStore is the lineage of the cluster (its etcd cluster ID) in the tier's bucket, read
// as the member tool reads it.
func lineageStore(t *testing.T, srv *s3server.Server, id string) backup.Store {
	t.Helper()
	s, err := backup.NewS3(backup.S3Config{Endpoint: srv.Endpoint, Bucket: backupBucket, Prefix: backupPrefix, Region: s3server.Region,
		AccessKeyID: s3server.AccessKey, SecretAccessKey: s3server.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	return backup.LineageStore(s, id)
}

// drillOnRequest asks for a restore drill (the drill-now annotation) of a cluster whose
// newest backup is snap, and waits for status.backup.lastDrill: Passed, of the cluster's
// lineage and that snapshot, with the key count the live cluster has at the revision compared,
// a SHA-256 digest and the restore's duration, and BackupVerified True. The drill's Job must be
// the one the docs describe (the etcd pods' image, the member tool copied in by an init
// container, `etcdops-member drill --etcd=/usr/local/bin/etcd`), and the node must have run
// that binary as the real etcd of the image's release.
func drillOnRequest(t *testing.T, c *Cluster, snap *v1alpha1.BackupRecord) {
	ec, err := c.Get()
	if err != nil {
		t.Fatal(err)
	}
	before := ""
	if b := ec.Status.Backup; b != nil && b.LastDrill != nil {
		before = b.LastDrill.Job
	}
	const request = "in-the-tier"
	if err := c.Annotate(v1alpha1.AnnotationDrillNow, request); err != nil {
		t.Fatal(err)
	}
	var job *batchv1.Job // the drill's Job as the API server held it while it ran
	took, err := c.WaitFor(2*time.Minute, func(ec *v1alpha1.EtcdCluster) (bool, string) {
		if job == nil {
			job = c.drillJob()
		}
		b := ec.Status.Backup
		if b == nil || b.LastDrillRequest != request || b.LastDrill == nil || b.LastDrill.Job == before {
			return false, fmt.Sprintf("the drill asked for has not finished: %+v", b)
		}
		return true, ""
	})
	if err != nil {
		t.Fatalf("no drill: %v", err)
	}
	ec, err = c.Get()
	if err != nil {
		t.Fatal(err)
	}
	rec := ec.Status.Backup.LastDrill
	t.Logf("%s in %s: %s %s", rec.Job, took.Round(time.Second), rec.Result, rec.Message)
	if ok, why := Condition(v1alpha1.ConditionBackupVerified, metav1.ConditionTrue)(ec); !ok {
		t.Errorf("after a passed drill: %s", why)
	}
	switch {
	case rec.Result != v1alpha1.DrillPassed:
		t.Fatalf("the drill did not pass: %+v", rec)
	case rec.Lineage != ec.Status.ClusterID || path.Base(rec.Snapshot) != path.Base(snap.Object):
		t.Errorf("the drill restored %s of lineage %s; want the newest snapshot %s of lineage %s", rec.Snapshot, rec.Lineage, snap.Object, ec.Status.ClusterID)
	case rec.RestoredRevision < snap.Revision || rec.Revision != rec.RestoredRevision:
		t.Errorf("the drill restored revision %d and compared at %d; want at least the snapshot's %d, compared where restored (nothing is compacted here)",
			rec.RestoredRevision, rec.Revision, snap.Revision)
	case len(rec.Digest) != 64 || strings.Trim(rec.Digest, "0123456789abcdef") != "":
		t.Errorf("digest %q: want SHA-256 in hex", rec.Digest)
	case rec.RestoreDuration == nil || rec.RestoreDuration.Duration <= 0 || rec.RestoreDuration.Duration > took:
		t.Errorf("restoreDuration %v: want a time within the drill's %s", rec.RestoreDuration, took.Round(time.Second))
	}
	if keys := c.keysAt(t, rec.Revision); rec.Keys != keys {
		t.Errorf("the drill compared %d keys; the cluster has %d at revision %d", rec.Keys, keys, rec.Revision)
	}

	if job == nil {
		t.Fatalf("the drill's Job %s was never seen", rec.Job)
	}
	sts, err := c.StatefulSet()
	if err != nil {
		t.Fatal(err)
	}
	pod := job.Spec.Template.Spec
	etcdImage := sts.Spec.Template.Spec.Containers[0].Image
	if job.Name != rec.Job || len(pod.Containers) != 1 || pod.Containers[0].Image != etcdImage || len(pod.InitContainers) == 0 ||
		!slices.Contains(pod.Containers[0].Command, "drill") || !slices.Contains(pod.Containers[0].Command, "--etcd=/usr/local/bin/etcd") {
		t.Errorf("drill Job %s: containers %+v, init containers %+v; want the etcd pods' image %s running `etcdops-member drill --etcd=/usr/local/bin/etcd`, the tool installed by an init container",
			job.Name, pod.Containers, pod.InitContainers, etcdImage)
	}
	bin, err := etcdbin.Path(harness.ImageVersion(etcdImage))
	if err != nil {
		t.Fatal(err)
	}
	ran := slices.ContainsFunc(c.Jobs(), func(r JobRun) bool {
		return r.Job == rec.Job && r.Err == nil && slices.Contains(r.Args, "drill") && slices.Contains(r.Args, "--etcd="+bin)
	})
	if !ran {
		t.Errorf("the node ran no drill of Job %s with --etcd=%s (the release of %s); its Job runs: %+v", rec.Job, bin, etcdImage, c.Jobs())
	}
}

// drillJob is the cluster's restore drill Job, if one is there.
func (c *Cluster) drillJob() *batchv1.Job {
	ctx, cancel := context.WithTimeout(c.Plane.ctx, 5*time.Second)
	defer cancel()
	jobs, err := c.Plane.Client.BatchV1().Jobs(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sync.LabelCluster + "=" + c.Name + "," + sync.LabelAction + "=drill"})
	if err != nil || len(jobs.Items) == 0 {
		return nil
	}
	return &jobs.Items[0]
}

// keysAt counts the cluster's keys at revision rev, read from its members.
func (c *Cluster) keysAt(t *testing.T, rev int64) int64 {
	t.Helper()
	var n int64
	withEtcd(t, c, func(ctx context.Context, cli *clientv3.Client) error {
		resp, err := cli.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(rev), clientv3.WithCountOnly())
		if err == nil {
			n = resp.Count
		}
		return err
	})
	return n
}

// guardedRoll rolls a configuration change of every member (changed) of a cluster backed up to
// srv that has no snapshot younger than beforeRiskySteps' 5 minutes, and checks that the roll
// waited for a snapshot of its own: status.backup.guard names the step and the snapshot, which
// is in the bucket, and was there while every member pod was still the old one; the history
// has the snapshot's Backup step, then the roll's steps naming it, every pod's replacement
// among them.
func guardedRoll(t *testing.T, c *Cluster, changed string, srv *s3server.Server) {
	ec, err := c.Get()
	if err != nil {
		t.Fatal(err)
	}
	if b := ec.Status.Backup; b != nil && b.LastSuccessful != nil {
		t.Fatalf("a snapshot is on record (%s): the roll would not need one of its own", b.LastSuccessful.Object)
	}
	ls := lineageStore(t, srv, ec.Status.ClusterID)
	before := c.PodUIDs()
	// Watched until the first pod of the roll goes: the snapshots the bucket lists while every
	// member pod is still the old one.
	var mu gosync.Mutex
	storedBefore := map[string]time.Time{}
	changedAt := time.Time{}
	ctx, cancel := context.WithCancel(c.Plane.ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ; ctx.Err() == nil; time.Sleep(100 * time.Millisecond) {
			lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
			objs, err := ls.List(lctx)
			lcancel()
			if err != nil {
				continue
			}
			// Listed first, then the pods: a snapshot listed here was stored before the pods
			// were read.
			gone, err := c.anyPodGone(before)
			if err != nil {
				continue
			}
			mu.Lock()
			if gone {
				changedAt = time.Now()
				mu.Unlock()
				return
			}
			for _, o := range objs {
				if _, ok := storedBefore[o.Name]; !ok {
					storedBefore[o.Name] = time.Now()
				}
			}
			mu.Unlock()
		}
	}()
	configRoll(t, c, changed)
	cancel()
	<-watched

	// Metacontroller may write one more status from a parent a write behind after the one that
	// said the roll was over: what status says is read once it has settled.
	var g *v1alpha1.StepGuard
	var first *v1alpha1.StepRecord
	last := ""
	if _, err := c.WaitFor(30*time.Second, func(ec *v1alpha1.EtcdCluster) (ok bool, why string) {
		defer func() { last = why }()
		g, first = ec.Status.Backup.Guard, nil
		switch {
		case g == nil || !strings.HasPrefix(g.Step, "roll-") || g.Snapshot == "" || g.Requested == nil || g.Skipped || g.Revision == 0:
			return false, fmt.Sprintf("status.backup.guard %+v: want the roll's step, guarded by a snapshot taken for it", g)
		case g.Done == nil:
			return false, fmt.Sprintf("status.backup.guard %+v: the roll is over, its guard is not done", g)
		}
		hist := ec.Status.History
		took := slices.IndexFunc(hist, func(r v1alpha1.StepRecord) bool {
			return r.Type == sync.TakeBackup.String() && strings.Contains(r.Reason, "backup before "+g.Step) && r.Result == v1alpha1.StepSucceeded
		})
		// After the snapshot, every pod's replacement, each guarded by it: the hook plans a
		// sync handed a stale parent from its newest answer, so none is written over.
		replaced := map[string]bool{}
		for i := max(took, 0); took >= 0 && i < len(hist); i++ {
			r := &hist[i]
			if !strings.Contains(r.Reason, "guarded by snapshot "+g.Snapshot) {
				continue
			}
			if first == nil {
				first = r
			}
			if r.Type == sync.ReplacePod.String() && r.Result == v1alpha1.StepSucceeded {
				replaced[r.Member] = true
			}
		}
		if first != nil && len(replaced) == 3 {
			return true, ""
		}
		var b strings.Builder
		for _, r := range hist {
			fmt.Fprintf(&b, "  %s %s %s: %s\n", r.Type, r.Member, r.Result, r.Reason)
		}
		return false, fmt.Sprintf("status.history does not show the snapshot before %s, then the replacement of every pod, succeeded, guarded by %s:\n%s", g.Step, g.Snapshot, b.String())
	}); err != nil {
		// The state of the cluster first, the failure last, where a reader of the log's end
		// finds it.
		t.Log(err)
		t.Fatalf("30s after the roll: %s", last)
	}
	name := path.Base(g.Snapshot)
	objs, err := ls.List(c.Plane.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(objs, func(o backup.Object) bool { return o.Name == name && o.Revision == g.Revision }) {
		t.Errorf("the guarding snapshot %s (revision %d) is not in the bucket: %+v", g.Snapshot, g.Revision, objs)
	}
	mu.Lock()
	listed, stored := storedBefore[name]
	at := changedAt
	mu.Unlock()
	if at.IsZero() || !stored {
		t.Errorf("the bucket listed %s before the roll's first pod went: %v (the first pod seen going at %s)", name, stored, at.Format(time.TimeOnly))
	} else {
		t.Logf("the bucket listed %s %s before the roll's first pod was seen going", name, at.Sub(listed).Round(time.Millisecond))
	}
	t.Logf("%s guarded by %s (revision %d), stored before the first pod went: %s", g.Step, g.Snapshot, g.Revision, first.Reason)
}

// anyPodGone: a member pod of before (name → UID) is being deleted or was replaced.
func (c *Cluster) anyPodGone(before map[string]string) (bool, error) {
	ctx, cancel := context.WithTimeout(c.Plane.ctx, 5*time.Second)
	defer cancel()
	pods, err := c.Plane.Client.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: ownPodSelector(c).String()})
	if err != nil {
		return false, err
	}
	now := map[string]*corev1.Pod{}
	for i := range pods.Items {
		now[pods.Items[i].Name] = &pods.Items[i]
	}
	for name, uid := range before {
		p, ok := now[name]
		if !ok || string(p.UID) != uid || p.DeletionTimestamp != nil {
			return true, nil
		}
	}
	return false, nil
}
