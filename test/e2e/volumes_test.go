package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/harness"
)

// TestVolumeExpansion grows the volumes of a running three-member cluster under the workload:
// every member's claim is patched by an expand-claim Job, one at a time, and grows (the
// harness's resizer plays the storage system and the kubelet's online file system resize,
// which cannot run here); no pod restarts, the StatefulSet's claim template stays as created,
// and no acknowledged write is lost. Then a class that does not allow expansion: a larger size
// starts no Job and changes nothing, and the VolumesExpanded condition says why; once the class
// allows it, the expansion goes ahead. Last a class whose driver grows file systems only when
// the volume is mounted again: the operator restarts every member's pod itself, one at a time.
func TestVolumeExpansion(t *testing.T) {
	t.Parallel()
	onCluster(t, spec(3),
		scenario{name: "expand", act: planned(expandVolumes)},
		scenario{name: "refused", act: refusedExpansion},
		scenario{name: "offline", act: planned(offlineExpansion)},
	)
}

func expandVolumes(t *testing.T, env *harness.Env) int {
	pods0 := podUIDs(env)
	env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { s.StorageSpec.VolumeSizeRequest = resource.MustParse("2Gi") })
	waitExpanded(t, env, "2Gi")
	for name, uid := range podUIDs(env) {
		if pods0[name] != uid {
			t.Errorf("pod %s was recreated; an online expansion restarts nothing", name)
		}
	}
	o, _ := env.Store.Get("StatefulSet", env.Cluster)
	if q := o.(*appsv1.StatefulSet).Spec.VolumeClaimTemplates[0].Spec.Resources.Requests[corev1.ResourceStorage]; q.String() != "1Gi" {
		t.Errorf("the StatefulSet's claim template asks for %s; it cannot change and must keep 1Gi", q.String())
	}
	expanded := map[string]bool{}
	for _, r := range env.Store.Parent().Status.History {
		if r.Type == sync.ExpandVolume.String() && r.Result == v1alpha1.StepSucceeded {
			expanded[r.Member] = true
		}
	}
	if len(expanded) != 3 {
		t.Errorf("history shows ExpandVolume succeeded for %v, want each of the 3 members", expanded)
	}
	return 3
}

func refusedExpansion(t *testing.T, env *harness.Env) int {
	harness.SetExpansion(env.Store, false)
	jobs0, pods0 := jobNames(env), podUIDs(env)
	env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { s.StorageSpec.VolumeSizeRequest = resource.MustParse("4Gi") })
	var msg string
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		st := env.Store.Parent().Status
		c := condition(st, v1alpha1.ConditionVolumesExpanded)
		msg = c.Message
		return c.Status == metav1.ConditionFalse && c.Reason == sync.ReasonExpansionNotAllowed && c.ObservedGeneration == env.Store.Parent().Generation,
			fmt.Sprintf("VolumesExpanded %s %s: %s", c.Status, c.Reason, c.Message)
	}); err != nil {
		t.Fatalf("no ExpansionNotAllowed: %v\n%s", err, env.Describe())
	}
	if !strings.Contains(msg, "StorageClass "+harness.DefaultStorageClass+" does not allow volume expansion") {
		t.Errorf("VolumesExpanded says %q; want it to name the class and why", msg)
	}
	nothingMoves(t, env, jobs0, pods0, "though the class does not allow expansion")
	checkClaims(t, env, "2Gi")
	harness.SetExpansion(env.Store, true)
	waitExpanded(t, env, "4Gi")
	return 3
}

// offlineExpansion grows the volumes with a class whose driver grows file systems only on a
// remount (the harness's resizer plays it: a claim stays FileSystemResizePending until another
// pod runs on it). Every member's pod is restarted by a restart-pod Job, each once and never two
// voters down at once, and while it goes on status names the members done and those waiting.
func offlineExpansion(t *testing.T, env *harness.Env) int {
	harness.SetOfflineResize(env.Store, true)
	t.Cleanup(func() { harness.SetOfflineResize(env.Store, false) })
	pods0 := podUIDs(env)
	var maxDown []string
	sawWaiting, sawMembers := false, false
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			var down []string
			for _, m := range env.Monitor.View().Members {
				if !m.IsLearner && !m.Running {
					down = append(down, m.Name)
				}
			}
			if len(down) > len(maxDown) {
				maxDown = down
			}
			st := env.Store.Parent().Status
			msg := condition(st, v1alpha1.ConditionVolumesExpanded).Message
			sawWaiting = sawWaiting || strings.Contains(msg, "waiting for a pod restart to grow the file system: ") && strings.Contains(msg, "done: ")
			waiting, done := false, false
			for _, m := range st.Members {
				waiting = waiting || m.Volume != nil && m.Volume.Resizing == string(corev1.PersistentVolumeClaimFileSystemResizePending)
				done = done || m.Volume != nil && m.Volume.Resizing == "" && m.Volume.Capacity == "6Gi"
			}
			sawMembers = sawMembers || waiting && done
		}
	}()
	stopSampling := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-stopped
	}
	defer stopSampling()
	env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { s.StorageSpec.VolumeSizeRequest = resource.MustParse("6Gi") })
	// Drivers that grow file systems online pass through FileSystemResizePending too, so the
	// operator restarts a pod only once its claim waited past a grace of some minutes: once
	// every claim waits, the hook's clock is moved past it.
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		for i := range 3 {
			o, _ := env.Store.Get("PersistentVolumeClaim", sync.ClaimName(env.Cluster, i))
			pvc := o.(*corev1.PersistentVolumeClaim)
			if len(pvc.Status.Conditions) != 1 || pvc.Status.Conditions[0].Type != corev1.PersistentVolumeClaimFileSystemResizePending {
				return false, fmt.Sprintf("claim %s: %v", pvc.Name, pvc.Status.Conditions)
			}
		}
		return true, ""
	}); err != nil {
		t.Fatalf("the claims do not wait for a remount: %v\n%s", err, env.Describe())
	}
	for j := range jobNames(env) {
		if strings.Contains(j, "-restart-pod-") {
			t.Errorf("Job %s restarts a pod within the grace", j)
		}
	}
	env.AdvanceHookClock(5 * time.Minute)
	waitExpanded(t, env, "6Gi")
	// The last restart's step ends once a sync finds the cluster steady.
	if _, err := env.WaitSteady(3, changeBound); err != nil {
		t.Fatalf("not steady after the restarts: %v\n%s", err, env.Describe())
	}
	stopSampling()
	if len(maxDown) > 1 {
		t.Errorf("voters down at once: %v; the restarts go one at a time", maxDown)
	}
	for name, uid := range podUIDs(env) {
		if pods0[name] == uid {
			t.Errorf("pod %s was not restarted; its file system grows only on a remount", name)
		}
	}
	restarted := map[string]int{}
	var steps []string
	for _, r := range env.Store.Parent().Status.History {
		if r.Type == sync.RestartPod.String() {
			steps = append(steps, r.Member+" "+r.Result)
			if r.Result == v1alpha1.StepSucceeded {
				restarted[r.Member]++
			}
		}
	}
	if len(restarted) != 3 {
		t.Errorf("history shows RestartPod %v, want succeeded for each of the 3 members", steps)
	}
	for m, n := range restarted {
		if n != 1 {
			t.Errorf("%s restarted %d times, want once", m, n)
		}
	}
	if !sawWaiting || !sawMembers {
		t.Errorf("status never named the members done and those waiting for a restart (VolumesExpanded %v, members %v)", sawWaiting, sawMembers)
	}
	return 3
}

// waitExpanded waits until every member's claim asks for size and has it, and status says so.
func waitExpanded(t *testing.T, env *harness.Env, size string) {
	t.Helper()
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		for i := range 3 {
			o, ok := env.Store.Get("PersistentVolumeClaim", sync.ClaimName(env.Cluster, i))
			if !ok {
				return false, fmt.Sprintf("no claim for member %d", i)
			}
			pvc := o.(*corev1.PersistentVolumeClaim)
			req, have := pvc.Spec.Resources.Requests[corev1.ResourceStorage], pvc.Status.Capacity[corev1.ResourceStorage]
			if req.String() != size || have.String() != size {
				return false, fmt.Sprintf("claim %s asks for %s and has %s", pvc.Name, req.String(), have.String())
			}
		}
		st := env.Store.Parent().Status
		for _, m := range st.Members {
			if m.Volume == nil || m.Volume.Capacity != size || m.Volume.Resizing != "" {
				return false, fmt.Sprintf("status of %s: volume %+v", m.Name, m.Volume)
			}
		}
		c := condition(st, v1alpha1.ConditionVolumesExpanded)
		return c.Status == metav1.ConditionTrue, fmt.Sprintf("VolumesExpanded %s %s: %s", c.Status, c.Reason, c.Message)
	}); err != nil {
		t.Fatalf("volumes not expanded to %s: %v\n%s", size, err, env.Describe())
	}
}

// checkClaims: every member's claim asks for size.
func checkClaims(t *testing.T, env *harness.Env, size string) {
	t.Helper()
	for i := range 3 {
		o, ok := env.Store.Get("PersistentVolumeClaim", sync.ClaimName(env.Cluster, i))
		if !ok {
			t.Errorf("no claim for member %d", i)
			continue
		}
		if q := o.(*corev1.PersistentVolumeClaim).Spec.Resources.Requests[corev1.ResourceStorage]; q.String() != size {
			t.Errorf("claim %s asks for %s, want %s", o.GetName(), q.String(), size)
		}
	}
}
