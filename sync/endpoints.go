package sync

import (
	"net"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
)

// Endpoints are the client endpoints of the cluster's own pods, sorted by ordinal: the pod IP
// when the pod has one (no DNS lookup on the hook's path), the member's stable DNS name
// otherwise; the DNS name is always the TLS server name.
func Endpoints(cfg Config, c *v1alpha1.EtcdCluster, pods []corev1.Pod) []etcdstate.Endpoint {
	type ep struct {
		ordinal int
		etcdstate.Endpoint
	}
	var eps []ep
	for _, p := range pods {
		ord, ok := ownPod(c, &p)
		if !ok {
			continue
		}
		host := MemberHost(c, p.Name, cfg.ClusterDomain)
		addr := host
		if p.Status.PodIP != "" {
			addr = p.Status.PodIP
		}
		eps = append(eps, ep{ord, etcdstate.Endpoint{
			Member:     p.Name,
			Address:    net.JoinHostPort(addr, strconv.Itoa(ClientPort)),
			ServerName: host,
		}})
	}
	sort.Slice(eps, func(i, j int) bool { return eps[i].ordinal < eps[j].ordinal })
	out := make([]etcdstate.Endpoint, len(eps))
	for i, e := range eps {
		out[i] = e.Endpoint
	}
	return out
}

// ownPod reports whether p is one of c's member pods, and its ordinal.
func ownPod(c *v1alpha1.EtcdCluster, p *corev1.Pod) (int, bool) {
	if v, ok := p.Labels[LabelCluster]; ok && v != c.Name {
		return 0, false
	}
	return Ordinal(c.Name, p.Name)
}
