package harness

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A Job that completed is never run again, even when the controller decides from a listing
// made before its attempt ended (the listing and an attempt's end race in Run).
func TestCompletedJobRunsOnce(t *testing.T) {
	s := NewStore("ns")
	var runs atomic.Int32
	jobs := NewJobs(s, Tools{Member: func(context.Context, []string) (string, error) {
		runs.Add(1)
		return "done", nil
	}}, 1)
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "etcd-backup-etcd-4"}, Spec: batchv1.JobSpec{
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Command: []string{toolBinary, "backup"}}}}}}}
	if err := s.Create(job); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listed := s.List("Job")
	jobs.consider(ctx, job.Name)
	deadline := time.Now().Add(10 * time.Second)
	for {
		o, _ := s.Get("Job", job.Name)
		if done, _ := jobDone(o.(*batchv1.Job)); done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Job's attempt did not complete within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The listing taken before the attempt ended still shows the Job unfinished.
	if done, _ := jobDone(listed[0].(*batchv1.Job)); done {
		t.Fatal("the listing was taken after the Job completed: the test proves nothing")
	}
	jobs.consider(ctx, listed[0].GetName())
	time.Sleep(100 * time.Millisecond)
	if n := runs.Load(); n != 1 {
		t.Fatalf("a completed Job ran %d times, want 1", n)
	}
	if r := jobs.Running(); len(r) != 0 {
		t.Fatalf("attempts running after the Job completed: %v", r)
	}
}
