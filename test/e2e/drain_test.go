package e2e

import (
	"errors"
	"math/rand"
	gosync "sync"
	"testing"
	"time"

	policyv1 "k8s.io/api/policy/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/harness"
)

// TestDrain runs node drains against the operator's PodDisruptionBudget while it rolls a
// configuration change and while it scales 3→5→3: a drain evicts a random pod through the
// Eviction API, retrying a refused eviction as kubectl drain does, and moves on to another
// pod once one is evicted. The budget must refuse whatever would take a second member down
// with the operator's own step (the monitor counts a quorum lost after an allowed eviction
// as the operator's). Each scenario must see an eviction go through, and the rolling change
// one refused while a pod it replaces was down. The scale's only steps that take a member
// down, leadership moved off a member and the member removed, last a few hundred
// milliseconds, less than kubectl's retry period: a refusal inside them is not demanded.
func TestDrain(t *testing.T) {
	t.Parallel()
	onCluster(t, spec(3),
		scenario{name: "drain-during-rolling-config-change", act: draining(true, func(t *testing.T, env *harness.Env) int {
			size := rollingConfigChange(21000)(t, env)
			waitSteady(t, env, size)
			return size
		})},
		scenario{name: "drain-during-scale-3-5-3", act: draining(false, func(t *testing.T, env *harness.Env) int {
			for _, size := range []int32{5, 3} {
				scaleTo(env, size)
				waitSteady(t, env, int(size))
			}
			return 3
		})},
	)
}

// Drain pacing, in Kubernetes time (scaled): kubectl drain retries a refused eviction every
// 5 seconds, and the next node is drained a little after the last.
const (
	drainRetry    = 5 * time.Second
	drainNextNode = 30 * time.Second
	// drainAttempts bounds the evictions asked for in one scenario, refused ones included.
	drainAttempts = 400
	// drainEvictions bounds the pods evicted in one scenario.
	drainEvictions = 3
)

// drainer is one scenario's drains, and what the Eviction API answered them.
type drainer struct {
	env  *harness.Env
	rng  *rand.Rand
	stop chan struct{}
	done chan struct{}

	mu gosync.Mutex
	// abort stops the drain at once: the scenario failed.
	abort bool
	// attempts counts evictions asked for; evicted those that went through; refused those
	// the budget refused, and refusedInStep those refused while a step of the operator's
	// had a member down (the hook's status said so) or was about to (the budget's
	// minAvailable 100%).
	attempts, evicted, refused, refusedInStep int
}

// draining runs act with drains going on until it returns and one pod was evicted; with
// refusedInStep, an eviction must have been refused while a step had a member down.
func draining(refusedInStep bool, act func(*testing.T, *harness.Env) int) func(*testing.T, *harness.Env) int {
	return func(t *testing.T, env *harness.Env) int {
		d := &drainer{env: env, rng: rand.New(rand.NewSource(1)), stop: make(chan struct{}), done: make(chan struct{})}
		go d.run(time.Now().Add(3 * changeBound))
		finished := false
		defer func() {
			if !finished {
				d.mu.Lock()
				d.abort = true
				d.mu.Unlock()
				close(d.stop)
				<-d.done
			}
		}()
		size := act(t, env)
		finished = true
		close(d.stop)
		<-d.done
		d.mu.Lock()
		defer d.mu.Unlock()
		t.Logf("drains: %d evictions asked for, %d evicted, %d refused (%d while a step of the operator's had a member down)",
			d.attempts, d.evicted, d.refused, d.refusedInStep)
		if refusedInStep && d.refusedInStep == 0 {
			t.Error("no eviction was refused while a step of the operator's had a member down")
		}
		if d.evicted == 0 {
			t.Error("no eviction went through")
		}
		return size
	}
}

// run drains until told to stop once a pod was evicted, or a bound is reached.
func (d *drainer) run(deadline time.Time) {
	defer close(d.done)
	for d.more(deadline) {
		pods := d.env.Pods()
		if len(pods) == 0 {
			d.pause(drainRetry)
			continue
		}
		pod := pods[d.rng.Intn(len(pods))].Name
		for d.more(deadline) {
			evicted, retry := d.evict(pod)
			if evicted {
				d.pause(drainNextNode)
				break
			}
			if !retry {
				break
			}
			d.pause(drainRetry)
		}
	}
}

// more reports whether the drain goes on: within its bounds, and until it is stopped with an
// eviction done (act may settle before the budget allowed any).
func (d *drainer) more(deadline time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.abort || d.attempts >= drainAttempts || d.evicted >= drainEvictions || time.Now().After(deadline) {
		return false
	}
	select {
	case <-d.stop:
		return d.evicted == 0
	default:
		return true
	}
}

// evict asks for one eviction; retry: the budget refused it, so kubectl would ask again.
func (d *drainer) evict(pod string) (evicted, retry bool) {
	// Read before asking: a sync may move the step on meanwhile.
	inStep := condition(d.env.Store.Parent().Status, v1alpha1.ConditionDegraded).Reason == sync.ReasonPlannedDisruption
	if o, ok := d.env.Store.Get("PodDisruptionBudget", d.env.Cluster); ok {
		ma := o.(*policyv1.PodDisruptionBudget).Spec.MinAvailable
		inStep = inStep || ma != nil && ma.String() == "100%"
	}
	err := d.env.Drain(pod)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.attempts++
	switch {
	case err == nil:
		d.evicted++
		return true, false
	case errors.Is(err, harness.ErrBudget):
		d.refused++
		if inStep {
			d.refusedInStep++
		}
		return false, true
	}
	// The pod is gone (scaled away, or between incarnations): drain another.
	return false, false
}

// pause waits k in Kubernetes time.
func (d *drainer) pause(k time.Duration) {
	time.Sleep(time.Duration(float64(k) * timeScale))
}
