package sync

import (
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
)

// TestInvariantsCatchUnsafeSteps feeds hand-made unsafe steps to the checker: each must be
// refused, whatever phase might have produced it.
func TestInvariantsCatchUnsafeSteps(t *testing.T) {
	// The join state of a quorum recovery from etcd-0 under token t.
	forceFromEtcd0 := func(p *planner) step {
		s := p.wait("etcd-0", "", resyncSoon)
		s.recovery = &v1alpha1.RecoveryStatus{Survivor: "etcd-0", Token: "t", Phase: recoveryForcing}
		return s
	}
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
			func(w *simWorld) {
				w.members = append(w.members, &simMember{id: 0x99, ord: 3, learner: true, peerURL: PeerURL(&w.cluster, w.podName(3), simConfig.ClusterDomain)})
			},
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
			"re-creating a deleted StatefulSet below a member's orphaned pod",
			func(w *simWorld) { w.deleteChild("statefulset", true) },
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
		{
			"removing a voter only the hook cannot reach",
			func(w *simWorld) { w.pods[1].blind = true },
			func(p *planner) step {
				return p.runJob(memberJob{verb: verbRemove, member: "etcd-1", id: p.byOrd[1].ID}, RemoveMember, "")
			},
			"removing etcd-1, which only the hook cannot reach",
		},
		{
			"replacing the pod of a voter only the hook cannot reach",
			func(w *simWorld) {
				w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=1"}
				w.pods[2].blind = true
			},
			func(p *planner) step { return p.replacePod(2, "etcd-2", "") },
			"replacing etcd-2, which only the hook cannot reach",
		},
		{
			"moving leadership off a healthy leader while a member did not answer",
			func(w *simWorld) { w.pods[1].blind = true },
			func(p *planner) step {
				return p.runJob(memberJob{verb: verbMoveLeader, member: "etcd-2", id: p.byOrd[2].ID}, MoveLeader, "")
			},
			"disturbing etcd-0 while etcd-1 did not answer",
		},
		{
			"forcing a new cluster while quorum holds",
			func(w *simWorld) {
				w.cluster.Status.Recovery = &v1alpha1.RecoveryStatus{Survivor: "etcd-0", Token: "t", Phase: recoveryChosen}
			},
			forceFromEtcd0,
			"forcing a new cluster while quorum holds",
		},
		{
			"forcing a new cluster before status recorded the choice",
			func(w *simWorld) { w.pods[1].down, w.pods[2].down = true, true },
			forceFromEtcd0,
			"forcing a new cluster from etcd-0 before status recorded its fences",
		},
		{
			"forcing a new cluster before the fences reached the others",
			func(w *simWorld) {
				w.pods[1].down, w.pods[2].down = true, true
				w.cluster.Status.Recovery = &v1alpha1.RecoveryStatus{Survivor: "etcd-0", Token: "t", Phase: recoveryFencing, Since: metav1.NewTime(w.now)}
			},
			forceFromEtcd0,
			"forcing a new cluster from etcd-0 before its fences reached the others: etcd-1 answers",
		},
		{
			"a recovery leaving Forcing unfenced while the survivor may still force",
			func(w *simWorld) {
				w.cluster.Status.Recovery = &v1alpha1.RecoveryStatus{Survivor: "etcd-0", Token: "t", Phase: recoveryForcing, Since: metav1.NewTime(w.now)}
			},
			func(p *planner) step {
				s := p.wait("etcd-0", "", resyncSoon)
				s.recovery = &v1alpha1.RecoveryStatus{Survivor: "etcd-0", Token: "t", Phase: recoveryCancelled}
				return s
			},
			"recovery from etcd-0 leaves Forcing for Cancelled: its volume may still force a new cluster",
		},
		{
			"a withdrawal ended while the survivor's pod may still read the force",
			func(w *simWorld) {
				w.cluster.Status.Recovery = &v1alpha1.RecoveryStatus{Survivor: "etcd-0", Token: "t", Phase: recoveryWithdrawing, Since: metav1.NewTime(w.now.Add(-time.Minute))}
			},
			func(p *planner) step {
				s := p.wait("etcd-0", "", resyncSoon)
				s.recovery = &v1alpha1.RecoveryStatus{Survivor: "etcd-0", Token: "t", Phase: recoveryCancelled}
				return s
			},
			"recovery from etcd-0 leaves Withdrawing for Cancelled while its pod may still read the force",
		},
		{
			"a drill beside a backup",
			nil,
			func(p *planner) step {
				s := p.base(Action{Type: RestoreDrill, Member: "etcd-2"}, resyncSoon)
				s.job = &memberJob{verb: verbDrill, member: "etcd-2", backupFor: "scheduled", clusterID: "c1"}
				running := &batchv1.Job{}
				running.Name, running.Labels = "etcd-backup-etcd-2-0123456789", map[string]string{LabelAction: verbBackup}
				s.keep = []*batchv1.Job{running}
				return s
			},
			"new drill Job while Job etcd-backup-etcd-2-0123456789 is outstanding",
		},
		{
			"rolling a healthy member before a snapshot guards the roll",
			func(w *simWorld) {
				w.cluster.Spec.Backup = &v1alpha1.BackupSpec{Schedule: "@daily", Destination: v1alpha1.BackupDestination{
					S3: &v1alpha1.S3Destination{Endpoint: "https://s3.example.test", Bucket: "backups", CredentialsSecret: "s3-credentials"}}}
				w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=1"}
			},
			func(p *planner) step { return p.replacePod(2, "etcd-2", "") },
			"disturbing etcd-2, a healthy voter, before a snapshot guards roll-",
		},
		{
			"removing a healthy member for a scale-in guarded by an older step's snapshot",
			func(w *simWorld) {
				w.cluster.Spec.Backup = &v1alpha1.BackupSpec{Schedule: "@daily", Destination: v1alpha1.BackupDestination{
					S3: &v1alpha1.S3Destination{Endpoint: "https://s3.example.test", Bucket: "backups", CredentialsSecret: "s3-credentials"}}}
				w.cluster.Spec.Size = ptrTo(int32(1))
				w.cluster.Status.Backup = &v1alpha1.BackupStatus{Guard: &v1alpha1.StepGuard{Step: "scale-in-3", Snapshot: "s3://backups/old.db"}}
			},
			func(p *planner) step {
				return p.runJob(memberJob{verb: verbRemove, member: "etcd-2", id: p.byOrd[2].ID}, RemoveMember, "")
			},
			"disturbing etcd-2, a healthy voter, before a snapshot guards scale-in-1",
		},
		{
			"forcing a new cluster before the survivor's snapshot",
			func(w *simWorld) {
				w.cluster.Spec.Backup = &v1alpha1.BackupSpec{Schedule: "@daily", Destination: v1alpha1.BackupDestination{
					S3: &v1alpha1.S3Destination{Endpoint: "https://s3.example.test", Bucket: "backups", CredentialsSecret: "s3-credentials"}}}
				// Their etcd stopped, the fences standing long enough: only the snapshot is missing.
				w.pods[1].running, w.pods[2].running = false, false
				w.cluster.Status.Recovery = &v1alpha1.RecoveryStatus{Survivor: "etcd-0", Token: "t", Phase: recoveryFencing, Since: metav1.NewTime(w.now.Add(-time.Hour))}
			},
			forceFromEtcd0,
			"forcing a new cluster from etcd-0 before a snapshot guards it",
		},
		{
			"replacing the leader's pod while another voter could lead",
			func(w *simWorld) {
				w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=1"}
				w.setLeader(2)
				w.pods[2].slow = true
			},
			func(p *planner) step { return p.replacePod(2, "etcd-2", "") },
			"replacing leader etcd-2 while etcd-0 could take leadership",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newSimWorld(t, 3, true)
			w.run(100)
			if tc.setup != nil {
				tc.setup(w)
			}
			wantRefused(t, w, tc.step, tc.want)
		})
	}
}

// wantRefused plans step on the world as it is and checks the invariant check refuses it with
// want, turning it into an internal hold.
func wantRefused(t *testing.T, w *simWorld, step func(p *planner) step, want string) {
	t.Helper()
	obs := w.observe()
	c := v1alpha1.Defaulted(obs.Cluster)
	p := &planner{view: newView(simConfig, &obs, &c)}
	s := step(p)
	err := checkInvariants(p.view, s)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("checkInvariants = %v, want an error containing %q", err, want)
	}
	if d := p.decision(s); !strings.HasPrefix(d.Action.Reason, "internal: ") || d.Action.Type != Hold {
		t.Errorf("decision %v, want an internal hold", d.Action)
	}
}

// TestRollForwardInvariants: a hold may recreate one pod only when nothing serves.
func TestRollForwardInvariants(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(w *simWorld)
		want  string
	}{
		{"a pod is Ready", func(w *simWorld) {}, "rolling forward while etcd-0 may serve"},
		{"a pod only the node controller marked not Ready", func(w *simWorld) { w.loseNode(w.pods[0]) }, "rolling forward while etcd-0 may serve"},
		{"no volumes", func(w *simWorld) { w.cluster.Spec.StorageSpec = nil }, "rolling forward without volumes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newSimWorld(t, 1, true)
			w.run(100)
			w.cluster.Spec.Version = "v3.6.17"
			tc.setup(w)
			obs := w.observe()
			obs.Etcd = etcdstate.Snapshot{Err: "no voter answered"}
			c := v1alpha1.Defaulted(obs.Cluster)
			v := newView(simConfig, &obs, &c)
			s := v.hold("etcd not reachable", "")
			s.rollForward, s.partition = true, 0
			if err := checkInvariants(v, s); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("checkInvariants = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestTeardownAndBootstrapInvariants: finalize and bootstrap decisions are checked too; each
// broken decision is refused.
func TestTeardownAndBootstrapInvariants(t *testing.T) {
	w := newSimWorld(t, 3, true)
	w.run(100)
	obs := w.observe()
	d := Plan(simConfig, obs)
	job := Child{APIVersion: "batch/v1", Kind: "Job", Name: "etcd-remove-etcd-2-0123456789", Object: object{}}
	fresh := &Observed{Cluster: newSimWorld(t, 3, true).cluster}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"teardown starts a Job", checkTeardown(&obs, Decision{Children: append([]Child{job}, d.Children...)}), "was not observed"},
		{"finalized with children left", checkTeardown(&obs, Decision{Finalized: true}), "finalized while children or pods are left"},
		{"bootstrap over a cluster that answered", checkBootstrap(&obs, d), "bootstrapping a cluster that answered"},
		{"bootstrap of three", checkBootstrap(fresh, Decision{Children: []Child{{Kind: "StatefulSet", Object: apiObject{Spec: statefulSetSpec{Replicas: 3}}}}}), "bootstrap StatefulSet of 3 replicas"},
		{"bootstrap with a Job", checkBootstrap(fresh, Decision{Children: []Child{job}}), "bootstrap starts a member Job"},
		{"teardown deletes the StatefulSet before the Jobs", func() error {
			o := obs
			o.Children.Jobs = []batchv1.Job{{}}
			o.Children.Jobs[0].Name = job.Name
			return checkTeardown(&o, Decision{Children: nil})
		}(), "deletes the StatefulSet while a member Job is left"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, tc.err, tc.want)
		}
	}
	if err := checkBootstrap(fresh, Plan(simConfig, *fresh)); err != nil {
		t.Errorf("the planner's own bootstrap is refused: %v", err)
	}

	// A seed without a volume that ran etcd and never answered the hook, and a spec change:
	// the planner keeps the pod on its template (partition 1); lowering the partition onto it
	// would recreate it and lose its data, which the check refuses.
	w = newSimWorld(t, 1, false)
	w.etcdOverride = func(s *etcdstate.Snapshot) { *s = etcdstate.Snapshot{Err: "context deadline exceeded"} }
	w.step()
	w.pods[0].blind = true
	w.step()
	w.cluster.Spec.Version = "v3.6.17"
	w.cluster.Generation++
	seeded := w.observe()
	held := Plan(simConfig, seeded)
	if held.Action.Type != Hold || strings.HasPrefix(held.Action.Reason, "internal:") {
		t.Fatalf("a spec change over a seed that ran etcd without a volume: %v, want the seed held", held.Action)
	}
	if err := checkBootstrap(&seeded, held); err != nil {
		t.Fatalf("the held bootstrap is refused: %v", err)
	}
	for i, c := range held.Children {
		if c.Kind == "StatefulSet" {
			obj := c.Object.(apiObject)
			spec := obj.Spec.(statefulSetSpec)
			spec.UpdateStrategy.RollingUpdate.Partition = 0
			obj.Spec = spec
			held.Children[i].Object = obj
		}
	}
	if err := checkBootstrap(&seeded, held); err == nil || !strings.Contains(err.Error(), "ran etcd without a volume") {
		t.Errorf("bootstrap recreating a seed that ran etcd without a volume: %v, want refused", err)
	}
}

// TestPlannerHoldsOnPartialInput: observations as the hook builds them on a bad day, where a
// guard of the planner's own, not the invariant check, keeps a destructive step from being
// planned.
func TestPlannerHoldsOnPartialInput(t *testing.T) {
	for _, tc := range []struct {
		name   string
		setup  func(w *simWorld)
		mutate func(obs *Observed)
		want   Action // Type and Reason substring
	}{
		{
			"a learner whose pod is still Pending is not stuck, however long it waits: it is held as a pod that cannot start",
			func(w *simWorld) {
				w.cluster.Spec.Size = ptrTo(int32(4))
				for range 3 {
					w.step()
				}
				w.pods[3].down = true
				w.step()
				w.now = w.now.Add(stuckAfter + time.Minute)
			},
			func(obs *Observed) { obs.Pods[3].Status.Phase = corev1.PodPending },
			Action{Type: Hold, Reason: "learner etcd-3 cannot start (Pending since "},
		},
		{
			"no pod recreated in a hold while another is terminating",
			func(w *simWorld) {
				w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=5000"}
				for _, p := range w.pods {
					p.down = true
				}
			},
			func(obs *Observed) {
				ts := metav1.NewTime(obs.Now)
				obs.Pods[2].DeletionTimestamp = &ts
				obs.Etcd = etcdstate.Snapshot{Err: "context deadline exceeded"}
			},
			Action{Type: Hold, Reason: "etcd not reachable"},
		},
		{
			"no pod recreated in a hold when etcd answered in a way that cannot be trusted",
			func(w *simWorld) {
				w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=5000"}
				for _, p := range w.pods {
					p.slow = true
				}
			},
			func(obs *Observed) { obs.Etcd.Inconsistent = "etcd-0 and etcd-1 both lead term 7" },
			Action{Type: Hold, Reason: "etcd answers inconsistently"},
		},
		{
			"a survivor chosen for quorum recovery and since re-added under a new member ID is chosen again, not forced",
			func(w *simWorld) {
				w.faulty = true
				w.pods[1].down, w.pods[2].down = true, true
				w.cluster.Annotations = map[string]string{v1alpha1.AnnotationForceNewClusterFrom: "etcd-0"}
				w.step() // records Chosen with etcd-0's member ID
			},
			func(obs *Observed) {
				for i := range obs.Etcd.Members {
					if obs.Etcd.Members[i].Name == "etcd-0" {
						obs.Etcd.Members[i].ID = 0xfeed
					}
				}
			},
			Action{Type: RecoverQuorum, Reason: "quorum lost: recovering from etcd-0, the surviving member with the highest raft index"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newSimWorld(t, 3, true)
			w.run(100)
			tc.setup(w)
			obs := w.observe()
			tc.mutate(&obs)
			d := Plan(simConfig, obs)
			if d.Action.Type != tc.want.Type || !strings.HasPrefix(d.Action.Reason, tc.want.Reason) {
				t.Errorf("planned %v %s: %s, want %v: %s...", d.Action.Type, d.Action.Member, d.Action.Reason, tc.want.Type, tc.want.Reason)
			}
		})
	}
}
