package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	gosync "sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"

	"etcdops.dev/etcdops/cmd/etcdops-member/membertool"
)

// APINode is the kubelet of one node of a real API server (the control-plane tier): the
// harness's Kubelet, run on a Store that mirrors the namespace's pods bound to the node and the
// ConfigMaps, Secrets and Services they read, with what the Kubelet writes to the Store sent
// back through the pods' status subresource. It also plays the scheduler for the namespace
// (binds each pod whose claims are bound to this node: there is one node) and runs the pods of
// Jobs itself, the member tool in-process with the pod's real service account token.
type APINode struct {
	Name      string
	Namespace string
	Client    kubernetes.Interface
	// Config reaches the API server; the pods' own clients take its host and CA.
	Config  *rest.Config
	Kubelet *Kubelet
	Store   *Store
	Tools   Tools
	Root    string
	Logf    func(format string, args ...any)
	// BeforeJob hears of every Job pod about to run the member tool: its Job and arguments.
	BeforeJob func(job string, args []string)
	// OnJob hears of every Job pod that ran: its Job, arguments, output and error.
	OnJob func(job string, args []string, out string, err error)

	pods        listersv1.PodLister
	configMaps  listersv1.ConfigMapLister
	secrets     listersv1.SecretLister
	services    listersv1.ServiceLister
	claims      listersv1.PersistentVolumeClaimLister
	kick        chan struct{}
	volumesRoot string

	mu       gosync.Mutex
	mirrored map[types.UID]bool
	pushed   map[types.UID]string // the last status sent, as JSON
	jobs     map[types.UID]bool
	streams  map[types.UID]*streamRun
	tokens   map[string][]byte // by pod UID and audience
	work     gosync.WaitGroup
}

// APINodeOptions configure an APINode.
type APINodeOptions struct {
	Name, Namespace, Domain, Root string
	Client                        kubernetes.Interface
	Config                        *rest.Config
	Tools                         Tools
	// VolumesRoot holds a directory per PersistentVolume, by name (CSIDriver's Root).
	VolumesRoot string
	EtcdBinary  EtcdBinaryForImage
	TimeScale   float64
	Logf        func(format string, args ...any)
}

// StartAPINode registers the node and runs its kubelet until ctx ends; the returned function
// waits for it to have stopped every process it started.
func StartAPINode(ctx context.Context, o APINodeOptions) (*APINode, func(), error) {
	dns, err := ClusterDNS()
	if err != nil {
		return nil, nil, err
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if err := os.MkdirAll(filepath.Join(o.Root, "pods"), 0o755); err != nil {
		return nil, nil, err
	}
	n := &APINode{Name: o.Name, Namespace: o.Namespace, Client: o.Client, Config: o.Config, Tools: o.Tools, Root: o.Root, Logf: o.Logf,
		Store: NewStore(o.Namespace), kick: make(chan struct{}, 1),
		mirrored: map[types.UID]bool{}, pushed: map[types.UID]string{}, jobs: map[types.UID]bool{}, streams: map[types.UID]*streamRun{},
		tokens: map[string][]byte{}}
	n.volumesRoot = o.VolumesRoot
	n.Kubelet = NewKubelet(n.Store, n, dns, o.Tools, o.Domain, o.Root, o.TimeScale)
	n.Kubelet.Logf = o.Logf
	n.Kubelet.EtcdBinary = o.EtcdBinary
	n.Kubelet.Token = n.token
	if err := n.register(ctx); err != nil {
		return nil, nil, fmt.Errorf("registering node %s: %w", n.Name, err)
	}
	f := informers.NewSharedInformerFactoryWithOptions(o.Client, 0, informers.WithNamespace(o.Namespace))
	n.pods = f.Core().V1().Pods().Lister()
	n.configMaps = f.Core().V1().ConfigMaps().Lister()
	n.secrets = f.Core().V1().Secrets().Lister()
	n.services = f.Core().V1().Services().Lister()
	n.claims = f.Core().V1().PersistentVolumeClaims().Lister()
	for _, inf := range []func() error{
		func() error { _, err := f.Core().V1().Pods().Informer().AddEventHandler(n.handler()); return err },
		func() error { _, err := f.Core().V1().ConfigMaps().Informer().AddEventHandler(n.handler()); return err },
		func() error { _, err := f.Core().V1().Secrets().Informer().AddEventHandler(n.handler()); return err },
		func() error { _, err := f.Core().V1().Services().Informer().AddEventHandler(n.handler()); return err },
		func() error {
			_, err := f.Core().V1().PersistentVolumeClaims().Informer().AddEventHandler(n.handler())
			return err
		},
	} {
		if err := inf(); err != nil {
			return nil, nil, err
		}
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, nil, fmt.Errorf("node %s: the %v informer did not sync", n.Name, typ)
		}
	}
	kubeletCtx, stopKubelet := context.WithCancel(context.Background())
	n.work.Add(2)
	go func() {
		defer n.work.Done()
		n.Kubelet.Run(kubeletCtx)
	}()
	go func() {
		defer n.work.Done()
		defer stopKubelet()
		n.run(ctx)
	}()
	return n, func() { n.work.Wait(); f.Shutdown() }, nil
}

// VolumeDir is the directory of the volume a claim of the namespace is bound to.
func (n *APINode) VolumeDir(claim string) string {
	c, err := n.claims.PersistentVolumeClaims(n.Namespace).Get(claim)
	if err != nil || c.Status.Phase != corev1.ClaimBound || c.Spec.VolumeName == "" {
		return ""
	}
	return filepath.Join(n.volumesRoot, c.Spec.VolumeName)
}

// View looks at cluster's members from inside the etcd servers of its pods on this node, as
// Monitor.View does in the end-to-end tier: membership from the server that has applied the
// most, the leader from the one with the highest term.
func (n *APINode) View(cluster string) View {
	servers := map[string]etcdServer{}
	for name, s := range n.Kubelet.servers() {
		if _, ok := podOrdinal(cluster, name); ok {
			servers[name] = s
		}
	}
	return viewOf(servers, nil)
}

// register creates the Node, Ready, with the loopback address.
func (n *APINode) register(ctx context.Context) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{"kubernetes.io/hostname": n.Name}}}
	created, err := n.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	capacity := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("24Gi"), corev1.ResourcePods: resource.MustParse("110")}
	created.Status = corev1.NodeStatus{Capacity: capacity, Allocatable: capacity,
		Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: n.Name}},
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}}
	_, err = n.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return err
}

func (n *APINode) handler() informerHandler { return informerHandler{n.poke} }

// informerHandler pokes a loop on every event of an informer.
type informerHandler struct{ poke func() }

func (h informerHandler) OnAdd(any, bool)   { h.poke() }
func (h informerHandler) OnUpdate(any, any) { h.poke() }
func (h informerHandler) OnDelete(any)      { h.poke() }

func (n *APINode) poke() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// run keeps the Store and the API server in step until ctx ends: on every change of either,
// and at least every second.
func (n *APINode) run(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		changed := n.Store.Changed()
		n.sync(ctx)
		select {
		case <-ctx.Done():
			return
		case <-n.kick:
		case <-changed:
		case <-tick.C:
		}
	}
}

func (n *APINode) sync(ctx context.Context) {
	all, err := n.pods.Pods(n.Namespace).List(labels.Everything())
	if err != nil {
		return
	}
	ours := map[string]*corev1.Pod{}
	for _, p := range all {
		switch {
		case p.Spec.NodeName == "":
			n.bind(ctx, p)
		case p.Spec.NodeName != n.Name:
		case isJobPod(p):
			n.startJob(ctx, p)
		default:
			ours[p.Name] = p
		}
	}
	for name, p := range ours {
		o, inStore := n.Store.Get("Pod", name)
		n.mu.Lock()
		seen := n.mirrored[p.UID]
		n.mu.Unlock()
		if p.DeletionTimestamp != nil && seen && (!inStore || o.GetUID() != p.UID) {
			// The kubelet stopped the container of a deleted pod: the pod goes for good.
			err := n.Client.CoreV1().Pods(n.Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0)), Preconditions: &metav1.Preconditions{UID: &p.UID}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				n.Logf("node %s: deleting pod %s: %v", n.Name, name, err)
			}
			delete(ours, name)
			continue
		}
		mirror := p.DeepCopy()
		if inStore && o.GetUID() == p.UID {
			mirror.Status = o.(*corev1.Pod).Status
		}
		n.Store.Put(mirror)
		n.mu.Lock()
		n.mirrored[p.UID] = true
		n.mu.Unlock()
	}
	for _, o := range n.Store.List("Pod") {
		if p, ok := ours[o.GetName()]; !ok || p.UID != o.GetUID() {
			n.Store.Remove("Pod", o.GetName())
		}
	}
	n.syncStreams(ctx, ours)
	n.mirrorKind("ConfigMap", func() ([]Object, error) {
		return objects(n.configMaps.ConfigMaps(n.Namespace).List(labels.Everything()))
	})
	n.mirrorKind("Secret", func() ([]Object, error) { return objects(n.secrets.Secrets(n.Namespace).List(labels.Everything())) })
	n.mirrorKind("Service", func() ([]Object, error) { return objects(n.services.Services(n.Namespace).List(labels.Everything())) })
	for _, o := range n.Store.List("Pod") {
		if p, ok := ours[o.GetName()]; ok && p.UID == o.GetUID() {
			n.pushStatus(ctx, p, o.(*corev1.Pod).Status)
		}
	}
}

func objects[T Object](list []T, err error) ([]Object, error) {
	out := make([]Object, len(list))
	for i, o := range list {
		out[i] = o
	}
	return out, err
}

// mirrorKind puts every object of kind the API server has into the Store and removes the
// others.
func (n *APINode) mirrorKind(kind string, list func() ([]Object, error)) {
	objs, err := list()
	if err != nil {
		return
	}
	names := map[string]bool{}
	for _, o := range objs {
		names[o.GetName()] = true
		n.Store.Put(o)
	}
	for _, o := range n.Store.List(kind) {
		if !names[o.GetName()] {
			n.Store.Remove(kind, o.GetName())
		}
	}
}

// bind plays the scheduler: a pod whose claims are all bound goes to this node.
func (n *APINode) bind(ctx context.Context, p *corev1.Pod) {
	if p.DeletionTimestamp != nil {
		return
	}
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		c, err := n.claims.PersistentVolumeClaims(n.Namespace).Get(v.PersistentVolumeClaim.ClaimName)
		if err != nil || c.Status.Phase != corev1.ClaimBound {
			return
		}
	}
	b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID},
		Target: corev1.ObjectReference{Kind: "Node", Name: n.Name}}
	if err := n.Client.CoreV1().Pods(p.Namespace).Bind(ctx, b, metav1.CreateOptions{}); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		n.Logf("node %s: binding pod %s: %v", n.Name, p.Name, err)
	}
}

// pushStatus sends the kubelet's status of a pod through the status subresource when it
// changed since the last one sent; the fields the kubelet does not own (qosClass) stay.
func (n *APINode) pushStatus(ctx context.Context, p *corev1.Pod, st corev1.PodStatus) {
	if st.Phase == "" {
		return
	}
	b, _ := json.Marshal(st)
	n.mu.Lock()
	same := n.pushed[p.UID] == string(b)
	n.mu.Unlock()
	if same {
		return
	}
	next := p.DeepCopy()
	st.QOSClass = p.Status.QOSClass
	if st.StartTime == nil {
		st.StartTime = p.Status.StartTime
		if st.StartTime == nil {
			st.StartTime = ptr(metav1.NewTime(time.Now().Truncate(time.Second)))
		}
	}
	next.Status = st
	if _, err := n.Client.CoreV1().Pods(n.Namespace).UpdateStatus(ctx, next, metav1.UpdateOptions{}); err != nil {
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			n.Logf("node %s: pod %s status: %v", n.Name, p.Name, err)
		}
		return
	}
	n.mu.Lock()
	n.pushed[p.UID] = string(b)
	n.mu.Unlock()
}

// token issues the pod's service account token through the TokenRequest API, bound to the
// pod, once per pod and audience.
func (n *APINode) token(p *corev1.Pod, src *corev1.ServiceAccountTokenProjection) ([]byte, error) {
	key := string(p.UID) + "/" + src.Audience
	n.mu.Lock()
	tok, ok := n.tokens[key]
	n.mu.Unlock()
	if ok {
		return tok, nil
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: src.ExpirationSeconds,
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID}}}
	if src.Audience != "" {
		req.Spec.Audiences = []string{src.Audience}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	account := p.Spec.ServiceAccountName
	if account == "" {
		account = "default"
	}
	resp, err := n.Client.CoreV1().ServiceAccounts(p.Namespace).CreateToken(ctx, account, req, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.tokens[key] = []byte(resp.Status.Token)
	n.mu.Unlock()
	return []byte(resp.Status.Token), nil
}

// serviceAccountDir is where a pod's service account token, CA and namespace are mounted.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

func (n *APINode) startJob(ctx context.Context, p *corev1.Pod) {
	if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.jobs[p.UID] || ctx.Err() != nil {
		return
	}
	n.jobs[p.UID] = true
	n.work.Add(1)
	go func() {
		defer n.work.Done()
		n.runJob(ctx, p.DeepCopy())
	}()
}

// runJob runs a Job pod's container, the member tool, in-process: its arguments mapped onto
// the pod's volumes, its API client (expand-claim, restart-pod) built from the token mounted
// at the service account's path, as client-go's in-cluster configuration reads it. The pod
// reports Running, then Succeeded or Failed with the container's termination message.
func (n *APINode) runJob(ctx context.Context, p *corev1.Pod) {
	dir := filepath.Join(n.Root, "pods", p.Name+"-"+string(p.UID)[len(p.UID)-6:])
	started := metav1.NewTime(time.Now().Truncate(time.Second))
	c := p.Spec.Containers[0]
	n.writeJobStatus(ctx, p, corev1.PodStatus{Phase: corev1.PodRunning, StartTime: &started,
		ContainerStatuses: []corev1.ContainerStatus{{Name: c.Name, Image: c.Image, ImageID: c.Image, Started: ptr(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}}}})
	argv := append(append([]string(nil), c.Command...), c.Args...)
	var out, logFile string
	var err error
	if len(argv) < 2 || path.Base(argv[0]) != toolBinary {
		err = fmt.Errorf("pod %s: the harness runs only %s, got %q", p.Name, toolBinary, argv)
	}
	var mounts map[string]string
	if err == nil {
		mounts, err = n.Kubelet.jobMounts(p, dir)
	}
	jobCtx := ctx
	if err == nil {
		logFile = mounts[terminationLog]
		for i := range argv {
			argv[i] = rewritePath(argv[i], mounts)
		}
		if slices.ContainsFunc(argv, func(a string) bool { return strings.HasPrefix(a, "--etcd=") }) {
			// A restore drill runs the etcd pods' image; its --etcd is that image's binary.
			argv = withImageEtcd(argv, nil, c.Image, n.Kubelet.etcdBinaryFor, n.Logf)
		}
		if sa, ok := mounts[serviceAccountDir]; ok {
			var claims membertool.Claims
			if claims, err = n.podClaims(sa); err == nil {
				jobCtx = withClaims(ctx, claims)
			}
		}
	}
	job := p.Labels[batchv1.JobNameLabel]
	if err == nil {
		if n.BeforeJob != nil {
			n.BeforeJob(job, argv)
		}
		out, err = n.Tools.Member(jobCtx, argv[1:])
	}
	if ctx.Err() != nil {
		return
	}
	if n.OnJob != nil {
		n.OnJob(job, argv, out, err)
	}
	if err != nil {
		n.Logf("node %s: job pod %s failed: %v", n.Name, p.Name, err)
	}
	st := corev1.PodStatus{Phase: corev1.PodSucceeded, StartTime: &started}
	if err != nil {
		st.Phase = corev1.PodFailed
	}
	done := p.DeepCopy()
	terminated(done, logFile, err)
	st.ContainerStatuses = done.Status.ContainerStatuses
	st.ContainerStatuses[0].Image, st.ContainerStatuses[0].ImageID = c.Image, c.Image
	st.ContainerStatuses[0].State.Terminated.StartedAt = started
	st.ContainerStatuses[0].State.Terminated.FinishedAt = metav1.NewTime(time.Now().Truncate(time.Second))
	n.writeJobStatus(ctx, p, st)
}

// podClaims is the member tool's client of the API server as the pod's service account,
// from the token and CA mounted in dir.
func (n *APINode) podClaims(dir string) (membertool.Claims, error) {
	tok, err := os.ReadFile(filepath.Join(dir, "token"))
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, err
	}
	return membertool.NewKubeClaims(&rest.Config{Host: n.Config.Host, BearerToken: string(tok), TLSClientConfig: rest.TLSClientConfig{CAData: ca}})
}

// writeJobStatus writes a Job pod's status, retrying conflicts for a while.
func (n *APINode) writeJobStatus(ctx context.Context, p *corev1.Pod, st corev1.PodStatus) {
	for range 20 {
		cur, err := n.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil || cur.UID != p.UID {
			return
		}
		st.QOSClass = cur.Status.QOSClass
		st.HostIP, st.HostIPs = "127.0.0.1", []corev1.HostIP{{IP: "127.0.0.1"}}
		now := metav1.NewTime(time.Now().Truncate(time.Second))
		ready := corev1.ConditionFalse
		if st.Phase == corev1.PodRunning {
			ready = corev1.ConditionTrue
		}
		st.Conditions = []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: ready, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: ready, LastTransitionTime: now},
		}
		cur.Status = st
		_, err = n.Client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		if err == nil || !apierrors.IsConflict(err) {
			if err != nil {
				n.Logf("node %s: job pod %s status: %v", n.Name, p.Name, err)
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}
