package sync

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// TestServingOf reads what a pod serves from its etcd flags, as rendered by each stage.
func TestServingOf(t *testing.T) {
	c := &v1alpha1.EtcdCluster{}
	c.Name, c.Namespace = "etcd", "db"
	for _, tc := range []struct {
		story string
		s     serving
	}{
		{"plain", serving{}},
		{"client port on both schemes", serving{client: clientBoth, serverSecret: "srv"}},
		{"client TLS", serving{client: clientTLS, serverSecret: "srv"}},
		{"peer certificate on an http listener", serving{peer: peerDial, peerSecret: "peer"}},
		{"peer TLS", serving{peer: peerTLS, peerSecret: "peer"}},
		{"everything, with a trust digest", serving{client: clientTLS, peer: peerTLS, serverSecret: "srv", peerSecret: "peer", trust: "0123456789"}},
	} {
		tmpl := podTemplate(simConfig, c, tc.s, "etcd:v3.6.16")
		var pt corev1.PodTemplateSpec
		if err := jsonRoundTrip(tmpl, &pt); err != nil {
			t.Fatal(err)
		}
		got, ok := servingOf(pt.Annotations, &pt.Spec)
		if !ok || got != tc.s {
			t.Errorf("%s: read back %+v (%v), rendered %+v", tc.story, got, ok, tc.s)
		}
	}
	if _, ok := servingOf(nil, &corev1.PodSpec{Containers: []corev1.Container{{Name: "sidecar"}}}); ok {
		t.Error("a pod without an etcd container serves something")
	}
}

// TestEndpointsDialOnlyOwnPods: the hook dials the cluster's own pods only, each over what
// it serves; a forged request naming anything else yields no endpoint for it.
func TestEndpointsDialOnlyOwnPods(t *testing.T) {
	c := &v1alpha1.EtcdCluster{}
	c.Name, c.Namespace = "etcd", "db"
	c.Spec.TLS = &v1alpha1.TLSSpec{ServerSecret: "srv", ClientSecret: "cli"}
	own := map[string]string{LabelCluster: "etcd"}
	pod := func(name, ns, ip string, labels map[string]string, s *serving) corev1.Pod {
		p := corev1.Pod{}
		p.Name, p.Namespace, p.Labels, p.Status.PodIP = name, ns, labels, ip
		if s != nil {
			var pt corev1.PodTemplateSpec
			if err := jsonRoundTrip(podTemplate(simConfig, c, *s, "etcd:v3.6.16"), &pt); err != nil {
				t.Fatal(err)
			}
			p.Spec = pt.Spec
		}
		return p
	}
	got := memberEndpoints(simConfig, c, []corev1.Pod{
		pod("etcd-0", "db", "10.0.0.10", own, &serving{client: clientBoth, serverSecret: "srv"}), // both: the spec's https
		pod("etcd-1", "db", "10.0.0.11", own, &serving{}),                                        // plain only: http
		pod("etcd-2", "db", "10.0.0.12", own, &serving{client: clientTLS, serverSecret: "srv"}),
		pod("etcd-3", "other", "10.0.0.13", own, nil),                               // another namespace
		pod("etcd-4", "db", "10.0.0.14", nil, nil),                                  // no cluster label
		pod("etcd-5", "db", "10.0.0.15", map[string]string{LabelCluster: "x"}, nil), // another cluster's label
		pod("kube-apiserver", "db", "10.0.0.1", own, nil),                           // not a member's name
		pod("etcd-6", "db", "169.254.169.254", own, nil),                            // the metadata service
		pod("etcd-7", "db", "0.0.0.0", own, nil),                                    // unspecified
		pod("etcd-8", "db", "evil.example.com", own, nil),                           // a name, not an address
		pod("etcd-9", "db", "10.0.0.19:443", own, nil),                              // an address with a port
		pod("etcd-18", "db", "10.0.0.28", own, nil),                                 // beyond any size
		pod("etcd-10", "db", "fe80::1", own, nil),                                   // link-local
	})
	want := []string{
		"etcd-0 10.0.0.10:2379 https",
		"etcd-1 10.0.0.11:2379 http",
		"etcd-2 10.0.0.12:2379 https",
	}
	var lines []string
	for _, e := range got {
		scheme := "http"
		if e.TLS {
			scheme = "https"
		}
		lines = append(lines, e.Member+" "+e.Address+" "+scheme)
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("Endpoints:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}

	c.Spec.TLS = nil // turning TLS off: a pod on both schemes is asked over http
	if got := memberEndpoints(simConfig, c, []corev1.Pod{pod("etcd-0", "db", "10.0.0.10", own, &serving{client: clientBoth, serverSecret: "srv"})}); len(got) != 1 || got[0].TLS {
		t.Errorf("turning TLS off, a pod serving both is asked %+v, want over http", got)
	}
}

// TestTLSInvariantsCatchUnsafeSteps feeds unsafe TLS steps to the checker: each is refused
// and becomes an internal hold.
func TestTLSInvariantsCatchUnsafeSteps(t *testing.T) {
	// retemplate renders the StatefulSet's template at another stage, as a buggy stage
	// decision would.
	retemplate := func(p *planner, s serving) {
		p.tls.desired = s
		p.spec = renderPodSpec(p.cfg, p.c, s)
	}
	for _, tc := range []struct {
		name  string
		tls   string
		setup func(w *simWorld)
		step  func(p *planner) step
		want  string
	}{
		{
			"the client port from http to https in one roll", "none", nil,
			func(p *planner) step {
				retemplate(p, serving{client: clientTLS, serverSecret: simServerSecret})
				return p.replacePod(2, "etcd-2", "")
			},
			"moves its client port from http to https in one roll",
		},
		{
			"an https peer listener while another pod has no peer certificate", "none", nil,
			func(p *planner) step {
				retemplate(p, serving{peer: peerTLS, peerSecret: simPeerSecret})
				return p.replacePod(2, "etcd-2", "")
			},
			"onto an https peer listener while etcd-0 has no peer certificate",
		},
		{
			"the peer certificate dropped while a member advertises https", "peer",
			func(w *simWorld) { w.cluster.Spec.TLS = nil },
			func(p *planner) step {
				retemplate(p, serving{})
				return p.replacePod(2, "etcd-2", "")
			},
			"dropping the peer certificate of etcd-2 while a member advertises an https peer URL",
		},
		{
			"a peer URL updated to where the member's pod does not listen", "none", nil,
			func(p *planner) step {
				m := p.byOrd[2]
				return p.runJob(memberJob{verb: verbUpdatePeerURL, member: m.name, id: m.ID, peerURL: peerURLOf(p.c, m.name, p.cfg.ClusterDomain, true)}, UpdatePeerURL, "")
			},
			"where its pod does not listen",
		},
		{
			"a peer URL updated to https that another member cannot reach", "none",
			func(w *simWorld) {
				// etcd-2's pod alone was recreated on an https peer listener.
				c := v1alpha1.Defaulted(w.cluster)
				w.pods[2].tmpl = templateAt(w.t, &c, serving{peer: peerTLS, peerSecret: simPeerSecret})
			},
			func(p *planner) step {
				m := p.byOrd[2]
				return p.runJob(memberJob{verb: verbUpdatePeerURL, member: m.name, id: m.ID, peerURL: peerURLOf(p.c, m.name, p.cfg.ClusterDomain, true)}, UpdatePeerURL, "")
			},
			"which etcd-0 cannot reach",
		},
		{
			"a learner added at an https peer URL that a member cannot reach", "none", nil,
			func(p *planner) step {
				return p.runJob(memberJob{verb: verbAddLearner, member: "etcd-3", peerURL: peerURLOf(p.c, "etcd-3", p.cfg.ClusterDomain, true)}, AddLearner, "")
			},
			"which etcd-0 cannot reach",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newSimWorld(t, 3, true)
			w.setTLS(tc.tls)
			w.run(100)
			if tc.setup != nil {
				tc.setup(w)
			}
			wantRefused(t, w, tc.step, tc.want)
		})
	}
}

// templateAt is the pod template of c rendered at TLS stage s.
func templateAt(t testing.TB, c *v1alpha1.EtcdCluster, s serving) corev1.PodTemplateSpec {
	var pt corev1.PodTemplateSpec
	if err := jsonRoundTrip(renderPodSpec(simConfig, c, s).template, &pt); err != nil {
		t.Fatal(err)
	}
	return pt
}

// fatalRecorder stands in for the test a simulated world reports to, so a test can check that
// the simulator's own world checks catch a broken world.
type fatalRecorder struct {
	testing.TB
	msg string
}

type recordedFatal struct{}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	panic(recordedFatal{})
}

func (r *fatalRecorder) Helper() {}

// catchFatal runs f against a recorder and returns what it failed with, "" if nothing.
func catchFatal(t *testing.T, f func(tb testing.TB)) (msg string) {
	r := &fatalRecorder{TB: t}
	defer func() {
		if v := recover(); v != nil {
			if _, ok := v.(recordedFatal); !ok {
				panic(v)
			}
			msg = r.msg
		}
	}()
	f(r)
	return ""
}

// TestSimulatorCatchesUnreachablePeerURLs: the simulator's world checks fail a world in which
// a member advertises an https peer URL that a running peer cannot reach, and cut off a
// member whose pod listens with another scheme than the URL its peers know.
func TestSimulatorCatchesUnreachablePeerURLs(t *testing.T) {
	msg := catchFatal(t, func(tb testing.TB) {
		w := newSimWorld(tb, 3, true)
		w.run(100)
		w.members[2].peerURL = peerURLOf(&w.cluster, w.podName(2), simConfig.ClusterDomain, true)
		w.checkWorld()
	})
	if !strings.Contains(msg, "cannot reach: it has no peer certificate") {
		t.Errorf("the simulator let an unreachable https peer URL pass: %q", msg)
	}

	w := newSimWorld(t, 3, true)
	w.run(100)
	c := v1alpha1.Defaulted(w.cluster)
	w.pods[2].tmpl = templateAt(t, &c, serving{peer: peerTLS, peerSecret: simPeerSecret})
	if m := w.memberAt(2); w.healthy(m) {
		t.Error("a member listening on https while its peers know it on http counts as healthy")
	}
}

// TestTLSSecretSwapRefused: the hook refuses a spec naming another Secret than the pods use,
// with the safe path in the message, and changes nothing.
func TestTLSSecretSwapRefused(t *testing.T) {
	w := newSimWorld(t, 3, true)
	w.setTLS("client,peer")
	w.run(100)
	w.cluster.Spec.TLS.PeerSecret = "etcd-peer-2"
	d := Plan(simConfig, w.observe())
	if d.Status.Phase != v1alpha1.PhaseInvalid || !strings.Contains(d.Action.Reason, "renew the certificate inside etcd-peer instead") {
		t.Fatalf("%s %v, want Invalid naming the safe path", d.Status.Phase, d.Action)
	}
}

// TestRandomFaultsDuringTLSChanges turns TLS on and off, client and peer, and changes the CA,
// while members crash, hang, or go unseen by the hook and the caches lag; every step keeps the
// invariants (the simulator's world checks included: no member advertises a peer URL a
// running peer cannot reach), and each change converges once the faults heal.
func TestRandomFaultsDuringTLSChanges(t *testing.T) {
	for seed := int64(1); seed <= seeds(6); seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewSource(seed))
			simLag = rand.New(rand.NewSource(seed))
			defer func() { simLag = nil }()
			w, _ := created(t, 3, seed%2 == 1)
			w.faulty = true
			changes := []func(){
				func() { w.setTLS("client") },
				func() { w.setTLS("client,peer") },
				func() { w.secrets[simPeerSecret] = "ca-1+2" },
				func() { w.cluster.Spec.Size = ptrTo(int32(5)) },
				func() { w.setTLS("peer") },
				func() { w.cluster.Spec.Size = ptrTo(int32(3)) },
				func() { w.setTLS("none") },
			}
			for _, change := range changes {
				change()
				w.cluster.Generation++
				var heal func()
				for i := 0; i < 60; i++ {
					if heal == nil && rng.Intn(8) == 0 {
						if p := w.randomPod(rng); p != nil {
							switch rng.Intn(3) {
							case 0:
								p.crash = true
							case 1:
								p.down = true
							default:
								p.blind = true
							}
							heal = func() { p.crash, p.down, p.blind = false, false, false }
						}
					}
					if heal != nil && rng.Intn(6) == 0 {
						heal()
						heal = nil
					}
					w.step()
				}
				if heal != nil {
					heal()
				}
				w.run(500)
			}
		})
	}
}

// jsonRoundTrip decodes the JSON form of a rendered value into a typed struct.
func jsonRoundTrip(v any, into any) error {
	return json.Unmarshal(mustJSON(v), into)
}
