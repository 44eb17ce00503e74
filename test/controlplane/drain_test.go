package controlplane

import (
	"context"
	"fmt"
	"math/rand"
	"testing"
	"time"

	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/test/harness"
)

// evictEvery is how often the drain asks for an eviction, as kubectl drain retries a
// refusal every 5 seconds, several pods at once.
const evictEvery = time.Second

// drainAfterwards bounds how long, once the change is done, the drain waits for an eviction
// to go through: the operator must open its budget again when the cluster is steady.
const drainAfterwards = 2 * time.Minute

// drainDuring runs change while a drain asks the real Eviction API to evict a Ready member
// pod picked at random every second, then goes on until one eviction goes through and the
// cluster is steady again. The real disruption controller counts the operator's budget and
// the real Metacontroller applies it after the StatefulSet and Jobs of the same answer, so a
// step that takes a member down must have seen the budget closed and counted before it
// starts (sync/disruption.go): the invariants (no quorum lost, sampled every 50ms from the
// members) and the workload (nothing acknowledged lost) hold throughout. The change must see
// an eviction refused (its budget closed), and the drain must get one through after it.
func drainDuring(t *testing.T, c *Cluster, size int, change func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(c.Plane.ctx)
	defer cancel()
	type outcome struct {
		allowed, refused int
	}
	during, after := &outcome{}, &outcome{}
	current := during
	results := make(chan error, 1)
	phase := make(chan *outcome)
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	go func() {
		tick := time.NewTicker(evictEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				results <- nil
				return
			case o := <-phase:
				current = o
			case <-tick.C:
				pod := c.Pod(rng.Intn(size))
				got, err := evictReady(ctx, c, pod)
				switch {
				case err != nil && ctx.Err() != nil:
					results <- nil
					return
				case err != nil:
					results <- err
					return
				case got == evicted:
					current.allowed++
					c.Plane.logf("drain: %s evicted", pod)
				case got == refused:
					current.refused++
				}
				if current == after && after.allowed > 0 {
					results <- nil
					return
				}
			}
		}
	}()
	change()
	select {
	case phase <- after:
	case err := <-results:
		t.Fatalf("the drain stopped during the change: %v", err)
	}
	select {
	case err := <-results:
		if err != nil {
			t.Fatalf("the drain: %v", err)
		}
	case <-time.After(drainAfterwards):
		cancel()
		<-results
	}
	t.Logf("drain: during the change %d evicted, %d refused; after it %d evicted, %d refused",
		during.allowed, during.refused, after.allowed, after.refused)
	if during.refused == 0 {
		t.Errorf("no eviction was refused during the change: its budget was never closed")
	}
	if after.allowed == 0 {
		t.Errorf("no eviction went through in %s after the change: the budget stayed closed", drainAfterwards)
	}
	waitSteady(t, c, size, 3*time.Minute)
}

// eviction is what the Eviction API answered for a pod: evicted, refused by its budget (429),
// or not asked (the pod not Ready, terminating, gone or replaced).
type eviction int

const (
	notAsked eviction = iota
	evicted
	refused
)

// evictReady asks the Eviction API for pod if it is Ready and not terminating.
func evictReady(ctx context.Context, c *Cluster, pod string) (eviction, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	p, err := c.Plane.Client.CoreV1().Pods(c.Namespace).Get(cctx, pod, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return notAsked, nil
	}
	if err != nil {
		return notAsked, err
	}
	if !harness.PodReady(p) {
		return notAsked, nil
	}
	err = c.Plane.Client.PolicyV1().Evictions(c.Namespace).Evict(cctx, &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: pod, Namespace: c.Namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}},
	})
	switch {
	case err == nil:
		return evicted, nil
	case apierrors.IsTooManyRequests(err):
		return refused, nil
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return notAsked, nil
	default:
		return notAsked, fmt.Errorf("evicting %s: %w", pod, err)
	}
}
