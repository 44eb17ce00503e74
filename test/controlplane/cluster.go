package controlplane

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	gosync "sync"
	"time"

	"go.uber.org/zap"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	clientv3 "go.etcd.io/etcd/client/v3"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/etcdbin"
	"etcdops.dev/etcdops/test/harness"
)

// The StorageClasses every plane has: the default class, whose driver grows file systems
// online, and a class whose driver grows them only when the volume is mounted again.
const (
	OnlineClass   = "standard"
	OfflineClass  = "remount"
	OnlineDriver  = "online.csi.test.etcdops.dev"
	OfflineDriver = "remount.csi.test.etcdops.dev"
)

// KubeletTimeScale shrinks the played kubelet's own clocks (probe periods, crash-loop
// back-off), so that a pod is ready in seconds; the controllers' clocks are real.
const KubeletTimeScale = 0.2

// ResizeDelay is how long the played driver takes to grow a volume.
const ResizeDelay = 2 * time.Second

var etcdClusters = schema.GroupVersionResource{Group: v1alpha1.Group, Version: "v1alpha1", Resource: "etcdclusters"}

// StartStorage creates the StorageClasses and runs their CSI drivers (harness.CSIDriver),
// volumes under Dir/volumes.
func (p *Plane) StartStorage() {
	p.t.Helper()
	expand := true
	for _, sc := range []*storagev1.StorageClass{
		{ObjectMeta: metav1.ObjectMeta{Name: OnlineClass, Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
			Provisioner: OnlineDriver, AllowVolumeExpansion: &expand},
		{ObjectMeta: metav1.ObjectMeta{Name: OfflineClass}, Provisioner: OfflineDriver, AllowVolumeExpansion: &expand},
	} {
		if _, err := p.Client.StorageV1().StorageClasses().Create(p.ctx, sc, metav1.CreateOptions{}); err != nil {
			p.t.Fatalf("StorageClass %s: %v", sc.Name, err)
		}
	}
	for _, d := range []*harness.CSIDriver{
		{Name: OnlineDriver, Offline: false},
		{Name: OfflineDriver, Offline: true},
	} {
		d.Root, d.Delay, d.Client, d.Logf = p.file("volumes"), ResizeDelay, p.Client, p.logf
		ctx, cancel := context.WithCancel(p.ctx)
		wait, err := d.Start(ctx)
		if err != nil {
			cancel()
			p.t.Fatal(err)
		}
		p.t.Cleanup(func() { cancel(); wait() })
	}
}

// logf writes to the test's log while it runs.
func (p *Plane) logf(format string, args ...any) {
	p.logMu.Lock()
	defer p.logMu.Unlock()
	if !p.closed {
		p.t.Logf(format, args...)
	}
}

// Cluster is one EtcdCluster on the plane, in a namespace whose pods a node of its own runs
// (NewCluster), or beside another cluster in its namespace and on its node (Beside).
type Cluster struct {
	Plane     *Plane
	Namespace string
	Name      string
	Node      *harness.APINode

	node *nodeShare
	pki  *harness.PKI
	inv  *invariants
}

// nodeShare is what the clusters of one namespace share: its node's Job runs, and the
// clusters, which each hear of the Jobs of their own.
type nodeShare struct {
	mu       gosync.Mutex
	jobs     []JobRun
	clusters []*Cluster
}

// JobRun is one run of a Job's pod on the node.
type JobRun struct {
	Job  string
	Args []string
	Out  string
	Err  error
}

// NewCluster creates the namespace, enforcing the restricted Pod Security Standard, and
// starts its node; the EtcdCluster comes with Apply. The invariants (invariants.go) are
// checked from then on.
func (p *Plane) NewCluster(namespace, name string) *Cluster {
	p.t.Helper()
	// The restricted Pod Security Standard, enforced by the API server's admission: every pod
	// the operator renders must meet it (docs/security.md).
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"}}}
	if _, err := p.Client.CoreV1().Namespaces().Create(p.ctx, ns, metav1.CreateOptions{}); err != nil {
		p.t.Fatal(err)
	}
	share := &nodeShare{}
	tools := harness.OperatorTools()
	ctx, cancel := context.WithCancel(p.ctx)
	node, wait, err := harness.StartAPINode(ctx, harness.APINodeOptions{
		Name: "node-" + namespace, Namespace: namespace, Domain: "cluster.local",
		Root: p.file(filepath.Join("nodes", namespace)), VolumesRoot: p.file("volumes"),
		Client: p.Client, Config: p.Config, Tools: tools, TimeScale: KubeletTimeScale,
		EtcdBinary: func(image string) (string, error) { return etcdbin.Path(harness.ImageVersion(image)) },
		Logf:       p.logf,
	})
	if err != nil {
		cancel()
		p.t.Fatal(err)
	}
	node.BeforeJob = func(job string, args []string) {
		share.mu.Lock()
		clusters := slices.Clone(share.clusters)
		share.mu.Unlock()
		for _, c := range clusters {
			c.inv.beforeJob(job, args)
		}
	}
	node.OnJob = func(job string, args []string, out string, err error) {
		share.mu.Lock()
		share.jobs = append(share.jobs, JobRun{Job: job, Args: args, Out: out, Err: err})
		clusters := slices.Clone(share.clusters)
		share.mu.Unlock()
		for _, c := range clusters {
			c.inv.jobDone(job, err)
		}
		if err != nil {
			p.logf("job %s: %v", job, err)
		} else {
			p.logf("job %s done: %s", job, strings.TrimSpace(out))
		}
	}
	p.t.Cleanup(func() { cancel(); wait() })
	c := p.addCluster(namespace, name, node, share)
	p.t.Cleanup(c.logWarnings)
	return c
}

// Beside is another EtcdCluster, name, in c's namespace and on its node: a restore beside the
// cluster it restores, or a neighbour whose objects c's accounts must not reach. Its name must
// not begin with c's name and a dash, so that Jobs and their pods tell the two apart by name.
func (c *Cluster) Beside(name string) *Cluster {
	c.Plane.t.Helper()
	if strings.HasPrefix(name, c.Name+"-") || strings.HasPrefix(c.Name, name+"-") {
		c.Plane.t.Fatalf("cluster %s beside %s: one name begins with the other's and a dash", name, c.Name)
	}
	return c.Plane.addCluster(c.Namespace, name, c.Node, c.node)
}

// addCluster registers a cluster of the node and starts checking its invariants.
func (p *Plane) addCluster(namespace, name string, node *harness.APINode, share *nodeShare) *Cluster {
	c := &Cluster{Plane: p, Namespace: namespace, Name: name, Node: node, node: share}
	c.inv = startInvariants(c)
	share.mu.Lock()
	share.clusters = append(share.clusters, c)
	share.mu.Unlock()
	p.clustersMu.Lock()
	p.clusters = append(p.clusters, c)
	p.clustersMu.Unlock()
	return c
}

// Jobs are the Job pods the cluster's node ran so far (of every cluster on it).
func (c *Cluster) Jobs() []JobRun {
	c.node.mu.Lock()
	defer c.node.mu.Unlock()
	return append([]JobRun(nil), c.node.jobs...)
}

// UseTLS creates the PKI's Secrets in the cluster's namespace, as cert-manager would, and
// makes the cluster's clients (the workload's) present the application's certificate over
// https; the EtcdCluster names the Secrets in spec.tls.
func (c *Cluster) UseTLS(pki *harness.PKI) {
	c.Plane.t.Helper()
	for _, s := range pki.Secrets() {
		s.Namespace = c.Namespace
		if _, err := c.Plane.Client.CoreV1().Secrets(c.Namespace).Create(c.Plane.ctx, s, metav1.CreateOptions{}); err != nil {
			c.Plane.t.Fatalf("TLS Secret %s: %v", s.Name, err)
		}
	}
	c.pki = pki
}

// Apply creates or changes the EtcdCluster with `kubectl apply` of a manifest, as a user does.
func (c *Cluster) Apply(manifest string) {
	c.Plane.t.Helper()
	ctx, cancel := context.WithTimeout(c.Plane.ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Plane.Bins.Kubectl, "--kubeconfig="+c.Plane.Kubeconfig, "apply", "-n", c.Namespace, "-f", "-")
	cmd.Stdin = strings.NewReader(manifest)
	if out, err := cmd.CombinedOutput(); err != nil {
		c.Plane.t.Fatalf("kubectl apply of the EtcdCluster: %v\n%s", err, out)
	}
}

// Get reads the EtcdCluster.
func (c *Cluster) Get() (*v1alpha1.EtcdCluster, error) {
	ctx, cancel := context.WithTimeout(c.Plane.ctx, 10*time.Second)
	defer cancel()
	u, err := c.Plane.Dynamic.Resource(etcdClusters).Namespace(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var ec v1alpha1.EtcdCluster
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ec); err != nil {
		return nil, err
	}
	return &ec, nil
}

// WaitFor polls the EtcdCluster every 250ms until cond holds, at most bound; the error carries
// cond's last reason, the status and where the logs are.
func (c *Cluster) WaitFor(bound time.Duration, cond func(*v1alpha1.EtcdCluster) (bool, string)) (time.Duration, error) {
	start := time.Now()
	why := "not read yet"
	for time.Since(start) < bound {
		ec, err := c.Get()
		if err == nil {
			var ok bool
			if ok, why = cond(ec); ok {
				return time.Since(start), nil
			}
		} else {
			why = err.Error()
		}
		time.Sleep(250 * time.Millisecond)
	}
	return bound, fmt.Errorf("after %s: %s\n%s\nlogs: %s", bound, why, c.Describe(), c.Plane.Logs())
}

// Steady holds once the cluster runs size voters, all healthy and ready, nothing in flight,
// the StatefulSet rolled out, and the status is of the current generation.
func (c *Cluster) Steady(size int) func(*v1alpha1.EtcdCluster) (bool, string) {
	return func(ec *v1alpha1.EtcdCluster) (bool, string) {
		st := ec.Status
		switch {
		case st.ObservedGeneration != ec.Generation:
			return false, fmt.Sprintf("status of generation %d, not %d", st.ObservedGeneration, ec.Generation)
		case st.Phase != v1alpha1.PhaseRunning:
			return false, "phase " + string(st.Phase)
		case st.Action != nil && st.Action.Type != "Steady":
			return false, "action " + st.Action.Type + " " + st.Action.Member
		case int(st.ReadyMembers) != size || len(st.Members) != size:
			return false, fmt.Sprintf("%d ready of %d members", st.ReadyMembers, len(st.Members))
		case st.Leader == "":
			return false, "no leader"
		}
		for _, m := range st.Members {
			if m.IsLearner || !m.Healthy {
				return false, fmt.Sprintf("member %+v", m)
			}
		}
		ctx, cancel := context.WithTimeout(c.Plane.ctx, 10*time.Second)
		defer cancel()
		sts, err := c.Plane.Client.AppsV1().StatefulSets(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if sts.Status.ReadyReplicas != int32(size) || sts.Status.UpdatedReplicas != int32(size) || sts.Status.ObservedGeneration != sts.Generation {
			return false, fmt.Sprintf("StatefulSet %d ready, %d updated", sts.Status.ReadyReplicas, sts.Status.UpdatedReplicas)
		}
		return true, ""
	}
}

// Condition holds once the EtcdCluster's condition typ has status want.
func Condition(typ string, want metav1.ConditionStatus) func(*v1alpha1.EtcdCluster) (bool, string) {
	return func(ec *v1alpha1.EtcdCluster) (bool, string) {
		for _, cond := range ec.Status.Conditions {
			if cond.Type == typ {
				return cond.Status == want, fmt.Sprintf("%s=%s (%s: %s)", typ, cond.Status, cond.Reason, cond.Message)
			}
		}
		return false, "no condition " + typ
	}
}

// Describe is the EtcdCluster's status and its pods and claims, for failure messages.
func (c *Cluster) Describe() string {
	var b strings.Builder
	if ec, err := c.Get(); err == nil {
		fmt.Fprintf(&b, "EtcdCluster %s/%s generation %d: phase %s, action %+v, members %+v\n", c.Namespace, c.Name, ec.Generation, ec.Status.Phase, ec.Status.Action, ec.Status.Members)
		for _, cond := range ec.Status.Conditions {
			fmt.Fprintf(&b, "  %s=%s %s: %s\n", cond.Type, cond.Status, cond.Reason, cond.Message)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if pods, err := c.Plane.Client.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{}); err == nil {
		for _, p := range pods.Items {
			fmt.Fprintf(&b, "pod %s %s node=%q ip=%s deleting=%v\n", p.Name, p.Status.Phase, p.Spec.NodeName, p.Status.PodIP, p.DeletionTimestamp != nil)
		}
	}
	if claims, err := c.Plane.Client.CoreV1().PersistentVolumeClaims(c.Namespace).List(ctx, metav1.ListOptions{}); err == nil {
		for _, pvc := range claims.Items {
			q := pvc.Status.Capacity[corev1.ResourceStorage]
			fmt.Fprintf(&b, "claim %s %s capacity=%s conditions=%v\n", pvc.Name, pvc.Status.Phase, q.String(), pvc.Status.Conditions)
		}
	}
	return b.String()
}

// Pod is the name of the member pod of an ordinal.
func (c *Cluster) Pod(ordinal int) string { return fmt.Sprintf("%s-%d", c.Name, ordinal) }

// StatefulSet reads the cluster's StatefulSet.
func (c *Cluster) StatefulSet() (*appsv1.StatefulSet, error) {
	ctx, cancel := context.WithTimeout(c.Plane.ctx, 10*time.Second)
	defer cancel()
	return c.Plane.Client.AppsV1().StatefulSets(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
}

// PodUIDs are the member pods' UIDs by name.
func (c *Cluster) PodUIDs() map[string]string {
	ctx, cancel := context.WithTimeout(c.Plane.ctx, 10*time.Second)
	defer cancel()
	out := map[string]string{}
	pods, err := c.Plane.Client.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "etcdops.dev/cluster=" + c.Name})
	if err != nil {
		return out
	}
	for _, p := range pods.Items {
		if p.Labels["batch.kubernetes.io/job-name"] == "" {
			out[p.Name] = string(p.UID)
		}
	}
	return out
}

// Kill crashes a member's etcd (SIGKILL); the node restarts it after back-off.
func (c *Cluster) Kill(pod string) error { return c.Node.Kubelet.Kill(pod) }

// DeletePod deletes a member's pod through the API server, as kubectl delete pod does.
func (c *Cluster) DeletePod(pod string) error {
	ctx, cancel := context.WithTimeout(c.Plane.ctx, 10*time.Second)
	defer cancel()
	err := c.Plane.Client.CoreV1().Pods(c.Namespace).Delete(ctx, pod, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// ClientURL is a member's client URL by its DNS name, which the node's cluster DNS answers;
// https with TLS (UseTLS).
func (c *Cluster) ClientURL(pod string) string {
	scheme := "http"
	if c.pki != nil {
		scheme = "https"
	}
	return fmt.Sprintf("%s://%s.%s.%s.svc.cluster.local:2379", scheme, pod, c.Name, c.Namespace)
}

// ClientURLs are the voters' client URLs, as the status lists them (every pod's before there
// is a status).
func (c *Cluster) ClientURLs() []string {
	var out []string
	if ec, err := c.Get(); err == nil {
		for _, m := range ec.Status.Members {
			if !m.IsLearner {
				out = append(out, c.ClientURL(m.Name))
			}
		}
	}
	if len(out) == 0 {
		out = []string{c.ClientURL(c.Pod(0))}
	}
	return out
}

// ClientConfig is an application's client configuration for the voters: with TLS, the
// application's certificate, the server's verified against the PKI's CA.
func (c *Cluster) ClientConfig() clientv3.Config {
	cfg := clientv3.Config{Endpoints: c.ClientURLs(), DialTimeout: time.Second, Logger: zap.NewNop()}
	if c.pki != nil {
		cfg.TLS = c.pki.ClientTLS()
	}
	return cfg
}

// Annotate sets an annotation on the EtcdCluster, as kubectl annotate does: a change that
// makes Metacontroller sync it and that the hook's answer does not depend on.
func (c *Cluster) Annotate(key, value string) error {
	_, err := c.Plane.Kubectl("annotate", "-n", c.Namespace, "--overwrite", "etcdcluster/"+c.Name, key+"="+value)
	return err
}

// warningsSince are the Warning events on the cluster's objects last seen at or after t.
func (c *Cluster) warningsSince(t time.Time) []string {
	ctx, cancel := context.WithTimeout(c.Plane.ctx, 10*time.Second)
	defer cancel()
	events, err := c.Plane.Client.CoreV1().Events(c.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"})
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, e := range events.Items {
		if !c.owns(e.InvolvedObject.Name) {
			continue
		}
		if !e.LastTimestamp.Time.Before(t.Truncate(time.Second)) {
			out = append(out, fmt.Sprintf("x%d on %s %s: %s: %s", e.Count, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message))
		}
	}
	return out
}

// owns: an object of this name is the cluster's (the EtcdCluster, its children, pods and Jobs
// by their names, its claims).
func (c *Cluster) owns(name string) bool {
	return name == c.Name || strings.HasPrefix(name, c.Name+"-") || c.ownClaim(name)
}

// ownClaim: name is the claim of one of the cluster's members.
func (c *Cluster) ownClaim(name string) bool {
	pod, ok := strings.CutPrefix(name, "data-")
	_, own := sync.Ordinal(c.Name, pod)
	return ok && own
}

// logWarnings logs the Warning events of the cluster's namespace, once each with its count:
// what the real controllers (and Metacontroller, on the EtcdCluster) had to say.
func (c *Cluster) logWarnings() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	events, err := c.Plane.Client.CoreV1().Events(c.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"})
	if err != nil {
		c.Plane.logf("warning events of %s: %v", c.Namespace, err)
		return
	}
	for _, e := range events.Items {
		c.Plane.logf("warning event x%d (%s to %s) on %s %s: %s: %s", e.Count, e.FirstTimestamp.Format(time.TimeOnly), e.LastTimestamp.Format(time.TimeOnly),
			e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
	}
}
