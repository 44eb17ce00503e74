package sync

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/joinstate"
)

// recoveringWorld is a cluster of three whose etcd-1 and etcd-2 crash on every start (their
// data kept), while a person asks to recover from etcd-0, stepped until status says phase.
// Mounted files reach the pods 60s, 105s and 150s late.
func recoveringWorld(t *testing.T, phase string) *simWorld {
	t.Helper()
	w, _ := created(t, 3, true)
	w.lag = nil // the story controls what is seen
	w.withMountDelays(60*time.Second, 45*time.Second)
	w.faulty = true
	w.pods[1].crash, w.pods[2].crash = true, true
	w.cluster.Annotations = map[string]string{v1alpha1.AnnotationForceNewClusterFrom: "etcd-0"}
	for i := 0; i < 60; i++ {
		w.step()
		if r := w.cluster.Status.Recovery; r != nil && r.Phase == phase {
			return w
		}
	}
	t.Fatalf("no recovery %s after 60 syncs:\n%s\n  %s", phase, w.describe(), strings.Join(lastN(w.log, 12), "\n  "))
	return nil
}

// fencedBy fails unless join state st fences every member but survivor, and tells survivor to
// force when force is set.
func fencedBy(t *testing.T, st *joinstate.State, survivor string, force bool) {
	t.Helper()
	if st == nil {
		t.Fatal("no join state")
	}
	for _, m := range st.Members {
		if m.Name != survivor && !m.Fenced {
			t.Errorf("join state does not fence %s: %s", m.Name, joinstate.Encode(*st))
		}
	}
	if got := st.Recovery != nil && st.Recovery.Survivor == survivor; got != force {
		t.Errorf("join state tells %s to force: %v, want %v", survivor, got, force)
	}
}

// TestRecoveryJoinStateKeepsFences: every sync during Forcing renders the fences and the
// force, also one that waits on an observed Job, and a hold that finds the join ConfigMap
// gone and renders it again.
func TestRecoveryJoinStateKeepsFences(t *testing.T) {
	t.Run("a Job observed", func(t *testing.T) {
		w := recoveringWorld(t, recoveryForcing)
		c := v1alpha1.Defaulted(w.cluster)
		j := memberJob{verb: verbMoveLeader, member: "etcd-0", id: w.memberAt(0).id, endpoints: []string{"http://etcd-0.etcd.default.svc.cluster.local:2379"}}.render(simConfig, &c)
		b, err := json.Marshal(j.Object)
		if err != nil {
			t.Fatal(err)
		}
		w.applied["Job/"+j.Name] = b
		w.jobs[j.Name] = w.newJob(b)
		if d := w.sync(); d.Action.Type != Wait || !strings.Contains(d.Action.Reason, j.Name) {
			t.Fatalf("%v: %s, want a wait on Job %s", d.Action.Type, d.Action.Reason, j.Name)
		}
		fencedBy(t, w.join, "etcd-0", true)
	})
	t.Run("a hold without the join ConfigMap", func(t *testing.T) {
		w := recoveringWorld(t, recoveryForcing)
		w.deleteChild("configmap", false)
		w.etcdOverride = func(s *etcdstate.Snapshot) { *s = etcdstate.Snapshot{Err: "context deadline exceeded"} }
		if d := w.sync(); d.Action.Type != Hold {
			t.Fatalf("%v: %s, want a hold", d.Action.Type, d.Action.Reason)
		}
		fencedBy(t, w.join, "etcd-0", true)
	})
}

// TestRecoveryOutlivesItsStatus: status.recovery has a copy on the join ConfigMap. A status
// lost during Forcing, or rewritten by an older hook replica without the field, keeps the
// fences and the force, at once and on every sync after.
func TestRecoveryOutlivesItsStatus(t *testing.T) {
	w := recoveringWorld(t, recoveryForcing)
	w.cluster.Status.Recovery = nil
	for range 3 {
		w.step()
		fencedBy(t, w.join, "etcd-0", true)
	}
	if r := w.cluster.Status.Recovery; r == nil || r.Phase != recoveryForcing {
		t.Errorf("status.recovery %+v, want Forcing again", r)
	}
}

// TestRecoveryPhaseUnknownHolds: a recovery in a phase this build does not know (a newer
// hook's) is not acted on: every sync holds, says so, and leaves the join ConfigMap's fences
// and force as they are.
func TestRecoveryPhaseUnknownHolds(t *testing.T) {
	w := recoveringWorld(t, recoveryForcing)
	before := joinstate.Encode(*w.join)
	r := *w.cluster.Status.Recovery
	r.Phase = "Verifying"
	w.cluster.Status.Recovery = &r
	w.applied["ConfigMap/"+JoinConfigMapName(w.cluster.Name)] = withAnnotation(t, w.applied["ConfigMap/"+JoinConfigMapName(w.cluster.Name)], AnnotationRecovery, "")
	for range 3 {
		d := w.step()
		cond := apimetaCondition(d, v1alpha1.ConditionDegraded)
		if d.Action.Type != Hold || !strings.Contains(d.Action.Reason, `phase "Verifying", which this hook does not know`) || cond == nil || cond.Reason != ReasonRecoveryPhaseUnknown {
			t.Fatalf("%v: %s (Degraded %+v), want a hold naming the phase", d.Action.Type, d.Action.Reason, cond)
		}
		if got := joinstate.Encode(*w.join); got != before {
			t.Fatalf("the join state changed:\n%s\nwant\n%s", got, before)
		}
		if p := w.cluster.Status.Recovery; p == nil || p.Phase != "Verifying" {
			t.Fatalf("status.recovery %+v, want it kept", p)
		}
	}
}

// withAnnotation is a child's JSON with annotation k set to v, or dropped when v is "".
func withAnnotation(t *testing.T, raw []byte, k, v string) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	md, _ := m["metadata"].(map[string]any)
	ann, _ := md["annotations"].(map[string]any)
	if ann == nil {
		ann = map[string]any{}
		md["annotations"] = ann
	}
	if v == "" {
		delete(ann, k)
	} else {
		ann[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func apimetaCondition(d Decision, typ string) *metav1.Condition {
	for i := range d.Status.Conditions {
		if d.Status.Conditions[i].Type == typ {
			return &d.Status.Conditions[i]
		}
	}
	return nil
}

// TestRecoveryNeverUnfencesWhileTheSurvivorMayForce: the survivor has been told to force, and
// the two fenced members come back healthy on the old membership anyway (their kubelets could
// neither refresh the fence nor report: the guarantee a person gives when declaring them lost
// was wrong). The recovery is withdrawn, not cancelled: the survivor's mounted file may still
// carry the force for a minute, so the fences stand until it cannot, and the survivor's
// launcher does not force while the others answer. The cluster ends as one, of three members.
func TestRecoveryNeverUnfencesWhileTheSurvivorMayForce(t *testing.T) {
	w := recoveringWorld(t, recoveryForcing)
	for _, ord := range []int{1, 2} {
		p := w.pods[ord]
		p.crash, p.running, p.restarts = false, true, 0
	}
	var withdrawnAt time.Time
	prev := recoveryForcing
	for i := 0; i < 60 && prev != recoveryCancelled && prev != recoveryDone; i++ {
		w.step()
		r := w.cluster.Status.Recovery
		switch {
		case prev == recoveryForcing && r.Phase != recoveryForcing && r.Phase != recoveryWithdrawing:
			t.Fatalf("the recovery went from Forcing to %s while etcd lists %d members:\n%s", r.Phase, len(w.members), w.describe())
		case r.Phase == recoveryWithdrawing:
			fencedBy(t, w.join, "etcd-0", false)
			if withdrawnAt.IsZero() {
				withdrawnAt = w.now
			}
		case r.Phase == recoveryCancelled && w.now.Sub(withdrawnAt) < fenceMountDelay:
			t.Fatalf("cancelled %s after the force was withdrawn, before the survivor's mount must have dropped it", w.now.Sub(withdrawnAt))
		}
		prev = r.Phase
	}
	if prev != recoveryCancelled {
		t.Fatalf("recovery %s, want Cancelled:\n%s", prev, w.describe())
	}
	w.faulty = false
	w.run(100)
	if w.stats.forced != 0 {
		t.Errorf("the survivor forced a new cluster %d times beside a live quorum", w.stats.forced)
	}
}

// TestRecoveryCountsAMissingPodAsRunning: automatic recovery waits while a lost voter has no
// pod in the observation: a pod deleted off a node that stopped answering may still run there.
func TestRecoveryCountsAMissingPodAsRunning(t *testing.T) {
	w, _ := created(t, 3, true)
	w.lag = nil
	w.faulty = true
	w.cluster.Spec.Recovery = &v1alpha1.RecoverySpec{QuorumLoss: v1alpha1.QuorumLossForceNewCluster}
	for _, ord := range []int{1, 2} {
		delete(w.data, ord)
		w.pods[ord].running = false
		w.lost++
	}
	w.step()
	w.step()
	w.now = w.now.Add(6 * time.Minute)
	obs := w.observe()
	for i, p := range obs.Pods {
		if p.Name == "etcd-2" {
			obs.Pods = append(obs.Pods[:i], obs.Pods[i+1:]...)
			break
		}
	}
	d := Plan(simConfig, obs)
	if d.Status.Recovery != nil || !strings.Contains(d.Action.Reason, "etcd-2 has no pod") {
		t.Errorf("%v: %s (recovery %+v), want a hold naming etcd-2's missing pod", d.Action.Type, d.Action.Reason, d.Status.Recovery)
	}
}

// TestRandomRecoveries mixes quorum recoveries with the faults that make them dangerous, on a
// kubelet as slow as a real one (each pod's mounted files a minute or more late, by its own
// delay). Each round takes two members down at once, each in its own way: a crash loop, a
// hang, an etcd that runs on cut off while its pod still reports it running, a node
// partitioned and later declared lost (its pod replaced, waiting for its volume), a volume lost
// for good. Meanwhile the hook loses a member, the join ConfigMap is deleted, etcd cannot be
// reached for a sync, time jumps, and a person names a survivor at any moment or takes the
// annotation back; automatic recovery is on for half the seeds. Every invariant holds at every
// step, and no two clusters ever both have a quorum under the name (checkFork). Once the world
// heals, the cluster converges to three healthy members.
func TestRandomRecoveries(t *testing.T) {
	forced := 0
	for seed := int64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewSource(seed))
			w, _ := created(t, 3, true)
			w.withMountDelays(time.Duration(60+rng.Intn(30))*time.Second, time.Duration(15+rng.Intn(30))*time.Second)
			w.faulty = true
			if seed%2 == 0 {
				w.cluster.Spec.Recovery = &v1alpha1.RecoverySpec{QuorumLoss: v1alpha1.QuorumLossForceNewCluster, After: &metav1.Duration{Duration: time.Minute}}
			}
			var heal []func()
			downs := []func(ord int, p *simPod){
				func(_ int, p *simPod) { p.crash = true; heal = append(heal, func() { p.crash = false }) },
				func(_ int, p *simPod) { p.down = true; heal = append(heal, func() { p.down = false }) },
				func(_ int, p *simPod) { // cut off, its etcd running on
					p.down, p.blind, p.stuck = true, true, true
					heal = append(heal, func() { p.down, p.blind, p.stuck = false, false, false })
				},
				func(_ int, p *simPod) { // partitioned: evicted, stuck terminating
					p.down, p.terminating, p.stuck = true, true, true
					heal = append(heal, func() { p.down, p.stuck = false, false })
				},
				func(ord int, p *simPod) { // its volume lost for good; at most one, to leave data
					if m := w.memberAt(ord); m != nil && !m.learner && w.data[ord] != nil && w.lost == 0 {
						delete(w.data, ord)
						p.running = false
						w.lost++
					}
				},
			}
			others := []func(){
				func() { // a node declared lost: its stuck pods are force-deleted
					for ord, p := range w.pods {
						if p.stuck && p.terminating {
							p.stuck = false
							w.attaching[ord] = true
							heal = append(heal, func() { delete(w.attaching, ord) })
						}
					}
				},
				func() {
					if p := w.randomPod(rng); p != nil {
						p.blind = true
						heal = append(heal, func() { p.blind = false })
					}
				},
				func() {
					if ords := sortedInts(w.pods); len(ords) > 0 {
						w.cluster.Annotations = map[string]string{v1alpha1.AnnotationForceNewClusterFrom: w.podName(ords[rng.Intn(len(ords))])}
					}
				},
				func() { w.cluster.Annotations = nil },
				func() { w.now = w.now.Add(time.Duration(1+rng.Intn(4)) * time.Minute) },
				func() { w.deleteChild("configmap", false) },
				func() {
					w.etcdOverride = func(s *etcdstate.Snapshot) { *s = etcdstate.Snapshot{Err: "context deadline exceeded"} }
				},
			}
			for round := 0; round < 5; round++ {
				for _, ord := range rng.Perm(3)[:2] {
					if p := w.pods[ord]; p != nil {
						f := rng.Intn(len(downs))
						w.log = append(w.log, fmt.Sprintf("down %d on %s", f, w.podName(ord)))
						downs[f](ord, p)
					}
				}
				for i := 0; i < 60; i++ {
					if rng.Intn(5) == 0 {
						f := rng.Intn(len(others))
						w.log = append(w.log, fmt.Sprintf("fault %d", f))
						others[f]()
					}
					w.step()
				}
				for _, h := range heal {
					h()
				}
				heal = nil
				for i := 0; i < 20; i++ {
					w.step()
				}
			}
			w.cluster.Annotations = nil
			w.cluster.Spec.Recovery = &v1alpha1.RecoverySpec{QuorumLoss: v1alpha1.QuorumLossForceNewCluster, After: &metav1.Duration{Duration: time.Minute}}
			w.run(800)
			forced += w.stats.forced
		})
	}
	t.Logf("%d new clusters forced", forced)
}
