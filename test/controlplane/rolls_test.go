package controlplane

import (
	"context"
	"fmt"
	"strings"
	gosync "sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clientv3 "go.etcd.io/etcd/client/v3"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/etcdbin"
)

// versionRoll changes spec.version of a steady 3-member cluster from the default release to
// to, under the workload: the operator rolls the pods one at a time as for a configuration
// change, the node runs each new pod's etcd as the real binary of the image's release, and
// when one pod is left on the old release it is the leader's (leader last: leadership went to
// the lowest ordinal, replaced last, before the first leader's pod was). Every member keeps
// its ID and ends on the new release.
func versionRoll(t *testing.T, c *Cluster, changed, to string) {
	old := "etcd:" + v1alpha1.DefaultVersion
	var mu gosync.Mutex
	var lastOld, leader string // the pod first seen alone on the old release, and who led then
	ctx, cancel := context.WithCancel(c.Plane.ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ctx.Err() == nil {
			if pod, ok := c.onlyPodOn(old); ok {
				if l := c.Node.View(c.Name).Leader; l != "" {
					mu.Lock()
					if lastOld == "" {
						lastOld, leader = pod, l
					}
					mu.Unlock()
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	configRoll(t, c, changed)
	cancel()
	<-watched
	mu.Lock()
	defer mu.Unlock()
	switch {
	case lastOld == "":
		t.Error("never saw one pod alone on the old release")
	case lastOld != leader:
		t.Errorf("%s was the last pod on %s while %s led: the leader's pod goes last", lastOld, v1alpha1.DefaultVersion, leader)
	default:
		t.Logf("the last pod on %s was %s, the leader's", v1alpha1.DefaultVersion, lastOld)
	}
	want := strings.TrimPrefix(to, "v")
	for _, url := range c.ClientURLs() {
		if got, err := c.etcdVersion(url); err != nil || got != want {
			t.Errorf("%s runs etcd %q (%v), want %s", url, got, err, want)
		}
	}
}

// onlyPodOn is the one member pod whose etcd container runs image (a suffix such as
// "etcd:v3.6.16"), if exactly one does.
func (c *Cluster) onlyPodOn(image string) (string, bool) {
	ctx, cancel := context.WithTimeout(c.Plane.ctx, 5*time.Second)
	defer cancel()
	pods, err := c.Plane.Client.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: ownPodSelector(c).String()})
	if err != nil {
		return "", false
	}
	var on []string
	for _, p := range pods.Items {
		for _, ctr := range p.Spec.Containers {
			if ctr.Name == "etcd" && strings.HasSuffix(ctr.Image, image) && p.DeletionTimestamp == nil {
				on = append(on, p.Name)
			}
		}
	}
	if len(on) != 1 {
		return "", false
	}
	return on[0], true
}

// etcdVersion is the server release a member reports (Status).
func (c *Cluster) etcdVersion(url string) (string, error) {
	cfg := c.ClientConfig()
	cfg.Endpoints = []string{url}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return "", err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(c.Plane.ctx, 5*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, url)
	if err != nil {
		return "", err
	}
	return st.Version, nil
}

// withVersion is a manifest of manifest()'s form running release v.
func withVersion(manifest, v string) string {
	return strings.Replace(manifest, "version: "+v1alpha1.DefaultVersion, "version: "+v, 1)
}

// statefulSetDeleted deletes the StatefulSet by hand, as `kubectl delete statefulset` does
// (background cascade: the garbage collector deletes its pods), under the workload: the
// operator returns the StatefulSet on the next sync, the real StatefulSet controller creates
// the pods again on the claims that outlived the set (whenDeleted Retain), and every member
// comes back with its ID. Writes fail while the pods are gone; none acknowledged is lost.
func statefulSetDeleted(t *testing.T, c *Cluster) {
	ec, err := c.Get()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, m := range ec.Status.Members {
		ids[m.Name] = m.ID
	}
	claims := map[string]string{}
	for ord := range 3 {
		pvc, err := c.Plane.Client.CoreV1().PersistentVolumeClaims(c.Namespace).Get(c.Plane.ctx, sync.ClaimName(c.Name, ord), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		claims[pvc.Name] = string(pvc.UID)
	}
	old, err := c.StatefulSet()
	if err != nil {
		t.Fatal(err)
	}
	before := c.PodUIDs()
	w := startWorkloadAfter(t, c, nil)
	// Every pod goes with the StatefulSet: the quorum is lost on purpose until they are back.
	c.inv.allowQuorumLoss(true)
	defer c.inv.allowQuorumLoss(false)
	if out, err := c.Plane.Kubectl("delete", "statefulset", "-n", c.Namespace, c.Name); err != nil {
		w.Stop()
		t.Fatal(err)
	} else {
		t.Logf("%s", strings.TrimSpace(out))
	}
	var gone time.Time // when the last old pod was gone
	took, err := c.WaitFor(3*time.Minute, func(ec *v1alpha1.EtcdCluster) (bool, string) {
		after := c.PodUIDs()
		if gone.IsZero() && !anyLeft(before, after) {
			gone = time.Now()
		}
		sts, err := c.StatefulSet()
		if err != nil || sts.UID == old.UID {
			return false, fmt.Sprintf("the StatefulSet is not created again yet (%v)", err)
		}
		for name, uid := range before {
			if after[name] == "" || after[name] == uid {
				return false, "pod " + name + " not created again yet"
			}
		}
		return c.Steady(3)(ec)
	})
	if err != nil {
		w.Stop()
		t.Fatalf("the cluster did not come back from its StatefulSet's deletion: %v", err)
	}
	back := time.Since(gone)
	t.Logf("the old pods gone in %s, and the StatefulSet and its pods created again and the cluster steady %s after", (took - back).Round(time.Second), back.Round(time.Second))
	// Created again over its pods still going, the StatefulSet's controller backs off for
	// each pod it cannot create yet, doubling: the pods came back 40 s after the old ones went.
	if back > backAfterOldPods {
		t.Errorf("the cluster was steady %s after its old pods were gone, more than %s", back.Round(time.Second), backAfterOldPods)
	}
	checkWorkload(t, w)
	ec, err = c.Get()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ec.Status.Members {
		if ids[m.Name] != m.ID {
			t.Errorf("member %s has ID %s, was %s: its pod came back on its own claim and must keep its member", m.Name, m.ID, ids[m.Name])
		}
	}
	for name, uid := range claims {
		pvc, err := c.Plane.Client.CoreV1().PersistentVolumeClaims(c.Namespace).Get(c.Plane.ctx, name, metav1.GetOptions{})
		if err != nil || string(pvc.UID) != uid || pvc.Status.Phase != corev1.ClaimBound {
			t.Errorf("claim %s did not outlive the StatefulSet as it was (%v)", name, err)
		}
	}
}

// anyLeft: a pod of before (name → UID) is still there in after.
func anyLeft(before, after map[string]string) bool {
	for name, uid := range before {
		if after[name] == uid {
			return true
		}
	}
	return false
}

// backAfterOldPods bounds how long a cluster whose StatefulSet was deleted takes, once the
// garbage collector has deleted the old pods, to run again: pods created, etcd started.
const backAfterOldPods = 15 * time.Second

// pinned is the release the tests run for a minor ("v3.7").
func pinned(t *testing.T, minor string) string {
	t.Helper()
	v, ok := etcdbin.Pinned[minor]
	if !ok {
		t.Fatalf("no pinned release of %s", minor)
	}
	return v
}
