package sync

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
)

// view is one observation partitioned into role-named parts, built once so that each phase
// reads like the workflow and stays short.
type view struct {
	cfg    Config
	obs    *Observed
	c      *v1alpha1.EtcdCluster // defaulted
	size   int
	spec   podSpec     // the pod template the spec asks for now
	labels childLabels // of the top-level children
	tls    tlsView     // the TLS stage spec renders, and what the pods serve

	pods    map[int]*corev1.Pod // the cluster's pods by ordinal
	members []*member           // etcd members by ordinal
	byOrd   map[int]*member
	// stranger is a member whose name or peer URL is not one of this cluster's ordinals.
	stranger string
	leader   *member

	sts       *appsv1.StatefulSet // observed; nil when missing
	replicas  int                 // observed StatefulSet replicas
	partition int                 // observed StatefulSet partition
	join      *corev1.ConfigMap   // observed join ConfigMap; nil when missing
	// ledger merges the join ConfigMap's ledger with its durable copy in status, so that
	// losing either loses nothing.
	ledger ledger
	// clusterID is the etcd cluster ID this cluster is known by (status, else the join
	// ConfigMap); "" before etcd first answered.
	clusterID string
	jobs      []*batchv1.Job // the cluster's member Jobs
	// foreignJobs are the observed Jobs without a member Job's labels (an older or a newer
	// hook's naming).
	foreignJobs []*batchv1.Job
	// target is how many members the cluster runs: the size, and one more while a cluster of
	// two rolls (see surging).
	target int
	// schedule is spec.backup.schedule, parsed once; nil without a backup or a valid schedule.
	schedule cron.Schedule
	// unknown says why etcd's state cannot be trusted, "" when it can; unknownBy is the
	// Degraded reason for it (unknownStateReason).
	unknown, unknownBy string
	// versionWait says why the spec's etcd release waits (v37Wait), "" when it does not; the
	// template keeps the release the StatefulSet runs meanwhile.
	versionWait string
	// safe is the safety state status and the join ConfigMap record, merged (durable.go).
	safe durable
	// v2Bound is the raft index up to which v2 requests may be in the log: the recorded one, or
	// without a record the highest one seen, while a cluster on v3.6 is asked for v3.7
	// (versions.go); 0 when there is nothing to wait for or nothing to know.
	v2Bound int64
}

// member is an etcd member with its ordinal and pod.
type member struct {
	etcdstate.Member
	ordinal int
	name    string      // pod name, also for a member that has not started
	pod     *corev1.Pod // nil when the pod does not exist
}

func newView(cfg Config, obs *Observed, c *v1alpha1.EtcdCluster) *view {
	v := &view{
		cfg:    cfg,
		obs:    obs,
		c:      c,
		size:   int(*c.Spec.Size),
		labels: labelsOf(c),
		pods:   map[int]*corev1.Pod{},
		byOrd:  map[int]*member{},
		ledger: ledger{},
	}
	for i := range obs.Pods {
		if ord, ok := ownPod(c, &obs.Pods[i]); ok {
			v.pods[ord] = &obs.Pods[i]
		}
	}
	for _, m := range obs.Etcd.Members {
		ord, ok := v.memberOrdinal(m)
		if !ok || v.byOrd[ord] != nil {
			v.stranger = fmt.Sprintf("member %x (name %q, peer URLs %v)", m.ID, m.Name, m.PeerURLs)
			continue
		}
		mm := &member{Member: m, ordinal: ord, name: PodName(c.Name, ord), pod: v.pods[ord]}
		v.byOrd[ord] = mm
		v.members = append(v.members, mm)
		if m.IsLeader {
			v.leader = mm
		}
	}
	sort.Slice(v.members, func(i, j int) bool { return v.members[i].ordinal < v.members[j].ordinal })
	for i := range obs.Children.StatefulSets {
		if s := &obs.Children.StatefulSets[i]; s.Name == StatefulSetName(c.Name) {
			v.sts = s
			if s.Spec.Replicas != nil {
				v.replicas = int(*s.Spec.Replicas)
			}
			if ru := s.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.Partition != nil {
				v.partition = int(*ru.Partition)
			}
		}
	}
	for i := range obs.Children.ConfigMaps {
		if cm := &obs.Children.ConfigMaps[i]; cm.Name == JoinConfigMapName(c.Name) {
			v.join = cm
			v.ledger = decodeLedger(cm.Annotations[AnnotationLedger])
		}
	}
	v.ledger = mergeLedgers(v.ledger, ledgerFromStatus(obs.Cluster.Status.Ledger))
	v.safe = mergedDurable(obs.Cluster.Status, v.join)
	v.clusterID = obs.Cluster.Status.ClusterID
	if v.clusterID == "" && v.join != nil {
		v.clusterID = v.join.Annotations[AnnotationClusterID]
	}
	for i := range obs.Children.Jobs {
		if j := &obs.Children.Jobs[i]; j.Labels[LabelCluster] == c.Name && j.Labels[LabelAction] != "" {
			v.jobs = append(v.jobs, j)
		} else {
			v.foreignJobs = append(v.foreignJobs, j)
		}
	}
	sort.Slice(v.jobs, func(i, j int) bool { return v.jobs[i].Name < v.jobs[j].Name })
	v.unknown, v.unknownBy = unknownStateReason(v)
	// The template follows the pods through a TLS change, so it is rendered from what they run.
	v.tls = newTLSView(v)
	rendered := c
	v.v2Bound = v.v2Fallback()
	if held := v.heldVersion(); held != "" {
		if v.versionWait = v.v37Wait(); v.versionWait != "" {
			kept := *c
			kept.Spec.Version = held
			rendered = &kept
		}
	}
	v.spec = keptTool(cfg, restoreRendered(obs, rendered), v.tls.desired, v.sts)
	if b := c.Spec.Backup; b != nil {
		if sched, err := v1alpha1.ParseSchedule(b.Schedule); err == nil {
			v.schedule = sched
		}
	}
	v.target = v.size
	if v.surging() {
		v.target = v.size + 1
	}
	return v
}

// surging: a cluster of two cannot take a member down without losing quorum (two voters
// need both), so while a pod of it is to be rolled a third member joins first and leaves once
// the roll is done. Quorum never drops below what the size promises, at the cost of one
// temporary pod.
func (v *view) surging() bool {
	if v.size != 2 {
		return false
	}
	for ord, p := range v.pods {
		if ord < v.size && (isTerminating(p) || v.outdated(p)) {
			return true
		}
	}
	return false
}

// memberOrdinal finds a member's ordinal by its peer URL, which must name one of this
// cluster's pods, and for a started member also by its name, which must be that pod's: a
// member at etcd-3's peer URL that calls itself etcd-1, or anything else, has no ordinal (the
// view counts it a stranger). A member added but not started has only its peer URL (etcd
// learns the name on start).
func (v *view) memberOrdinal(m etcdstate.Member) (int, bool) {
	for _, p := range m.PeerURLs {
		u, err := url.Parse(p)
		if err != nil {
			continue
		}
		pod, _, _ := strings.Cut(u.Hostname(), ".")
		ord, ok := Ordinal(v.c.Name, pod)
		if !ok || u.Hostname() != MemberHost(v.c, pod, v.cfg.ClusterDomain) {
			continue
		}
		if m.Started() && m.Name != pod {
			return 0, false
		}
		return ord, true
	}
	return 0, false
}

// voters are the members that vote, learners those that do not.
func (v *view) voters() []*member   { return v.filter(func(m *member) bool { return !m.IsLearner }) }
func (v *view) learners() []*member { return v.filter(func(m *member) bool { return m.IsLearner }) }

// healthyVoters counts the voters that answered healthy.
func (v *view) healthyVoters() int {
	return len(v.filter(func(m *member) bool { return !m.IsLearner && m.Healthy }))
}

// unansweredVoters are the voters the hook could not reach whose pods may serve.
func (v *view) unansweredVoters() []*member {
	return v.filter(func(m *member) bool { return !m.IsLearner && m.unanswered() })
}

// unanswered: the member did not answer the hook, but its pod is Ready, so the kubelet's
// probe of its own health passes, or only the node controller marked it not Ready
// (nodeNotReporting); for a learner that has started, whose pod is never Ready
// (readinessProbe), its etcd container runs, which its liveness probe keeps so only while etcd
// answers it. Nothing from etcd or the kubelet says something is wrong: the member is unknown,
// not failed, and is never removed or replaced on that view alone. (A learner that has not
// started is not expected to answer: its container may run something else, or wait.)
func (m *member) unanswered() bool {
	return !m.Reachable && (mayServe(m.pod) || m.IsLearner && m.Started() && etcdRunning(m.pod))
}

// unansweredWhy says why an unanswered member may still serve, and the Degraded reason for it.
func (m *member) unansweredWhy() (why, degradedBy string) {
	switch {
	case nodeNotReporting(m.pod):
		return "its node stopped reporting (the node controller marked its pod not Ready; its etcd was last seen running)", ReasonNodeNotReporting
	case !mayServe(m.pod):
		return "its etcd container runs", ReasonMemberUnanswered
	}
	return "its pod is Ready", ReasonMemberUnanswered
}

func (v *view) filter(keep func(*member) bool) []*member {
	var out []*member
	for _, m := range v.members {
		if keep(m) {
			out = append(out, m)
		}
	}
	return out
}

// maxMemberOrdinal is the highest ordinal holding a member, -1 with no members.
func (v *view) maxMemberOrdinal() int {
	if len(v.members) == 0 {
		return -1
	}
	return v.members[len(v.members)-1].ordinal
}

// freeOrdinal is where the next member goes: the lowest ordinal without one, so gaps are
// filled first and no running member is ever renumbered. missing says it is below the target.
func (v *view) freeOrdinal() (ord int, missing bool) {
	for ord = 0; v.byOrd[ord] != nil; ord++ {
	}
	return ord, ord < v.target
}

// outdated reports whether a pod runs a template other than the one the spec asks for now.
func (v *view) outdated(p *corev1.Pod) bool {
	return p.Annotations[AnnotationSpecHash] != v.spec.specHash
}

// drifted reports whether a pod's configuration, not counting the etcd version, differs.
func (v *view) drifted(p *corev1.Pod) bool {
	return p.Annotations[AnnotationConfigHash] != v.spec.configHash
}

// protectivePartition keeps every live outdated pod on its old template: the StatefulSet
// only replaces pods at or above the partition, and the planner replaces them one at a time.
// A pod that is gone or going is recreated from the current template.
func (v *view) protectivePartition() int { return v.highestOutdated() + 1 }

// highestOutdated is the highest ordinal of a live pod on an outdated template, -1 when none:
// the next pod to roll.
func (v *view) highestOutdated() int {
	top := -1
	for ord, p := range v.pods {
		if !isTerminating(p) && v.outdated(p) && ord > top {
			top = ord
		}
	}
	return top
}

// replacementBlocker names the pod that keeps the partition from being lowered onto ord yet,
// and why; "" when it may be. The StatefulSet controller deletes the pod at the partition as
// soon as every pod above it is ready, without the planner's quorum and leadership checks at
// that moment: so every pod above ord must already run the current spec and be up, and every
// pod from the observed partition up, which the StatefulSet may be replacing, must be up.
// Outdated pods below ord are the ones still to roll.
func (v *view) replacementBlocker(ord int) (name, why string) {
	for o := min(v.partition, ord+1); o < v.replicas; o++ {
		if o == ord {
			continue
		}
		name = PodName(v.c.Name, o)
		pod := v.pods[o]
		if o > ord && pod != nil && !isTerminating(pod) && v.outdated(pod) {
			return name, "pod " + name + " still runs an outdated spec"
		}
		if why := v.notUp(o); why != "" {
			return name, why
		}
	}
	return "", ""
}

// notUp says why the pod at o is not a ready pod with a healthy voter on it; "" when it is.
func (v *view) notUp(o int) string {
	name := PodName(v.c.Name, o)
	pod, m := v.pods[o], v.byOrd[o]
	switch {
	case pod == nil:
		return "pod " + name + " is missing"
	case isTerminating(pod):
		return "pod " + name + " is terminating"
	case !isReady(pod):
		return "pod " + name + " is not ready"
	case m == nil || m.IsLearner || !m.Started() || !m.Healthy:
		return "member " + name + " is not a healthy voter"
	}
	return ""
}

// canReplace: the partition may be lowered onto ord now.
func (v *view) canReplace(ord int) bool {
	_, why := v.replacementBlocker(ord)
	return why == ""
}

// unansweredSince is when the hook first found m not answering while its pod was Ready: the
// time the last status recorded for the same member, else now.
func (v *view) unansweredSince(m *member) time.Time {
	id := fmt.Sprintf("%x", m.ID)
	for _, prev := range v.obs.Cluster.Status.Members {
		if prev.Name == m.name && prev.ID == id && prev.UnansweredSince != nil {
			return prev.UnansweredSince.Time
		}
	}
	return v.obs.Now
}

// oldPodsGoing are the cluster's pods going with their StatefulSet, which is missing: one
// deleted by hand (`kubectl delete statefulset` without --cascade=orphan), whose pods the
// garbage collector deletes. Such a pod still names the StatefulSet as its controller until it
// is deleted (an orphaning deletion takes that reference away first), then is terminating
// until its grace period ends. The StatefulSet is created again only once they are gone:
// created over them, it fails to create each pod whose name is still taken, and the
// StatefulSet controller retries with a back-off that doubles on each failure, so the pods
// came back only 40 s after the last old one went (the control-plane tier,
// statefulset-deleted). A pod past its grace period is not waited for: one stuck on a lost
// node would keep every pod from coming back.
func (v *view) oldPodsGoing() []string {
	if v.sts != nil {
		return nil
	}
	var going []string
	for _, ord := range slices.Sorted(maps.Keys(v.pods)) {
		p := v.pods[ord]
		owned := slices.ContainsFunc(p.OwnerReferences, func(r metav1.OwnerReference) bool {
			return r.Kind == "StatefulSet" && r.Name == StatefulSetName(v.c.Name) && r.Controller != nil && *r.Controller
		})
		if isTerminating(p) && v.obs.Now.Before(p.DeletionTimestamp.Time) || !isTerminating(p) && owned {
			going = append(going, p.Name)
		}
	}
	return going
}

// leaderTarget is where leadership goes before the leader's pod is disrupted: the lowest
// ordinal healthy started voter other than the leader, because higher ordinals are replaced
// and removed first.
func (v *view) leaderTarget(leaving *member) *member {
	for _, m := range v.members {
		if m != leaving && !m.IsLearner && m.Healthy && m.Started() {
			return m
		}
	}
	return nil
}

func memberNames(ms []*member) string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.name
	}
	return strings.Join(names, ", ")
}
