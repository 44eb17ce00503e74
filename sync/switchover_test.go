package sync

import (
	"strings"
	"testing"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// TestSwitchoverRefusals: a switchover request naming a member that cannot lead is refused
// with a Hold on it that says why, and nothing is started or recorded; the request stays and
// is served once the member can lead. A learner or an unhealthy voter never reaches this
// phase through the fixes before it (a learner is promoted or removed, an unhealthy voter
// waited for or replaced), so the phase is asked directly, on the world the fixes left.
func TestSwitchoverRefusals(t *testing.T) {
	for _, tc := range []struct {
		name    string
		request string
		setup   func(w *simWorld)
		want    string
	}{
		{"no such member", "etcd-5", nil, "refused: etcd-5 is no member of the cluster (members: etcd-0, etcd-1, etcd-2)"},
		{"a learner", "etcd-3", func(w *simWorld) {
			w.members = append(w.members, &simMember{id: w.nextID, ord: 3, learner: true, peerURL: PeerURL(&w.cluster, "etcd-3", simConfig.ClusterDomain)})
			w.nextID++
		}, "refused: etcd-3 is a learner, which cannot lead"},
		{"an unhealthy voter", "etcd-2", func(w *simWorld) { w.pods[2].down = true }, "refused: etcd-2 is not healthy"},
		{"no leader known", "etcd-1", func(w *simWorld) { w.leader = 0 }, "refused: no member is known to lead"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newSimWorld(t, 3, true)
			w.run(100)
			if tc.setup != nil {
				tc.setup(w)
			}
			w.cluster.Annotations = map[string]string{v1alpha1.AnnotationSwitchoverTo: tc.request}
			obs := w.observe()
			c := v1alpha1.Defaulted(obs.Cluster)
			p := &planner{view: newView(simConfig, &obs, &c)}
			s, ok := p.switchover()
			switch {
			case !ok || s.action.Type != Hold || s.action.Member != v1alpha1.SwitchoverTarget(tc.request):
				t.Errorf("switchover = %v (decided %v), want a Hold on %s", s.action, ok, tc.request)
			case !strings.Contains(s.action.Reason, tc.want):
				t.Errorf("reason %q, want it to contain %q", s.action.Reason, tc.want)
			case s.job != nil || s.switchover != nil:
				t.Errorf("a refused switchover started %v, recorded %+v", s.job, s.switchover)
			}
		})
	}
}
