package controlplane

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/harness"
	"etcdops.dev/etcdops/test/s3server"
)

// manifest is an EtcdCluster as a user writes it: size members, each with a claim of size
// from class, kept or deleted with the cluster as whenDeleted says.
func manifest(size int, class, volume string, whenDeleted v1alpha1.PVCRetention) string {
	return fmt.Sprintf(`apiVersion: etcdops.dev/v1alpha1
kind: EtcdCluster
metadata:
  name: etcd
spec:
  size: %d
  version: %s
  storageSpec:
    accessModes: ReadWriteOnce
    volumeSizeRequest: %s
    storageClassName: %s
    whenDeleted: %s
`, size, v1alpha1.DefaultVersion, volume, class, whenDeleted)
}

// createBound bounds a 3-member cluster's creation: three pods started one after another,
// two member Jobs each, on real controllers' clocks.
const createBound = 4 * time.Minute

// TestKustomizeInstall installs the operator with `kubectl apply -k`, creates a 3-member
// cluster, checks that idle syncs write nothing, grows its volumes online, scales it to 5
// and back (checking the hook's Events of it and its account), hands leadership to a follower
// on request and refuses a request naming no member, upgrades the operator to a new member
// tool image (no pod rolls), rolls a configuration change under a node drain (the pods take
// the new tool; evictions refused while the change runs, let through after),
// deletes a member's pod, then its StatefulSet, and rolls a minor version upgrade, the workload
// writing throughout; turns etcd's authentication on with an application user and off again;
// then it deletes the cluster, keeping its claims.
func TestKustomizeInstall(t *testing.T) {
	t.Parallel()
	p := Start(t)
	p.StartStorage()
	p.StartMetacontroller()
	p.InstallKustomize(p.StartHook())
	c := p.NewCluster("kustomize", "etcd")
	grown := manifest(3, OnlineClass, "2Gi", v1alpha1.PVCRetain)
	var scaled time.Time
	steps(t,
		step{"create-3", func(t *testing.T) {
			w := startWorkloadAfter(t, c, func() {
				c.Apply(manifest(3, OnlineClass, "1Gi", v1alpha1.PVCRetain))
				waitSteady(t, c, 3, createBound)
			})
			checkWorkload(t, w)
		}},
		step{"idle-syncs", func(t *testing.T) {
			idleSyncsWriteNothing(t, c)
			wireFormatMatchesFixtures(t, p)
		}},
		step{"online-growth", func(t *testing.T) { growVolumes(t, c, grown, false) }},
		step{"scale-3-5-3", func(t *testing.T) {
			scaled = time.Now()
			scale(t, c, manifest(5, OnlineClass, "2Gi", v1alpha1.PVCRetain), grown, true)
		}},
		step{"hook-events", func(t *testing.T) {
			hookEventsOfSteps(t, c, scaled)
			hookAccountMayOnlyWriteEvents(t, c)
		}},
		step{"switchover", func(t *testing.T) { switchover(t, c) }},
		step{"operator-upgrade", func(t *testing.T) { operatorUpgrade(t, c) }},
		step{"config-roll", func(t *testing.T) {
			drainDuring(t, c, 3, func() { configRoll(t, c, grown+"  etcdOptions:\n  - --snapshot-count=5000\n") })
			podsRunTool(t, c, NextToolImage)
		}},
		step{"deleted-pod", func(t *testing.T) { deletedPod(t, c, c.Pod(1)) }},
		step{"statefulset-deleted", func(t *testing.T) { statefulSetDeleted(t, c) }},
		step{"version-roll", func(t *testing.T) {
			v37 := pinned(t, "v3.7")
			versionRoll(t, c, withVersion(grown, v37)+"  etcdOptions:\n  - --snapshot-count=5000\n", v37)
		}},
		step{"auth-on-off", func(t *testing.T) {
			authOnAndOff(t, c, withVersion(grown, pinned(t, "v3.7"))+"  etcdOptions:\n  - --snapshot-count=5000\n", 3)
		}},
		step{"teardown-retain", func(t *testing.T) { teardown(t, c, v1alpha1.PVCRetain) }},
	)
}

// TestHelmInstall installs the operator with `helm install` of the chart and creates a
// 3-member cluster with TLS on both ports whose changes stream to S3, on a class whose driver
// grows file systems only on a remount, and grows its volumes: the operator restarts the
// members' pods itself, one at a time. It rolls a configuration change of every member, which
// waits for a snapshot of its own, takes a snapshot on request and proves it by a restore drill
// on request, restores it into a new cluster beside it and replays another to a revision, proves
// that the volume Jobs' account reaches nothing of those neighbours, and deletes the first
// cluster with its claims.
func TestHelmInstall(t *testing.T) {
	t.Parallel()
	p := Start(t)
	p.StartStorage()
	p.StartMetacontroller()
	p.InstallHelm(p.StartHook())
	srv := s3server.Start(t, backupBucket)
	c := p.NewCluster("helm", "etcd")
	pki, err := harness.NewPKI(c.Namespace, c.Name, "cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	c.UseTLS(pki)
	c.createS3Credentials()
	spec := func(volume string) string {
		return withVerify(withBackup(withTLS(manifest(3, OfflineClass, volume, v1alpha1.PVCDelete), pki), srv))
	}
	var b backedUp
	var restored *Cluster
	steps(t,
		step{"create-3-tls", func(t *testing.T) {
			w := startWorkloadAfter(t, c, func() {
				c.Apply(spec("1Gi"))
				waitSteady(t, c, 3, createBound)
			})
			checkWorkload(t, w)
		}},
		step{"offline-growth", func(t *testing.T) { growVolumes(t, c, spec("2Gi"), true) }},
		step{"guarded-roll", func(t *testing.T) {
			guardedRoll(t, c, spec("2Gi")+"  etcdOptions:\n  - --snapshot-count=5000\n", srv)
		}},
		step{"backup", func(t *testing.T) { b = backupOnRequest(t, c) }},
		step{"drill", func(t *testing.T) { drillOnRequest(t, c, b.snapshot) }},
		step{"restores", func(t *testing.T) { restored, _ = restores(t, c, b, srv) }},
		step{"least-privilege", func(t *testing.T) {
			claimsAccountReachesOnlyItsCluster(t, c, restored, 3)
			claimsTokenReachesNoNeighbour(t, c, restored)
			refusedRestart(t, c, restored)
		}},
		step{"teardown-delete", func(t *testing.T) { teardown(t, c, v1alpha1.PVCDelete) }},
	)
}

// step is one scenario of a test's cluster, a subtest.
type step struct {
	name string
	run  func(*testing.T)
}

// steps runs the scenarios in order, each from the state the one before left, and stops at
// the first that fails: the cluster's state is then unknown. A step fails too when an
// invariant of one of the plane's clusters broke while it ran (invariants.go).
func steps(t *testing.T, all ...step) {
	p := planeOf(t)
	for _, s := range all {
		if !t.Run(s.name, func(t *testing.T) {
			marks := p.invariantMarks()
			s.run(t)
			p.reportInvariants(t, marks)
		}) {
			return
		}
	}
}

// scale takes a steady 3-member cluster to 5 members (manifest five) and back to 3 (three),
// the workload writing throughout: the real StatefulSet controller grows and shrinks the set
// as the operator says, and on the scale-in deletes the removed members' claims (the
// StatefulSet's whenScaled: Delete while the operator shrinks it past members it removed),
// whose volumes the driver then deletes; the kept members' claims stay as they were. With
// grown, the volumes grew past the claim template's size: the new members' claims must be
// created at the spec's size by the operator's Jobs, under RBAC.
func scale(t *testing.T, c *Cluster, five, three string, grown bool) {
	claimUID := func(ord int) string {
		pvc, err := c.Plane.Client.CoreV1().PersistentVolumeClaims(c.Namespace).Get(c.Plane.ctx, "data-"+c.Pod(ord), metav1.GetOptions{})
		if err != nil {
			return ""
		}
		return string(pvc.UID)
	}
	kept := map[int]string{}
	for ord := range 3 {
		kept[ord] = claimUID(ord)
	}
	w := startWorkloadAfter(t, c, nil)
	c.Apply(five)
	waitSteady(t, c, 5, 3*time.Minute)
	if grown {
		// The claim template still asks for the size the cluster was created with: each new
		// member's claim is created at the spec's size by an expand-claim Job, as its account,
		// before the member joins (RBAC's create, which names no claim).
		for ord := 3; ord < 5; ord++ {
			created := "claim " + sync.ClaimName(c.Name, ord) + " created"
			if !slices.ContainsFunc(c.Jobs(), func(r JobRun) bool { return r.Err == nil && strings.Contains(r.Out, created) }) {
				t.Errorf("no expand-claim Job said %q; the node's Job runs: %+v", created, c.Jobs())
			}
		}
	}
	c.Apply(three)
	waitSteady(t, c, 3, 3*time.Minute)
	checkWorkload(t, w)
	deadline := time.Now().Add(time.Minute)
	for ord := 3; ord < 5; ord++ {
		for claimUID(ord) != "" && time.Now().Before(deadline) {
			time.Sleep(250 * time.Millisecond)
		}
		if claimUID(ord) != "" {
			t.Errorf("the claim of the removed member %s survived the scale-in\n%s", c.Pod(ord), c.Describe())
		}
	}
	for ord, uid := range kept {
		if got := claimUID(ord); got != uid {
			t.Errorf("the claim of the kept member %s is %q, was %q", c.Pod(ord), got, uid)
		}
	}
	for time.Now().Before(deadline) && c.volumesOfGoneClaims() != "" {
		time.Sleep(250 * time.Millisecond)
	}
	if v := c.volumesOfGoneClaims(); v != "" {
		t.Errorf("volumes left of claims gone: %s", v)
	}
}

// volumesOfGoneClaims names the namespace's volumes whose claim is gone.
func (c *Cluster) volumesOfGoneClaims() string {
	pvs, err := c.Plane.Client.CoreV1().PersistentVolumes().List(c.Plane.ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, pv := range pvs.Items {
		ref := pv.Spec.ClaimRef
		if ref == nil || ref.Namespace != c.Namespace {
			continue
		}
		pvc, err := c.Plane.Client.CoreV1().PersistentVolumeClaims(c.Namespace).Get(c.Plane.ctx, ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err == nil && pvc.UID != ref.UID {
			out = append(out, pv.Name+" of "+ref.Name)
		}
	}
	return strings.Join(out, ", ")
}

// configRoll applies a changed configuration (changed) under the workload: the operator
// lowers the StatefulSet's partition one pod at a time, highest ordinal first, and the real
// StatefulSet controller replaces each pod, until every pod is of the new revision; the
// members keep their IDs (their volumes stay), and no write is lost.
func configRoll(t *testing.T, c *Cluster, changed string) {
	before := c.PodUIDs()
	ec, err := c.Get()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, m := range ec.Status.Members {
		ids[m.Name] = m.ID
	}
	w := startWorkloadAfter(t, c, nil)
	c.Apply(changed)
	took, err := c.WaitFor(3*time.Minute, func(ec *v1alpha1.EtcdCluster) (bool, string) {
		after := c.PodUIDs()
		for name, uid := range before {
			if after[name] == uid {
				return false, "pod " + name + " not replaced yet"
			}
		}
		sts, err := c.StatefulSet()
		if err != nil {
			return false, err.Error()
		}
		if sts.Status.CurrentRevision != sts.Status.UpdateRevision {
			return false, fmt.Sprintf("StatefulSet at revision %s, rolling to %s", sts.Status.CurrentRevision, sts.Status.UpdateRevision)
		}
		return c.Steady(3)(ec)
	})
	if err != nil {
		w.Stop()
		t.Fatalf("the configuration change did not roll out: %v", err)
	}
	t.Logf("every pod replaced and the cluster steady in %s", took.Round(time.Second))
	checkWorkload(t, w)
	ec, err = c.Get()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ec.Status.Members {
		if ids[m.Name] != m.ID {
			t.Errorf("member %s has ID %s, was %s: a configuration roll keeps every member", m.Name, m.ID, ids[m.Name])
		}
	}
}

// deletedPod deletes a member's pod through the API server, as `kubectl delete pod` does,
// under the workload: the node stops its etcd gracefully, the StatefulSet controller creates
// the pod again on the same claim, and the member comes back as it was (same member ID: its
// data survived), with nothing lost.
func deletedPod(t *testing.T, c *Cluster, pod string) {
	ec, err := c.Get()
	if err != nil {
		t.Fatal(err)
	}
	id := ""
	for _, m := range ec.Status.Members {
		if m.Name == pod {
			id = m.ID
		}
	}
	before := c.PodUIDs()[pod]
	w := startWorkloadAfter(t, c, nil)
	if err := c.DeletePod(pod); err != nil {
		t.Fatal(err)
	}
	took, err := c.WaitFor(2*time.Minute, func(ec *v1alpha1.EtcdCluster) (bool, string) {
		if uid := c.PodUIDs()[pod]; uid == "" || uid == before {
			return false, "pod " + pod + " not created again yet"
		}
		return c.Steady(3)(ec)
	})
	if err != nil {
		w.Stop()
		t.Fatalf("the cluster did not recover from the deleted pod: %v", err)
	}
	t.Logf("pod %s deleted, created again and its member back in %s", pod, took.Round(time.Second))
	checkWorkload(t, w)
	ec, err = c.Get()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ec.Status.Members {
		if m.Name == pod && m.ID != id {
			t.Errorf("member %s has ID %s, was %s: its pod came back on its own volume and must keep its member", pod, m.ID, id)
		}
	}
}

// children are the resources of the CompositeController's children.
var children = []string{"statefulsets", "services", "configmaps", "poddisruptionbudgets", "jobs", "serviceaccounts", "roles", "rolebindings", "deployments"}

// idleSyncsWriteNothing makes Metacontroller sync a steady cluster a few times (an annotation
// on the EtcdCluster each time) and checks that nothing of its children was written: its
// three-way merge finds each child as the API server stores it, defaults included, so it
// sends no update. A child rendered without a field the API server defaults, in a list
// Metacontroller replaces whole, would be written again on every sync.
func idleSyncsWriteNothing(t *testing.T, c *Cluster) {
	before, err := c.Plane.Writes("PUT", children...)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := c.Annotate("etcdops.test/poke", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
	}
	after, err := c.Plane.Writes("PUT", children...)
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		templates := ""
		if sts, err := c.Plane.Dynamic.Resource(appsv1.SchemeGroupVersion.WithResource("statefulsets")).Namespace(c.Namespace).Get(c.Plane.ctx, c.Name, metav1.GetOptions{}); err == nil {
			list, _, _ := unstructured.NestedSlice(sts.Object, "spec", "volumeClaimTemplates")
			b, _ := json.Marshal(list)
			templates = string(b)
		}
		t.Errorf("3 syncs of a steady cluster updated its children %d times (metacontroller.log says which, %s); the StatefulSet's claim templates as stored: %s", after-before, c.Plane.logOf("metacontroller"), templates)
	}
}

// growVolumes applies grown, the cluster's manifest asking for 2Gi, under the workload and
// waits for every claim to have it, the VolumesExpanded condition True and the cluster steady.
// Online, no pod is recreated; offline, every pod is, as the driver needs.
func growVolumes(t *testing.T, c *Cluster, grown string, offline bool) {
	before := c.PodUIDs()
	w := startWorkloadAfter(t, c, nil)
	c.Apply(grown)
	if offline {
		// The planner leaves a claim FileSystemResizePending for three minutes of its clock
		// before it restarts the member's pod, in case the node grows it online after all:
		// once every claim waits, the hook's clock is moved past that.
		if _, err := c.WaitFor(2*time.Minute, func(*v1alpha1.EtcdCluster) (bool, string) { return claimsPending(c) }); err != nil {
			w.Stop()
			t.Fatalf("the claims did not reach FileSystemResizePending: %v", err)
		}
		c.Plane.HookClock.Advance(4 * time.Minute)
		t.Log("every claim is FileSystemResizePending: the hook's clock moved on by 4m")
	}
	took, err := c.WaitFor(3*time.Minute, func(ec *v1alpha1.EtcdCluster) (bool, string) {
		if ok, why := Condition(v1alpha1.ConditionVolumesExpanded, metav1.ConditionTrue)(ec); !ok {
			return false, why
		}
		if ok, why := claimsHave(c, "2Gi"); !ok {
			return false, why
		}
		return c.Steady(3)(ec)
	})
	if err != nil {
		w.Stop()
		t.Fatalf("the volumes did not grow: %v", err)
	}
	t.Logf("volumes grown to 2Gi and the cluster steady in %s", took.Round(time.Second))
	checkWorkload(t, w)
	after := c.PodUIDs()
	for name, uid := range before {
		switch recreated := after[name] != uid; {
		case offline && !recreated:
			t.Errorf("pod %s was not recreated; a driver that grows on a remount needs a new pod", name)
		case !offline && recreated:
			t.Errorf("pod %s was recreated; an online growth restarts nothing", name)
		}
	}
	sts, err := c.StatefulSet()
	if err != nil {
		t.Fatal(err)
	}
	if q := sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests[corev1.ResourceStorage]; q.String() != "1Gi" {
		t.Errorf("the StatefulSet's claim template asks for %s; it cannot change and must keep 1Gi", q.String())
	}
}

// teardown deletes the EtcdCluster with kubectl as docs/create.md says to delete one on
// purpose and waits for it to be gone: the finalize hook, Metacontroller's finalizer and the
// garbage collector, for real. Its pods, StatefulSet and Jobs go; its claims and their volumes
// stay with whenDeleted Retain, and go with Delete.
func teardown(t *testing.T, c *Cluster, whenDeleted v1alpha1.PVCRetention) {
	unprotect(t, c)
	start := time.Now()
	// The members go one by one: the quorum is lost on purpose on the way.
	c.inv.allowQuorumLoss(true)
	defer c.inv.allowQuorumLoss(false)
	if _, err := c.Plane.Kubectl("delete", "-n", c.Namespace, "etcdcluster", c.Name, "--wait=false"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	why := ""
	for ; time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if why = c.leftovers(whenDeleted); why == "" {
			break
		}
	}
	if why != "" {
		t.Fatalf("after 2m the cluster is not torn down: %s\n%s\nlogs: %s", why, c.Describe(), c.Plane.Logs())
	}
	t.Logf("torn down in %s", time.Since(start).Round(time.Second))
	// Nothing of the teardown may make a controller complain: a budget left without its
	// pods' controller, for one, fails on every change of the pods.
	for _, w := range c.warningsSince(start.Add(-time.Second)) {
		t.Errorf("warning during the teardown: %s", w)
	}
	ctx := c.Plane.ctx
	all, err := c.Plane.Client.CoreV1().PersistentVolumeClaims(c.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var claims []corev1.PersistentVolumeClaim
	for _, pvc := range all.Items {
		if c.ownClaim(pvc.Name) {
			claims = append(claims, pvc)
		}
	}
	if whenDeleted == v1alpha1.PVCRetain {
		if len(claims) != 3 {
			t.Errorf("%d claims left, want the 3 members' with whenDeleted Retain", len(claims))
		}
		for _, pvc := range claims {
			if pvc.DeletionTimestamp != nil || pvc.Status.Phase != corev1.ClaimBound {
				t.Errorf("claim %s: %s, deleting %v; whenDeleted Retain keeps it bound", pvc.Name, pvc.Status.Phase, pvc.DeletionTimestamp != nil)
			}
		}
	}
}

// leftovers says what of the cluster is still there ("" when nothing that should go is):
// the EtcdCluster, its pods (members', Jobs', the stream's), its StatefulSet, Jobs, and with
// whenDeleted Delete its claims and volumes. Other clusters of the namespace are left out.
func (c *Cluster) leftovers(whenDeleted v1alpha1.PVCRetention) string {
	ctx := c.Plane.ctx
	cs := c.Plane.Client
	if _, err := c.Get(); !apierrors.IsNotFound(err) {
		return fmt.Sprintf("the EtcdCluster is still there (%v)", err)
	}
	pods, err := cs.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var left []string
	for _, p := range pods.Items {
		if ownPodSelector(c).Matches(labels.Set(p.Labels)) || ownJobPod(c, &p) || p.Labels[sync.LabelBackupStreamOf] == c.Name {
			left = append(left, p.Name)
		}
	}
	if len(left) > 0 {
		return fmt.Sprintf("pods left: %v", left)
	}
	if _, err := c.StatefulSet(); !apierrors.IsNotFound(err) {
		return fmt.Sprintf("the StatefulSet is still there (%v)", err)
	}
	jobs, err := cs.BatchV1().Jobs(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sync.LabelCluster + "=" + c.Name})
	if err != nil {
		return err.Error()
	}
	if len(jobs.Items) > 0 {
		return fmt.Sprintf("%d Jobs left", len(jobs.Items))
	}
	if whenDeleted != v1alpha1.PVCDelete {
		return ""
	}
	claims, err := cs.CoreV1().PersistentVolumeClaims(c.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	for _, pvc := range claims.Items {
		if c.ownClaim(pvc.Name) {
			return fmt.Sprintf("claim %s left with whenDeleted Delete", pvc.Name)
		}
	}
	pvs, err := cs.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	for _, pv := range pvs.Items {
		if ref := pv.Spec.ClaimRef; ref != nil && ref.Namespace == c.Namespace && c.ownClaim(ref.Name) {
			return fmt.Sprintf("volume %s of claim %s left (%s)", pv.Name, ref.Name, pv.Status.Phase)
		}
	}
	return ""
}

// claimsPending holds once every member's claim waits for its file system to grow.
func claimsPending(c *Cluster) (bool, string) {
	for i := range 3 {
		name := "data-" + c.Pod(i)
		pvc, err := c.Plane.Client.CoreV1().PersistentVolumeClaims(c.Namespace).Get(c.Plane.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		pending := false
		for _, cond := range pvc.Status.Conditions {
			pending = pending || cond.Type == corev1.PersistentVolumeClaimFileSystemResizePending && cond.Status == corev1.ConditionTrue
		}
		if !pending {
			return false, fmt.Sprintf("claim %s: conditions %v", name, pvc.Status.Conditions)
		}
	}
	return true, ""
}

// claimsHave holds once every member's claim has the capacity.
func claimsHave(c *Cluster, size string) (bool, string) {
	want := resource.MustParse(size)
	for i := range 3 {
		name := "data-" + c.Pod(i)
		pvc, err := c.Plane.Client.CoreV1().PersistentVolumeClaims(c.Namespace).Get(c.Plane.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if q := pvc.Status.Capacity[corev1.ResourceStorage]; q.Cmp(want) < 0 {
			return false, fmt.Sprintf("claim %s has %s, conditions %v", name, q.String(), pvc.Status.Conditions)
		}
	}
	return true, ""
}

func waitSteady(t *testing.T, c *Cluster, size int, bound time.Duration) {
	t.Helper()
	took, err := c.WaitFor(bound, c.Steady(size))
	if err != nil {
		t.Fatalf("the cluster did not become steady: %v", err)
	}
	t.Logf("steady with %d members in %s", size, took.Round(time.Second))
}

// startWorkloadAfter runs step (nil: nothing) and starts the recorded workload: once the
// cluster serves, when step creates it.
func startWorkloadAfter(t *testing.T, c *Cluster, step func()) *harness.Workload {
	t.Helper()
	if step != nil {
		step()
	}
	w, err := harness.StartWorkloadOn(c, "/workload/"+t.Name(), harness.WorkloadOptions{})
	if err != nil {
		t.Fatalf("starting the workload: %v", err)
	}
	return w
}

// checkWorkload stops the workload once it has 20 acknowledged appends, reads every
// acknowledged write back and checks the history: linearizable, and the watches complete.
func checkWorkload(t *testing.T, w *harness.Workload) {
	t.Helper()
	w.AwaitAcked(20, 30*time.Second)
	stats := w.Stop()
	lost, err := w.Verify(30 * time.Second)
	if err != nil {
		t.Fatalf("reading the workload's keys back: %v", err)
	}
	if len(lost) > 0 {
		t.Errorf("%d acknowledged writes lost: %v", len(lost), lost)
	}
	if stats.Acked < 20 {
		t.Errorf("only %d appends acknowledged", stats.Acked)
	}
	dir := filepath.Join(os.TempDir(), "etcdops-controlplane-histories")
	v := w.History().Check(dir)
	if !v.Linearizable || len(v.Problems) > 0 {
		t.Errorf("the workload's history fails its check: %v (written to %s)", v.Problems, v.Written)
	}
	t.Logf("workload: %d appends acknowledged, %d failed operations, worst %s; %d operations checked, linearizable %v", stats.Acked, stats.Failed, stats.Worst.Round(time.Millisecond), v.Ops, v.Linearizable)
}

// unprotect first checks that the installed ValidatingAdmissionPolicy refuses a plain delete
// of the cluster, protected by default, with a message that says how to delete it on purpose
// and leaves it untouched; then it does what the message says.
func unprotect(t *testing.T, c *Cluster) {
	t.Helper()
	out, err := c.Plane.Kubectl("delete", "-n", c.Namespace, "etcdcluster", c.Name, "--wait=false")
	if err == nil {
		t.Fatalf("kubectl delete of a protected EtcdCluster was let through: %s", out)
	}
	patch := `{"spec":{"deletionProtection":false}}`
	for _, want := range []string{
		"ValidatingAdmissionPolicy 'etcdops-deletion-protection'",
		"EtcdCluster " + c.Namespace + "/" + c.Name + " is protected from deletion",
		"kubectl patch etcdcluster " + c.Name + " -n " + c.Namespace + " --type=merge -p '" + patch + "'",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the refused delete says %q, which lacks %q", out, want)
		}
	}
	ec, err := c.Get()
	switch {
	case err != nil:
		t.Fatal(err)
	case ec.DeletionTimestamp != nil:
		t.Fatal("the refused delete marked the EtcdCluster for deletion")
	case ec.Spec.DeletionProtection == nil || !*ec.Spec.DeletionProtection:
		t.Fatalf("spec.deletionProtection = %v, want the default true", ec.Spec.DeletionProtection)
	}
	if out, err := c.Plane.Kubectl("patch", "-n", c.Namespace, "etcdcluster", c.Name, "--type=merge", "-p", patch); err != nil {
		t.Fatalf("unprotect: %v\n%s", err, out)
	}
}
