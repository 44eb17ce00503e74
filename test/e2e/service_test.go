package e2e

import (
	"context"
	"fmt"
	"strings"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/harness"
)

// TestServiceClients: applications reach the cluster through the client Service, as
// docs/install.md tells them to, and so does the continuous backup's stream. Clients that
// connect anew for every request (so each lands on whichever pod the Service picks: the
// harness's DNS rotates the Service's ready pods, as kube-proxy picks one per connection)
// write and watch through it while a learner joins, in a scale-out and in a member's
// replacement. No request may land on the learner, which refuses writes, linearizable reads
// and watches ("rpc not supported for learner"): the Service routes to Ready pods only, and a
// learner's pod is not Ready.
func TestServiceClients(t *testing.T) {
	t.Parallel()
	onCluster(t, spec(3),
		scenario{name: "scale-out", act: throughService(func(t *testing.T, env *harness.Env) int {
			syncs0 := env.MC.Syncs()
			scaleTo(env, 4)
			waitSteady(t, env, 4)
			if !sawLearner(env, env.Pod(3), syncs0) {
				t.Errorf("%s did not join as a learner", env.Pod(3))
			}
			scaleTo(env, 3)
			return 3
		})},
		scenario{name: "replacement", act: throughService(func(t *testing.T, env *harness.Env) int {
			victim := followerOf(t, env)
			syncs0 := env.MC.Syncs()
			if err := env.Wipe(victim); err != nil {
				t.Fatal(err)
			}
			waitSteady(t, env, 3)
			if !sawLearner(env, victim, syncs0) {
				t.Errorf("%s did not come back through a learner", victim)
			}
			return 3
		})},
	)
}

// throughService runs act while clients write and watch through the client Service, and
// fails the scenario when any request was refused for landing on a learner, or when too few
// succeeded for the run to say anything. Their writes go into the workload's history, so
// that its checks account for them.
func throughService(act func(*testing.T, *harness.Env) int) func(*testing.T, *harness.Env) int {
	return func(t *testing.T, env *harness.Env) int {
		c := &serviceClients{env: env, url: fmt.Sprintf("http://%s.%s.svc.cluster.local:%d", sync.ClientServiceName(env.Cluster), env.Store.Namespace, sync.ClientPort)}
		ctx, cancel := context.WithCancel(context.Background())
		var wg gosync.WaitGroup
		for i := range 2 {
			wg.Go(func() { c.run(ctx, 200+i, fmt.Sprintf("/service/%s/%d", namespaceOf(t.Name()), i)) })
		}
		size := act(t, env)
		cancel()
		wg.Wait()
		t.Logf("%d requests through %s succeeded, %d failed otherwise", c.ok.Load(), c.url, c.failed.Load())
		for _, e := range c.refusals() {
			t.Errorf("a request through the Service landed on a learner: %s", e)
		}
		if c.ok.Load() < 50 {
			t.Errorf("only %d requests through the Service succeeded", c.ok.Load())
		}
		return size
	}
}

// serviceClients are clients that dial the client Service for every request.
type serviceClients struct {
	env        *harness.Env
	url        string
	ok, failed atomic.Int64
	mu         gosync.Mutex
	learner    []string
}

// run writes a key and watches for it, each time through a client dialled anew, one a
// little after another, until ctx ends; id is its client ID in the workload's history.
func (c *serviceClients) run(ctx context.Context, id int, prefix string) {
	for i := 0; ctx.Err() == nil; i++ {
		err := c.once(ctx, id, fmt.Sprintf("%s/%d", prefix, i))
		switch {
		case err == nil:
			c.ok.Add(1)
		case strings.Contains(err.Error(), "not supported for learner"):
			c.mu.Lock()
			if len(c.learner) == 0 {
				// The first says where every pod and member stood then.
				err = fmt.Errorf("%w\n%s", err, c.env.Describe())
			}
			c.learner = append(c.learner, err.Error())
			c.mu.Unlock()
		default:
			// A member restarting, an election: clients retry those.
			c.failed.Add(1)
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// once opens a watch on key, writes it and waits for the event, all through one new client.
func (c *serviceClients) once(ctx context.Context, id int, key string) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.url}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	wch := cli.Watch(clientv3.WithRequireLeader(ctx), key)
	if _, err := c.env.RecordedPut(id, cli, key, key+"#1"); err != nil {
		return err
	}
	for resp := range wch {
		if err := resp.Err(); err != nil {
			return err
		}
		if len(resp.Events) > 0 {
			return nil
		}
	}
	return ctx.Err()
}

func (c *serviceClients) refusals() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.learner...)
}
