package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	gosync "sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/test/harness"
)

// scenario is one change or fault on a steady cluster; act returns the size the cluster must
// settle at afterwards (0: do not wait for the operator).
type scenario struct {
	name string
	act  func(t *testing.T, env *harness.Env) int
	// workload, when set, shapes the workload that runs during the scenario.
	workload func(t *testing.T, env *harness.Env) harness.WorkloadOptions
	// injected says how the workload breaks linearizability on purpose: the checker must
	// find the history not linearizable.
	injected string
	// expectPanic says why etcd is expected to panic in this scenario, and panicSays what
	// etcd's message then contains; any other panic fails the scenario.
	expectPanic, panicSays string
}

// onCluster creates one cluster from s (the "create" row) and runs the scenarios on it in
// turn, each a subtest with its own figures, each starting from the steady cluster the one
// before left. Sharing the cluster keeps the default run within its time budget.
func onCluster(t *testing.T, s v1alpha1.EtcdClusterSpec, scenarios ...scenario) {
	onClusterCrashing(t, s, harness.Crashes{}, scenarios...)
}

// onClusterCrashing is onCluster with the harness crashing at c while the cluster is
// created, which must crash the bootstrap (and the Jobs that add the other members).
func onClusterCrashing(t *testing.T, s v1alpha1.EtcdClusterSpec, c harness.Crashes, scenarios ...scenario) {
	size := int(*s.Size)
	env := newEnv(t, false)
	t.Run("create", func(t *testing.T) {
		before := env.CrashesSoFar()
		env.CrashAt(c)
		env.Create(s)
		// The workload starts as soon as the seed serves, and writes while the rest join.
		if _, err := env.WaitFor(createBound, func() (bool, string) {
			return env.Monitor.View().Leader != "", "no leader yet"
		}); err != nil {
			t.Fatal(err)
		}
		measure(t, env, scenario{act: func(*testing.T, *harness.Env) int { return size }})
		env.CrashAt(harness.Crashes{})
		if c.LoseAnswers {
			checkCrashed(t, env, before, harness.BoundaryLostAnswer, []string{harness.Bootstrap})
		}
		if c.RestartHook {
			checkCrashed(t, env, before, harness.BoundaryHookRestart, []string{harness.Bootstrap})
		}
		if c.KillJobs && size > 1 {
			checkCrashed(t, env, before, harness.BoundaryKilledJob, []string{"add-learner", "promote"})
		}
	})
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			if _, err := env.WaitSteady(size, changeBound); err != nil {
				t.Fatalf("the cluster is not steady before the scenario: %v\n%s", err, env.Describe())
			}
			measure(t, env, sc)
		})
	}
}

// TestScale scales one cluster out and in; planned work, so no sync of it may set Degraded.
// Each scale-in deletes the removed members' claims and volumes (the StatefulSet says
// whenScaled: Delete while the operator shrinks it past members it removed), and keeps the
// others' claims, volumes and members as they were.
func TestScale(t *testing.T) {
	t.Parallel()
	onCluster(t, spec(1), scenario{name: "1-3-5-3-1", act: planned(func(t *testing.T, env *harness.Env) int {
		for _, size := range []int32{3, 5} {
			scaleTo(env, size)
			waitSteady(t, env, int(size))
		}
		scaleInDropsClaims(t, env, 5, 3)
		scaleInDropsClaims(t, env, 3, 1)
		return 1
	})})
}

// scaleInDropsClaims scales a steady cluster from from to to members and checks the claims:
// gone with their volumes for the removed ordinals, the same claims on the same volumes,
// holding the same members' data, for the others.
func scaleInDropsClaims(t *testing.T, env *harness.Env, from, to int) {
	t.Helper()
	checkClaimsRetained(t, env)
	claim := func(ord int) string { return "data-" + env.Pod(ord) }
	dirs, ids, uids := map[int]string{}, map[int]string{}, map[int]string{}
	for ord := range from {
		c, ok := env.Store.Get("PersistentVolumeClaim", claim(ord))
		if !ok || env.STS.VolumeDir(claim(ord)) == "" {
			t.Fatalf("no claim or volume %s at %d members", claim(ord), from)
		}
		dirs[ord], ids[ord], uids[ord] = env.STS.VolumeDir(claim(ord)), memberID(env, env.Pod(ord)), string(c.GetUID())
	}
	scaleTo(env, int32(to))
	waitSteady(t, env, to)
	for ord := range from {
		c, ok := env.Store.Get("PersistentVolumeClaim", claim(ord))
		if ord >= to {
			if ok {
				t.Errorf("the claim %s of a removed member survived the scale-in", claim(ord))
			}
			if _, err := os.Stat(dirs[ord]); !os.IsNotExist(err) {
				t.Errorf("the volume of the removed member %s is still there: %v", env.Pod(ord), err)
			}
			continue
		}
		switch {
		case !ok || string(c.GetUID()) != uids[ord] || env.STS.VolumeDir(claim(ord)) != dirs[ord]:
			t.Errorf("the claim %s of a kept member was replaced", claim(ord))
		case memberID(env, env.Pod(ord)) != ids[ord]:
			t.Errorf("the kept member %s was replaced (ID %s, was %s)", env.Pod(ord), memberID(env, env.Pod(ord)), ids[ord])
		}
		if _, err := os.Stat(filepath.Join(dirs[ord], "data", "member", "wal")); err != nil {
			t.Errorf("the kept member %s lost its data: %v", env.Pod(ord), err)
		}
	}
}

// checkClaimsRetained: at rest the StatefulSet keeps every claim, whatever happens to it. The
// cluster is steady once the scaled-away pods are gone, but the sync that shrank the
// StatefulSet may have seen them terminating and set whenScaled: Delete for them: the next
// sync, which the pods' deletion brings, sets it back, so the check waits for it.
func checkClaimsRetained(t *testing.T, env *harness.Env) {
	t.Helper()
	retain := appsv1.RetainPersistentVolumeClaimRetentionPolicyType
	if _, err := env.WaitFor(30*time.Second, func() (bool, string) {
		o, _ := env.Store.Get("StatefulSet", env.Cluster)
		pol := o.(*appsv1.StatefulSet).Spec.PersistentVolumeClaimRetentionPolicy
		return pol != nil && pol.WhenScaled == retain && pol.WhenDeleted == retain, fmt.Sprintf("%+v", pol)
	}); err != nil {
		t.Errorf("the StatefulSet's claim retention policy is not Retain for both: %v", err)
	}
}

// TestStatefulSetDeleted deletes the StatefulSet with its pods (kubectl delete statefulset,
// as for changing an immutable field) under each spec.storageSpec.whenDeleted: the claims
// stay, the operator renders the StatefulSet again, every member comes back on its own data,
// and no acknowledged write is lost.
func TestStatefulSetDeleted(t *testing.T) {
	t.Parallel()
	s := spec(3)
	s.StorageSpec.WhenDeleted = v1alpha1.PVCDelete
	deleted := func(whenDeleted v1alpha1.PVCRetention) func(t *testing.T, env *harness.Env) int {
		return func(t *testing.T, env *harness.Env) int {
			env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { s.StorageSpec.WhenDeleted = whenDeleted })
			checkClaimsRetained(t, env)
			uids, ids := map[string]string{}, map[string]string{}
			for ord := range 3 {
				c, ok := env.Store.Get("PersistentVolumeClaim", "data-"+env.Pod(ord))
				if !ok {
					t.Fatalf("no claim for %s", env.Pod(ord))
				}
				uids[env.Pod(ord)], ids[env.Pod(ord)] = string(c.GetUID()), memberID(env, env.Pod(ord))
			}
			env.DeleteStatefulSet()
			waitSteady(t, env, 3)
			for pod, uid := range uids {
				if c, ok := env.Store.Get("PersistentVolumeClaim", "data-"+pod); !ok || string(c.GetUID()) != uid {
					t.Errorf("the claim of %s did not outlive the StatefulSet", pod)
				}
				if id := memberID(env, pod); id != ids[pod] {
					t.Errorf("%s came back as member %s, was %s: not on its own data", pod, id, ids[pod])
				}
			}
			return 3
		}
	}
	onCluster(t, s,
		scenario{name: "deleted-under-whenDeleted-Delete", act: deleted(v1alpha1.PVCDelete)},
		scenario{name: "deleted-under-whenDeleted-Retain", act: deleted(v1alpha1.PVCRetain)})
}

// TestThreeMembers runs the single-member faults, the rolling changes and the baseline on
// one 3-member cluster. The planned changes must never set Degraded; a lost node and a wiped
// member must, until repaired.
func TestThreeMembers(t *testing.T) {
	t.Parallel()
	onCluster(t, spec(3),
		scenario{name: "kill-follower", act: killFollower},
		scenario{name: "kill-leader", act: killLeader},
		scenario{name: "partition-member", act: partitionMember},
		staleReads(),
		scenario{name: "quorum-loss", act: quorumLoss},
		scenario{name: "node-lost", act: unplanned(nodeLost)},
		scenario{name: "wipe-member", act: unplanned(wipeMember)},
		scenario{name: "rolling-config-change", act: planned(rollingConfigChange(20000))},
		scenario{name: "patch-upgrade", act: planned(patchUpgrade)},
		scenario{name: "invalid-spec-mid-rollout", act: invalidSpecMidRollout},
		scenario{name: "baseline-statefulset-rolling-update", act: baselineRollingUpdate(30000)},
	)
}

func TestFiveMembers(t *testing.T) {
	t.Parallel()
	onCluster(t, spec(5),
		scenario{name: "rolling-config-change", act: rollingConfigChange(20000)},
		scenario{name: "baseline-statefulset-rolling-update", act: baselineRollingUpdate(30000)},
	)
}

// TestEmptyDir rolls a change on members without a storageSpec: a recreated pod starts
// with an empty data dir, so each member is replaced through a learner.
func TestEmptyDir(t *testing.T) {
	t.Parallel()
	onCluster(t, emptyDirSpec(3), scenario{name: "rolling-config-change", act: rollingConfigChange(20000)})
}

// setSnapshotCount is the config change every rolling scenario makes: a harmless etcd flag.
func setSnapshotCount(s *v1alpha1.EtcdClusterSpec, n int) {
	flag := fmt.Sprintf("--snapshot-count=%d", n)
	for i, o := range s.EtcdOptions {
		if strings.HasPrefix(o, "--snapshot-count=") {
			s.EtcdOptions[i] = flag
			return
		}
	}
	s.EtcdOptions = append(s.EtcdOptions, flag)
}

func rollingConfigChange(n int) func(t *testing.T, env *harness.Env) int {
	return func(t *testing.T, env *harness.Env) int {
		env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { setSnapshotCount(s, n) })
		return int(*env.Store.Parent().Spec.Size)
	}
}

// baselineRollingUpdate makes the same kind of change the way a plain StatefulSet does: the
// operator steps aside for good (Metacontroller stops; run it last on a cluster) and the
// template is edited directly, with partition 0. The StatefulSet controller recreates pods
// from the highest ordinal down, each once the one above is Ready; no leadership is moved
// first and no learner is used. Pods are deleted gracefully in both runs, so etcd's own
// leadership hand-off on SIGTERM happens in both.
func baselineRollingUpdate(n int) func(t *testing.T, env *harness.Env) int {
	return func(t *testing.T, env *harness.Env) int {
		size := int(*env.Store.Parent().Spec.Size)
		env.StopOperator()
		o, _ := env.Store.Get("StatefulSet", env.Cluster)
		sts := o.(*appsv1.StatefulSet)
		c := &sts.Spec.Template.Spec.Containers[0]
		c.Args = append(c.Args, fmt.Sprintf("--snapshot-count=%d", n))
		zero := int32(0)
		sts.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateStatefulSetStrategy{Partition: &zero}
		if err := env.Store.Update(sts); err != nil {
			t.Fatal(err)
		}
		if _, err := env.WaitFor(changeBound, func() (bool, string) { return env.RolledOut(size) }); err != nil {
			t.Fatal(err)
		}
		return 0
	}
}

func patchUpgrade(t *testing.T, env *harness.Env) int {
	env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { s.Version = upgradeVersion })
	return 3
}

func killFollower(t *testing.T, env *harness.Env) int {
	if err := env.Kill(followerOf(t, env)); err != nil {
		t.Fatal(err)
	}
	return 3
}

func killLeader(t *testing.T, env *harness.Env) int {
	if err := env.Kill(leaderOf(t, env)); err != nil {
		t.Fatal(err)
	}
	return 3
}

// wipeMember deletes a member's data dir: the launcher refuses to start an established
// voter on an empty data dir, and the operator replaces the member through a learner.
func wipeMember(t *testing.T, env *harness.Env) int {
	victim := followerOf(t, env)
	before := memberID(env, victim)
	syncs0 := env.MC.Syncs()
	if err := env.Wipe(victim); err != nil {
		t.Fatal(err)
	}
	waitSteady(t, env, 3)
	if after := memberID(env, victim); after == before {
		t.Errorf("%s still has member ID %s: it was not replaced", victim, before)
	}
	if !sawLearner(env, victim, syncs0) {
		t.Errorf("%s did not come back through a learner", victim)
	}
	return 3
}

// sawLearner reports whether a sync after the first n reported pod as a learner.
func sawLearner(env *harness.Env, pod string, n int) bool {
	for _, rec := range env.MC.History()[n:] {
		for _, m := range rec.Answer.Status.Members {
			if m.Name == pod && m.IsLearner {
				return true
			}
		}
	}
	return false
}

// partitionMember cuts one follower's peer traffic both ways for a while, then mends it.
func partitionMember(t *testing.T, env *harness.Env) int {
	victim := followerOf(t, env)
	if err := env.Partition(victim); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	env.Mend(victim)
	return 3
}

// quorumLoss takes two of three members down: the operator must hold, report, and start
// no membership change; when they return the cluster recovers by itself.
func quorumLoss(t *testing.T, env *harness.Env) int {
	leader := leaderOf(t, env)
	var down []string
	for _, m := range env.Monitor.View().Members {
		if m.Name != leader {
			down = append(down, m.Name)
		}
	}
	for _, p := range down {
		if err := env.Isolate(p); err != nil {
			t.Fatal(err)
		}
	}
	jobs0 := len(env.Store.List("Job"))
	syncs0 := env.MC.Syncs()
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		return env.MC.Syncs() >= syncs0+5, "waiting for syncs"
	}); err != nil {
		t.Fatal(err)
	}
	p := env.Store.Parent()
	if p.Status.Phase == v1alpha1.PhaseRunning {
		t.Errorf("status says Running with 2 of 3 members down")
	}
	if n := len(env.Store.List("Job")); n != jobs0 {
		t.Errorf("a member Job was created while quorum was lost (%d → %d Jobs)", jobs0, n)
	}
	if v := env.Monitor.View(); v.Voters() != 3 {
		t.Errorf("membership changed while quorum was lost: %+v", v.Members)
	}
	for _, p := range down {
		env.Heal(p)
	}
	return 3
}

// TestHookReplay drives a scale-out with the hook's answers tested against Metacontroller's
// corner cases: every request is sent twice and the answers compared byte for byte (while
// etcd is unchanged in between); after each member Job completes, the last request from
// before the Job existed is sent again (a lagging cache) and its answer applied, the next
// answer is dropped, and the hook restarts before the next sync. (Metacontroller only ever
// applies the answer to the request it just sent, so an old answer reaches the cluster
// exactly this way: as the fresh answer to a stale request.)
func TestHookReplay(t *testing.T) {
	t.Parallel()
	onCluster(t, spec(1), scenario{name: "scale-out-with-replays", act: func(t *testing.T, env *harness.Env) int {
		env.MC.SendTwice(true)
		var mu gosync.Mutex
		var done []string
		env.AfterJob(func(job string) {
			replayBefore(t, env, job)
			mu.Lock()
			done = append(done, job)
			mu.Unlock()
		})
		t.Cleanup(func() { env.AfterJob(nil) })
		scaleTo(env, 3)
		waitSteady(t, env, 3)
		mu.Lock()
		defer mu.Unlock()
		if len(done) == 0 {
			t.Error("no member Job completed during the scale-out")
		}
		return 3
	}})
}

// replayBefore sends again the last request that did not yet contain job, applies the
// answer, drops the next answer and restarts the hook.
func replayBefore(t *testing.T, env *harness.Env, job string) {
	hist := env.MC.History()
	for i := len(hist) - 1; i >= 0; i-- {
		if hist[i].Request == nil || strings.Contains(string(hist[i].Request), job) {
			continue
		}
		if rec := env.MC.Replay(context.Background(), hist[i]); rec.Err != nil {
			t.Logf("replayed request of sync %d: %v", hist[i].N, rec.Err)
		}
		break
	}
	env.MC.DropNext(1)
	if err := env.RestartHook(); err != nil {
		t.Error(err)
	}
}

// invalidSpecMidRollout starts a rolling change, makes the spec invalid as soon as the
// first pod was replaced, checks that nothing destructive happens while it is invalid, and
// then fixes the spec.
func invalidSpecMidRollout(t *testing.T, env *harness.Env) int {
	o, _ := env.Store.Get("StatefulSet", env.Cluster)
	rev0 := o.(*appsv1.StatefulSet).Status.UpdateRevision
	env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { setSnapshotCount(s, 25000) })
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		o, _ := env.Store.Get("StatefulSet", env.Cluster)
		sts := o.(*appsv1.StatefulSet)
		return sts.Status.UpdateRevision != rev0 && sts.Status.UpdatedReplicas >= 1, "no pod replaced yet"
	}); err != nil {
		t.Fatal(err)
	}
	env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) {
		s.EtcdOptions = append(s.EtcdOptions, "--data-dir=/elsewhere")
	})
	syncs0 := env.MC.Syncs()
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		return env.MC.Syncs() >= syncs0+3 && env.Store.Parent().Status.Phase == v1alpha1.PhaseInvalid, "waiting for the hook to report Invalid"
	}); err != nil {
		t.Fatal(err)
	}
	jobs0 := jobNames(env)
	// A pod whose replacement was already under way when the spec broke may finish; after
	// that, nothing may move.
	if _, err := env.WaitFor(changeBound, func() (bool, string) { return env.PodsSettled(3) }); err != nil {
		t.Fatal(err)
	}
	nothingMoves(t, env, jobs0, podUIDs(env), "while the spec was invalid")
	env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) {
		s.EtcdOptions = s.EtcdOptions[:len(s.EtcdOptions)-1]
	})
	return 3
}

// nothingMoves waits five syncs and checks that no Job was created beyond jobs0 and no pod
// replaced since pods0 (by UID); while says when, for the message.
func nothingMoves(t *testing.T, env *harness.Env, jobs0 map[string]bool, pods0 map[string]string, while string) {
	t.Helper()
	syncs0 := env.MC.Syncs()
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		return env.MC.Syncs() >= syncs0+5, "waiting for syncs"
	}); err != nil {
		t.Fatal(err)
	}
	for name := range jobNames(env) {
		if !jobs0[name] {
			t.Errorf("Job %s created %s", name, while)
		}
	}
	for name, uid := range podUIDs(env) {
		if pods0[name] != uid {
			t.Errorf("pod %s replaced %s", name, while)
		}
	}
}

func jobNames(env *harness.Env) map[string]bool {
	out := map[string]bool{}
	for _, o := range env.Store.List("Job") {
		out[o.GetName()] = true
	}
	return out
}

func podUIDs(env *harness.Env) map[string]string {
	out := map[string]string{}
	for _, p := range env.Pods() {
		out[p.Name] = string(p.UID)
	}
	return out
}
