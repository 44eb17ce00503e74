package sync

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// TestGracePeriodHasClockSkewMargin: a voter unhealthy for an hour by its own record is
// replaced only once its pod is older than the grace period plus the margin, by the API
// server's creationTimestamp: an API server clock behind the hook's must not end the wait early.
func TestGracePeriodHasClockSkewMargin(t *testing.T) {
	w := newSimWorld(t, 3, true)
	w.run(100)
	w.pods[1].down = true
	w.step()
	w.now = w.now.Add(time.Hour)
	for _, tc := range []struct {
		age      time.Duration
		replaced bool
	}{
		{stuckAfter, false},
		{stuckAfter + clockSkewMargin - time.Second, false},
		{stuckAfter + clockSkewMargin, true},
	} {
		w.pods[1].created = w.now.Add(-tc.age)
		w.closeBudget()
		d := Plan(simConfig, w.observe())
		if got := d.Action.Type == RemoveMember; got != tc.replaced {
			t.Errorf("pod %s old: %s %s: %s; want replaced=%v", tc.age, d.Action.Type, d.Action.Member, d.Action.Reason, tc.replaced)
		}
	}
}

// TestBackupReportWaitHasClockSkewMargin: a succeeded backup Job's pod report is waited for
// backupResultWait after the Job controller's completion time, plus the margin.
func TestBackupReportWaitHasClockSkewMargin(t *testing.T) {
	w := backupWorld(t)
	for i := 0; i < 10; i++ {
		w.step()
		if j := w.backupJob(); j != nil && j.state == jobSucceeded {
			break
		}
	}
	j := w.backupJob()
	if j == nil || j.state != jobSucceeded {
		t.Fatalf("no succeeded backup Job: %+v", j)
	}
	for _, tc := range []struct {
		after   time.Duration
		waiting bool
	}{
		{backupResultWait, true},
		{backupResultWait + clockSkewMargin - time.Second, true},
		{backupResultWait + clockSkewMargin, false},
	} {
		w.now = j.at.Add(tc.after)
		obs := w.observe()
		// The report pod is not seen yet (its informer lags the Job's).
		var pods []corev1.Pod
		for _, p := range obs.Pods {
			if p.Labels[LabelBackupOf] == "" {
				pods = append(pods, p)
			}
		}
		obs.Pods = pods
		d := Plan(simConfig, obs)
		if got := strings.Contains(d.Action.Reason, "report not seen yet"); got != tc.waiting {
			t.Errorf("%s after the Job completed: %s: %s; want waiting=%v", tc.after, d.Action.Type, d.Action.Reason, tc.waiting)
		}
	}
}

func (w *simWorld) backupJob() *simJob {
	for _, name := range sortedKeysOf(w.jobs) {
		if j := w.jobs[name]; j.verb == verbBackup {
			return j
		}
	}
	return nil
}

// TestMemberClocksInStatus: the records are written to status, carried over from it (a hook
// restarted in between reads them back), and dropped with the condition or the member.
func TestMemberClocksInStatus(t *testing.T) {
	record := func(w *simWorld, name string) *v1alpha1.MemberStatus {
		for i := range w.cluster.Status.Members {
			if m := &w.cluster.Status.Members[i]; m.Name == name {
				return m
			}
		}
		return nil
	}

	w := newSimWorld(t, 3, true)
	w.run(100)
	w.pods[1].down = true
	w.step()
	first := record(w, "etcd-1").UnhealthySince
	if first == nil {
		t.Fatal("etcd-1 down: no unhealthySince recorded")
	}
	w.step()
	if got := record(w, "etcd-1").UnhealthySince; got == nil || !got.Equal(first) {
		t.Fatalf("unhealthySince moved from %v to %v", first, got)
	}
	w.pods[1].down = false
	w.step()
	w.step()
	if got := record(w, "etcd-1").UnhealthySince; got != nil {
		t.Fatalf("etcd-1 healthy again, unhealthySince still %v", got)
	}

	// A learner: Pending, then running, then applying; promoted, its records go.
	w.paceCommand(t, "pending", []string{"etcd-3", "2m"})
	w.paceCommand(t, "catch-up", []string{"etcd-3", "5m"})
	w.cluster.Spec.Size = ptrTo(int32(4))
	w.cluster.Generation++
	var sawPending, sawRunning, sawProgress bool
	for i := 0; i < 120; i++ {
		w.step()
		r := record(w, "etcd-3")
		if r != nil && !r.IsLearner && sawProgress {
			if r.RunningSince != nil || r.ProgressSince != nil || r.AppliedIndex != 0 {
				t.Fatalf("etcd-3 promoted: learner records kept: %+v", r)
			}
			break
		}
		if r == nil || !r.IsLearner {
			continue
		}
		switch p := w.pods[3]; {
		case p != nil && !p.running && p.restarts == 0:
			sawPending = true
			if r.RunningSince != nil {
				t.Fatalf("etcd-3 Pending: runningSince %v", r.RunningSince)
			}
		case r.RunningSince != nil:
			sawRunning = true
		}
		if r.ProgressSince != nil && r.AppliedIndex > 0 {
			sawProgress = true
		}
	}
	if !sawPending || !sawRunning || !sawProgress {
		t.Fatalf("learner records: Pending %v, running %v, progress %v", sawPending, sawRunning, sawProgress)
	}
}

// TestLearnerProgressRestartsWithItsEtcd: the index recorded while a learner's etcd last ran is
// not the bar for a new start (a pod recreated without a volume applies again from nothing).
func TestLearnerProgressRestartsWithItsEtcd(t *testing.T) {
	w := newSimWorld(t, 3, true)
	w.run(100)
	w.paceCommand(t, "catch-up", []string{"etcd-3", "20m"})
	w.cluster.Spec.Size = ptrTo(int32(4))
	w.cluster.Generation++
	const before = 1 << 40
	for i := 0; i < 60; i++ {
		w.step()
		for j := range w.cluster.Status.Members {
			r := &w.cluster.Status.Members[j]
			if r.Name != "etcd-3" || !r.IsLearner || r.RunningSince == nil {
				continue
			}
			// As if its etcd had last run on a pod since gone, far ahead of where it is now.
			r.RunningSince, r.AppliedIndex, r.ProgressSince = nil, before, nil
			w.step()
			for _, again := range w.cluster.Status.Members {
				if again.Name == "etcd-3" && again.AppliedIndex >= before {
					t.Fatalf("etcd-3 started again: applied index %d still the bar", again.AppliedIndex)
				}
			}
			return
		}
	}
	t.Fatal("etcd-3 never ran as a learner")
}
