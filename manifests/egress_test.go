package manifests

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/sync"
)

// checkHookEgress: the hook may dial etcd members' client ports, found by the label the
// operator puts on their pods, cluster DNS, the continuous backup's progress on its
// pods' metrics port, and the Kubernetes API's usual ports (for Events); nothing else.
func checkHookEgress(t *testing.T, np networkingv1.NetworkPolicySpec) {
	t.Helper()
	if !slices.Contains(np.PolicyTypes, networkingv1.PolicyTypeEgress) || len(np.Egress) != 4 {
		t.Fatalf("NetworkPolicy: want egress restricted to four rules, got %+v", np)
	}
	members, dns, streams, api := np.Egress[0], np.Egress[1], np.Egress[2], np.Egress[3]
	if len(api.Ports) != 2 || api.Ports[0].Port.IntValue() != 443 || api.Ports[1].Port.IntValue() != 6443 ||
		*api.Ports[0].Protocol != corev1.ProtocolTCP || *api.Ports[1].Protocol != corev1.ProtocolTCP {
		t.Errorf("NetworkPolicy API egress ports %+v, want TCP 443 and 6443 only", api.Ports)
	}
	if len(streams.To) != 1 || streams.To[0].PodSelector == nil || !slices.ContainsFunc(streams.To[0].PodSelector.MatchExpressions, func(r metav1.LabelSelectorRequirement) bool {
		return r.Key == sync.LabelBackupStreamOf && r.Operator == metav1.LabelSelectorOpExists
	}) || len(streams.To[0].PodSelector.MatchLabels) > 0 {
		t.Errorf("NetworkPolicy egress %+v, want the stream pods (%s) in any namespace", streams.To, sync.LabelBackupStreamOf)
	}
	if len(streams.Ports) != 1 || streams.Ports[0].Port.IntValue() != sync.StreamMetricsPort || *streams.Ports[0].Protocol != corev1.ProtocolTCP {
		t.Errorf("NetworkPolicy stream egress ports %+v, want TCP %d only", streams.Ports, sync.StreamMetricsPort)
	}
	want := metav1.LabelSelectorRequirement{Key: sync.LabelCluster, Operator: metav1.LabelSelectorOpExists}
	if len(members.To) != 1 || members.To[0].PodSelector == nil || !slices.ContainsFunc(members.To[0].PodSelector.MatchExpressions, func(r metav1.LabelSelectorRequirement) bool {
		return r.Key == want.Key && r.Operator == want.Operator
	}) || len(members.To[0].PodSelector.MatchLabels) > 0 {
		t.Errorf("NetworkPolicy egress %+v, want pods with %s in any namespace", members.To, sync.LabelCluster)
	}
	if len(members.Ports) != 1 || members.Ports[0].Port.IntValue() != sync.ClientPort || *members.Ports[0].Protocol != corev1.ProtocolTCP {
		t.Errorf("NetworkPolicy egress ports %+v, want TCP %d only", members.Ports, sync.ClientPort)
	}
	if len(dns.To) != 1 || dns.To[0].PodSelector == nil || dns.To[0].PodSelector.MatchLabels["k8s-app"] != "kube-dns" {
		t.Errorf("NetworkPolicy egress %+v, want cluster DNS", dns.To)
	}
	for _, p := range dns.Ports {
		if p.Port.IntValue() != 53 {
			t.Errorf("NetworkPolicy DNS egress port %v, want 53", p.Port)
		}
	}
}
