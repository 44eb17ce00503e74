package sync

import (
	"cmp"
	"net"
	"net/netip"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
)

// Endpoints are the client endpoints of the cluster's own pods, sorted by ordinal: the pod IP
// when the pod has one (no DNS lookup on the hook's path), the member's stable DNS name
// otherwise; the DNS name is always the TLS server name. Each is asked over the scheme its
// pod serves, read from the pod's own etcd flags; a pod that serves both is asked over the one
// the spec asks for, so a member is seen answering over it before the other is dropped.
//
// Only the cluster's own pods are dialled: in the parent's namespace, labelled with its name,
// named <cluster>-<ordinal> below the largest size, with an IP a pod can have. A request that
// names other pods or addresses makes the hook dial nothing of them.
func Endpoints(cfg Config, c *v1alpha1.EtcdCluster, pods []corev1.Pod) []etcdstate.Endpoint {
	type ep struct {
		ordinal int
		etcdstate.Endpoint
	}
	eps := make([]ep, 0, len(pods))
	for _, p := range pods {
		ord, ok := ownPod(c, &p)
		if !ok || p.Labels[LabelCluster] != c.Name || p.Namespace != c.Namespace || ord >= maxOrdinal {
			continue
		}
		host := MemberHost(c, p.Name, cfg.ClusterDomain)
		addr := host
		if p.Status.PodIP != "" {
			ip, err := netip.ParseAddr(p.Status.PodIP)
			if err != nil || !podAddress(ip) {
				continue
			}
			addr = ip.String()
		}
		eps = append(eps, ep{ord, etcdstate.Endpoint{
			Member:     p.Name,
			Address:    net.JoinHostPort(addr, strconv.Itoa(ClientPort)),
			ServerName: host,
			TLS:        asksTLS(c, &p),
		}})
	}
	slices.SortFunc(eps, func(a, b ep) int { return cmp.Compare(a.ordinal, b.ordinal) })
	out := make([]etcdstate.Endpoint, len(eps))
	for i, e := range eps {
		out[i] = e.Endpoint
	}
	return out
}

// maxOrdinal bounds the ordinals dialled: twice the largest size leaves room for gaps, and a
// request listing thousands of pods makes the hook dial no more than this.
const maxOrdinal = 2 * int(v1alpha1.MaxSize)

// podAddress: an address a pod can be given. Unspecified, multicast and link-local addresses
// (169.254.169.254 is the cloud's metadata service) never are.
func podAddress(ip netip.Addr) bool {
	return ip.IsValid() && !ip.IsUnspecified() && !ip.IsMulticast() && !ip.IsLinkLocalUnicast() && !ip.IsLinkLocalMulticast() && !ip.IsInterfaceLocalMulticast() && ip.Zone() == ""
}

// ownPod reports whether p is one of c's member pods, and its ordinal.
func ownPod(c *v1alpha1.EtcdCluster, p *corev1.Pod) (int, bool) {
	if v, ok := p.Labels[LabelCluster]; ok && v != c.Name {
		return 0, false
	}
	return Ordinal(c.Name, p.Name)
}
