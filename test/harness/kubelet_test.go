package harness

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A new pod stays Pending for its own delay (image pull, volume attach), and a moved pod's
// next incarnation for its volume's attach: its container is not started before, and is after. The pods here have two containers, which the harness refuses
// to run: a start that was tried shows as a restart, which is all this test needs.
func TestKubeletKeepsPodsPendingForTheirDelay(t *testing.T) {
	s := NewStore("ns")
	k := NewKubelet(s, NewStatefulSets(s, t.TempDir()), nil, Tools{}, "cluster.local", t.TempDir(), 1)
	const delay = 400 * time.Millisecond
	k.PendingFor = func(pod string) time.Duration {
		if pod == "slow-0" {
			return delay
		}
		return 0
	}
	k.Moved("moved-0", delay)
	for _, name := range []string{"slow-0", "moved-0", "fast-0"} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd"}, {Name: "sidecar"}}}}
		if err := s.Create(pod); err != nil {
			t.Fatal(err)
		}
	}
	status := func(name string) corev1.PodStatus {
		o, _ := s.Get("Pod", name)
		return o.(*corev1.Pod).Status
	}
	ctx := context.Background()
	start := time.Now()
	k.syncPods(ctx)
	k.work.Wait()
	k.syncPods(ctx)
	for _, name := range []string{"slow-0", "moved-0"} {
		if st := status(name); time.Since(start) < delay && (st.Phase != corev1.PodPending || st.ContainerStatuses[0].RestartCount != 0 || st.PodIP != "") {
			t.Fatalf("%s within its delay: phase %s, restarts %d, IP %q; want Pending, not started, no address", name, st.Phase, st.ContainerStatuses[0].RestartCount, st.PodIP)
		}
	}
	if st := status("fast-0"); st.Phase != corev1.PodRunning || st.ContainerStatuses[0].RestartCount == 0 {
		t.Fatalf("fast-0 without a delay: phase %s, restarts %d; want its start tried", st.Phase, st.ContainerStatuses[0].RestartCount)
	}
	time.Sleep(time.Until(start.Add(delay + 100*time.Millisecond)))
	k.syncPods(ctx)
	k.work.Wait()
	k.syncPods(ctx)
	for _, name := range []string{"slow-0", "moved-0"} {
		if st := status(name); st.Phase != corev1.PodRunning || st.ContainerStatuses[0].RestartCount == 0 {
			t.Fatalf("%s after its delay: phase %s, restarts %d; want its start tried", name, st.Phase, st.ContainerStatuses[0].RestartCount)
		}
	}
}
