package sync

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	policyv1ac "k8s.io/client-go/applyconfigurations/policy/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/joinstate"
)

// Rendering: every child is built as an apply configuration, which holds only the fields set
// here, so the JSON carries no creationTimestamp: null, no status: {} and no empty structs,
// and identical input encodes to identical bytes.

// AnnotationLedger on the join ConfigMap keeps, per ordinal ever used, the member ID,
// incarnation and whether it was established, so a member re-added under the same name gets a
// new incarnation even after its old record left the membership.
const AnnotationLedger = "etcdops.dev/ledger"

// commonLabels are on every child; selectorLabels pick the cluster's pods.
func commonLabels(c *v1alpha1.EtcdCluster) map[string]string {
	return map[string]string{
		LabelCluster:   c.Name,
		LabelManagedBy: ManagedBy,
		LabelName:      "etcd",
		LabelInstance:  c.Name,
	}
}

func selectorLabels(c *v1alpha1.EtcdCluster) map[string]string {
	return map[string]string{LabelCluster: c.Name}
}

func headlessService(c *v1alpha1.EtcdCluster) Child {
	name := HeadlessServiceName(c.Name)
	svc := corev1ac.Service(name, c.Namespace).
		WithLabels(commonLabels(c)).
		WithSpec(corev1ac.ServiceSpec().
			WithClusterIP(corev1.ClusterIPNone).
			// Peers must find each other before they are ready: readiness waits for them.
			WithPublishNotReadyAddresses(true).
			WithSelector(selectorLabels(c)).
			WithPorts(servicePort("client", ClientPort), servicePort("peer", PeerPort)))
	return Child{APIVersion: "v1", Kind: "Service", Name: name, Object: svc}
}

func clientService(c *v1alpha1.EtcdCluster) Child {
	name := ClientServiceName(c.Name)
	svc := corev1ac.Service(name, c.Namespace).
		WithLabels(commonLabels(c)).
		WithSpec(corev1ac.ServiceSpec().
			WithSelector(selectorLabels(c)).
			WithPorts(servicePort("client", ClientPort)))
	return Child{APIVersion: "v1", Kind: "Service", Name: name, Object: svc}
}

func servicePort(name string, port int32) *corev1ac.ServicePortApplyConfiguration {
	return corev1ac.ServicePort().WithName(name).WithPort(port).WithTargetPort(intstr.FromInt32(port)).WithProtocol(corev1.ProtocolTCP)
}

func joinConfigMap(c *v1alpha1.EtcdCluster, state joinstate.State, l ledger) Child {
	name := JoinConfigMapName(c.Name)
	cm := corev1ac.ConfigMap(name, c.Namespace).
		WithLabels(commonLabels(c)).
		WithAnnotations(map[string]string{AnnotationLedger: l.encode()}).
		WithData(map[string]string{joinstate.ConfigMapKey: joinstate.Encode(state)})
	return Child{APIVersion: "v1", Kind: "ConfigMap", Name: name, Object: cm}
}

// podDisruptionBudget lets voluntary disruptions take down only as many pods as the cluster
// can lose without losing quorum.
func podDisruptionBudget(c *v1alpha1.EtcdCluster, size int) Child {
	name := PDBName(c.Name)
	pdb := policyv1ac.PodDisruptionBudget(name, c.Namespace).
		WithLabels(commonLabels(c)).
		WithSpec(policyv1ac.PodDisruptionBudgetSpec().
			WithMaxUnavailable(intstr.FromInt32(int32(size - etcdstate.Quorum(size)))).
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(selectorLabels(c))))
	return Child{APIVersion: "policy/v1", Kind: "PodDisruptionBudget", Name: name, Object: pdb}
}

// shortHash is a stable 10-hex-digit digest of v's JSON.
func shortHash(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("sync: hashing plain values cannot fail: %v", err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:10]
}
