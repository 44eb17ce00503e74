package controlplane

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// NextToolImage is the member tool image of the release operatorUpgrade moves to.
const NextToolImage = "etcdops/etcdops:v0.2.0"

// installImage is the member tool image a pod template's init container installs.
func installImage(spec corev1.PodSpec) string {
	for _, c := range spec.InitContainers {
		if c.Name == "install" {
			return c.Image
		}
	}
	return ""
}

// operatorUpgrade replaces the hook with one of a new release, whose member tool image is
// NextToolImage, as an operator upgrade does, and checks that this alone rolls no etcd pod:
// through syncs the new hook answered, the StatefulSet keeps its template and revision and
// every pod stays. The pods take the new tool at their next roll (podsRunTool after it).
func operatorUpgrade(t *testing.T, c *Cluster) {
	sts, err := c.StatefulSet()
	if err != nil {
		t.Fatal(err)
	}
	revision, tool := sts.Status.UpdateRevision, installImage(sts.Spec.Template.Spec)
	if tool != ToolImage {
		t.Fatalf("the StatefulSet installs %q, want %s before the upgrade", tool, ToolImage)
	}
	pods := c.PodUIDs()
	c.Plane.UpgradeHook(NextToolImage)
	// A change of the cluster's metadata gets a sync at once (Metacontroller watches it); two
	// answered by the new hook, the second after the first's children were applied.
	for i := range 2 {
		n := c.Plane.requests.syncCount()
		if err := c.Annotate("test.etcdops.dev/nudge", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WaitFor(time.Minute, func(*v1alpha1.EtcdCluster) (bool, string) {
			return c.Plane.requests.syncCount() > n, "no sync since the annotation"
		}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2 * time.Second)
	after, err := c.StatefulSet()
	if err != nil {
		t.Fatal(err)
	}
	if got := installImage(after.Spec.Template.Spec); got != ToolImage || after.Status.UpdateRevision != revision {
		t.Fatalf("after the operator's upgrade the StatefulSet installs %s at revision %s; want %s at %s, unchanged", got, after.Status.UpdateRevision, ToolImage, revision)
	}
	if now := c.PodUIDs(); !maps.Equal(now, pods) {
		t.Fatalf("after the operator's upgrade the pods are %v, were %v: a new tool image alone must roll no pod", now, pods)
	}
}

// podsRunTool: every member pod of c installs tool.
func podsRunTool(t *testing.T, c *Cluster, tool string) {
	ctx, cancel := context.WithTimeout(c.Plane.ctx, 10*time.Second)
	defer cancel()
	pods, err := c.Plane.Client.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "etcdops.dev/cluster=" + c.Name})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Labels["batch.kubernetes.io/job-name"] == "" && installImage(p.Spec) != tool {
			t.Errorf("pod %s installs %s after its roll, want %s", p.Name, installImage(p.Spec), tool)
		}
	}
}
