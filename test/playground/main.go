// Command playground runs the operator's whole loop on this machine, without Kubernetes: the
// real hook over HTTP, real embedded etcd members on 127.0.0.x, and test/harness playing
// Metacontroller, the StatefulSet and Job controllers and the kubelet. It creates a
// 3-member cluster, scales it to 5 and back to 3, rolls a configuration change, and prints
// one line per sync (action, member, phase, conditions, members, leader, reason) while a
// workload writes. None of that is unplanned: the last line counts the syncs that reported
// Degraded, and it should say 0. It stops by itself, within -timeout.
//
//	go run ./test/playground
package main

import (
	"flag"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/manifests"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/harness"
)

func main() {
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	verbose := flag.Bool("v", false, "also print Jobs and faults")
	flag.Parse()
	if err := run(*timeout, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "playground:", err)
		os.Exit(1)
	}
}

func run(timeout time.Duration, verbose bool) error {
	ctrl, err := harness.LoadController(manifests.FS, "metacontroller")
	if err != nil {
		return err
	}
	root, err := os.MkdirTemp("", "etcdops-playground-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	start := time.Now()
	var degraded atomic.Int64
	stamp := func() string { return fmt.Sprintf("%6.2fs", time.Since(start).Seconds()) }
	logf := func(format string, args ...any) {
		if verbose {
			fmt.Printf("%s  %s\n", stamp(), fmt.Sprintf(format, args...))
		}
	}
	env, err := harness.Start(harness.Options{
		Namespace:  "playground",
		Cluster:    "etcd",
		Domain:     "cluster.local",
		TimeScale:  0.1,
		Tools:      harness.OperatorTools(),
		Hook:       harness.InProcessHook(sync.Config{ClusterDomain: "cluster.local", ToolImage: "etcdops.dev/etcdops:playground"}, nil),
		Controller: ctrl,
		Root:       root,
		Logf:       logf,
		OnSync: func(rec harness.SyncRecord) {
			fmt.Printf("%s  %s\n", stamp(), harness.SyncLine(rec))
			for _, c := range rec.Answer.Status.Conditions {
				if c.Type == v1alpha1.ConditionDegraded && c.Status == metav1.ConditionTrue {
					degraded.Add(1)
				}
			}
		},
	})
	if err != nil {
		return err
	}
	defer env.Close()

	deadline := time.Now().Add(timeout)
	step := func(what string, size int, change func()) error {
		fmt.Printf("%s  ==> %s\n", stamp(), what)
		change()
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("%s: out of time", what)
		}
		took, err := env.WaitSteady(size, left)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		fmt.Printf("%s  ==> %s: steady after %s\n", stamp(), what, took.Round(10*time.Millisecond))
		return nil
	}
	size := func(n int32) func() {
		return func() { env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { s.Size = &n }) }
	}
	three := int32(3)
	if err := step("create a 3-member cluster", 3, func() {
		env.Create(v1alpha1.EtcdClusterSpec{Size: &three, Version: "v3.7.3",
			StorageSpec: &v1alpha1.StorageSpec{VolumeSizeRequest: resource.MustParse("1Gi")}})
	}); err != nil {
		return err
	}
	w, err := env.StartWorkload("/playground")
	if err != nil {
		return err
	}
	for _, s := range []struct {
		what string
		n    int
		f    func()
	}{
		{"scale to 5", 5, size(5)},
		{"scale back to 3", 3, size(3)},
		{"roll a config change (--snapshot-count=20000)", 3, func() {
			env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) {
				s.EtcdOptions = append(s.EtcdOptions, "--snapshot-count=20000")
			})
		}},
	} {
		if err := step(s.what, s.n, s.f); err != nil {
			w.Stop()
			return err
		}
	}
	stats := w.Stop()
	lost, err := w.Verify(15 * time.Second)
	if err != nil {
		return err
	}
	c := env.Monitor.Counts()
	fmt.Printf("%s  done: %d syncs (%d Degraded), %d membership changes, %d leader changes; writes: %d acknowledged, %d lost, %d failed attempts, worst latency %s\n",
		stamp(), env.MC.Syncs(), degraded.Load(), c.MembershipChanges, c.LeaderChanges, stats.Acked, len(lost), stats.Failed, stats.Worst.Round(time.Millisecond))
	if v := env.Monitor.Violations(); len(v) > 0 || len(lost) > 0 {
		return fmt.Errorf("%d invariant violations, %d writes lost", len(v), len(lost))
	}
	return nil
}
