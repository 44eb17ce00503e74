package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	gosync "sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/version"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"etcdops.dev/etcdops/test/etcdbin"
)

// Tools are the operator's binaries, run in-process.
type Tools struct {
	// Launch is `etcdops-member launch` up to the point where it would exec etcd: it takes the
	// arguments after the binary name and returns etcd's arguments.
	Launch func(ctx context.Context, args []string) ([]string, error)
	// Member runs one member Job subcommand (the arguments after the binary name) and
	// returns what it printed on success.
	Member func(ctx context.Context, args []string) (string, error)
}

// ContainerExited is a container that ended on its own with a termination message (exit
// code 0), as the launcher's does once after a restore; the kubelet keeps the message in the
// container's last state and restarts it.
type ContainerExited struct{ Message string }

func (e ContainerExited) Error() string { return "exited: " + e.Message }

// toolBinary is the basename of the member tool in images.
const toolBinary = "etcdops-member"

// Kubelet plays the kubelet (and the container runtime, and the endpoints controller plus
// cluster DNS) for etcd pods: each pod gets its own loopback address, its volumes are
// directories, its container runs the launcher in-process and then a real embedded etcd
// member. Init containers are not run: they only copy the member tool's binary, which here is
// linked into the test. Pods of Jobs are run by the Job controller (Jobs), or by APINode on a
// real API server.
type Kubelet struct {
	Store *Store
	// Volumes finds the directory of each bound claim: the StatefulSet controller's volumes
	// here, the CSI driver's on a real API server (APINode).
	Volumes VolumeDirs
	DNS     *DNS
	Tools   Tools
	Domain  string
	// TimeScale shrinks probe periods and crash-loop back-off; see Options.TimeScale.
	TimeScale float64
	// Root holds per-pod directories (emptyDir, projected ConfigMaps and Secrets).
	Root string
	// Logf receives container starts and exits.
	Logf func(format string, args ...any)
	// OnPanic hears of every etcd member that panicked, with etcd's message.
	OnPanic func(pod, msg string)
	// PendingFor, when set, is how long a new pod stays Pending before its container starts
	// (its image pulling, its volume attaching), by pod name, scaled by TimeScale; each
	// incarnation asks again.
	PendingFor func(pod string) time.Duration
	// MountDelay, when set, is how seldom the kubelet refreshes the mounted ConfigMaps and
	// Secrets of the pod of ordinal 0 (scaled by TimeScale); each higher ordinal waits a
	// quarter of it longer. A new pod mounts them as they are; a pod whose node is cut off is
	// not refreshed, and one whose node comes back is refreshed a delay later. Zero refreshes
	// on every pass. Set it before Run, or with SetMountDelay.
	MountDelay time.Duration
	// Token, when set, issues the service account token of a projected volume's
	// serviceAccountToken source (the TokenRequest API); without it such a volume is refused.
	Token func(p *corev1.Pod, src *corev1.ServiceAccountTokenProjection) ([]byte, error)
	// EtcdBinary, when set, runs each etcd container as a real etcd process of the binary
	// it returns for the pod's image (etcdproc.go); otherwise members are embedded.
	EtcdBinary EtcdBinaryForImage
	// Login, when set, is the etcd user the harness's own clients of real etcd processes
	// log in as (Env.UseLogin): etcd v3.6 on answers Status and the member list only to a
	// client that logged in once its auth is on.
	Login func() (user, password string)

	mu      gosync.Mutex
	closed  bool
	work    gosync.WaitGroup // container starts and stops in flight
	pods    map[types.UID]*podRuntime
	dnsKeys map[string]bool
	probe   *http.Client

	defragHolds defragHolds // HoldNextDefragment (defrag.go)

	// attach is how much longer the next incarnation of a pod stays Pending, by pod name:
	// its volume moving to another node (Moved).
	attach map[string]time.Duration
}

// podRuntime is what the kubelet keeps of one pod incarnation.
type podRuntime struct {
	name     string
	ip       string
	dir      string
	proc     *etcdProcess
	starting bool
	restarts int32
	next     time.Time // earliest restart (crash-loop back-off)
	held     bool      // restarts refused: the pod's node is cut off
	ready    bool
	lastErr  string
	// lastExit is how the container last ended on its own with a termination message.
	lastExit *corev1.ContainerStateTerminated
	stopping bool
	liveFail int
	started  time.Time
	// nextReady and nextLive are when the readiness and liveness probes run next.
	nextReady, nextLive time.Time
	// pendingUntil: the pod is Pending (image pull, volume attach) until then.
	pendingUntil time.Time
	// refreshed is when each projected volume was last written from its source.
	refreshed map[string]time.Time
	// mounted: the pod's Secret volumes were set up once; its container started since.
	mounted bool
}

// VolumeDirs finds the directory that backs a bound claim, "" when it is not bound.
type VolumeDirs interface {
	VolumeDir(claim string) string
}

// NewKubelet returns a kubelet for the store's pods.
func NewKubelet(s *Store, volumes VolumeDirs, dns *DNS, tools Tools, domain, root string, timeScale float64) *Kubelet {
	return &Kubelet{Store: s, Volumes: volumes, DNS: dns, Tools: tools, Domain: domain, Root: root, TimeScale: timeScale, Logf: func(string, ...any) {}, OnPanic: func(string, string) {},
		pods: map[types.UID]*podRuntime{}, dnsKeys: map[string]bool{},
		probe: &http.Client{Timeout: 500 * time.Millisecond}}
}

// Run syncs pods on every change and probes them periodically until ctx ends; then it stops
// every member.
func (k *Kubelet) Run(ctx context.Context) {
	runOnChange(ctx, k.Store, k.scaled(time.Second), func() { k.syncPods(ctx) })
	// Members die first: a start in flight may be waiting for a volume one of them holds,
	// and a start that completes after this kills what it started.
	k.mu.Lock()
	k.closed = true
	var procs []*etcdProcess
	for _, rt := range k.pods {
		if rt.proc != nil {
			procs = append(procs, rt.proc)
		}
	}
	k.mu.Unlock()
	for _, p := range procs {
		p.Kill()
	}
	k.work.Wait()
}

func (k *Kubelet) scaled(d time.Duration) time.Duration {
	return max(time.Duration(float64(d)*k.TimeScale), 10*time.Millisecond)
}

// lastIP numbers the pod addresses handed out in this process. It starts from a block drawn
// from the process ID: test processes running side by side on one machine (several packages,
// several checkouts) would otherwise hand out the same addresses, and one's hook would find
// the other's members.
var lastIP = func() *atomic.Int64 {
	var n atomic.Int64
	n.Store(int64(os.Getpid()%200) * 62500)
	return &n
}()

// allocateIP hands out 127.x.y.z, a fresh address per pod incarnation in this process (as a
// CNI would hand out a new pod IP), so that no address is ever reused by another member. An
// address whose etcd ports another process holds is skipped.
func allocateIP() string {
	for {
		n := lastIP.Add(1)
		ip := fmt.Sprintf("127.%d.%d.%d", 1+n/62500, 1+n/250%250, 1+n%250)
		if portsFree(ip) {
			return ip
		}
	}
}

func portsFree(ip string) bool {
	for _, port := range []string{"2379", "2380", "2381"} {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, port))
		if err != nil {
			return false
		}
		ln.Close()
	}
	return true
}

func isJobPod(p *corev1.Pod) bool { return p.Labels[batchv1.JobNameLabel] != "" }

func (k *Kubelet) syncPods(ctx context.Context) {
	seen := map[types.UID]bool{}
	for _, o := range k.Store.List("Pod") {
		p := o.(*corev1.Pod)
		if isJobPod(p) || isStreamPod(p) {
			continue
		}
		seen[p.UID] = true
		k.syncPod(ctx, p)
	}
	k.mu.Lock()
	for uid, rt := range k.pods {
		if !seen[uid] && !rt.stopping {
			// The pod is gone without a graceful deletion (forced): its container dies,
			// and one still starting is killed once it has started (see start), so that
			// no etcd outlives its pod and keeps the volume from the pod's next incarnation.
			rt.stopping = true
			if proc := rt.proc; proc != nil {
				k.work.Add(1)
				go func() {
					defer k.work.Done()
					proc.Kill()
				}()
			}
			delete(k.pods, uid)
		}
	}
	k.mu.Unlock()
	k.syncDNS()
}

func (k *Kubelet) syncPod(ctx context.Context, p *corev1.Pod) {
	k.mu.Lock()
	rt, ok := k.pods[p.UID]
	if !ok {
		rt = &podRuntime{name: p.Name, ip: allocateIP()}
		pending := k.attach[p.Name]
		delete(k.attach, p.Name)
		if k.PendingFor != nil {
			pending += k.PendingFor(p.Name)
		}
		// Not k.scaled: no delay stays no delay.
		rt.pendingUntil = time.Now().Add(time.Duration(float64(pending) * k.TimeScale))
		rt.dir = filepath.Join(k.Root, "pods", p.Name+"-"+string(p.UID)[len(p.UID)-6:])
		k.pods[p.UID] = rt
	}
	k.mu.Unlock()

	if p.DeletionTimestamp != nil {
		k.terminate(p, rt)
		return
	}
	if err := k.projectVolumes(p, rt); err != nil {
		k.setLastErr(rt, err)
	}
	if why := k.unmountable(p, rt); why != "" {
		k.setLastErr(rt, errors.New(why))
		k.writePending(p, rt)
		return
	}
	k.mu.Lock()
	pending := time.Now().Before(rt.pendingUntil)
	startNow := !pending && !rt.starting && !rt.held && (rt.proc == nil || rt.proc.Exited()) && !time.Now().Before(rt.next)
	if rt.proc != nil && rt.proc.Exited() {
		// The container exited on its own: restartPolicy Always, with back-off.
		rt.lastErr = rt.proc.exitReason()
		rt.lastExit = nil
		k.Logf("pod %s (%s): %s", rt.name, rt.ip, rt.lastErr)
		if msg, ok := rt.proc.panicMessage(); ok {
			k.OnPanic(rt.name, msg)
		}
		rt.proc = nil
		rt.ready = false
		rt.restarts++
		rt.next = time.Now().Add(k.backoff(rt.restarts))
		startNow = false
	}
	if startNow && !k.closed {
		rt.starting = true
		k.work.Add(1)
		go func() {
			defer k.work.Done()
			k.start(ctx, p, rt)
		}()
	}
	k.mu.Unlock()
	k.probePod(p, rt)
	k.writeStatus(p, rt)
}

// unmountable says why a pod whose container never started cannot start yet: a Secret one
// of its volumes names (not optional) does not exist. A real kubelet then reports
// "MountVolume.SetUp failed" and keeps the pod ContainerCreating until the Secret is there; a
// pod that started keeps the files it mounted, whatever happens to the Secret.
func (k *Kubelet) unmountable(p *corev1.Pod, rt *podRuntime) string {
	k.mu.Lock()
	mounted := rt.mounted
	k.mu.Unlock()
	if mounted {
		return ""
	}
	for _, v := range p.Spec.Volumes {
		if s := v.Secret; s != nil && (s.Optional == nil || !*s.Optional) {
			if _, ok := k.Store.Get("Secret", s.SecretName); !ok {
				return fmt.Sprintf("MountVolume.SetUp failed for volume %q : secret %q not found", v.Name, s.SecretName)
			}
		}
	}
	k.mu.Lock()
	rt.mounted = true
	k.mu.Unlock()
	return ""
}

// backoff is the kubelet's crash-loop back-off: 10s doubling to 5 minutes, scaled.
func (k *Kubelet) backoff(restarts int32) time.Duration {
	d := 10 * time.Second
	for i := int32(1); i < restarts && d < 5*time.Minute; i++ {
		d *= 2
	}
	return k.scaled(min(d, 5*time.Minute))
}

func (k *Kubelet) setLastErr(rt *podRuntime, err error) {
	k.mu.Lock()
	rt.lastErr = err.Error()
	k.mu.Unlock()
}

// start runs the pod's one container: the launcher's decision, then etcd.
func (k *Kubelet) start(ctx context.Context, p *corev1.Pod, rt *podRuntime) {
	proc, err := k.runContainer(ctx, p, rt)
	if k.record(rt, proc, err) {
		proc.Kill()
	}
}

// record notes the outcome of a container start, and reports whether the process it started
// is unwanted: the node was cut off, the pod deleted or the kubelet stopped meanwhile.
func (k *Kubelet) record(rt *podRuntime, proc *etcdProcess, err error) (unwanted bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	rt.starting = false
	if err != nil {
		rt.lastErr = err.Error()
		// The last termination is this one: a message of an earlier one is gone.
		rt.lastExit = nil
		var exited ContainerExited
		if errors.As(err, &exited) {
			rt.lastExit = &corev1.ContainerStateTerminated{Reason: "Completed", Message: exited.Message, FinishedAt: metav1.NewTime(time.Now().Truncate(time.Second))}
		}
		k.Logf("pod %s (%s): container failed: %s", rt.name, rt.ip, rt.lastErr)
		rt.restarts++
		rt.next = time.Now().Add(k.backoff(rt.restarts))
		return false
	}
	if rt.held || rt.stopping || k.closed {
		return true
	}
	rt.proc = proc
	k.Logf("pod %s (%s): etcd started", rt.name, rt.ip)
	rt.lastErr = ""
	rt.liveFail = 0
	rt.started = time.Now()
	return false
}

func (k *Kubelet) runContainer(ctx context.Context, p *corev1.Pod, rt *podRuntime) (*etcdProcess, error) {
	if len(p.Spec.Containers) != 1 {
		return nil, fmt.Errorf("pod %s: the harness runs pods with one container, not %d", p.Name, len(p.Spec.Containers))
	}
	c := p.Spec.Containers[0]
	argv, err := k.containerArgv(p, rt, append(append([]string(nil), c.Command...), c.Args...), true)
	if err != nil {
		return nil, err
	}
	if len(argv) < 2 || path.Base(argv[0]) != toolBinary || argv[1] != "launch" {
		return nil, fmt.Errorf("pod %s: the harness runs etcd pods through `%s launch`, got %q", p.Name, toolBinary, argv)
	}
	etcdArgs, err := k.Tools.Launch(ctx, k.imageEtcd(c.Image, argv[1:]))
	if err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	return k.startContainerEtcd(c.Image, etcdArgs, rt)
}

// imageEtcd points launch's --etcd, the image's own etcd binary, at the binary that stands
// for it here, in a pod that may restore: only a restore runs it (the replay of stored
// changes). That is the real binary of the image's release with EtcdBinary, else that of the
// release the embedded members link (test/etcdbin), which then start on what it wrote. One that cannot be built leaves the flag as
// it is, and a replay then fails, naming the binary it did not find.
func (k *Kubelet) imageEtcd(image string, args []string) []string {
	end := slices.Index(args, "--")
	if end < 0 {
		end = len(args)
	}
	if !slices.ContainsFunc(args[:end], func(a string) bool { return strings.HasPrefix(a, "--restore-") }) {
		return args
	}
	return withImageEtcd(args[:end], args[end:], image, k.etcdBinaryFor, k.Logf)
}

// etcdBinaryFor is the etcd binary that stands here for an image's: the real binary of the
// image's release with EtcdBinary, else that of the release the embedded members link.
func (k *Kubelet) etcdBinaryFor(image string) (string, error) {
	if k.EtcdBinary != nil {
		return k.EtcdBinary(image)
	}
	return etcdbin.Path("v" + version.Version)
}

// withImageEtcd is flags, with its --etcd= pointed at the binary that stands for image's, then
// rest as it is. One that cannot be built leaves the flag as it is, and what runs it then fails,
// naming the binary it did not find.
func withImageEtcd(flags, rest []string, image string, binaryFor func(string) (string, error), logf func(string, ...any)) []string {
	bin, err := binaryFor(image)
	if err != nil {
		logf("image %s: no etcd binary for --etcd: %v", image, err)
		return append(slices.Clone(flags), rest...)
	}
	out := append(slices.Clone(flags), rest...)
	for i, a := range out[:len(flags)] {
		if strings.HasPrefix(a, "--etcd=") {
			out[i] = "--etcd=" + bin
		}
	}
	return out
}

// containerArgv is a command as the container runs it: $(VAR) expanded from the container's
// environment when expandEnv (the kubelet expands a container's command, not an exec probe's,
// which reads its environment itself), container paths mapped onto the pod's directories.
func (k *Kubelet) containerArgv(p *corev1.Pod, rt *podRuntime, cmd []string, expandEnv bool) ([]string, error) {
	c := p.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			v, err := fieldRef(p, rt, e.ValueFrom.FieldRef.FieldPath)
			if err != nil {
				return nil, err
			}
			env[e.Name] = v
		case e.ValueFrom != nil:
			return nil, fmt.Errorf("pod %s: env %s: only fieldRef is supported", p.Name, e.Name)
		default:
			env[e.Name] = expand(e.Value, env)
		}
	}
	if !expandEnv {
		env = nil
	}
	mounts, err := k.mounts(p, rt, c)
	if err != nil {
		return nil, err
	}
	argv := make([]string, len(cmd))
	for i := range cmd {
		argv[i] = rewritePath(expand(cmd[i], env), mounts)
	}
	return argv, nil
}

func fieldRef(p *corev1.Pod, rt *podRuntime, field string) (string, error) {
	switch field {
	case "metadata.name":
		return p.Name, nil
	case "metadata.namespace":
		return p.Namespace, nil
	case "status.podIP":
		return rt.ip, nil
	case "metadata.uid":
		return string(p.UID), nil
	}
	return "", fmt.Errorf("pod %s: fieldRef %s is not supported by the harness", p.Name, field)
}

// expand does the kubelet's $(VAR) substitution; unknown references stay as written.
func expand(s string, env map[string]string) string {
	for name, v := range env {
		s = strings.ReplaceAll(s, "$("+name+")", v)
	}
	return s
}

// rewritePath maps container paths onto the host directories that back the mounts: in a
// --flag=value argument the value, otherwise the whole argument.
func rewritePath(arg string, mounts map[string]string) string {
	prefix, val := "", arg
	if strings.HasPrefix(arg, "-") {
		i := strings.Index(arg, "=")
		if i < 0 {
			return arg
		}
		prefix, val = arg[:i+1], arg[i+1:]
	}
	paths := make([]string, 0, len(mounts))
	for mp := range mounts {
		paths = append(paths, mp)
	}
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	for _, mp := range paths {
		if val == mp || strings.HasPrefix(val, mp+"/") {
			return prefix + mounts[mp] + val[len(mp):]
		}
	}
	return arg
}

// volumeDir is where a pod volume lives on the "node".
func (k *Kubelet) volumeDir(p *corev1.Pod, rt *podRuntime, v corev1.Volume) (string, error) {
	switch {
	case v.PersistentVolumeClaim != nil:
		dir := k.Volumes.VolumeDir(v.PersistentVolumeClaim.ClaimName)
		if dir == "" {
			return "", fmt.Errorf("pod %s: claim %s is not bound", p.Name, v.PersistentVolumeClaim.ClaimName)
		}
		return dir, nil
	case v.EmptyDir != nil, v.ConfigMap != nil, v.Secret != nil, v.Projected != nil:
		dir := filepath.Join(rt.dir, v.Name)
		return dir, os.MkdirAll(dir, 0o755)
	}
	return "", fmt.Errorf("pod %s: volume %s: unsupported source", p.Name, v.Name)
}

func (k *Kubelet) mounts(p *corev1.Pod, rt *podRuntime, c corev1.Container) (map[string]string, error) {
	out := map[string]string{}
	for _, m := range c.VolumeMounts {
		var dir string
		for _, v := range p.Spec.Volumes {
			if v.Name == m.Name {
				d, err := k.volumeDir(p, rt, v)
				if err != nil {
					return nil, err
				}
				dir = d
			}
		}
		if dir == "" {
			return nil, fmt.Errorf("pod %s: mount %s has no volume", p.Name, m.Name)
		}
		out[m.MountPath] = filepath.Join(dir, m.SubPath)
	}
	return out, nil
}

// projectVolumes writes ConfigMap and Secret volumes, refreshing them when their source
// changes: on every pass, or with MountDelay no sooner than the pod's delay after the last
// refresh, as a real kubelet does on its sync period (a minute or two, pod by pod).
func (k *Kubelet) projectVolumes(p *corev1.Pod, rt *podRuntime) error {
	k.mu.Lock()
	delay, held := k.mountDelay(p.Name), rt.held
	k.mu.Unlock()
	if held && delay > 0 {
		// Its node cannot reach the API server.
		return nil
	}
	for _, v := range p.Spec.Volumes {
		if v.ConfigMap == nil && v.Secret == nil && v.Projected == nil {
			continue
		}
		k.mu.Lock()
		last, ok := rt.refreshed[v.Name]
		k.mu.Unlock()
		if ok && time.Since(last) < delay {
			continue
		}
		var data map[string][]byte
		switch {
		case v.ConfigMap != nil:
			o, ok := k.Store.Get("ConfigMap", v.ConfigMap.Name)
			if !ok {
				continue
			}
			data = map[string][]byte{}
			for key, val := range o.(*corev1.ConfigMap).Data {
				data[key] = []byte(val)
			}
		case v.Secret != nil:
			o, ok := k.Store.Get("Secret", v.Secret.SecretName)
			if !ok {
				continue
			}
			data = o.(*corev1.Secret).Data
		default:
			var err error
			if data, err = k.projected(p, v.Projected); err != nil {
				return err
			}
		}
		dir, err := k.volumeDir(p, rt, v)
		if err != nil {
			return err
		}
		for key, val := range data {
			file := filepath.Join(dir, key)
			if old, err := os.ReadFile(file); err == nil && string(old) == string(val) {
				continue
			}
			tmp := file + ".tmp"
			if err := os.WriteFile(tmp, val, 0o644); err != nil {
				return err
			}
			if err := os.Rename(tmp, file); err != nil {
				return err
			}
		}
		k.mu.Lock()
		if rt.refreshed == nil {
			rt.refreshed = map[string]time.Time{}
		}
		rt.refreshed[v.Name] = time.Now()
		k.mu.Unlock()
	}
	return nil
}

// projected is the content of a projected volume as the admission plugin renders the
// service account's (kube-api-access-*): a token issued for the pod, a ConfigMap's keys, and
// the pod's namespace from the downward API.
func (k *Kubelet) projected(p *corev1.Pod, v *corev1.ProjectedVolumeSource) (map[string][]byte, error) {
	data := map[string][]byte{}
	for _, src := range v.Sources {
		switch {
		case src.ServiceAccountToken != nil:
			if k.Token == nil {
				return nil, fmt.Errorf("pod %s: no API server issues service account tokens here", p.Name)
			}
			tok, err := k.Token(p, src.ServiceAccountToken)
			if err != nil {
				return nil, fmt.Errorf("pod %s: service account token: %w", p.Name, err)
			}
			data[src.ServiceAccountToken.Path] = tok
		case src.ConfigMap != nil:
			o, ok := k.Store.Get("ConfigMap", src.ConfigMap.Name)
			if !ok {
				return nil, fmt.Errorf("pod %s: configmap %s not found", p.Name, src.ConfigMap.Name)
			}
			cm := o.(*corev1.ConfigMap)
			for _, item := range src.ConfigMap.Items {
				data[item.Path] = []byte(cm.Data[item.Key])
			}
		case src.DownwardAPI != nil:
			for _, item := range src.DownwardAPI.Items {
				if item.FieldRef == nil || item.FieldRef.FieldPath != "metadata.namespace" {
					return nil, fmt.Errorf("pod %s: downward API item %s is not supported by the harness", p.Name, item.Path)
				}
				data[item.Path] = []byte(p.Namespace)
			}
		default:
			return nil, fmt.Errorf("pod %s: projected volume source is not supported by the harness", p.Name)
		}
	}
	return data, nil
}

// SetMountDelay changes MountDelay while the kubelet runs.
func (k *Kubelet) SetMountDelay(d time.Duration) {
	k.mu.Lock()
	k.MountDelay = d
	k.mu.Unlock()
}

// mountDelay is how seldom the kubelet refreshes the mounted files of pod: MountDelay for
// ordinal 0, a quarter more for each higher ordinal, scaled; 0 without MountDelay. Called with
// k.mu held.
func (k *Kubelet) mountDelay(pod string) time.Duration {
	if k.MountDelay <= 0 {
		return 0
	}
	ord := 0
	if i := strings.LastIndex(pod, "-"); i >= 0 {
		fmt.Sscanf(pod[i+1:], "%d", &ord)
	}
	return k.scaled(k.MountDelay + time.Duration(ord)*k.MountDelay/4)
}

// probePod runs the container's readiness and liveness probes as the pod renders them, each
// on its own schedule: the initial delay, then one probe per period, each bounded by the
// probe's timeout, all scaled like the kubelet's other clocks; the container is killed once
// its liveness probe failed failureThreshold times in a row. Probes run inline, so a probe that
// hangs holds this pod's pass for at most its timeout.
func (k *Kubelet) probePod(p *corev1.Pod, rt *podRuntime) {
	k.mu.Lock()
	proc, started := rt.proc, rt.started
	k.mu.Unlock()
	c := p.Spec.Containers[0]
	if proc == nil || proc.Exited() {
		k.mu.Lock()
		rt.ready = false
		rt.nextReady, rt.nextLive = time.Time{}, time.Time{}
		k.mu.Unlock()
		return
	}
	now := time.Now()
	if k.due(c.ReadinessProbe, started, &rt.nextReady, now) {
		ready := k.probeOK(p, rt, c.ReadinessProbe)
		k.mu.Lock()
		rt.ready = ready
		k.mu.Unlock()
	}
	lp := c.LivenessProbe
	if lp == nil || !k.due(lp, started, &rt.nextLive, now) {
		return
	}
	live := k.probeOK(p, rt, lp)
	k.mu.Lock()
	if live {
		rt.liveFail = 0
	} else {
		rt.liveFail++
	}
	threshold := 3
	if lp.FailureThreshold > 0 {
		threshold = int(lp.FailureThreshold)
	}
	kill := rt.liveFail >= threshold
	if kill {
		rt.liveFail = 0
		k.Logf("pod %s (%s): liveness probe failed %d times: killing etcd", rt.name, rt.ip, threshold)
	}
	k.mu.Unlock()
	if kill {
		proc.Kill()
	}
}

// due reports whether probe pr of a container started at started runs now, and schedules the
// next one; next is the pod's own record of it. A container without the probe passes it at
// every pass, as with the kubelet.
func (k *Kubelet) due(pr *corev1.Probe, started time.Time, next *time.Time, now time.Time) bool {
	if pr == nil {
		return true
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if next.IsZero() {
		*next = started.Add(k.scaled(time.Duration(pr.InitialDelaySeconds) * time.Second))
	}
	if now.Before(*next) {
		return false
	}
	period := pr.PeriodSeconds
	if period <= 0 {
		period = 10
	}
	*next = now.Add(k.scaled(time.Duration(period) * time.Second))
	return true
}

// probeTimeout is the probe's timeoutSeconds (the kubelet's default is 1), scaled, and never
// below the harness's floor for a request on a loaded machine.
func (k *Kubelet) probeTimeout(pr *corev1.Probe) time.Duration {
	secs := pr.TimeoutSeconds
	if secs <= 0 {
		secs = 1
	}
	return max(k.scaled(time.Duration(secs)*time.Second), k.probe.Timeout)
}

// probeOK runs one probe: an HTTP GET on the pod's address, or an exec of the member tool
// (the one command the harness can run in a container), in-process with the pod's name and
// address, as its own environment and loopback would give them. A container without a probe
// passes, as with the kubelet.
func (k *Kubelet) probeOK(p *corev1.Pod, rt *podRuntime, pr *corev1.Probe) bool {
	if pr != nil && pr.Exec != nil {
		argv, err := k.containerArgv(p, rt, pr.Exec.Command, false)
		if err != nil || len(argv) < 2 || path.Base(argv[0]) != toolBinary {
			k.Logf("pod %s: exec probe %q not run by the harness: %v", rt.name, pr.Exec.Command, err)
			return false
		}
		args := append(argv[1:], "--name="+p.Name)
		for i, a := range args {
			args[i] = strings.Replace(a, "//127.0.0.1:", "//"+rt.ip+":", 1)
		}
		ctx, cancel := context.WithTimeout(context.Background(), k.probeTimeout(pr))
		defer cancel()
		_, err = k.Tools.Member(ctx, args)
		return err == nil
	}
	if pr == nil || pr.HTTPGet == nil {
		return true
	}
	scheme := strings.ToLower(string(pr.HTTPGet.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	url := fmt.Sprintf("%s://%s:%s%s", scheme, rt.ip, pr.HTTPGet.Port.String(), pr.HTTPGet.Path)
	ctx, cancel := context.WithTimeout(context.Background(), k.probeTimeout(pr))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := k.probe.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 400
}

func (k *Kubelet) writeStatus(p *corev1.Pod, rt *podRuntime) {
	k.mu.Lock()
	if time.Now().Before(rt.pendingUntil) {
		k.mu.Unlock()
		k.writePending(p, rt)
		return
	}
	running := rt.proc != nil && !rt.proc.Exited()
	st := corev1.PodStatus{Phase: corev1.PodRunning, PodIP: rt.ip, PodIPs: []corev1.PodIP{{IP: rt.ip}}, HostIP: "127.0.0.1"}
	cs := corev1.ContainerStatus{Name: p.Spec.Containers[0].Name, Image: p.Spec.Containers[0].Image, RestartCount: rt.restarts, Ready: rt.ready && running}
	if rt.lastExit != nil {
		cs.LastTerminationState.Terminated = rt.lastExit.DeepCopy()
	}
	if running {
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(rt.started.Truncate(time.Second))}
		cs.Started = ptr(true)
	} else {
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: rt.lastErr}
		if rt.restarts == 0 {
			cs.State.Waiting.Reason = "ContainerCreating"
		}
	}
	k.mu.Unlock()
	cond := corev1.ConditionFalse
	if cs.Ready {
		cond = corev1.ConditionTrue
	}
	st.ContainerStatuses = []corev1.ContainerStatus{cs}
	st.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue},
		{Type: corev1.ContainersReady, Status: cond},
		{Type: corev1.PodReady, Status: cond},
	}
	// Keep transition times stable so that an unchanged status is not a new write.
	for i := range st.Conditions {
		for _, old := range p.Status.Conditions {
			if old.Type == st.Conditions[i].Type && old.Status == st.Conditions[i].Status {
				st.Conditions[i].LastTransitionTime = old.LastTransitionTime
			}
		}
		if st.Conditions[i].LastTransitionTime.IsZero() {
			st.Conditions[i].LastTransitionTime = metav1.NewTime(time.Now().Truncate(time.Second))
		}
	}
	p.Status = st
	_ = k.Store.UpdateStatus(p)
}

// writePending reports a pod whose container cannot start yet: scheduled, its volume
// attaching or its image pulling, so no address and no container started.
func (k *Kubelet) writePending(p *corev1.Pod, rt *podRuntime) {
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	st := corev1.PodStatus{Phase: corev1.PodPending, HostIP: "127.0.0.1"}
	st.ContainerStatuses = []corev1.ContainerStatus{{Name: p.Spec.Containers[0].Name, Image: p.Spec.Containers[0].Image,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}
	st.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodInitialized, Status: corev1.ConditionFalse, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionFalse, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: now},
	}
	for i := range st.Conditions {
		for _, old := range p.Status.Conditions {
			if old.Type == st.Conditions[i].Type && old.Status == st.Conditions[i].Status {
				st.Conditions[i].LastTransitionTime = old.LastTransitionTime
			}
		}
	}
	p.Status = st
	_ = k.Store.UpdateStatus(p)
}

// terminate stops a deleted pod's container gracefully (SIGTERM) and then removes the pod.
func (k *Kubelet) terminate(p *corev1.Pod, rt *podRuntime) {
	k.mu.Lock()
	if rt.stopping {
		k.mu.Unlock()
		return
	}
	rt.stopping = true
	k.work.Add(1)
	k.mu.Unlock()
	go func() {
		defer k.work.Done()
		for {
			k.mu.Lock()
			starting, proc := rt.starting, rt.proc
			k.mu.Unlock()
			if !starting {
				if proc != nil {
					proc.Stop()
				}
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		k.Store.Remove("Pod", p.Name)
		k.mu.Lock()
		delete(k.pods, p.UID)
		k.mu.Unlock()
		os.RemoveAll(rt.dir)
	}()
}

// syncDNS keeps cluster DNS in step with Services and pods: a headless Service publishes
// <hostname>.<service> for each selected pod (not-ready ones too with
// publishNotReadyAddresses) and the Service name for all of them; a ClusterIP Service
// resolves to its ready pods, standing in for the virtual IP and kube-proxy.
func (k *Kubelet) syncDNS() {
	want := map[string][]netip.Addr{}
	pods := k.Store.List("Pod")
	for _, o := range k.Store.List("Service") {
		svc := o.(*corev1.Service)
		if len(svc.Spec.Selector) == 0 {
			continue
		}
		sel := labels.SelectorFromSet(svc.Spec.Selector)
		svcName := fmt.Sprintf("%s.%s.svc.%s", svc.Name, svc.Namespace, k.Domain)
		headless := svc.Spec.ClusterIP == corev1.ClusterIPNone
		for _, po := range pods {
			p := po.(*corev1.Pod)
			if p.Status.PodIP == "" || !sel.Matches(labels.Set(p.Labels)) {
				continue
			}
			ready := PodReady(p)
			if !ready && !(headless && svc.Spec.PublishNotReadyAddresses) {
				continue
			}
			ip := netip.MustParseAddr(p.Status.PodIP)
			want[svcName] = append(want[svcName], ip)
			if headless && p.Spec.Subdomain == svc.Name && p.Spec.Hostname != "" {
				want[p.Spec.Hostname+"."+svcName] = []netip.Addr{ip}
			}
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for name := range k.dnsKeys {
		if _, ok := want[name]; !ok {
			k.DNS.Set(name)
			delete(k.dnsKeys, name)
		}
	}
	for name, addrs := range want {
		k.DNS.Set(name, addrs...)
		k.dnsKeys[name] = true
	}
}

// runtimeLocked returns the live runtime of a pod by name.
func (k *Kubelet) runtimeLocked(pod string) *podRuntime {
	for _, rt := range k.pods {
		if rt.name == pod && !rt.stopping {
			return rt
		}
	}
	return nil
}

// Kill crashes a pod's etcd (SIGKILL); the kubelet restarts it after back-off.
func (k *Kubelet) Kill(pod string) error {
	k.mu.Lock()
	rt := k.runtimeLocked(pod)
	k.mu.Unlock()
	if rt == nil || rt.proc == nil {
		return fmt.Errorf("pod %s has no running etcd", pod)
	}
	rt.proc.Kill()
	return nil
}

// Isolate cuts a pod's node off: etcd stops at once and is not restarted until Heal. It
// models a network partition of one node: nothing reaches the member and it reaches
// nothing; when the partition heals the member resumes from its durable state (the WAL),
// as the isolated process would.
func (k *Kubelet) Isolate(pod string) error {
	k.mu.Lock()
	rt := k.runtimeLocked(pod)
	if rt == nil {
		k.mu.Unlock()
		return fmt.Errorf("pod %s not found", pod)
	}
	rt.held = true
	proc := rt.proc
	rt.proc = nil
	rt.ready = false
	k.mu.Unlock()
	if proc != nil {
		proc.Kill()
	}
	return nil
}

// Heal ends Isolate: the member starts again at once.
func (k *Kubelet) Heal(pod string) {
	k.mu.Lock()
	if rt := k.runtimeLocked(pod); rt != nil {
		rt.held = false
		rt.next = time.Time{}
		// The node's kubelet starts the container on the files it has, and refreshes them
		// on its next sync period.
		for v := range rt.refreshed {
			rt.refreshed[v] = time.Now()
		}
	}
	k.mu.Unlock()
	k.Store.touch()
}

// Moved says that pod's next incarnation runs on another node, where its volume takes attach
// (scaled) to attach before the container can start, on top of PendingFor.
func (k *Kubelet) Moved(pod string, attach time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.attach == nil {
		k.attach = map[string]time.Duration{}
	}
	k.attach[pod] = attach
}

// Isolated reports whether a pod is cut off by Isolate.
func (k *Kubelet) Isolated(pod string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	rt := k.runtimeLocked(pod)
	return rt != nil && rt.held
}

// Wipe crashes a pod's etcd and deletes its data dir (the volume's data subdirectory), a
// stand-in for disk loss or corruption; the volume's other files stay. The container is not
// restarted until the data dir is gone: a restart in between would start etcd on the data,
// and the wipe would then only unlink files the running etcd keeps open.
func (k *Kubelet) Wipe(pod, dataSubdir string) error {
	k.mu.Lock()
	rt := k.runtimeLocked(pod)
	if rt == nil || rt.proc == nil {
		k.mu.Unlock()
		return fmt.Errorf("pod %s has no running etcd", pod)
	}
	proc, held := rt.proc, rt.held
	rt.held = true
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		rt.held = held
		k.mu.Unlock()
		k.Store.touch()
	}()
	dir := proc.dataDir()
	proc.Kill()
	if filepath.Base(dir) != dataSubdir {
		return fmt.Errorf("pod %s: data dir %s is not the volume's %q", pod, dir, dataSubdir)
	}
	// Kill counts the process as ended after stopBound, but on a loaded machine etcd may
	// still be closing its files then and write some back: wipe only once it has let go.
	select {
	case <-proc.closed:
	case <-time.After(releaseBound):
		return fmt.Errorf("pod %s: etcd did not release %s within %s", pod, dir, releaseBound)
	}
	return os.RemoveAll(dir)
}

// servers returns the running etcd servers by pod name.
func (k *Kubelet) servers() map[string]etcdServer {
	out := map[string]etcdServer{}
	for name, p := range k.procs() {
		if s := p.server(); s != nil {
			out[name] = s
		}
	}
	return out
}

// procs returns the running etcd processes by pod name.
func (k *Kubelet) procs() map[string]*etcdProcess {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[string]*etcdProcess{}
	for _, rt := range k.pods {
		if !rt.stopping && rt.proc != nil && !rt.proc.Exited() {
			out[rt.name] = rt.proc
		}
	}
	return out
}

// runningSince is when the pod's current etcd process started; zero when none runs.
func (k *Kubelet) runningSince(pod string) time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	rt := k.runtimeLocked(pod)
	if rt == nil || rt.proc == nil || rt.proc.Exited() {
		return time.Time{}
	}
	return rt.started
}
