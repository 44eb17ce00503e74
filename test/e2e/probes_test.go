package e2e

import (
	"fmt"
	"testing"
	"time"

	"etcdops.dev/etcdops/test/harness"
)

// slowDefragHold is how long the slow defragmentation holds its member's backend, in real
// time: with the harness's clocks ten times faster, 150 s of a real node's time, nearly twice
// the liveness probe's budget of 8 failures 10 s apart (8 s here), and within the member tool's
// 4 minutes. The hold is made up (HoldNextDefragment), not a large database: a real
// defragmentation of that length would need gigabytes on this machine's disk.
const slowDefragHold = 15 * time.Second

// slowDefragment fragments every member's database as scheduledDefragment does and makes the
// first defragmentation the schedule starts hold its member for slowDefragHold, while the
// kubelet probes it as rendered. It ends with every member defragmented and no etcd container
// restarted: the liveness probe reads etcd's gauge of a defragmentation in flight while
// /livez waits.
func slowDefragment(t *testing.T, env *harness.Env) int {
	pods, restarts := podUIDs(env), restartCounts(env)
	env.HoldNextDefragment(slowDefragHold)
	started := time.Now()
	scheduledDefragment(t, env)
	if env.DefragmentsHeld() != 1 {
		t.Fatalf("%d defragmentations held, want 1", env.DefragmentsHeld())
	}
	if took := time.Since(started); took < slowDefragHold {
		t.Errorf("the defragmentations took %v, less than the hold of %v", took, slowDefragHold)
	}
	if after := restartCounts(env); fmt.Sprint(after) != fmt.Sprint(restarts) {
		t.Errorf("etcd containers restarted during the defragmentation: restarts %v before, %v after", restarts, after)
	}
	for name, uid := range podUIDs(env) {
		if pods[name] != uid {
			t.Errorf("pod %s was recreated during the defragmentation", name)
		}
	}
	return 3
}

// restartCounts are the etcd containers' restart counts, by pod.
func restartCounts(env *harness.Env) map[string]int32 {
	out := map[string]int32{}
	for _, p := range env.Pods() {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name == "etcd" {
				out[p.Name] = cs.RestartCount
			}
		}
	}
	return out
}
