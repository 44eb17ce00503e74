package sync

import (
	"encoding/json"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
)

// childrenOf plans on a world and returns the children by kind/name, as JSON.
func childrenOf(t *testing.T, d Decision) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, c := range d.Children {
		b, err := json.Marshal(c.Object)
		if err != nil {
			t.Fatal(err)
		}
		out[c.Kind+"/"+c.Name] = string(b)
	}
	return out
}

func TestRenderingIsStableAndOwnsOnlyItsFields(t *testing.T) {
	w := newSimWorld(t, 3, true)
	w.cluster.Spec.TLS = &v1alpha1.TLSSpec{ServerSecret: "srv", PeerSecret: "peer", ClientSecret: "cli"}
	w.cluster.Spec.PodTemplate = &v1alpha1.PodTemplate{
		Metadata: &v1alpha1.PodMetadata{Labels: map[string]string{"team": "db", LabelCluster: "spoofed"}},
		Spec: &v1alpha1.PodSpec{
			NodeSelector: map[string]string{"disk": "ssd"},
			Tolerations:  []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "etcd", Effect: corev1.TaintEffectNoSchedule}},
			Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
				Weight: 100, PodAffinityTerm: corev1.PodAffinityTerm{TopologyKey: "kubernetes.io/hostname"},
			}}}},
		},
	}
	w.run(100)
	w.cluster.Spec.Size = ptrTo(int32(4))
	obs := w.observe()
	a, b := Plan(simConfig, obs), Plan(simConfig, obs)
	if encodeDecision(t, a) != encodeDecision(t, b) {
		t.Fatal("the same observation encodes differently")
	}
	children := childrenOf(t, a)
	for key, js := range children {
		for _, bad := range []string{`"creationTimestamp":null`, `"status":{}`, `"resources":{}`, `"metadata":{}`, `"namespace":""`} {
			if strings.Contains(js, bad) {
				t.Errorf("%s carries %s", key, bad)
			}
		}
	}

	var sts appsv1.StatefulSet
	if err := json.Unmarshal([]byte(children["StatefulSet/etcd"]), &sts); err != nil {
		t.Fatal(err)
	}
	spec := sts.Spec
	if spec.PodManagementPolicy != appsv1.ParallelPodManagement || spec.UpdateStrategy.Type != appsv1.RollingUpdateStatefulSetStrategyType {
		t.Errorf("pod management %q, update strategy %q", spec.PodManagementPolicy, spec.UpdateStrategy.Type)
	}
	if r := spec.PersistentVolumeClaimRetentionPolicy; r == nil || r.WhenScaled != appsv1.DeletePersistentVolumeClaimRetentionPolicyType || r.WhenDeleted != appsv1.RetainPersistentVolumeClaimRetentionPolicyType {
		t.Errorf("claim retention %+v: a scaled-away ordinal must lose its claim, deletion keeps them by default", r)
	}
	if len(spec.VolumeClaimTemplates) != 1 || spec.VolumeClaimTemplates[0].Kind != "" {
		t.Errorf("volume claim templates %+v", spec.VolumeClaimTemplates)
	}
	pod := spec.Template
	if pod.Labels[LabelCluster] != "etcd" || pod.Labels["team"] != "db" {
		t.Errorf("pod labels %v: operator labels win, user labels kept", pod.Labels)
	}
	if pod.Annotations[AnnotationSpecHash] == "" || pod.Annotations[AnnotationConfigHash] == "" {
		t.Errorf("pod annotations %v lack the hashes", pod.Annotations)
	}
	if pod.Spec.Affinity == nil || pod.Spec.NodeSelector["disk"] != "ssd" || len(pod.Spec.Tolerations) != 1 {
		t.Errorf("scheduling settings not applied: %+v", pod.Spec)
	}
	etcd := pod.Spec.Containers[0]
	args := strings.Join(append(etcd.Command, etcd.Args...), " ")
	for _, want := range []string{
		"/opt/etcdops/etcdops-member launch --join-state=/etc/etcdops/join/join-state.json --name=$(POD_NAME) --data-dir=/var/lib/etcd/data --etcd=/usr/local/bin/etcd --",
		"--listen-client-urls=https://0.0.0.0:2379",
		"--advertise-client-urls=https://$(POD_NAME).etcd.default.svc.cluster.local:2379",
		"--initial-advertise-peer-urls=https://$(POD_NAME).etcd.default.svc.cluster.local:2380",
		"--listen-metrics-urls=http://0.0.0.0:2381",
		"--client-cert-auth=true", "--peer-client-cert-auth=true",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("etcd command lacks %q:\n%s", want, args)
		}
	}
	if etcd.Image != "gcr.io/etcd-development/etcd:v3.6.16" || pod.Spec.InitContainers[0].Image != simConfig.ToolImage {
		t.Errorf("images %s, %s", etcd.Image, pod.Spec.InitContainers[0].Image)
	}
	if p := etcd.ReadinessProbe; p == nil || p.HTTPGet.Port.IntValue() != MetricsPort || !strings.Contains(p.HTTPGet.Path, "serializable=true") {
		t.Errorf("readiness probe %+v must not need quorum", p)
	}

	var job batchv1.Job
	for key, js := range children {
		if strings.HasPrefix(key, "Job/") {
			if err := json.Unmarshal([]byte(js), &job); err != nil {
				t.Fatal(err)
			}
		}
	}
	c := job.Spec.Template.Spec.Containers[0]
	if got := strings.Join(c.Command, " "); !strings.Contains(got, "--cacert=/etc/etcdops/tls/client/ca.crt --cert=/etc/etcdops/tls/client/tls.crt --key=/etc/etcdops/tls/client/tls.key") ||
		!strings.HasPrefix(got, "/etcdops-member add-learner --endpoints=https://etcd-0.etcd.default.svc.cluster.local:2379,") {
		t.Errorf("job command %s", got)
	}
	if job.Spec.TTLSecondsAfterFinished != nil || job.Spec.BackoffLimit == nil || job.Spec.ActiveDeadlineSeconds == nil {
		t.Errorf("job spec %+v", job.Spec)
	}
	if job.Labels[LabelAction] != "add-learner" || job.Labels[LabelMember] != "etcd-3" || len(job.Name) > 63 {
		t.Errorf("job %s labels %v", job.Name, job.Labels)
	}
}

func TestJobNamesFitAndDiffer(t *testing.T) {
	c := &v1alpha1.EtcdCluster{}
	c.Name, c.Namespace = strings.Repeat("a", 52), "default"
	j := memberJob{verb: verbMoveLeader, member: PodName(c.Name, 8), id: 7}
	a := j.render(simConfig, c)
	j.attempt = 1
	b := j.render(simConfig, c)
	if len(a.Name) > 63 || len(b.Name) > 63 || a.Name == b.Name {
		t.Errorf("names %q and %q: at most 63 characters, and a retry is a new Job", a.Name, b.Name)
	}
}

func TestEndpoints(t *testing.T) {
	c := &v1alpha1.EtcdCluster{}
	c.Name, c.Namespace = "etcd", "db"
	pod := func(name, ip string, labels map[string]string) corev1.Pod {
		p := corev1.Pod{}
		p.Name, p.Labels, p.Status.PodIP = name, labels, ip
		return p
	}
	own := map[string]string{LabelCluster: "etcd"}
	got := Endpoints(simConfig, c, []corev1.Pod{
		pod("etcd-10", "10.0.0.11", own),
		pod("etcd-2", "", own),
		pod("etcd-0", "fd00::1", own),
		pod("etcd-1-0", "10.9.9.9", map[string]string{LabelCluster: "etcd-1"}), // another cluster
		pod("etcd-1", "10.0.0.2", map[string]string{LabelCluster: "other"}),    // not ours by label
	})
	want := []string{
		"etcd-0 [fd00::1]:2379 etcd-0.etcd.db.svc.cluster.local",
		"etcd-2 etcd-2.etcd.db.svc.cluster.local:2379 etcd-2.etcd.db.svc.cluster.local",
		"etcd-10 10.0.0.11:2379 etcd-10.etcd.db.svc.cluster.local",
	}
	var lines []string
	for _, e := range got {
		lines = append(lines, e.Member+" "+e.Address+" "+e.ServerName)
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("Endpoints:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

// TestHeldChildrenAreTheLastApplied: a hold returns each child exactly as last applied.
func TestHeldChildrenAreTheLastApplied(t *testing.T) {
	w := newSimWorld(t, 3, true)
	w.run(100)
	before := map[string]string{}
	for k, v := range w.applied {
		before[k] = string(v)
	}
	w.etcdOverride = func(s *etcdstate.Snapshot) { *s = etcdstate.Snapshot{Err: "timeout"} }
	d := Plan(simConfig, w.observe())
	if d.Action.Type != Hold {
		t.Fatalf("%v, want a hold", d.Action)
	}
	got := childrenOf(t, d)
	if len(got) != len(before) {
		t.Fatalf("%d children held, %d observed", len(got), len(before))
	}
	for k, v := range got {
		if !sameJSON([]byte(v), []byte(before[k])) {
			t.Errorf("%s changed in a hold:\n%s\n%s", k, v, before[k])
		}
	}
}

// BenchmarkPlanSteady5 is one sync of a healthy five-member cluster: the hook's common case.
func BenchmarkPlanSteady5(b *testing.B) {
	w := newSimWorld(b, 5, true)
	w.run(100)
	obs := w.observe()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		Plan(simConfig, obs)
	}
}
