package harness

import (
	"context"
	"strings"
	gosync "sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/sync"
)

// The stream's Deployment gets one pod that runs its command until killed (then again) or
// until the Deployment changes or goes, with its metrics address on the pod's own address.
// The member tool is a stand-in here that runs until stopped and records its arguments.
func TestStreamsRunTheDeploymentsPod(t *testing.T) {
	s := NewStore("ns")
	var mu gosync.Mutex
	var runs [][]string
	tools := Tools{Member: func(ctx context.Context, args []string) (string, error) {
		mu.Lock()
		runs = append(runs, args)
		mu.Unlock()
		<-ctx.Done()
		return "", nil
	}}
	c := NewStreams(s, tools, 0.01, t.Logf)
	c.Mounts = func(*corev1.Pod) (map[string]string, error) { return map[string]string{"/work": "/tmp/node/work"}, nil }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	deploy := func(interval string) *appsv1.Deployment {
		labels := map[string]string{sync.LabelBackupStreamOf: "e"}
		return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "e-backup-stream"}, Spec: appsv1.DeploymentSpec{
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "stream", Command: []string{"/etcdops-member", "stream-backup", "--work-dir=/work", "--metrics-addr=:9480", "--interval=" + interval}}}}}}}
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		for i := 0; !cond(); i++ {
			if i == 200 {
				t.Fatalf("%s: not within 10s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	ready := func() (*corev1.Pod, bool) {
		for _, o := range s.List("Pod") {
			p := o.(*corev1.Pod)
			return p, PodReady(p)
		}
		return nil, false
	}
	lastRun := func() []string {
		mu.Lock()
		defer mu.Unlock()
		if len(runs) == 0 {
			return nil
		}
		return runs[len(runs)-1]
	}

	if err := s.Create(deploy("1s")); err != nil {
		t.Fatal(err)
	}
	// The pod is Ready as its container starts, a moment before the command records its
	// arguments.
	wait("a Ready pod running the command", func() bool { _, ok := ready(); return ok && lastRun() != nil })
	p, _ := ready()
	args := strings.Join(lastRun(), " ")
	if !isStreamPod(p) || p.Status.PodIP == "" || !strings.Contains(args, "--metrics-addr="+p.Status.PodIP+":9480") || !strings.Contains(args, "--work-dir=/tmp/node/work") {
		t.Fatalf("pod %s at %q runs %q", p.Name, p.Status.PodIP, args)
	}

	if !c.Kill("e-backup-stream") {
		t.Fatal("nothing killed")
	}
	wait("a restart", func() bool { return c.Starts("e-backup-stream") == 2 })

	// A new template: the old pod goes before the new one starts.
	d, _ := s.Get("Deployment", "e-backup-stream")
	changed := d.(*appsv1.Deployment)
	changed.Spec.Template = deploy("2s").Spec.Template
	if err := s.Update(changed); err != nil {
		t.Fatal(err)
	}
	wait("the new template's pod", func() bool {
		q, ok := ready()
		return ok && q.Name != p.Name && len(s.List("Pod")) == 1 && strings.Contains(strings.Join(lastRun(), " "), "--interval=2s")
	})

	s.Delete("Deployment", "e-backup-stream")
	wait("no pod", func() bool { return len(s.List("Pod")) == 0 && c.Starts("e-backup-stream") == 0 })
}
