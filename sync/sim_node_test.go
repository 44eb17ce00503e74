package sync

import (
	corev1 "k8s.io/api/core/v1"
)

// A node that stops reporting, as Kubernetes shows it. The node lifecycle controller sets
// the Ready condition of the node's pods to False and nothing else (its reason stays the
// kubelet's, an event NodeNotReady is recorded on the pod); the container statuses stay as
// the kubelet last wrote them. Here the etcd on that node is cut off from the hook and from
// its peers, so the cluster sees the member down, while nothing on the node said it stopped.
// Eviction by the taint, minutes later, is the partitioned fault.

// loseNode makes p's node stop reporting.
func (w *simWorld) loseNode(p *simPod) {
	p.nodeLost, p.down, p.blind = true, true, true
}

// nodeStoppedReporting turns a pod's observed status into what the API server holds once the
// node controller marked it: Ready False, the etcd container last seen running and ready.
func nodeStoppedReporting(p *simPod, pod *corev1.Pod) {
	if !p.nodeLost {
		return
	}
	for i := range pod.Status.Conditions {
		if c := &pod.Status.Conditions[i]; c.Type == corev1.PodReady {
			c.Status, c.Reason = corev1.ConditionFalse, ""
		}
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "etcd", Ready: true, RestartCount: int32(p.restarts),
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
}
