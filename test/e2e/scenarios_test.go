package e2e

import (
	"context"
	"strings"
	gosync "sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/test/harness"
)

func TestCreate(t *testing.T) {
	for _, size := range []int32{1, 3, 5} {
		t.Run(sizeName(size), func(t *testing.T) {
			env := newEnv(t, false)
			env.Create(spec(size))
			// The workload starts as soon as the seed serves, and writes while the rest join.
			if _, err := env.WaitFor(createBound, func() (bool, string) {
				return env.Monitor.View().Leader != "", "no leader yet"
			}); err != nil {
				t.Fatal(err)
			}
			measure(t, env, func() int { return int(size) })
		})
	}
}

func sizeName(n int32) string { return "size=" + string(rune('0'+n)) }

func TestScale(t *testing.T) {
	run(t, 1, func(t *testing.T, env *harness.Env) int {
		for _, size := range []int32{3, 5, 3} {
			scaleTo(env, size)
			waitSteady(t, env, int(size))
		}
		scaleTo(env, 1)
		return 1
	})
}

// rollingChange is the config change every rolling scenario makes: a harmless etcd flag.
func rollingChange(s *v1alpha1.EtcdClusterSpec) {
	s.EtcdOptions = append(s.EtcdOptions, "--snapshot-count=20000")
}

func TestRollingConfigChange(t *testing.T) {
	for _, size := range []int32{3, 5} {
		t.Run(sizeName(size), func(t *testing.T) {
			run(t, size, func(t *testing.T, env *harness.Env) int {
				env.Store.EditParentSpec(rollingChange)
				return int(size)
			})
		})
	}
	// Without a storageSpec a recreated pod starts with an empty data dir, so each member
	// is replaced through a learner.
	t.Run("size=3/emptyDir", func(t *testing.T) {
		runSpec(t, emptyDirSpec(3), func(t *testing.T, env *harness.Env) int {
			env.Store.EditParentSpec(rollingChange)
			return 3
		})
	})
}

// TestBaselineRollingUpdate makes the same change the way a plain StatefulSet does: the
// operator creates the cluster, then steps aside (Metacontroller stops), and the template is
// edited directly with partition 0. The StatefulSet controller recreates pods from the
// highest ordinal down, each once the one above is Ready; no leadership is moved first and
// no learner is used. Pods are deleted gracefully in both runs, so etcd's own leadership
// hand-off on SIGTERM happens in both.
func TestBaselineRollingUpdate(t *testing.T) {
	for _, size := range []int32{3, 5} {
		t.Run(sizeName(size), func(t *testing.T) {
			env := newEnv(t, false)
			env.Create(spec(size))
			waitSteady(t, env, int(size))
			env.StopOperator()
			measure(t, env, func() int {
				o, _ := env.Store.Get("StatefulSet", env.Cluster)
				sts := o.(*appsv1.StatefulSet)
				c := &sts.Spec.Template.Spec.Containers[0]
				c.Args = append(c.Args, "--snapshot-count=20000")
				zero := int32(0)
				sts.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateStatefulSetStrategy{Partition: &zero}
				if err := env.Store.Update(sts); err != nil {
					t.Fatal(err)
				}
				if _, err := env.WaitFor(changeBound, func() (bool, string) {
					return env.RolledOut(int(size))
				}); err != nil {
					t.Fatal(err)
				}
				return 0
			})
		})
	}
}

func TestPatchUpgrade(t *testing.T) {
	run(t, 3, func(t *testing.T, env *harness.Env) int {
		env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { s.Version = upgradeVersion })
		return 3
	})
}

func TestKillFollower(t *testing.T) {
	run(t, 3, func(t *testing.T, env *harness.Env) int {
		if err := env.Kill(followerOf(t, env)); err != nil {
			t.Fatal(err)
		}
		return 3
	})
}

func TestKillLeader(t *testing.T) {
	run(t, 3, func(t *testing.T, env *harness.Env) int {
		if err := env.Kill(leaderOf(t, env)); err != nil {
			t.Fatal(err)
		}
		return 3
	})
}

// TestWipeMember deletes a member's data dir: the launcher refuses to start an established
// voter on an empty data dir, and the operator replaces the member through a learner.
func TestWipeMember(t *testing.T) {
	run(t, 3, func(t *testing.T, env *harness.Env) int {
		victim := followerOf(t, env)
		before := memberID(env, victim)
		if err := env.Wipe(victim); err != nil {
			t.Fatal(err)
		}
		waitSteady(t, env, 3)
		if after := memberID(env, victim); after == before {
			t.Errorf("%s still has member ID %s: it was not replaced", victim, before)
		}
		if !sawLearner(env, victim) {
			t.Errorf("%s did not come back through a learner", victim)
		}
		return 3
	})
}

func sawLearner(env *harness.Env, pod string) bool {
	for _, rec := range env.MC.History() {
		for _, m := range rec.Answer.Status.Members {
			if m.Name == pod && m.IsLearner {
				return true
			}
		}
	}
	return false
}

// TestPartitionMember cuts one follower's peer traffic both ways for a while, then mends it.
func TestPartitionMember(t *testing.T) {
	run(t, 3, func(t *testing.T, env *harness.Env) int {
		victim := followerOf(t, env)
		if err := env.Partition(victim); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)
		env.Mend(victim)
		return 3
	})
}

// TestQuorumLoss takes two of three members down: the operator must hold, report, and start
// no membership change; when they return the cluster recovers by itself.
func TestQuorumLoss(t *testing.T) {
	run(t, 3, func(t *testing.T, env *harness.Env) int {
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
	})
}

// TestHookReplay drives a scale-out with the hook's answers tested against Metacontroller's
// corner cases: every request is sent twice and the answers compared byte for byte (while
// etcd is unchanged in between); after each member Job completes, the last request from
// before the Job existed is sent again (a lagging cache) and its answer applied, the next
// answer is dropped, and the hook restarts before the next sync. (Metacontroller only ever
// applies the answer to the request it just sent, so an old answer reaches the cluster
// exactly this way: as the fresh answer to a stale request.)
func TestHookReplay(t *testing.T) {
	run(t, 1, func(t *testing.T, env *harness.Env) int {
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
	})
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

// TestInvalidSpecMidRollout starts a rolling change, makes the spec invalid as soon as the
// first pod was replaced, checks that nothing destructive happens while it is invalid, and
// then fixes the spec.
func TestInvalidSpecMidRollout(t *testing.T) {
	run(t, 3, func(t *testing.T, env *harness.Env) int {
		env.Store.EditParentSpec(rollingChange)
		if _, err := env.WaitFor(changeBound, func() (bool, string) {
			o, _ := env.Store.Get("StatefulSet", env.Cluster)
			sts := o.(*appsv1.StatefulSet)
			return sts.Status.UpdatedReplicas >= 1, "no pod replaced yet"
		}); err != nil {
			t.Fatal(err)
		}
		env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) {
			s.EtcdOptions = append(s.EtcdOptions, "--data-dir=/elsewhere")
		})
		jobs0 := jobNames(env)
		syncs0 := env.MC.Syncs()
		if _, err := env.WaitFor(changeBound, func() (bool, string) {
			return env.MC.Syncs() >= syncs0+3 && env.Store.Parent().Status.Phase == v1alpha1.PhaseInvalid, "waiting for the hook to report Invalid"
		}); err != nil {
			t.Fatal(err)
		}
		// A pod whose replacement was already under way when the spec broke may finish; after
		// that, nothing may move.
		if _, err := env.WaitFor(changeBound, func() (bool, string) { return env.PodsSettled(3) }); err != nil {
			t.Fatal(err)
		}
		pods0 := podUIDs(env)
		syncs0 = env.MC.Syncs()
		if _, err := env.WaitFor(changeBound, func() (bool, string) {
			return env.MC.Syncs() >= syncs0+5, "waiting for syncs"
		}); err != nil {
			t.Fatal(err)
		}
		for name := range jobNames(env) {
			if !jobs0[name] {
				t.Errorf("Job %s created while the spec was invalid", name)
			}
		}
		for name, uid := range podUIDs(env) {
			if pods0[name] != uid {
				t.Errorf("pod %s replaced while the spec was invalid", name)
			}
		}
		env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) {
			s.EtcdOptions = s.EtcdOptions[:len(s.EtcdOptions)-1]
		})
		return 3
	})
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
