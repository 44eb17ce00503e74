package sync

import (
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// TestInvariantsCatchUnsafeSteps feeds hand-made unsafe steps to the checker: each must be
// refused, whatever phase might have produced it.
func TestInvariantsCatchUnsafeSteps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(w *simWorld)
		step  func(p *planner) step
		want  string
	}{
		{
			"two changes in one sync: a Job and a grow",
			nil,
			func(p *planner) step {
				s := p.scaleTo(4, "etcd-3", "")
				s.job = &memberJob{verb: verbMoveLeader, member: "etcd-1", id: p.byOrd[1].ID}
				return s
			},
			"changes in one sync",
		},
		{
			"a second learner",
			func(w *simWorld) { w.members = append(w.members, &simMember{id: 0x99, ord: 3, learner: true}) },
			func(p *planner) step { return p.addLearner(4, "") },
			"a second learner",
		},
		{
			"removing a voter while another is down",
			func(w *simWorld) { w.pods[1].down = true },
			func(p *planner) step {
				return p.runJob(memberJob{verb: verbRemove, member: "etcd-2", id: p.byOrd[2].ID}, RemoveMember, "")
			},
			"would leave 1 healthy of 2 voters",
		},
		{
			"shrinking below a voter",
			nil,
			func(p *planner) step { return p.scaleTo(2, "etcd-2", "") },
			"would drop member etcd-2",
		},
		{
			"replacing two pods at once",
			func(w *simWorld) { w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=1"} },
			func(p *planner) step { return p.replacePod(1, "etcd-1", "") },
			"would replace 2 pods at once",
		},
		{
			"replacing the next pod while the one above is still being replaced",
			func(w *simWorld) {
				w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=1"}
				w.pods[2].terminating = true
			},
			func(p *planner) step { return p.replacePod(1, "etcd-1", "") },
			"exposes etcd-1 while pod etcd-2 is terminating",
		},
		{
			"replacing the next pod while the one above is back but not ready",
			func(w *simWorld) {
				w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=1"}
				w.pods[2].running = false
			},
			func(p *planner) step {
				// etcd-2 was recreated from the current spec and is starting.
				p.pods[2].Annotations[AnnotationSpecHash] = p.spec.specHash
				return p.replacePod(1, "etcd-1", "")
			},
			"exposes etcd-1 while pod etcd-2 is not ready",
		},
		{
			"a new Job while one is outstanding",
			nil,
			func(p *planner) step {
				s := p.runJob(memberJob{verb: verbMoveLeader, member: "etcd-1", id: p.byOrd[1].ID}, MoveLeader, "")
				running := &batchv1.Job{}
				running.Name = "etcd-promote-etcd-3-0123456789"
				s.keep = []*batchv1.Job{running}
				return s
			},
			"while Job etcd-promote-etcd-3-0123456789 is outstanding",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newSimWorld(t, 3, true)
			w.run(100)
			if tc.setup != nil {
				tc.setup(w)
			}
			obs := w.observe()
			c := v1alpha1.Defaulted(obs.Cluster)
			p := &planner{view: newView(simConfig, &obs, &c)}
			s := tc.step(p)
			err := checkInvariants(p.view, s)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("checkInvariants = %v, want an error containing %q", err, tc.want)
			}
			if d := p.decision(s); !strings.HasPrefix(d.Action.Reason, "internal: ") || d.Action.Type != Hold {
				t.Errorf("decision %v, want an internal hold", d.Action)
			}
		})
	}
}
