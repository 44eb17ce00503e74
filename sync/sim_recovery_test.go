package sync

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

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
