package sync

import (
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// Ports every etcd pod serves.
const (
	ClientPort  = 2379
	PeerPort    = 2380
	MetricsPort = 2381
)

// Labels the operator puts on what it renders.
const (
	LabelCluster   = "etcdops.dev/cluster"
	LabelAction    = "etcdops.dev/action"
	LabelMember    = "etcdops.dev/member"
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelName      = "app.kubernetes.io/name"
	LabelInstance  = "app.kubernetes.io/instance"
	ManagedBy      = "etcdops"
)

// Names of a cluster's children. The StatefulSet and the headless Service share the cluster's
// name, so member DNS names are <cluster>-<ordinal>.<cluster>.<namespace>.svc.<domain>.
func StatefulSetName(cluster string) string     { return cluster }
func HeadlessServiceName(cluster string) string { return cluster }
func ClientServiceName(cluster string) string   { return cluster + "-client" }
func JoinConfigMapName(cluster string) string   { return cluster + "-join" }
func PDBName(cluster string) string             { return cluster }

// PodName is the name of the pod (and etcd member) at ordinal.
func PodName(cluster string, ordinal int) string { return cluster + "-" + strconv.Itoa(ordinal) }

// Ordinal parses the ordinal from a pod or member name of cluster; false if it is not one.
func Ordinal(cluster, name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, cluster+"-")
	if !ok || rest == "" || (len(rest) > 1 && rest[0] == '0') {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// MemberHost is the stable DNS name of the member at pod name.
func MemberHost(c *v1alpha1.EtcdCluster, pod, clusterDomain string) string {
	return string(appendMemberHost(make([]byte, 0, 128), c, pod, clusterDomain))
}

// Host names and URLs are appended into one buffer and copied out once: the planner builds
// several per member on every sync.
func appendMemberHost(b []byte, c *v1alpha1.EtcdCluster, pod, clusterDomain string) []byte {
	b = append(b, pod...)
	b = append(b, '.')
	b = append(b, HeadlessServiceName(c.Name)...)
	b = append(b, '.')
	b = append(b, c.Namespace...)
	b = append(b, ".svc."...)
	return append(b, clusterDomain...)
}

// memberURL is scheme://<member host>:port.
func memberURL(c *v1alpha1.EtcdCluster, pod, clusterDomain string, secure bool, port int) string {
	b := append(make([]byte, 0, 128), scheme(secure)...)
	b = append(b, "://"...)
	b = appendMemberHost(b, c, pod, clusterDomain)
	b = append(b, ':')
	return string(strconv.AppendInt(b, int64(port), 10))
}

// Scheme is https when the cluster has TLS for that port, http otherwise.
func scheme(secure bool) string {
	if secure {
		return "https"
	}
	return "http"
}

// ownPod reports whether p is one of c's member pods, and its ordinal.
func ownPod(c *v1alpha1.EtcdCluster, p *corev1.Pod) (int, bool) {
	if v, ok := p.Labels[LabelCluster]; ok && v != c.Name {
		return 0, false
	}
	return Ordinal(c.Name, p.Name)
}
