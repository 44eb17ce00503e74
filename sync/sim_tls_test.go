package sync

import (
	"strings"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// The simulator's model of TLS: each pod serves what its template's etcd flags say (read back
// with servingOf, the planner's own reader), each member has the peer URL etcd has for it, and
// the hook reaches a member only over a scheme its pod serves.

// Secrets of a simulated cluster, present from the start.
const (
	simServerSecret = "etcd-server"
	simPeerSecret   = "etcd-peer"
	simClientSecret = "etcd-client"
)

// setTLS sets spec.tls from a list: client (server and client Secrets), peer, none.
func (w *simWorld) setTLS(list string) {
	var t v1alpha1.TLSSpec
	for _, part := range strings.Split(list, ",") {
		switch part {
		case "client":
			t.ServerSecret, t.ClientSecret = simServerSecret, simClientSecret
		case "peer":
			t.PeerSecret = simPeerSecret
		case "none":
		default:
			w.t.Fatalf("tls=%s: want client, peer or none", list)
		}
	}
	w.cluster.Spec.TLS = nil
	if t != (v1alpha1.TLSSpec{}) {
		w.cluster.Spec.TLS = &t
	}
}

func (w *simWorld) podServes(p *simPod) serving {
	s, _ := servingOf(p.tmpl.Annotations, &p.tmpl.Spec)
	return s
}

// peerReachable: the member's pod listens with the scheme of the peer URL its peers know; a
// member listening on the other one is cut off from them (and a member alone has no peers).
func (w *simWorld) peerReachable(m *simMember) bool {
	p := w.pods[m.ord]
	return p == nil || len(w.members) == 1 || strings.HasPrefix(m.peerURL, "https://") == (w.podServes(p).peer == peerTLS)
}

// servesClient: the hook, asking over https or not, gets an answer from p's etcd.
func (w *simWorld) servesClient(p *simPod, secure bool) bool {
	s := w.podServes(p)
	if !secure {
		return s.client.servesPlain()
	}
	_, _, client := secretsInUse(&w.cluster)
	_, haveCert := w.secrets[client]
	return s.client.servesTLS() && haveCert
}

// jobReaches: a member Job's client reaches a healthy member of its endpoints over their
// scheme (a client uses the first endpoint's scheme for all), presenting a certificate for
// https.
func (w *simWorld) jobReaches(j *simJob) bool {
	if len(j.endpoints) == 0 {
		return false
	}
	secure := strings.HasPrefix(j.endpoints[0], "https://")
	if secure && !j.clientCert {
		return false
	}
	for _, e := range j.endpoints {
		host := strings.TrimPrefix(strings.TrimPrefix(e, "https://"), "http://")
		pod, _, _ := strings.Cut(host, ".")
		ord, ok := Ordinal(w.cluster.Name, pod)
		if m := w.memberAt(ord); ok && m != nil && w.healthy(m) && w.servesClient(w.pods[ord], secure) {
			return true
		}
	}
	return false
}

// advertisedPeerURL is the peer URL p's etcd starts with (--initial-advertise-peer-urls).
func (w *simWorld) advertisedPeerURL(p *simPod) string {
	for _, c := range p.tmpl.Spec.Containers {
		for _, a := range c.Args {
			if v, ok := strings.CutPrefix(a, "--initial-advertise-peer-urls="); ok {
				return strings.ReplaceAll(v, "$(POD_NAME)", w.podName(p.ord))
			}
		}
	}
	return ""
}

// checkTLSWorld: a member never advertises an https peer URL that a running peer cannot
// reach (it would need the peer certificate to dial it and to pass its client check).
func (w *simWorld) checkTLSWorld() {
	w.t.Helper()
	for _, m := range w.members {
		if !strings.HasPrefix(m.peerURL, "https://") {
			continue
		}
		for _, o := range w.members {
			p := w.pods[o.ord]
			if o == m || p == nil || !p.running {
				continue
			}
			if !w.podServes(p).peer.canDialTLS() {
				w.t.Fatalf("%s advertises %s, which %s cannot reach: it has no peer certificate\n%s", w.podName(m.ord), m.peerURL, w.podName(o.ord), w.describe())
			}
		}
	}
}
