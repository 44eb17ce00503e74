package sync

import (
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"

	apimeta "k8s.io/apimachinery/pkg/api/meta"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
)

// The observation-level fork: at a pod's address a second membership answers, and the
// member the list has there is gone from the cluster. What the observer makes of such
// answers (membership.assemble, tested there on real etcd) is modelled here: the snapshot
// is inconsistent and names the pods involved.
const (
	// simForkCluster: the pod answers for another cluster ID (another cluster's member on
	// its address, or a cluster restored beside this one).
	simForkCluster = "forked-cluster"
	// simForkMember: the pod answers under the cluster's ID but a member ID the list lacks,
	// and leads a membership of its own (a copy of a volume forced into a new cluster).
	simForkMember = "forked-member"
	// simForkCopy: the pod answers under the cluster's ID and a member ID the list lacks and
	// that was never this pod's, and leads nothing the hook can see (a copy of a volume
	// started beside the cluster, whose leader the hook cannot reach).
	simForkCopy = "forked-copy"
)

// simForeignMemberID is the member ID a forked copy answers under.
const simForeignMemberID = 0xf0f0

// fork makes a second membership answer at p's address; its own member is down.
func (w *simWorld) fork(p *simPod, kind string) {
	p.forked, p.down = kind, true
}

// forkedAnswers turns the snapshot into what the observer reads when forked pods answer.
func (w *simWorld) forkedAnswers(s *etcdstate.Snapshot) {
	if !s.Asked {
		return
	}
	var conflicts []string
	forked := s.Forked
	for _, ord := range sortedInts(w.pods) {
		kind := w.pods[ord].forked
		if kind == "" {
			continue
		}
		name := w.podName(ord)
		for i := range s.Members {
			if m := &s.Members[i]; m.Name == name {
				m.Reachable, m.Healthy, m.IsLeader = false, false, false
				m.Errors = append(m.Errors, "its address answers as another membership")
				s.Complete = false
			}
		}
		if kind == simForkCopy {
			// The observer reports it for the planner to judge (membership.assemble).
			s.Unlisted = append(s.Unlisted, etcdstate.Unlisted{Endpoint: name, MemberID: simForeignMemberID})
			continue
		}
		forked = append(forked, name)
		if kind == simForkCluster {
			conflicts = append(conflicts, fmt.Sprintf("%s answers for cluster %x, the member list for %x", name, s.ClusterID+1, s.ClusterID))
			continue
		}
		conflicts = append(conflicts, fmt.Sprintf("%s answers as member %x, which is not in the member list", name, simForeignMemberID))
		if l, ok := s.Leader(); ok {
			conflicts = append(conflicts, fmt.Sprintf("%s (term %d), %s (outside the member list) each report themselves leader", l.Name, l.RaftTerm, name))
			forked = append(forked, l.Name)
		}
	}
	if len(conflicts) == 0 {
		return
	}
	if s.Inconsistent != "" {
		conflicts = append([]string{s.Inconsistent}, conflicts...)
	}
	s.Inconsistent = strings.Join(conflicts, "; ")
	slices.Sort(forked)
	s.Forked = slices.Compact(forked)
}

// randomFork forks a random pod, of either kind, and adds its healing to heal.
func (w *simWorld) randomFork(rng *rand.Rand, heal *[]func()) {
	p := w.randomPod(rng)
	if p == nil {
		return
	}
	w.fork(p, []string{simForkCluster, simForkMember, simForkCopy}[rng.Intn(3)])
	*heal = append(*heal, func() { p.forked, p.down = "", false })
}

// TestForkHoldsEveryChange: while a second membership answers, during scale and rolling
// changes with volumes and without, no sync starts a member Job, changes the StatefulSet
// or the join state, each names the pods, and each after the first says EtcdForked; once the
// fork is gone the cluster converges.
func TestForkHoldsEveryChange(t *testing.T) {
	for seed := int64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewSource(seed))
			w, _ := created(t, 3, seed%2 == 1)
			w.faulty = true
			changes := []func(){
				func() { w.cluster.Spec.Size = ptrTo(int32(5)) },
				func() { w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=5000"} },
				func() { w.cluster.Spec.Version = "v3.6.17" },
				func() { w.cluster.Spec.Size = ptrTo(int32(3)) },
			}
			for _, change := range changes {
				change()
				w.cluster.Generation++
				var heal []func()
				healAt, forks := -1, 0
				for i := 0; i < 60; i++ {
					if healAt < 0 && rng.Intn(5) == 0 {
						w.randomFork(rng, &heal)
						healAt = i + 2 + rng.Intn(8)
					}
					if i == healAt {
						for _, h := range heal {
							h()
						}
						heal, healAt = nil, -1
					}
					if w.forkedStep(t) {
						forks++
					}
				}
				for _, h := range heal {
					h()
				}
				if testing.Verbose() {
					t.Logf("%d syncs saw a fork", forks)
				}
				w.run(400)
			}
		})
	}
}

// forkedStep is one step; when the sync saw a fork it checks that the sync changed nothing
// and reports true.
func (w *simWorld) forkedStep(t *testing.T) bool {
	t.Helper()
	forked := ""
	for _, ord := range sortedInts(w.pods) {
		if w.pods[ord].forked != "" {
			forked = w.podName(ord)
			break
		}
	}
	before := map[string]string{}
	for k, v := range w.applied {
		before[k] = string(v)
	}
	seen := w.observe().Etcd
	confirmed := w.cluster.Status.ForkSeenSince != nil && w.now.Sub(w.cluster.Status.ForkSeenSince.Time) >= forkConfirmAfter
	d := w.sync()
	copied := slices.ContainsFunc(seen.Unlisted, func(u etcdstate.Unlisted) bool { return u.MemberID == simForeignMemberID })
	if len(seen.Forked) > 0 || copied {
		cond := apimeta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionDegraded)
		if d.Action.Type != Hold || !strings.Contains(d.Action.Reason, forked) {
			t.Fatalf("%s forked: want a hold naming it; got %v: %s", forked, d.Action.Type, d.Action.Reason)
		}
		if reported := cond != nil && cond.Reason == ReasonEtcdForked; reported != confirmed || reported && !strings.Contains(cond.Message, forked) {
			t.Fatalf("%s forked, seen by the sync before too: %v; Degraded %+v, want %s naming it exactly then", forked, confirmed, cond, ReasonEtcdForked)
		}
		for k, v := range w.applied {
			if kind, _, _ := strings.Cut(k, "/"); kind != "Service" && kind != "PodDisruptionBudget" && before[k] != string(v) {
				t.Fatalf("%s forked: the hold changed %s", forked, k)
			}
		}
	}
	w.tick()
	w.checkWorld()
	return forked != ""
}

// TestRemovedMemberAnsweringIsNoFork: a member removed by scale-in whose etcd never hears of
// its removal (cut off from its peers, not from the hook) keeps answering under the ID the
// ledger recorded for its pod. That is no second membership: scale-in goes on and takes the
// pod. The same answer under an ID that was never the pod's is a fork, and holds.
func TestRemovedMemberAnsweringIsNoFork(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sameID   bool
		wantFork bool
	}{{"its own ID", true, false}, {"another ID", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			w, _ := created(t, 5, true)
			removed := w.memberAt(4).id
			w.cluster.Spec.Size = ptrTo(int32(4))
			w.cluster.Generation++
			for w.memberAt(4) != nil {
				w.step()
			}
			id := removed
			if !tc.sameID {
				id = simForeignMemberID
			}
			var forked, scaled bool
			for i := 0; i < 5; i++ {
				w.etcdOverride = func(s *etcdstate.Snapshot) {
					s.Unlisted = []etcdstate.Unlisted{{Endpoint: w.podName(4), MemberID: id}}
				}
				d := w.step()
				cond := apimeta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionDegraded)
				forked = forked || cond != nil && cond.Status == "True" && cond.Reason == ReasonEtcdForked
				scaled = scaled || d.Action.Type == ScaleStatefulSet
			}
			if forked != tc.wantFork || scaled == tc.wantFork {
				t.Fatalf("etcd-4 answers as %x after its removal: forked %v, scaled in %v; want forked %v\n%s", id, forked, scaled, tc.wantFork, w.describe())
			}
		})
	}
}

// deafen cuts p's etcd off from its peers but not from the hook: the cluster sees its member
// down, it answers the hook (with errors), and once its member is removed it never hears of it,
// running on as the removed member until its pod is restarted.
func (w *simWorld) deafen(p *simPod) {
	p.deaf, p.down = true, true
}

// TestReplacedMemberStillRunningIsNoFork: a voter cut off from its peers but not from the hook
// is replaced on its own pod (removed, then added back as a learner). Its old etcd never hears
// of its removal and keeps answering the hook under its old member ID. That is not a second
// membership: no sync reports EtcdForked, the status names the removed member still running,
// the pod is restarted (by its UID) so that the new member can start there, and the cluster
// converges.
func TestReplacedMemberStillRunningIsNoFork(t *testing.T) {
	for _, learnerFirst := range []bool{false, true} {
		t.Run(fmt.Sprint("learner added before the answer is seen: ", learnerFirst), func(t *testing.T) {
			w, _ := created(t, 3, true)
			w.lag = nil
			old := w.memberAt(1).id
			w.deafen(w.pods[1])
			told := false
			var d Decision
			for i := 0; i < 200 && !w.converged(d); i++ {
				if learnerFirst && w.memberAt(1) == nil {
					// The syncs between the removal and the learner's add do not see the old
					// etcd answer.
					w.etcdOverride = func(s *etcdstate.Snapshot) { s.Unlisted = nil }
				}
				d = w.step()
				cond := apimeta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionDegraded)
				if cond != nil && cond.Reason == ReasonEtcdForked {
					t.Fatalf("sync %d: %s answers as its removed member %x: reported as a fork: %s\n%s", i, w.podName(1), old, cond.Message, w.describe())
				}
				told = told || strings.Contains(d.Action.Reason, fmt.Sprintf("still runs member %x, removed from the cluster", old))
			}
			if !w.converged(d) {
				t.Fatalf("not converged:\n%s\n%s", w.describe(), strings.Join(lastN(w.log, 12), "\n"))
			}
			if !told {
				t.Errorf("no sync said that %s still runs its removed member:\n%s", w.podName(1), strings.Join(w.log, "\n"))
			}
		})
	}
}

// TestForkReportedOnceConfirmed: a second membership seen by one observation only (two leaders
// while leadership moves, another cluster's pod on a reused IP while the pods sent lag) holds
// that sync and is not reported; the next sync sees none and goes on. Seen by two syncs in a
// row, it is reported as EtcdForked.
func TestForkReportedOnceConfirmed(t *testing.T) {
	forkOnce := func(s *etcdstate.Snapshot) {
		s.Forked = []string{"etcd-0", "etcd-1"}
		s.Inconsistent = "etcd-0 (term 5), etcd-1 (term 6) each report themselves leader"
	}
	w, _ := created(t, 3, true)
	w.lag = nil
	w.etcdOverride = forkOnce
	d := w.step()
	cond := apimeta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionDegraded)
	if d.Action.Type != Hold || cond == nil || cond.Status != "False" || w.cluster.Status.ForkSeenSince == nil {
		t.Fatalf("one sync sees two leaders: %v: %s, Degraded %+v; want a hold, not reported, the sighting recorded", d.Action.Type, d.Action.Reason, cond)
	}
	d = w.step()
	cond = apimeta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionDegraded)
	if d.Action.Type != Steady || cond.Status != "False" || w.cluster.Status.ForkSeenSince != nil {
		t.Fatalf("the next sync sees one leader: %v: %s, Degraded %+v; want Steady, the sighting cleared", d.Action.Type, d.Action.Reason, cond)
	}
	for i := range 2 {
		w.etcdOverride = forkOnce
		d = w.step()
		cond = apimeta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionDegraded)
		if reported := cond.Status == "True" && cond.Reason == ReasonEtcdForked; reported != (i == 1) || d.Action.Type != Hold {
			t.Fatalf("sync %d of a fork that lasts: %v, Degraded %+v; want a hold, reported from the second", i, d.Action.Type, cond)
		}
	}
}
