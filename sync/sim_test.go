package sync

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/backupresult"
	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/joinstate"
	"etcdops.dev/etcdops/launcher"
)

// The step simulator: a fake world of one EtcdCluster, its children, its pods and its etcd
// members. Each step observes the world, plans, checks the decision, applies it as
// Metacontroller would, and advances the world by one tick as Kubernetes and etcd would:
// Jobs run, the StatefulSet creates, deletes and rolls pods, pods start through the
// launcher's rules, learners catch up. Invariants are checked after every step.

var simConfig = Config{ClusterDomain: "cluster.local", ToolImage: "etcdops:test"}

var simStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// simLag, when set, makes every new world's caches lag (TestScenariosWithLaggingCaches).
var simLag *rand.Rand

// simStaleParent, when set, makes every new world hand some syncs a stale parent status
// (TestScenariosWithStaleParents).
var simStaleParent *rand.Rand

const simTick = 10 * time.Second

// simGrace is a pod's grace period: the default, as the etcd pods have.
const simGrace = 30 * time.Second

type simMember struct {
	id      uint64
	ord     int
	started bool
	learner bool
	raft    uint64
	// snap is the raft index of its last raft snapshot, which it replays its log from.
	snap uint64
	// live is the data the member holds at the current revision, history the older revisions
	// compaction frees; file is its database file, which only defragmentation shrinks.
	live, history, file int64
	// compactAt: a compaction applies on this member then, as followers apply one in the
	// background after the member that served it.
	compactAt time.Time
	// peerURL is the one peer URL etcd has for the member.
	peerURL string
}

// simData is what a member's data dir holds: the incarnation and member that wrote it, and the
// quorum recovery it last started from.
type simData struct {
	inc       int64
	id        uint64
	recovered string
	// restored is the join state token of the snapshot restore that wrote it.
	restored string
	// token is the join state token of the cluster whose member wrote it; "" on a volume
	// written before the launcher recorded it.
	token string
	// cluster is the etcd cluster ID its data is of, as its write-ahead log records it.
	cluster uint64
}

// simBackup is a snapshot stored by a backup Job: the raft index it holds stands for the
// revision, and the data it holds.
type simBackup struct {
	revision uint64
	live     int64
	member   uint64
}

type simPod struct {
	ord         int
	tmpl        corev1.PodTemplateSpec // the template it was created from: what its etcd serves
	spec        string                 // spec hash of the template it was created from
	config      string
	version     string
	running     bool
	restarts    int
	terminating bool
	// down: a fault keeps this pod's etcd unhealthy until healed.
	down bool
	// crash: a fault makes this pod's etcd exit on every start until healed.
	crash bool
	// noImage: its etcd image cannot be pulled; it never starts.
	noImage bool
	// blind: the hook cannot reach this pod, though its etcd runs and is Ready.
	blind bool
	// slow: its etcd keeps its part in raft (and leadership) but answers health checks with
	// errors, so its pod is not Ready: a leader on a failing disk.
	slow bool
	// stuck: its node stopped answering, so the pod was evicted and stays terminating with
	// the status its kubelet last reported, until the node is back.
	stuck bool
	// deletedAt is when the hook first saw it terminating: its deletionTimestamp is that and
	// its grace period (simGrace).
	deletedAt time.Time
	// nodeLost: its node stopped reporting; the node controller marked the pod not Ready
	// and the kubelet's last report stands (sim_node_test.go).
	nodeLost bool
	// forked: what else answers at this pod's address (simForkCluster, simForkMember;
	// sim_fork_test.go), "" for its own member.
	forked string
	// old: its etcd runs as a member of a membership a quorum recovery forced the survivor
	// out of (sim_oldquorum_test.go).
	old bool
	// deaf: its etcd is cut off from its peers but still answers the hook on its client port,
	// so once removed it never hears of it (sim_fork_test.go); a new pod at the ordinal is not.
	deaf bool
	// told: it runs for a membership it was removed from (the old one of a quorum recovery, or
	// the cluster's, whose member it no longer is) and has reached a member that answers that
	// it was removed: its etcd stops. Until then it answers as the member it was.
	told bool
	// why its etcd last failed to start, for describe; refusal, the termination message a
	// refusing launcher left.
	why, refusal string
	// restored, on a seed that restored a snapshot, is the termination message its container
	// ended with once before starting etcd on the restored data.
	restored string
	// created is when the StatefulSet created it.
	created time.Time
	// pendingUntil: its image pulls and its volume attaches until then.
	pendingUntil time.Time
	// mountFails: the kubelet cannot mount its volume (an attach that never completes, a file
	// system that fails to grow on the mount): it stays Pending, its containers not created.
	mountFails bool
	// unseen: deleted, its etcd already stopped, while the hook's cache still shows it as it
	// was (podsSeenLate).
	unseen bool
	// uid is the UID the API server gave it: another for each pod created at the ordinal.
	uid string
}

type simSTS struct {
	replicas, partition int
	// Template hashes of the update revision, and of the current revision that pods below
	// the partition are created from.
	updateSpec, updateConfig, updateVersion    string
	currentSpec, currentConfig, currentVersion string
	updateTmpl, currentTmpl                    corev1.PodTemplateSpec
	// whenDeleted and whenScaled are its persistentVolumeClaimRetentionPolicy
	// (sim_claims_test.go).
	whenDeleted, whenScaled string
}

type simJob struct {
	name      string
	verb      string
	member    string
	peerURL   string
	id        uint64
	alarm     string
	endpoints []string
	// clientCert: the Job presents the client certificate.
	clientCert bool
	// login: the Job logs in as root (--user=root); declaration: an auth Job's.
	login       bool
	declaration string
	state       jobState
	at          time.Time
	// created is when the Job was created: the time of the answer that asked for it.
	created time.Time
	failNow bool
	// ticks it has run without finishing (sim_slowbackup_test.go).
	ticks int

	// timeout is the member tool's --timeout.
	timeout time.Duration
	// claim and size: expand-claim's.
	claim, size string
	// podUID: restart-pod's.
	podUID string
	// scratch is a backup's scratch bound in bytes, 0 for none; evicted, that its pod was
	// evicted for outgrowing it (sim_restore_test.go).
	scratch int64
	evicted bool
	// create: expand-claim creates a missing claim.
	create bool
	// role is the claims Role as applied before the answer that created the Job.
	role []byte
	// delay is how many more ticks the Job waits before it acts (sim_latency_test.go).
	delay int
	// survivor: a backup from the survivor of a quorum recovery; drill: a drill's report
	// (sim_guard_test.go).
	survivor bool
	drill    backupresult.Drill
}

type simStats struct {
	syncs, adds, promotes, removes, leaderMoves, replacements, jobFailures int
	// forced counts etcd starts with --force-new-cluster.
	forced int
}

func (s simStats) String() string {
	return fmt.Sprintf("syncs=%d adds=%d promotes=%d removes=%d leader-moves=%d pod-replacements=%d",
		s.syncs, s.adds, s.promotes, s.removes, s.leaderMoves, s.replacements)
}

type simWorld struct {
	t         testing.TB
	cluster   v1alpha1.EtcdCluster
	now       time.Time
	members   []*simMember
	leader    uint64
	nextID    uint64
	clusterID uint64
	pods      map[int]*simPod
	data      map[int]*simData // per ordinal: the claim's data (with storage) or the pod's
	sts       *simSTS
	join      *joinstate.State
	applied   map[string][]byte // kind/name → JSON of the last applied child
	jobs      map[string]*simJob
	finalized bool
	// unmatched: the cluster no longer matches its CompositeController's labelSelector while it
	// carries that controller's finalizer, so Metacontroller calls finalize, not sync.
	unmatched bool
	stats     simStats
	// failJobs makes the next n member Jobs fail.
	failJobs int
	// hideJobs hides Job outcomes from the next observation (informer lag).
	hideJobs bool
	// badImage is an etcd version whose image cannot be pulled.
	badImage string
	// faulty tolerates lost availability (a scenario that breaks quorum on purpose); the
	// data must survive regardless.
	faulty bool
	// lag, when set, makes some observations see the children of the sync before the last
	// one, as a lagging informer cache would; stale holds them, seen is what the last
	// observation saw.
	lag   *rand.Rand
	stale map[string][]byte
	seen  map[string][]byte
	// staleParent, when set, makes some observations see the EtcdCluster's status as it was
	// before the last answer was written, as Metacontroller's cache of the parent may hand
	// it; the answer's status is written over the newer one all the same (Metacontroller's
	// AtomicStatusUpdate reads the object again and sets the status it is given).
	// lastStatus holds it.
	staleParent *rand.Rand
	lastStatus  *v1alpha1.EtcdClusterStatus
	// cfg is the hook's configuration: simConfig, but for an operator upgrade (sim_tool_test.go).
	cfg Config
	// rollWait is what the hook's bound on clusters rolling at once says while it holds this
	// one's roll back (sim_tool_test.go).
	rollWait string
	// etcdOverride, when set, changes the next observation of etcd.
	etcdOverride func(*etcdstate.Snapshot)
	// unschedulable ordinals: their pods stay Pending, whatever template they have.
	unschedulable map[int]bool
	// startDown ordinals: their next pod's etcd is down until healed (its volume still
	// attaching on the node it left).
	startDown map[int]bool
	// leaderReturns: after this many more move-leader Jobs leadership goes back to the member
	// it was moved from, as if something kept moving it.
	leaderReturns int
	// orphaned: the StatefulSet was deleted leaving its pods (kubectl delete --cascade=orphan).
	orphaned bool
	// doomedClaims are claims the retention policy deleted, at their ordinals; each goes once
	// no pod uses it (sim_claims_test.go).
	doomedClaims map[int]bool
	// alarms are the cluster's active alarms, as etcd keeps them: by member ID, also of
	// members removed since.
	alarms []etcdstate.Alarm
	// growth bytes are written per tick; past the quota etcd raises NOSPACE and refuses them.
	growth int64
	// lost counts voters whose volumes a story lost for good: fewer voters hold the data,
	// until a quorum recovery makes a cluster of the survivor, or the member of a claim lost
	// (lostClaims, by member ID) is replaced by a voter.
	lost       int
	lostClaims []uint64
	// backupTicks: a backup Job runs this many ticks before it finishes
	// (sim_slowbackup_test.go).
	backupTicks int
	// onTick, when set, runs at the end of every tick: a fault that heals on a condition.
	onTick func()
	log    []string
	// backups are the snapshots backup Jobs stored, oldest first; a restore reads the last.
	backups []simBackup
	// destination is how the backups' destination behaves (sim_guard_test.go).
	destination simStorage
	// stream is the continuous backup's progress, as its pod serves it (sim_stream_test.go).
	stream simStream
	// secrets are the TLS Secrets that exist, each with a digest of its CA bundle;
	// badCerts those whose certificate members would reject, and why.
	secrets  map[string]string
	badCerts map[string]string
	// probes, when set, runs liveness probes and lets defragmentations take time
	// (sim_probes_test.go).
	probes *simProbes
	// pace, when set, makes nodes slow (sim_pending_test.go).
	pace *simPace
	// mounts, when set, makes mounted ConfigMaps reach each pod late (sim_mounts_test.go).
	mounts *simMounts
	// attaching ordinals: their next pod waits for its volume to attach, its etcd not started,
	// until healed.
	attaching map[int]bool
	// auth is etcd's authentication and the credential Secrets (sim_auth_test.go).
	auth simAuth
	// goneMounts are Secrets and claims deleted while pods mount them (sim_restore_test.go).
	goneMounts map[string]bool
	// forks are the memberships quorum recoveries forced survivors out of
	// (sim_oldquorum_test.go).
	forks []*simFork
	// alarmSim: the members' quotas (sim_alarms_test.go).
	alarmSim simAlarms
	// drain, when set, is a node drain against the disruption budget (sim_drain_test.go).
	drain *simDrain
	// budget is the disruption controller's count of the PodDisruptionBudget.
	budget simBudget
	// duringSync, when set, is told each decision after it is planned and before it is
	// applied: what happens in the world between the hook's view and its answer.
	duringSync func(Decision)
	// podsSeenLate: a pod the StatefulSet deletes to roll it stops its etcd before the hook's
	// cache of pods shows it terminating, for one observation.
	podsSeenLate bool
	// v2Until is the highest raft index at which a v3.5 member may have written an etcd v2
	// request, which a v3.7 member cannot apply (versions.go).
	v2Until uint64
	// volumes are the claims and their class (sim_volumes_test.go).
	volumes simVolumes
	// podSeq numbers the pods created, for their UIDs.
	podSeq int
	// latency, when set, makes Jobs act some ticks after they were decided
	// (sim_latency_test.go).
	latency *simLatency
}

// seeds is how many seeds a random run tries: n, or a third of it (two at least, so that
// both halves of a seed%2 choice run) under -short, the inner loop (CONTRIBUTING.md).
func seeds(n int64) int64 {
	if testing.Short() {
		return max(2, (n+2)/3)
	}
	return n
}

func newSimWorld(t testing.TB, size int32, storage bool) *simWorld {
	c := v1alpha1.EtcdCluster{}
	c.APIVersion, c.Kind = v1alpha1.APIVersion, v1alpha1.Kind
	c.Name, c.Namespace, c.UID, c.Generation = "etcd", "default", "uid-1", 1
	c.CreationTimestamp = metav1.NewTime(simStart)
	c.Spec.Size = &size
	c.Spec.Version = "v3.6.16"
	if storage {
		c.Spec.StorageSpec = &v1alpha1.StorageSpec{VolumeSizeRequest: resource.MustParse("1Gi")}
	}
	return &simWorld{
		t: t, cfg: simConfig, cluster: c, now: simStart, nextID: 0x1000, clusterID: 0xc1,
		pods: map[int]*simPod{}, data: map[int]*simData{}, applied: map[string][]byte{}, jobs: map[string]*simJob{},
		lag: simLag, staleParent: simStaleParent, unschedulable: map[int]bool{}, startDown: map[int]bool{}, attaching: map[int]bool{}, goneMounts: map[string]bool{},
		secrets:  map[string]string{simServerSecret: "ca-1", simPeerSecret: "ca-1", simClientSecret: "ca-1"},
		badCerts: map[string]string{},
	}
}

func (w *simWorld) storage() bool { return w.cluster.Spec.StorageSpec != nil }

func (w *simWorld) memberAt(ord int) *simMember {
	for _, m := range w.members {
		if m.ord == ord {
			return m
		}
	}
	return nil
}

func (w *simWorld) memberByID(id uint64) *simMember {
	for _, m := range w.members {
		if m.id == id {
			return m
		}
	}
	return nil
}

func (w *simWorld) podName(ord int) string { return PodName(w.cluster.Name, ord) }

// healthy: the member's pod runs its etcd and nothing is wrong with it. A terminating pod's
// etcd answers until the pod is gone: it shuts down gracefully.
func (w *simWorld) healthy(m *simMember) bool {
	p := w.pods[m.ord]
	return m.started && p != nil && p.running && !p.down && !p.old && w.peerReachable(m) && !w.probes.holds(m.ord, w.now)
}

// ready is the kubelet's readiness of the pod at ord: its member's own health, which the
// hook's reach plays no part in, and that it is a voter by etcd and by the join state its pod
// has mounted (etcdops-member ready).
func (w *simWorld) ready(ord int) bool {
	m, p := w.memberAt(ord), w.pods[ord]
	if m == nil || p == nil || m.learner || !w.healthy(m) || p.slow || w.anyCorrupt() {
		return false
	}
	js := w.mountedJoin(p)
	if js == nil {
		return false
	}
	jm, ok := js.Find(w.podName(ord))
	return ok && !jm.Learner
}

// anyCorrupt: a CORRUPT alarm stands; etcd then serves no reads or writes anywhere, and every
// member's /readyz fails.
func (w *simWorld) anyCorrupt() bool {
	for _, a := range w.alarms {
		if a.Type == "CORRUPT" {
			return true
		}
	}
	return false
}

func (w *simWorld) hasAlarm(id uint64, alarm string) bool {
	for _, a := range w.alarms {
		if a.MemberID == id && a.Type == alarm {
			return true
		}
	}
	return false
}

func (w *simWorld) raise(id uint64, alarm string) {
	if !w.hasAlarm(id, alarm) {
		w.alarms = append(w.alarms, etcdstate.Alarm{MemberID: id, Type: alarm})
	}
}

// disarm removes the alarms of a type, of one member when id is not 0.
func (w *simWorld) disarm(alarm string, id uint64) {
	var kept []etcdstate.Alarm
	for _, a := range w.alarms {
		if a.Type != alarm || id != 0 && a.MemberID != id {
			kept = append(kept, a)
		}
	}
	w.alarms = kept
}

func (w *simWorld) voters() (voters, healthy int) {
	for _, m := range w.members {
		if !m.learner {
			voters++
			if w.healthy(m) {
				healthy++
			}
		}
	}
	return voters, healthy
}

func (w *simWorld) hasQuorum() bool {
	v, h := w.voters()
	return v > 0 && h >= etcdstate.Quorum(v)
}

// observe renders the world as the hook sees it.
func (w *simWorld) observe() Observed {
	obs := Observed{Cluster: w.cluster, Now: w.now, Finalizing: w.cluster.DeletionTimestamp != nil || w.unmatched, RollWait: w.rollWait}
	if w.staleParent != nil && w.lastStatus != nil && w.staleParent.Intn(3) == 0 {
		raw, err := json.Marshal(w.lastStatus)
		if err != nil {
			w.t.Fatal(err)
		}
		obs.Cluster.Status = v1alpha1.EtcdClusterStatus{}
		w.decode(raw, &obs.Cluster.Status)
	}
	children := w.applied
	if w.lag != nil && w.stale != nil && w.lag.Intn(3) == 0 {
		children = w.stale
	}
	w.seen = children
	for _, key := range sortedKeysOf(children) {
		raw := w.withLastApplied(children[key])
		kind, name, _ := strings.Cut(key, "/")
		switch kind {
		case "StatefulSet":
			var o appsv1.StatefulSet
			w.decode(raw, &o)
			obs.Children.StatefulSets = append(obs.Children.StatefulSets, o)
		case "Service":
			var o corev1.Service
			w.decode(raw, &o)
			obs.Children.Services = append(obs.Children.Services, o)
		case "ConfigMap":
			var o corev1.ConfigMap
			w.decode(raw, &o)
			obs.Children.ConfigMaps = append(obs.Children.ConfigMaps, o)
		case "PodDisruptionBudget":
			var o policyv1.PodDisruptionBudget
			w.decode(raw, &o)
			w.budgetStatus(&o)
			obs.Children.PDBs = append(obs.Children.PDBs, o)
		case "Job":
			var o batchv1.Job
			w.decode(raw, &o)
			if j := w.jobs[name]; j != nil {
				o.CreationTimestamp = metav1.NewTime(j.created)
				switch {
				case w.hideJobs:
				case j.state == jobSucceeded:
					o.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(j.at)}}
				case j.state == jobFailed:
					o.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(j.at)}}
				}
			}
			obs.Children.Jobs = append(obs.Children.Jobs, o)
		case "Deployment":
			var o appsv1.Deployment
			w.decode(raw, &o)
			obs.Children.Deployments = append(obs.Children.Deployments, o)
		case "ServiceAccount":
			var o corev1.ServiceAccount
			w.decode(raw, &o)
			obs.Children.Accounts = append(obs.Children.Accounts, o)
		case "Role":
			var o rbacv1.Role
			w.decode(raw, &o)
			obs.Children.Roles = append(obs.Children.Roles, o)
		case "RoleBinding":
			var o rbacv1.RoleBinding
			w.decode(raw, &o)
			obs.Children.RoleBindings = append(obs.Children.RoleBindings, o)
		}
	}
	w.hideJobs = false
	obs.BackupStream = w.streamProgress(obs.Children)
	obs.Pods = append(obs.Pods, w.backupPods(obs.Children.Jobs)...)
	for _, ord := range sortedInts(w.pods) {
		p := w.pods[ord]
		pod := corev1.Pod{Spec: *p.tmpl.Spec.DeepCopy()}
		pod.Name, pod.Namespace, pod.UID = w.podName(ord), w.cluster.Namespace, types.UID(p.uid)
		pod.CreationTimestamp = metav1.NewTime(p.created)
		pod.Labels = map[string]string{LabelCluster: w.cluster.Name}
		pod.Annotations = map[string]string{}
		for k, v := range p.tmpl.Annotations {
			pod.Annotations[k] = v
		}
		pod.Annotations[AnnotationSpecHash], pod.Annotations[AnnotationConfigHash] = p.spec, p.config
		pod.Status.PodIP = fmt.Sprintf("127.0.0.%d", ord+10)
		// Ready is the kubelet's probe of the member's own health: the hook's reach plays no
		// part in it.
		ready := corev1.ConditionFalse
		if w.ready(ord) || p.unseen {
			ready = corev1.ConditionTrue
		}
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}}
		pod.Status.Phase = corev1.PodRunning
		cs := corev1.ContainerStatus{Name: "etcd", RestartCount: int32(p.restarts), Ready: ready == corev1.ConditionTrue}
		switch {
		case w.unschedulable[ord]:
			pod.Status.Phase = corev1.PodPending
			pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
				Reason: corev1.PodReasonUnschedulable, Message: "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules"})
		case w.attaching[ord] || p.mountFails || !p.running && w.mountMissing(p):
			notStarted(&pod, &cs)
		case p.running:
			cs.State.Running = &corev1.ContainerStateRunning{}
			if p.restored != "" {
				cs.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{Reason: "Completed", Message: p.restored}
			}
		case p.noImage:
			pod.Status.Phase = corev1.PodPending
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}
		case p.restarts > 0:
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}
			if p.refusal != "" {
				cs.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: 3, Message: p.refusal}
			}
		default:
			notStarted(&pod, &cs)
		}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{cs}
		nodeStoppedReporting(p, &pod)
		if !w.orphaned {
			// Its StatefulSet's (or the one deleted with it, until the garbage collector takes
			// the pod); an orphaning deletion takes the reference away.
			pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: StatefulSetName(w.cluster.Name), Controller: ptrTo(true)}}
		}
		if p.terminating && !p.unseen {
			if p.deletedAt.IsZero() {
				p.deletedAt = w.now
			}
			// The time by which it is to be gone, as the API server sets it.
			ts := metav1.NewTime(p.deletedAt.Add(simGrace))
			pod.DeletionTimestamp = &ts
		}
		obs.Pods = append(obs.Pods, pod)
	}
	obs.CAs, obs.CABundles = map[string]string{}, map[string]string{}
	for _, n := range SecretNames(&w.cluster) {
		if ca, ok := w.secrets[n]; ok {
			obs.CAs[n], obs.CABundles[n] = ca, simCABundle(ca)
		}
	}
	obs.CertProblems = map[string]string{}
	for n, p := range w.badCerts {
		obs.CertProblems[n] = p
	}
	w.observedVolumes(&obs)
	obs.Etcd = w.snapshot(obs.Pods)
	w.observeAuth(&obs)
	w.forkedAnswers(&obs.Etcd)
	if w.etcdOverride != nil {
		w.etcdOverride(&obs.Etcd)
		w.etcdOverride = nil
	}
	return obs
}

// snapshot is what the membership observer would read: nothing when no voter can answer the
// hook. A blind pod's member is healthy for etcd and the kubelet, but does not answer the hook;
// nor does one whose pod does not serve the scheme the hook asks it over (memberEndpoints, from
// the pods as observed), or serves only https while the hook has no client certificate.
func (w *simWorld) snapshot(pods []corev1.Pod) etcdstate.Snapshot {
	asked := map[int]bool{}
	for _, ep := range memberEndpoints(simConfig, &w.cluster, pods) {
		ord, _ := Ordinal(w.cluster.Name, ep.Member)
		if p := w.pods[ord]; p != nil && w.servesClient(p, ep.TLS) {
			asked[ord] = true
		}
	}
	answers := false
	for _, m := range w.members {
		if !m.learner && w.healthy(m) && !w.pods[m.ord].blind && asked[m.ord] {
			answers = true
		}
	}
	if !answers {
		return etcdstate.Snapshot{Err: "no voter answered"}
	}
	s := etcdstate.Snapshot{Asked: true, ClusterID: w.clusterID, Complete: true}
	quorum := w.hasQuorum()
	for _, m := range w.members {
		em := etcdstate.Member{ID: m.id, IsLearner: m.learner, PeerURLs: []string{m.peerURL}}
		if m.started {
			em.Name = w.podName(m.ord)
		}
		p := w.pods[m.ord]
		if m.started && p != nil && p.running && !p.blind && !p.old && !p.unseen && asked[m.ord] {
			em.Reachable = true
			em.RaftIndex, em.RaftAppliedIndex = m.raft, m.raft
			em.Version = strings.TrimPrefix(p.version, "v")
			em.IsLeader = m.id == w.leader
			em.DBSize, em.DBSizeInUse, em.DBSizeQuota = m.file, m.live+m.history, w.reportedQuota(m)
			em.Healthy = w.healthy(m) && quorum && !p.slow && !w.hasAlarm(m.id, "CORRUPT")
		}
		// Every member's Status lists every alarm: also that of a member that does not answer.
		for _, a := range w.alarms {
			if a.MemberID == m.id {
				em.Alarms = append(em.Alarms, a.Type)
			}
		}
		s.Complete = s.Complete && em.Reachable
		s.Members = append(s.Members, em)
	}
	sort.Slice(s.Members, func(i, j int) bool { return s.Members[i].ID < s.Members[j].ID })
	s.Alarms = append([]etcdstate.Alarm(nil), w.alarms...)
	s.Unlisted = w.unlistedAnswers(asked)
	return s
}

// unlistedAnswers are the pods whose etcd runs as a member the cluster no longer lists: removed
// and not yet told, or a member of the membership a quorum recovery forced the survivor out of.
// Each answers the hook under its old member ID and, alone, leads nothing.
func (w *simWorld) unlistedAnswers(asked map[int]bool) []etcdstate.Unlisted {
	var out []etcdstate.Unlisted
	for _, ord := range sortedInts(w.pods) {
		p, d := w.pods[ord], w.data[ord]
		if !p.running || p.blind || !asked[ord] || d == nil || w.memberByID(d.id) != nil || p.forked != "" {
			continue
		}
		out = append(out, etcdstate.Unlisted{Endpoint: w.podName(ord), MemberID: d.id})
	}
	return out
}

// withLastApplied adds Metacontroller's last-applied annotation to an applied child.
func (w *simWorld) withLastApplied(raw []byte) []byte {
	var m map[string]any
	w.decode(raw, &m)
	md, _ := m["metadata"].(map[string]any)
	ann, _ := md["annotations"].(map[string]any)
	if ann == nil {
		ann = map[string]any{}
	}
	ann[AnnotationLastApplied] = string(raw)
	md["annotations"] = ann
	out, err := json.Marshal(m)
	if err != nil {
		w.t.Fatal(err)
	}
	return out
}

func (w *simWorld) decode(raw []byte, into any) {
	if err := json.Unmarshal(raw, into); err != nil {
		w.t.Fatalf("decoding a child: %v", err)
	}
}

// sync is one Metacontroller sync: observe, plan, check, apply. It returns the decision.
func (w *simWorld) sync() Decision {
	w.t.Helper()
	obs := w.observe()
	d := Plan(w.cfg, obs)
	checkTyped(w.t, d)
	checkConditions(w.t, obs.Cluster.Generation, d)
	checkEvents(w.t, &obs.Cluster.Status, d)
	w.stats.syncs++
	again := Plan(w.cfg, obs)
	if a, b := encodeDecision(w.t, d), encodeDecision(w.t, again); a != b {
		w.t.Fatalf("the same observation planned twice gave different answers:\n%s\n%s", a, b)
	}
	if strings.HasPrefix(d.Action.Reason, "internal:") {
		w.t.Fatalf("sync %d: invariant violated: %s", w.stats.syncs, d.Action.Reason)
	}
	w.checkAlarmDecision(obs, d)
	if w.drain != nil {
		w.drain.evictSometimes()
	}
	if w.duringSync != nil {
		w.duringSync(d)
	}
	w.apply(d)
	w.log = append(w.log, fmt.Sprintf("%s %s: %s", d.Action.Type, d.Action.Member, d.Action.Reason))
	return d
}

// apply does what Metacontroller does with a response: create or update every returned
// child, delete every observed child that was left out, write the status. A child that
// changed or went since it was observed, or was not observed, is left alone: Metacontroller
// updates what it merged from its cache, whose resourceVersion no longer matches, and
// deletes only what it observed.
func (w *simWorld) apply(d Decision) {
	w.t.Helper()
	// Metacontroller applies an answer's children in no set order: a new Job's pod may ask the
	// API server before the Role of the same answer lands (mustBeAllowed).
	roleBefore := w.applied["Role/"+ClaimsAccountName(w.cluster.Name)]
	w.stale = map[string][]byte{}
	conflict := map[string]bool{}
	for k, v := range w.applied {
		w.stale[k] = v
		if seen, ok := w.seen[k]; !ok || string(seen) != string(v) {
			conflict[k] = true
		}
	}
	for k := range w.seen {
		if _, ok := w.applied[k]; !ok {
			conflict[k] = true
		}
	}
	desired := map[string][]byte{}
	for _, c := range d.Children {
		b, err := json.Marshal(c.Object)
		if err != nil {
			w.t.Fatalf("encoding %s %s: %v", c.Kind, c.Name, err)
		}
		for _, bad := range []string{`"creationTimestamp":null`, `"status":{}`} {
			if strings.Contains(string(b), bad) {
				w.t.Fatalf("%s %s carries %s", c.Kind, c.Name, bad)
			}
		}
		key := c.Kind + "/" + c.Name
		if c.Kind == "Job" {
			if old, ok := w.applied[key]; ok && !sameJSON(old, b) {
				w.t.Fatalf("Job %s returned changed under the same name", c.Name)
			}
		}
		desired[key] = b
	}
	for key := range w.applied {
		if _, ok := desired[key]; !ok && !conflict[key] {
			kind, name, _ := strings.Cut(key, "/")
			delete(w.applied, key)
			switch {
			case kind == "Job":
				delete(w.jobs, name)
			case !ownChild(w.cluster.Name, kind, name):
				// Another hook's child: the world keeps no state of it (sim_foreign_test.go).
			case kind == "StatefulSet":
				w.deleteStatefulSet(false)
			case kind == "ConfigMap" && name == JoinConfigMapName(w.cluster.Name):
				w.join = nil
			}
		}
	}
	for key, b := range desired {
		if conflict[key] {
			continue
		}
		kind, name, _ := strings.Cut(key, "/")
		w.applied[key] = b
		if kind != "Job" && !ownChild(w.cluster.Name, kind, name) || kind == "Job" && foreignJob(b) {
			continue
		}
		switch kind {
		case "StatefulSet":
			w.applySTS(b)
		case "ConfigMap":
			if name != JoinConfigMapName(w.cluster.Name) {
				continue // the client ConfigMap: nothing in the world reads it
			}
			var cm corev1.ConfigMap
			w.decode(b, &cm)
			st, err := joinstate.Decode([]byte(cm.Data[joinstate.ConfigMapKey]))
			if err != nil {
				w.t.Fatalf("join state: %v", err)
			}
			w.join = &st
		case "Job":
			if _, ok := w.jobs[name]; !ok {
				j := w.newJob(b)
				j.role, j.created = roleBefore, w.now
				w.jobs[name] = j
			}
		}
	}
	last := w.cluster.Status
	w.lastStatus = &last
	w.cluster.Status = d.Status
	w.finalized = d.Finalized
	w.recordJoin()
}

func sameJSON(a, b []byte) bool {
	var x, y any
	_ = json.Unmarshal(a, &x)
	_ = json.Unmarshal(b, &y)
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}

func (w *simWorld) applySTS(b []byte) {
	var s appsv1.StatefulSet
	w.decode(b, &s)
	tmpl := s.Spec.Template
	version := tmpl.Spec.Containers[0].Image[strings.LastIndex(tmpl.Spec.Containers[0].Image, ":")+1:]
	if w.sts == nil {
		// The StatefulSet controller cannot create a pod whose name a pod being deleted still
		// holds, and backs off, doubling each time: a StatefulSet created again over its pods
		// still going brings them back late. One past its grace period may be stuck for good.
		for _, ord := range sortedInts(w.pods) {
			p := w.pods[ord]
			if !p.terminating && !w.orphaned || p.terminating && !p.deletedAt.IsZero() && w.now.Before(p.deletedAt.Add(simGrace)) {
				w.t.Fatalf("the StatefulSet was created again while pod %s is still to be deleted with the old one\n%s", w.podName(ord), w.describe())
			}
		}
		w.orphaned = false
		w.sts = &simSTS{currentSpec: tmpl.Annotations[AnnotationSpecHash], currentConfig: tmpl.Annotations[AnnotationConfigHash], currentVersion: version}
	}
	w.sts.replicas = int(*s.Spec.Replicas)
	w.sts.partition = int(*s.Spec.UpdateStrategy.RollingUpdate.Partition)
	w.sts.updateSpec, w.sts.updateConfig, w.sts.updateVersion = tmpl.Annotations[AnnotationSpecHash], tmpl.Annotations[AnnotationConfigHash], version
	w.sts.updateTmpl = tmpl
	if r := s.Spec.PersistentVolumeClaimRetentionPolicy; r != nil {
		w.sts.whenDeleted, w.sts.whenScaled = string(r.WhenDeleted), string(r.WhenScaled)
	}
	for _, t := range s.Spec.VolumeClaimTemplates {
		w.volumes.template = t.Spec.Resources.Requests[corev1.ResourceStorage]
	}
	if w.sts.currentTmpl.Spec.Containers == nil {
		w.sts.currentTmpl = tmpl
	}
}

func (w *simWorld) newJob(b []byte) *simJob {
	var j batchv1.Job
	w.decode(b, &j)
	sj := &simJob{name: j.Name, verb: j.Labels[LabelAction], member: j.Labels[LabelMember]}
	for _, v := range j.Spec.Template.Spec.Volumes {
		if v.Name == volumeBackupWork && v.EmptyDir != nil && v.EmptyDir.SizeLimit != nil {
			sj.scratch = v.EmptyDir.SizeLimit.Value()
		}
	}
	for _, a := range j.Spec.Template.Spec.Containers[0].Command {
		if v, ok := strings.CutPrefix(a, "--peer-url="); ok {
			sj.peerURL = v
		}
		if v, ok := strings.CutPrefix(a, "--id="); ok {
			fmt.Sscanf(v, "%x", &sj.id)
		}
		if v, ok := strings.CutPrefix(a, "--alarm="); ok {
			sj.alarm = v
		}
		if v, ok := strings.CutPrefix(a, "--declaration="); ok {
			sj.declaration = v
		}
		if a == "--user="+authRootUser {
			sj.login = true
		}
		if v, ok := strings.CutPrefix(a, "--endpoints="); ok {
			sj.endpoints = strings.Split(v, ",")
		}
		if v, ok := strings.CutPrefix(a, "--timeout="); ok {
			sj.timeout, _ = time.ParseDuration(v)
		}
		if v, ok := strings.CutPrefix(a, "--claim="); ok {
			sj.claim = v
		}
		if v, ok := strings.CutPrefix(a, "--size="); ok {
			sj.size = v
		}
		if v, ok := strings.CutPrefix(a, "--uid="); ok {
			sj.podUID = v
		}
		sj.create = sj.create || a == "--create"
		sj.clientCert = sj.clientCert || strings.HasPrefix(a, "--cert=")
		sj.survivor = sj.survivor || a == "--survivor"
	}
	if w.failJobs > 0 {
		w.failJobs--
		sj.failNow = true
	}
	sj.delay = w.jobLatency()
	return sj
}

// tick advances the world: Jobs run, the StatefulSet acts, pods start, raft moves.
func (w *simWorld) tick() {
	w.now = w.now.Add(simTick)
	for _, p := range w.pods {
		p.unseen = false // the cache has caught up
	}
	if w.probes != nil {
		w.defragmentationsEnd()
	}
	for _, name := range sortedKeysOf(w.jobs) {
		if j := w.jobs[name]; j.state == jobRunning && j.delay > 0 {
			j.delay--
		} else if j.state == jobRunning {
			w.runJob(j)
		}
	}
	w.statefulSetController()
	w.resizeClaims()
	w.kubelet()
	w.raft()
	w.countBudget()
	if w.onTick != nil {
		w.onTick()
	}
}

func (w *simWorld) runJob(j *simJob) {
	if w.backupStillRuns(j) {
		return
	}
	j.at = w.now
	fail := func() { j.state = jobFailed; w.stats.jobFailures++ }
	if j.verb == verbDefragment && w.probes != nil && w.slowDefragment(j, fail) {
		return
	}
	if (j.verb == verbExpandClaim || j.verb == verbRestartPod) && !j.failNow {
		// It asks the API server, not etcd.
		if j.verb == verbRestartPod {
			w.restartPod(j)
		} else {
			w.expandClaim(j)
		}
		if j.state == jobRunning {
			j.state = jobSucceeded
		}
		return
	}
	if (j.verb == verbBackup || j.verb == verbDrill) && w.readOnlyJob(j, fail) {
		return
	}
	if j.failNow || !w.hasQuorum() || !w.jobReaches(j) || w.auth.refuses(j) {
		fail()
		return
	}
	ord, _ := Ordinal(w.cluster.Name, j.member)
	switch j.verb {
	case verbAddLearner:
		if w.memberAt(ord) != nil {
			break // already added: the tool treats it as done
		}
		for _, m := range w.members {
			if m.learner {
				fail() // etcd: too many learner members
				return
			}
		}
		w.members = append(w.members, &simMember{id: w.nextID, ord: ord, learner: true, peerURL: j.peerURL})
		w.nextID++
		w.stats.adds++
	case verbPromote:
		m := w.memberByID(j.id)
		if m == nil || !m.learner {
			break
		}
		leader := w.memberByID(w.leader)
		if !w.healthy(m) || leader == nil || m.raft*10 < leader.raft*9 {
			fail() // etcd: learner not in sync with leader
			return
		}
		m.learner = false
		w.stats.promotes++
		w.replacedLost(m)
	case verbRemove:
		m := w.memberByID(j.id)
		if m == nil {
			break
		}
		if !m.learner && !w.quorumAfterRemoval(m) {
			fail() // the tool: the voters left that answer would not keep quorum
			return
		}
		for i, x := range w.members {
			if x == m {
				w.members = append(w.members[:i], w.members[i+1:]...)
				break
			}
		}
		if !m.learner && !w.hasQuorum() {
			w.t.Fatalf("removing %s lost quorum", j.member)
		}
		w.stats.removes++
		if w.leader == m.id {
			w.leader = 0
			w.elect()
		}
	case verbCompact:
		for _, m := range w.members {
			if m.id == w.leader {
				m.history = 0
			} else {
				m.compactAt = w.now.Add(simTick)
			}
		}
	case verbDefragment:
		m := w.memberByID(j.id)
		if m == nil || !w.healthy(m) {
			fail()
			return
		}
		m.file = m.live + m.history
	case verbDisarm:
		w.disarm(j.alarm, j.id)
	case verbAuth:
		if !w.applyAuth(j) {
			fail()
			return
		}
	case verbBackup:
		if w.outgrows(j) {
			j.evicted = true
			fail()
			return
		}
		if !w.backup(j.ticks > 0) {
			fail()
			return
		}
	case verbUpdatePeerURL:
		m := w.memberByID(j.id)
		if m == nil {
			fail()
			return
		}
		m.peerURL = j.peerURL
	case verbMoveLeader:
		m := w.memberByID(j.id)
		if m == nil || m.learner || !w.healthy(m) {
			fail()
			return
		}
		if w.leader != m.id {
			from := w.leader
			w.leader = m.id
			w.stats.leaderMoves++
			if w.leaderReturns > 0 {
				// Something moves leadership straight back: the Job succeeded, its effect did not last.
				w.leaderReturns--
				w.leader = from
			}
		}
	}
	j.state = jobSucceeded
}

// statefulSetController does what Kubernetes does for a StatefulSet with Parallel pod
// management and a partitioned RollingUpdate. A deleted pod takes a tick to terminate and
// another to be recreated, so one sync sees it terminating and the next sees it missing.
func (w *simWorld) statefulSetController() {
	gone := map[int]bool{}
	for ord, p := range w.pods {
		if p.terminating && !p.stuck {
			delete(w.pods, ord)
			gone[ord] = true
			if !w.storage() {
				delete(w.data, ord)
			}
		}
	}
	w.collectClaims()
	if w.sts == nil {
		// Deleting a StatefulSet deletes its pods, unless it was deleted orphaning them.
		for _, p := range w.pods {
			p.terminating = p.terminating || !w.orphaned
		}
		return
	}
	s := w.sts
	for ord, p := range w.pods {
		if ord >= s.replicas {
			p.terminating = true
			w.scaledAway(ord)
		}
	}
	// Roll: the highest pod at or above the partition not on the update revision.
	for ord := s.replicas - 1; ord >= s.partition; ord-- {
		p := w.pods[ord]
		if p == nil || p.terminating {
			break
		}
		if p.spec != s.updateSpec {
			p.terminating, p.unseen = true, w.podsSeenLate
			w.stats.replacements++
			break
		}
		if !p.running {
			break // waits for unhealthy pods
		}
	}
	for ord := 0; ord < s.replicas; ord++ {
		if w.pods[ord] != nil || gone[ord] {
			continue
		}
		w.podSeq++
		p := &simPod{ord: ord, spec: s.updateSpec, config: s.updateConfig, version: s.updateVersion, tmpl: s.updateTmpl, created: w.now, uid: fmt.Sprintf("pod-uid-%d", w.podSeq)}
		if ord < s.partition {
			p.spec, p.config, p.version, p.tmpl = s.currentSpec, s.currentConfig, s.currentVersion, s.currentTmpl
		}
		p.noImage = p.version == w.badImage
		p.pendingUntil = w.remountUntil(ord, w.pendingUntil(ord))
		p.down = w.startDown[ord]
		delete(w.startDown, ord)
		w.pods[ord] = p
		w.claimFor(ord)
	}
	all := true
	for ord := 0; ord < s.replicas; ord++ {
		all = all && w.pods[ord] != nil && w.pods[ord].spec == s.updateSpec
	}
	if all {
		s.currentSpec, s.currentConfig, s.currentVersion, s.currentTmpl = s.updateSpec, s.updateConfig, s.updateVersion, s.updateTmpl
	}
}

// kubelet starts every pod that is not running through the launcher's rules, and stops the
// etcd of a member that was removed. A pod that cannot be scheduled or pull its image never
// starts, so it never restarts either.
func (w *simWorld) kubelet() {
	for _, ord := range sortedInts(w.pods) {
		p := w.pods[ord]
		if p.terminating || p.noImage || w.unschedulable[ord] || w.attaching[ord] || !p.running && w.mountMissing(p) || w.now.Before(p.pendingUntil) || w.mountFails(p) {
			continue
		}
		if p.running && p.old && (p.stuck || !p.told) {
			// It runs for the old membership: cut off from the survivor that would tell it
			// it was removed, or for the tick that telling takes; then it stops below.
			p.told = !p.stuck
			continue
		}
		if p.running && w.livenessRestarts(ord, p) {
			p.running = false
			p.restarts++
			continue
		}
		m := w.memberAt(ord)
		if d := w.data[ord]; p.running && d != nil && !p.crash && (m == nil || d.id != m.id) && (p.stuck || p.deaf || !p.told) {
			// Its member was removed from the cluster: etcd learns it from the members it
			// reaches, a tick later, and never while cut off. Until then it runs and answers.
			p.told = !p.stuck && !p.deaf
			continue
		}
		if d := w.data[ord]; p.running && (m == nil || d == nil || d.id != m.id || p.crash) {
			// Its member was removed from the cluster (or it crashes): etcd exits.
			p.running = false
			p.restarts++
			continue
		}
		if js := w.mountedJoin(p); p.running && js != nil && launcher.RecoveryPending(*js, w.podName(ord), volumeOf(w.data[ord])) {
			// The liveness probe fails while a quorum recovery waits for this member: the
			// kubelet restarts its etcd through the launcher.
			p.running = false
			p.restarts++
			continue
		}
		if p.running {
			continue
		}
		if why := w.launch(p, m); why != "" {
			p.restarts++
			p.why = why
			continue
		}
		p.running, p.refusal = true, ""
	}
}

// launch starts a pod's etcd; "" when it runs. Whether it starts, and whether its data dir is
// wiped first, is the launcher's own decision (launcher.Decide) on the join state and what the
// volume holds; what etcd then makes of the data dir is modelled here.
func (w *simWorld) launch(p *simPod, m *simMember) string {
	p.old, p.told = false, false
	if p.crash {
		return "crashes"
	}
	join := w.mountedJoin(p)
	if join == nil {
		return "no join state" // the kubelet cannot mount a missing ConfigMap
	}
	d := w.data[p.ord]
	dec := launcher.Decide(w.launchInput(p, *join))
	if dec.Kind == launcher.Refuse {
		p.refusal = joinstate.Refused + dec.Reason
	}
	if dec.Kind != launcher.Start {
		return dec.Kind.String() + ": " + dec.Reason
	}
	if dec.Wipe {
		delete(w.data, p.ord)
		d = nil
	}
	if d != nil && d.token != dec.Token {
		// Another cluster's markers beside an empty data dir are ignored; its data never is.
		if d.token != "" {
			w.t.Fatalf("%s starts on data of cluster %s under %s", w.podName(p.ord), d.token, dec.Token)
		}
		d.token = dec.Token
	}
	if d != nil {
		if dec.Recovered != "" {
			d.recovered = dec.Recovered
			w.forceNewCluster(p.ord, d)
		}
		if m := w.memberAt(p.ord); m == nil || d.id != m.id {
			if w.oldData(d) {
				p.old = true
				return ""
			}
			return "member removed from the cluster"
		}
		w.replaysV2(p, m.snap)
		return ""
	}
	if join.ClusterState == joinstate.StateNew {
		if len(w.members) > 0 {
			w.t.Fatalf("%s formed a second cluster with state new", w.podName(p.ord))
		}
		m = &simMember{id: w.nextID, ord: p.ord, started: true, peerURL: join.Members[0].PeerURL}
		w.nextID++
		w.data[p.ord] = &simData{inc: dec.Incarnation, id: m.id, token: dec.Token, cluster: w.clusterID}
		if dec.Restore {
			// etcdutl snapshot restore: the snapshot's data under a new cluster ID.
			if len(w.backups) == 0 {
				return "restore: no snapshot"
			}
			b := w.backups[len(w.backups)-1]
			m.raft, m.live, m.file = b.revision, b.live, b.live
			m.snap = m.raft
			w.data[p.ord].restored = join.Token
			p.restored = joinstate.RestoredMessage(joinstate.RestoredPoint{Revision: int64(b.revision), Lineage: fmt.Sprintf("%x", w.clusterID),
				Object: fmt.Sprintf("s3://backups/default/etcd/lineages/%x/etcd-r%d.db", w.clusterID, b.revision)})
			w.clusterID++
			w.data[p.ord].cluster = w.clusterID
		}
		w.members = append(w.members, m)
		w.leader = m.id
		return ""
	}
	if m == nil {
		return "no member to join as"
	}
	if m.started {
		// etcd joins as the member whose log the cluster already sent it, with none of
		// that log: it panics (tocommit out of range), in e2e and in production.
		w.t.Fatalf("%s starts member %x a second time, on an empty data dir of incarnation %d", w.podName(p.ord), m.id, dec.Incarnation)
	}
	if adv := w.advertisedPeerURL(p); adv != m.peerURL {
		// etcd checks a joining member's advertised peer URL against its entry.
		return "advertises " + adv + ", etcd has " + m.peerURL
	}
	m.started = true
	m.raft = 0
	if l := w.memberByID(w.leader); l != nil {
		// The new member receives a snapshot of the leader's data, and the log after it.
		m.live, m.history = l.live, l.history
		m.file = m.live + m.history
		m.snap = l.snap
		w.replaysV2(p, m.snap)
	}
	w.data[p.ord] = &simData{inc: dec.Incarnation, id: m.id, token: dec.Token, cluster: w.clusterID}
	return ""
}

// volumeOf is what the launcher finds on a volume.
func volumeOf(d *simData) launcher.Volume {
	if d == nil {
		return launcher.Volume{}
	}
	v := launcher.Volume{HasData: true, HasMarker: true, Incarnation: d.inc, Token: d.token, Recovered: d.recovered, Restored: d.restored}
	if d.token == "" && d.cluster != 0 {
		v.ClusterID = fmt.Sprintf("%x", d.cluster)
	}
	return v
}

// forceNewCluster is etcd started with --force-new-cluster on the data d at ord: the member
// that wrote it becomes a cluster of one, every other member is removed from it.
func (w *simWorld) forceNewCluster(ord int, d *simData) {
	m := w.memberByID(d.id)
	if m == nil {
		w.t.Fatalf("%s forces a new cluster from data of a member that is gone", w.podName(ord))
	}
	w.recordFork(m.id)
	w.members = []*simMember{m}
	m.learner = false
	w.leader = m.id
	w.stats.forced++
	w.lost = 0
	for o, p := range w.pods {
		if o != ord && p.running && w.oldData(w.data[o]) {
			p.old = true
		}
	}
}

// raft moves the leader's index on and lets healthy members follow; a learner needs one
// tick after starting to catch up.
func (w *simWorld) raft() {
	w.elect()
	leader := w.memberByID(w.leader)
	if leader == nil {
		return
	}
	leader.raft += 10
	w.write()
	for _, m := range w.members {
		if !m.compactAt.IsZero() && !w.now.Before(m.compactAt) {
			m.history, m.compactAt = 0, time.Time{}
		}
	}
	for _, m := range w.members {
		if m == leader || !w.healthy(m) {
			continue
		}
		if m.learner && m.raft == 0 {
			m.raft = 1
			continue
		}
		if m.learner && w.diskTooSmall(m, leader) {
			continue // the snapshot does not fit its volume (sim_volumes_test.go)
		}
		m.raft = w.followed(m, leader)
	}
	count := snapshotCount(w.cluster.Spec.EtcdOptions)
	for _, m := range w.members {
		if m.raft > m.snap && m.raft-m.snap > count {
			m.snap = m.raft
		}
	}
	for _, p := range w.pods {
		if p.running && strings.HasPrefix(p.version, "v3.5.") {
			w.v2Until = leader.raft
		}
	}
}

// replaysV2 fails the story when a pod starts etcd v3.7 on a log that holds etcd v2 requests
// after the snapshot it starts from: etcd panics there ("unmarshal should never fail").
func (w *simWorld) replaysV2(p *simPod, snap uint64) {
	if minorOf(p.version) >= 7 && snap < w.v2Until {
		w.t.Fatalf("%s starts etcd %s from a raft snapshot at index %d, before v2 requests written up to %d: it panics",
			w.podName(p.ord), p.version, snap, w.v2Until)
	}
}

// write adds w.growth of new revisions to every member while quorum holds, as a steady
// writer would; the first member whose file reaches the quota it enforces raises NOSPACE, and from then
// on writes are refused.
func (w *simWorld) write() {
	if w.growth == 0 || !w.hasQuorum() {
		return
	}
	for _, a := range w.alarms {
		if a.Type == "NOSPACE" {
			return
		}
	}
	for _, m := range w.members {
		m.history += w.growth
		m.file = max(m.file, m.live+m.history)
		if quota := w.enforcedQuota(m); quota > 0 && m.file >= quota {
			w.raise(m.id, "NOSPACE")
		}
	}
}

// elect makes the lowest-ordinal healthy voter leader when there is none and quorum holds.
func (w *simWorld) elect() {
	if l := w.memberByID(w.leader); l != nil && !l.learner && w.healthy(l) {
		return
	}
	w.leader = 0
	if !w.hasQuorum() {
		return
	}
	best := -1
	for _, m := range w.members {
		if !m.learner && w.healthy(m) && (best < 0 || m.ord < best) {
			best = m.ord
		}
	}
	if best >= 0 {
		w.leader = w.memberAt(best).id
		// A leader carries the highest index.
		for _, m := range w.members {
			if m.raft > w.memberAt(best).raft {
				w.memberAt(best).raft = m.raft
			}
		}
	}
}

// checkWorld checks the world's invariants after a step.
func (w *simWorld) checkWorld() {
	w.t.Helper()
	running, learners := 0, 0
	for _, j := range w.jobs {
		if j.state == jobRunning {
			running++
		}
	}
	if running > 1 {
		w.t.Fatalf("%d member Jobs in flight", running)
	}
	for _, m := range w.members {
		if m.learner {
			learners++
		}
	}
	if learners > 1 {
		w.t.Fatalf("%d learners", learners)
	}
	w.checkTLSWorld()
	w.checkFork()
	w.checkRestarts()
	// A one-member cluster has no redundancy: recreating its pod is a planned outage.
	if v, _ := w.voters(); v > 1 && !w.faulty && !w.hasQuorum() {
		v, h := w.voters()
		w.t.Fatalf("quorum lost: %d of %d voters healthy\n%s", h, v, w.describe())
	}
	if w.sts != nil {
		for _, m := range w.members {
			if !m.learner && m.ord >= w.sts.replicas {
				w.t.Fatalf("StatefulSet of %d dropped voter %s", w.sts.replicas, w.podName(m.ord))
			}
		}
	}
	// Acknowledged writes survive: a quorum of the voters holds the cluster's data.
	if v, _ := w.voters(); v > 0 {
		holders := 0
		for _, m := range w.members {
			if d := w.data[m.ord]; !m.learner && d != nil && d.id == m.id {
				holders++
			}
		}
		if holders < etcdstate.Quorum(v)-w.lost {
			w.t.Fatalf("only %d of %d voters hold the data\n%s", holders, v, w.describe())
		}
	}
}

// step is one sync followed by one tick, with every check; a drain evicts between the two and
// its disruption controller counts after the tick.
func (w *simWorld) step() Decision {
	w.t.Helper()
	d := w.sync()
	w.checkVolumes(d)
	if w.drain != nil {
		w.drain.evictSometimes()
	}
	w.tick()
	w.checkWorld()
	return d
}

// converged: the last decision was steady and the world matches the spec.
func (w *simWorld) converged(d Decision) bool {
	if d.Action.Type != Steady || w.sts == nil {
		return false
	}
	v, h := w.voters()
	if v != int(*w.cluster.Spec.Size) || h != v || len(w.members) != v || w.sts.replicas != v {
		return false
	}
	for _, p := range w.pods {
		if p.spec != w.sts.updateSpec || !p.running {
			return false
		}
	}
	return w.volumesConverged()
}

// run steps until converged, failing after limit syncs; it returns the stats of the run.
func (w *simWorld) run(limit int) simStats {
	w.t.Helper()
	before := w.stats
	for i := 0; i < limit; i++ {
		if w.converged(w.step()) {
			s := w.stats
			s.syncs -= before.syncs
			s.adds -= before.adds
			s.promotes -= before.promotes
			s.removes -= before.removes
			s.leaderMoves -= before.leaderMoves
			s.replacements -= before.replacements
			s.jobFailures -= before.jobFailures
			return s
		}
	}
	w.t.Fatalf("not converged after %d syncs:\n%s\nlast actions:\n  %s", limit, w.describe(), strings.Join(lastN(w.log, 12), "\n  "))
	return simStats{}
}

func lastN(ss []string, n int) []string {
	if len(ss) > n {
		return ss[len(ss)-n:]
	}
	return ss
}

// describe prints the world in one line per part.
func (w *simWorld) describe() string {
	var b strings.Builder
	var ms []string
	sort.Slice(w.members, func(i, j int) bool { return w.members[i].ord < w.members[j].ord })
	for _, m := range w.members {
		s := w.podName(m.ord)
		if m.learner {
			s += "(learner)"
		}
		if !m.started {
			s += "(unstarted)"
		}
		if m.id == w.leader {
			s += "*"
		}
		if !w.healthy(m) {
			s += "!"
		}
		ms = append(ms, s)
	}
	fmt.Fprintf(&b, "members: %s\n", strings.Join(ms, " "))
	var ps []string
	for _, ord := range sortedInts(w.pods) {
		p := w.pods[ord]
		s := fmt.Sprintf("%d", ord)
		if w.sts != nil && p.spec != w.sts.updateSpec {
			s += "(old)"
		}
		if !p.running {
			s += fmt.Sprintf("(down,%d restarts", p.restarts)
			if p.why != "" {
				s += ": " + p.why
			}
			s += ")"
		}
		if p.terminating {
			s += "(terminating)"
		}
		if p.old {
			s += "(old membership)"
		}
		ps = append(ps, s)
	}
	fmt.Fprintf(&b, "pods: %s\n", strings.Join(ps, " "))
	if w.sts != nil {
		fmt.Fprintf(&b, "statefulset: replicas=%d partition=%d", w.sts.replicas, w.sts.partition)
	}
	return b.String()
}

func sortedInts[V any](m map[int]V) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

func sortedKeysOf[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// encodeDecision is the decision's wire form, for byte comparisons.
func encodeDecision(t testing.TB, d Decision) string {
	t.Helper()
	var children []string
	for _, c := range d.Children {
		b, err := json.Marshal(c.Object)
		if err != nil {
			t.Fatalf("encoding %s: %v", c.Name, err)
		}
		children = append(children, string(b))
	}
	st, err := json.Marshal(d.Status)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s\n%s\n%v %v %v", strings.Join(children, "\n"), st, d.Action, d.ResyncAfterSeconds, d.Finalized)
}

// backup is a backup Job's snapshot: never while a membership change is under way (a learner
// joins, a member was added without its pod, a pod waits for its member), and only from a
// healthy voter. false: no member could give one. One that started earlier (a slow backup)
// was checked then: a change after its start does not touch the snapshot it streams.
func (w *simWorld) backup(startedEarlier bool) bool {
	if !startedEarlier {
		w.checkBackupStart()
	}
	// A follower first, as the member tool reads from one.
	var from *simMember
	for _, m := range w.members {
		if w.healthy(m) && (from == nil || from.id == w.leader) {
			from = m
		}
	}
	if from == nil {
		return false
	}
	w.backups = append(w.backups, simBackup{revision: from.raft, live: from.live, member: from.id})
	return true
}

// checkBackupStart fails the test when a backup starts during a membership change.
func (w *simWorld) checkBackupStart() {
	for _, m := range w.members {
		if m.learner || !m.started {
			w.t.Fatalf("a backup runs during a membership change:\n%s", w.describe())
		}
	}
	for _, ord := range sortedInts(w.pods) {
		if w.memberAt(ord) == nil && w.sts != nil && ord < w.sts.replicas {
			w.t.Fatalf("a backup runs while pod %s waits for its member:\n%s", w.podName(ord), w.describe())
		}
	}
}

// backupPods are the pods of finished backup Jobs, with the report the member tool writes
// to the termination message; the Job controller's label names the Job.
func (w *simWorld) backupPods(jobs []batchv1.Job) []corev1.Pod {
	var out []corev1.Pod
	for _, j := range jobs {
		sj := w.jobs[j.Name]
		if j.Labels[LabelAction] == verbDrill && sj != nil && sj.state != jobRunning {
			out = append(out, w.drillPod(j, sj))
		}
		if j.Labels[LabelAction] != verbBackup || sj == nil || sj.state == jobRunning {
			continue
		}
		pod := corev1.Pod{}
		pod.Name, pod.Namespace = j.Name+"-x1", w.cluster.Namespace
		pod.Labels = map[string]string{LabelBackupOf: w.cluster.Name, batchv1.JobNameLabel: j.Name}
		r := backupresult.Result{Error: "no member could give a snapshot"}
		if w.destination.refuses {
			r.Error = "s3://backups/default/etcd/: Access Denied"
		}
		pod.Status.Phase = corev1.PodFailed
		if sj.evicted {
			pod.Status.Reason = "Evicted"
			pod.Status.Message = fmt.Sprintf("Usage of EmptyDir volume %q exceeds the limit %q. ", volumeBackupWork, resource.NewQuantity(sj.scratch, resource.BinarySI).String())
			out = append(out, pod)
			continue
		}
		if sj.state == jobSucceeded {
			b := w.backups[len(w.backups)-1]
			r = backupresult.Result{Object: fmt.Sprintf("s3://backups/default/etcd/etcd-r%d.db", b.revision), Revision: int64(b.revision), Size: 4096, MemberID: fmt.Sprintf("%x", b.member)}
			pod.Status.Phase = corev1.PodSucceeded
		}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "member", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Message: backupresult.Encode(r)}}}}
		out = append(out, pod)
	}
	return out
}
