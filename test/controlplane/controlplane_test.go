package controlplane

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/test/harness"
)

// manifest is an EtcdCluster as a user writes it: size members, each with a claim of size
// from class.
func manifest(size int, class, volume string) string {
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
`, size, v1alpha1.DefaultVersion, volume, class)
}

// createBound bounds a 3-member cluster's creation: three pods started one after another,
// two member Jobs each, on real controllers' clocks.
const createBound = 4 * time.Minute

// TestKustomizeInstall installs the operator with `kubectl apply -k`, creates a 3-member
// cluster and grows its volumes online, the workload writing throughout.
func TestKustomizeInstall(t *testing.T) {
	p := Start(t)
	p.StartStorage()
	p.StartMetacontroller()
	p.InstallKustomize(p.StartHook())
	c := p.NewCluster("kustomize", "etcd")
	t.Run("create-3", func(t *testing.T) {
		w := startWorkloadAfter(t, c, func() {
			c.Apply(manifest(3, OnlineClass, "1Gi"))
			waitSteady(t, c, 3, createBound)
		})
		checkWorkload(t, w)
	})
	t.Run("online-growth", func(t *testing.T) {
		growVolumes(t, c, OnlineClass, false)
	})
}

// TestHelmInstall installs the operator with `helm install` of the chart, creates a 3-member
// cluster whose class's driver grows file systems only on a remount, and grows its volumes:
// the operator restarts the members' pods itself, one at a time.
func TestHelmInstall(t *testing.T) {
	p := Start(t)
	p.StartStorage()
	p.StartMetacontroller()
	p.InstallHelm(p.StartHook())
	c := p.NewCluster("helm", "etcd")
	t.Run("create-3", func(t *testing.T) {
		c.Apply(manifest(3, OfflineClass, "1Gi"))
		waitSteady(t, c, 3, createBound)
	})
	t.Run("offline-growth", func(t *testing.T) {
		growVolumes(t, c, OfflineClass, true)
	})
}

// growVolumes asks for 2Gi under the workload and waits for every claim to have it, the
// VolumesExpanded condition True and the cluster steady. Online, no pod is recreated;
// offline, every pod is, as the driver needs.
func growVolumes(t *testing.T, c *Cluster, class string, offline bool) {
	if t.Failed() {
		t.Skip("the cluster was not created")
	}
	before := c.PodUIDs()
	w := startWorkloadAfter(t, c, nil)
	c.Apply(manifest(3, class, "2Gi"))
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
