package sync

import (
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// What a pod serves, read from its own configuration, and how it is reached: the modes of its
// client and peer ports, its Secrets, and the URLs and schemes the hook, the member Jobs and
// its peers use (tls.go moves a cluster from one to another).

// AnnotationTrust on the pod template is a digest of the ca.crt of every Secret the pods
// mount: the CAs etcd loaded when it started.
const AnnotationTrust = "etcdops.dev/trust"

// CA bundle key of a kubernetes.io/tls Secret, as cert-manager writes it.
const secretCAKey = "ca.crt"

// clientMode is what a member serves on its client port.
type clientMode int

const (
	clientPlain clientMode = iota // http
	clientBoth                    // http and https on the same port
	clientTLS                     // https, client certificates required
)

func (m clientMode) String() string {
	return [...]string{"http", "http+https", "https"}[m]
}

// servesTLS and servesPlain: what the port accepts.
func (m clientMode) servesTLS() bool   { return m != clientPlain }
func (m clientMode) servesPlain() bool { return m != clientTLS }

// peerMode is what a member speaks with its peers.
type peerMode int

const (
	peerPlain peerMode = iota // listens on http and has no peer certificate
	peerDial                  // listens on http, and has the peer certificate to reach peers on https
	peerTLS                   // listens on https and requires peer certificates
)

func (m peerMode) String() string {
	return [...]string{"http", "http, dialing https", "https"}[m]
}

// canDialTLS: the member holds the peer certificate and CA, so it reaches a peer on https.
func (m peerMode) canDialTLS() bool { return m != peerPlain }

// serving is the TLS side of one pod template: what its etcd listens with, the Secrets it
// mounts, and the CA bundles it trusts from start.
type serving struct {
	client       clientMode
	peer         peerMode
	serverSecret string
	peerSecret   string
	trust        string
}

// servingOf reads what a rendered pod template serves from its etcd container's flags and its
// volumes: the pod's own configuration. False when it has no etcd container.
func servingOf(annotations map[string]string, spec *corev1.PodSpec) (serving, bool) {
	i := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == "etcd" })
	if i < 0 {
		return serving{}, false
	}
	c := spec.Containers[i]
	s := serving{trust: annotations[AnnotationTrust]}
	var clientURLs, peerURLs string
	peerCert := false
	for _, args := range [][]string{c.Command, c.Args} {
		for _, a := range args {
			switch name, value, _ := strings.Cut(a, "="); name {
			case "--listen-client-urls":
				clientURLs = value
			case "--listen-peer-urls":
				peerURLs = value
			case "--peer-cert-file":
				peerCert = true
			}
		}
	}
	plain, secure := false, false
	for _, u := range strings.Split(clientURLs, ",") {
		plain = plain || strings.HasPrefix(u, "http://")
		secure = secure || strings.HasPrefix(u, "https://")
	}
	switch {
	case secure && plain:
		s.client = clientBoth
	case secure:
		s.client = clientTLS
	}
	switch {
	case strings.HasPrefix(peerURLs, "https://"):
		s.peer = peerTLS
	case peerCert:
		s.peer = peerDial
	}
	for _, v := range spec.Volumes {
		if v.Secret == nil {
			continue
		}
		switch v.Name {
		case volumeServerTLS:
			s.serverSecret = v.Secret.SecretName
		case volumePeerTLS:
			s.peerSecret = v.Secret.SecretName
		}
	}
	return s, true
}

// podServing is what a pod serves; false for a pod without an etcd container.
func podServing(p *corev1.Pod) (serving, bool) { return servingOf(p.Annotations, &p.Spec) }

// wantedServing is the end state the spec asks for.
func wantedServing(c *v1alpha1.EtcdCluster) serving {
	var s serving
	if t := c.Spec.TLS; t != nil {
		if t.ServerSecret != "" {
			s.client, s.serverSecret = clientTLS, t.ServerSecret
		}
		if t.PeerSecret != "" {
			s.peer, s.peerSecret = peerTLS, t.PeerSecret
		}
	}
	return s
}

// listenedPeerURL is the peer URL member m's pod listens at: its DNS name, with the scheme of
// the pod's peer listener. False when the pod is missing or going.
func (v *view) listenedPeerURL(m *member) (string, bool) {
	if m.pod == nil || isTerminating(m.pod) {
		return "", false
	}
	s, ok := podServing(m.pod)
	if !ok {
		return "", false
	}
	return peerURLOf(v.c, m.name, v.cfg.ClusterDomain, s.peer == peerTLS), true
}

// unreachableBy names a member that could not reach url, or "": a member on http can reach
// any peer on http, but one on https only with the peer certificate.
func (v *view) unreachableBy(self *member, url string) string {
	if !strings.HasPrefix(url, "https://") {
		return ""
	}
	for _, m := range v.members {
		if m == self {
			continue
		}
		if m.pod == nil {
			return m.name + " (no pod)"
		}
		if s, ok := podServing(m.pod); !ok || !s.peer.canDialTLS() {
			return m.name
		}
	}
	return ""
}

// memberClientTLS: whether m is asked over https, as the hook asks it (memberEndpoints).
func (v *view) memberClientTLS(m *member) bool { return asksTLS(v.c, m.pod) }

// asksTLS: a member whose pod is p is asked over https: the pod serves TLS, and only TLS or
// the spec asks for it. Without a pod to read, the spec decides.
func asksTLS(c *v1alpha1.EtcdCluster, p *corev1.Pod) bool {
	prefer := wantedServing(c).client.servesTLS()
	if p == nil {
		return prefer
	}
	s, ok := podServing(p)
	if !ok {
		return prefer
	}
	return s.client.servesTLS() && (prefer || !s.client.servesPlain())
}

// peerURLOf and clientURLOf are a member's URLs with the given scheme.
func peerURLOf(c *v1alpha1.EtcdCluster, pod, clusterDomain string, secure bool) string {
	return memberURL(c, pod, clusterDomain, secure, PeerPort)
}

func clientURLOf(c *v1alpha1.EtcdCluster, pod, clusterDomain string, secure bool) string {
	return memberURL(c, pod, clusterDomain, secure, ClientPort)
}

// stsServing reads an observed StatefulSet's template.
func stsServing(s *appsv1.StatefulSet) (serving, bool) {
	return servingOf(s.Spec.Template.Annotations, &s.Spec.Template.Spec)
}

// PeerURL is the peer URL of the member at pod name once the spec's TLS is rolled out.
func PeerURL(c *v1alpha1.EtcdCluster, pod, clusterDomain string) string {
	return peerURLOf(c, pod, clusterDomain, wantedServing(c).peer == peerTLS)
}

// ClientURL is the client URL of the member at pod name once the spec's TLS is rolled out.
func ClientURL(c *v1alpha1.EtcdCluster, pod, clusterDomain string) string {
	return clientURLOf(c, pod, clusterDomain, wantedServing(c).client == clientTLS)
}
