package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/harness"
)

// ShardsDir installs the operator with two shards: manifests/metacontroller and the shard-1
// component.
const ShardsDir = "../../manifests/shards/two"

// shardLabel is the label that puts an EtcdCluster on a shard.
const shardLabel = "etcdops.dev/shard"

// TestShards installs the operator with two shards (`kubectl apply -k manifests/shards/two`),
// each shard's CompositeController calling a hook of its own, and creates a one-member cluster
// on each: an unlabelled one, which shard 0 takes, and one labelled for shard 1. Each hook
// syncs and observes only its shard's cluster and each cluster carries only its shard's
// finalizer; the API server refuses to move a cluster to another shard by its label, and to
// create one for a shard not installed; and the hook refuses a teardown asked of it for a
// cluster that is not being deleted.
func TestShards(t *testing.T) {
	t.Parallel()
	p := Start(t)
	p.StartStorage()
	p.StartMetacontroller()
	hooks := map[string]string{"etcdops": p.StartHook(), "etcdops-shard-1": p.startShardHook(1)}
	p.installShards(hooks)
	c0 := p.NewCluster("shard-0", "etcd")
	c1 := p.NewCluster("shard-1", "etcd")
	one := manifest(1, OnlineClass, "1Gi", v1alpha1.PVCRetain)
	steps(t,
		step{"create-one-per-shard", func(t *testing.T) {
			c0.Apply(one)
			c1.Apply(withShard(one, "1"))
			waitSteady(t, c0, 1, createBound)
			waitSteady(t, c1, 1, createBound)
		}},
		step{"each-hook-its-shard", func(t *testing.T) {
			onlyItsShard(t, c0, "etcdops", hooks["etcdops"], c1)
			onlyItsShard(t, c1, "etcdops-shard-1", hooks["etcdops-shard-1"], c0)
		}},
		step{"relabel-refused", func(t *testing.T) {
			relabelRefused(t, c0, c1)
			// Labelled 0, c0 is still shard 0's.
			waitSteady(t, c0, 1, time.Minute)
			onlyItsShard(t, c0, "etcdops", hooks["etcdops"], c1)
			onlyItsShard(t, c1, "etcdops-shard-1", hooks["etcdops-shard-1"], c0)
		}},
		step{"finalize-refused", func(t *testing.T) { finalizeRefused(t, c0, hooks["etcdops"]) }},
	)
}

// withShard labels an EtcdCluster manifest for shard k.
func withShard(manifest, k string) string {
	return strings.Replace(manifest, "metadata:\n", "metadata:\n  labels:\n    "+shardLabel+": \""+k+"\"\n", 1)
}

// startShardHook runs another hook server in the test for shard k, as StartHook runs shard
// 0's (call StartHook first: this one shares its clock and Event sink), logging to
// Dir/hook-shard-<k>.log. Its requests are not recorded.
func (p *Plane) startShardHook(k int) string {
	p.t.Helper()
	f, err := os.Create(p.file(fmt.Sprintf("hook-shard-%d.log", k)))
	if err != nil {
		p.t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
	url, stop, err := harness.InProcessHookWithEvents(sync.Config{ClusterDomain: "cluster.local", ToolImage: ToolImage}, log, p.events)(p.ctx, p.HookClock)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { stop(); f.Close() })
	return url
}

// installShards applies ShardsDir, waits for every shard's two hook pods, and points each
// CompositeController (by name) at its hook's URL.
func (p *Plane) installShards(hooks map[string]string) {
	p.t.Helper()
	out, err := p.Kubectl("apply", "-k", ShardsDir)
	if err != nil {
		p.t.Fatalf("kubectl apply -k %s: %v", ShardsDir, err)
	}
	p.t.Logf("kubectl apply -k %s:\n%s", ShardsDir, out)
	want := 2 * len(hooks)
	deadline := time.Now().Add(time.Minute)
	for {
		pods, err := p.Client.CoreV1().Pods(OperatorNamespace).List(p.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=sync-hook"})
		if err == nil && len(pods.Items) == want {
			break
		}
		if time.Now().After(deadline) {
			events, _ := p.Kubectl("get", "events", "-n", OperatorNamespace)
			p.t.Fatalf("the shards' %d hook pods were not created within a minute (%v); events:\n%s", want, err, events)
		}
		time.Sleep(250 * time.Millisecond)
	}
	p.connectEvents()
	for controller, url := range hooks {
		p.PointControllerHooks(controller, url)
	}
}

// onlyItsShard: c carries only controller's Metacontroller finalizer, and the hook at url
// reports c as synced with its member answering (the hook asked etcd: it holds the cluster's
// connections) and reports nothing of other, another shard's cluster.
func onlyItsShard(t *testing.T, c *Cluster, controller, url string, other *Cluster) {
	t.Helper()
	ec, err := c.Get()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"metacontroller.io/compositecontroller-" + controller}; !slices.Equal(ec.Finalizers, want) {
		t.Errorf("%s/%s carries finalizers %q, want only %q", c.Namespace, c.Name, ec.Finalizers, want)
	}
	text := hookMetrics(t, url)
	series := func(ns string) []string {
		var out []string
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, "etcdops_cluster_") && strings.Contains(line, `namespace="`+ns+`"`) {
				out = append(out, line)
			}
		}
		return out
	}
	mine := series(c.Namespace)
	if !slices.ContainsFunc(mine, func(l string) bool {
		return strings.HasPrefix(l, "etcdops_cluster_healthy_voters{") && strings.HasSuffix(l, " 1")
	}) {
		t.Errorf("%s's hook does not report %s/%s with its member healthy: %q", controller, c.Namespace, c.Name, mine)
	}
	if theirs := series(other.Namespace); len(theirs) > 0 {
		t.Errorf("%s's hook reports %s/%s, another shard's cluster: %q", controller, other.Namespace, other.Name, theirs)
	}
	t.Logf("%s's hook reports %d series of %s/%s and none of %s/%s", controller, len(mine), c.Namespace, c.Name, other.Namespace, other.Name)
}

func hookMetrics(t *testing.T, url string) string {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s/metrics: %s %v", url, resp.Status, err)
	}
	return string(body)
}

// relabelRefused: the API server refuses to change or remove a cluster's shard label, or to
// label an unlabelled cluster (shard 0's) for another shard, with a message that says why and
// how a cluster moves; an unlabelled cluster may be labelled 0, its shard already; a new
// cluster labelled for a shard not installed is refused. Both clusters stay where they were.
func relabelRefused(t *testing.T, c0, c1 *Cluster) {
	t.Helper()
	p := c0.Plane
	const policy = "ValidatingAdmissionPolicy 'etcdops-shard-label'"
	const how = "A cluster cannot move to another shard in place; to move one, restore a backup of it into a new EtcdCluster created with the other shard's label"
	for _, tc := range []struct {
		c     *Cluster
		label string
		shard string
	}{
		{c1, shardLabel + "=0", "1"},
		{c1, shardLabel + "-", "1"},
		{c0, shardLabel + "=1", "0 (unlabelled)"},
	} {
		out, err := p.Kubectl("label", "-n", tc.c.Namespace, "etcdcluster", tc.c.Name, tc.label, "--overwrite")
		if err == nil {
			t.Errorf("kubectl label %s/%s %s was let through: %s", tc.c.Namespace, tc.c.Name, tc.label, out)
			continue
		}
		for _, want := range []string{policy, "EtcdCluster " + tc.c.Namespace + "/" + tc.c.Name + " is on shard " + tc.shard, "cannot be changed or removed", how} {
			if !strings.Contains(out, want) {
				t.Errorf("the refused kubectl label %s says %q, which lacks %q", tc.label, out, want)
			}
		}
	}
	if out, err := p.Kubectl("label", "-n", c0.Namespace, "etcdcluster", c0.Name, shardLabel+"=0"); err != nil {
		t.Errorf("labelling an unlabelled cluster for shard 0, its own: %v\n%s", err, out)
	}

	file := p.file("shard-5.yaml")
	if err := os.WriteFile(file, []byte(strings.Replace(withShard(manifest(1, OnlineClass, "1Gi", v1alpha1.PVCRetain), "5"), "name: etcd\n", "name: other\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := p.Kubectl("apply", "-n", c0.Namespace, "-f", file)
	if err == nil {
		t.Errorf("an EtcdCluster for shard 5 of 2 was created: %s", out)
	} else if want := "is labelled " + shardLabel + "=5, which is no installed shard (installed: 0, 1)"; !strings.Contains(out, want) {
		t.Errorf("the refused create says %q, which lacks %q", out, want)
	}

	for c, want := range map[*Cluster]string{c0: "0", c1: "1"} {
		ec, err := c.Get()
		if err != nil {
			t.Fatal(err)
		}
		if got := ec.Labels[shardLabel]; got != want {
			t.Errorf("%s/%s is labelled %s=%q, want %q", c.Namespace, c.Name, shardLabel, got, want)
		}
	}
}

// finalizeRefused posts to shard 0's hook, as a finalize call, the last sync request the real
// Metacontroller sent it (c0, running, without a deletionTimestamp), as Metacontroller would
// post it for a cluster that stopped matching the shard's selector: the hook answers with every
// observed child, not finalized, and a hold that says why, which it also writes as a Warning
// Event on the EtcdCluster; the cluster runs on as it was.
func finalizeRefused(t *testing.T, c *Cluster, url string) {
	t.Helper()
	p := c.Plane
	body := p.requests.lastRequest("/sync")
	var req struct {
		Parent struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		} `json:"parent"`
		Children map[string]map[string]json.RawMessage `json:"children"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatalf("the last sync request: %v", err)
	}
	if m := req.Parent.Metadata; m.Namespace != c.Namespace || m.Name != c.Name || m.DeletionTimestamp != nil {
		t.Fatalf("the last sync request is of %s/%s (deletionTimestamp %v), want %s/%s not being deleted", m.Namespace, m.Name, m.DeletionTimestamp, c.Namespace, c.Name)
	}
	observed := 0
	for _, objs := range req.Children {
		observed += len(objs)
	}
	since := time.Now()
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Post(url+"/finalize", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var answer struct {
		Status    v1alpha1.EtcdClusterStatus `json:"status"`
		Children  []json.RawMessage          `json:"children"`
		Finalized *bool                      `json:"finalized"`
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("finalize answered %s: %s", resp.Status, raw)
	}
	if err := json.Unmarshal(raw, &answer); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	if answer.Finalized == nil || *answer.Finalized || len(answer.Children) != observed || observed == 0 {
		t.Errorf("finalize answered finalized %v with %d children; want false and the %d observed", answer.Finalized, len(answer.Children), observed)
	}
	if a := answer.Status.Action; a == nil || a.Type != "Hold" || a.Reason != sync.ReasonNotBeingDeleted {
		t.Errorf("finalize answered action %+v, want a Hold saying %q", a, sync.ReasonNotBeingDeleted)
	}
	if answer.Status.Phase != v1alpha1.PhaseRunning || len(answer.Status.Members) != 1 {
		t.Errorf("finalize answered phase %s with %d members, want the cluster's status kept", answer.Status.Phase, len(answer.Status.Members))
	}

	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	for {
		events, err := p.Client.CoreV1().Events(c.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + c.Name + ",reason=" + sync.EventHold})
		if err == nil && slices.ContainsFunc(events.Items, func(e corev1.Event) bool { return e.Type == "Warning" && e.Message == sync.ReasonNotBeingDeleted }) {
			break
		}
		if ctx.Err() != nil {
			t.Errorf("no Warning Event %s on %s/%s saying why within 30s (%v)", sync.EventHold, c.Namespace, c.Name, err)
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if _, err := c.WaitFor(30*time.Second, c.Steady(1)); err != nil {
		t.Errorf("after the refused finalize: %v", err)
	}
	t.Logf("finalize of a cluster not being deleted refused, %d children kept, in %s", observed, time.Since(since).Round(time.Millisecond))
}
