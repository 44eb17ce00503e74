package sync

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

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
	w.setTLS("client,peer")
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
	if r := spec.PersistentVolumeClaimRetentionPolicy; r == nil || r.WhenScaled != appsv1.RetainPersistentVolumeClaimRetentionPolicyType || r.WhenDeleted != appsv1.RetainPersistentVolumeClaimRetentionPolicyType {
		t.Errorf("claim retention %+v: no claim may go with the StatefulSet or its replicas but by a decision", r)
	}
	// The template as the API server stores it, defaults included: Metacontroller replaces the
	// list whole, so one without them would be written again on every sync.
	if ts := spec.VolumeClaimTemplates; len(ts) != 1 || ts[0].Kind != "PersistentVolumeClaim" || ts[0].APIVersion != "v1" ||
		ts[0].Spec.VolumeMode == nil || *ts[0].Spec.VolumeMode != corev1.PersistentVolumeFilesystem || ts[0].Status.Phase != corev1.ClaimPending {
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
	if p := etcd.ReadinessProbe; p == nil || p.Exec == nil || !slices.Equal(p.Exec.Command, []string{"/opt/etcdops/etcdops-member", "ready",
		"--readyz=http://127.0.0.1:2381/readyz?exclude=linearizable_read", "--metrics=http://127.0.0.1:2381/metrics", "--join-state=/etc/etcdops/join/join-state.json"}) {
		t.Errorf("readiness probe %+v must need no quorum, and no learner may pass it", p)
	}
	if p := etcd.LivenessProbe; p == nil || p.Exec == nil || !slices.Contains(p.Exec.Command, "probe") || !slices.Contains(p.Exec.Command, "--health=http://127.0.0.1:2381/livez") {
		t.Errorf("liveness probe %+v must be the member tool's probe of /livez", p)
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

// TestEndpoints: the addresses here are data only; Endpoints builds strings and dials nothing.
func TestEndpoints(t *testing.T) {
	c := &v1alpha1.EtcdCluster{}
	c.Name, c.Namespace = "etcd", "db"
	pod := func(name, ip string, labels map[string]string) corev1.Pod {
		p := corev1.Pod{}
		p.Name, p.Namespace, p.Labels, p.Status.PodIP = name, "db", labels, ip
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

// TestPodsMeetTheRestrictedStandard: etcd pods and member Job pods pass the "restricted" Pod
// Security Standard, with and without volumes and TLS, and mount no API token.
func TestPodsMeetTheRestrictedStandard(t *testing.T) {
	for _, tc := range []struct {
		story   string
		storage bool
		tls     bool
	}{
		{"volumes, plain HTTP", true, false},
		{"no volumes: the data dir is an emptyDir", false, false},
		{"TLS: Secrets mounted in the etcd pods and the Jobs", true, true},
	} {
		w := newSimWorld(t, 3, tc.storage)
		if tc.tls {
			w.setTLS("client,peer")
		}
		w.run(100)
		w.cluster.Spec.Size = ptrTo(int32(4))
		children := childrenOf(t, Plan(simConfig, w.observe()))
		pods := map[string]corev1.PodSpec{}
		for key, js := range children {
			switch {
			case key == "StatefulSet/etcd":
				var s appsv1.StatefulSet
				if err := json.Unmarshal([]byte(js), &s); err != nil {
					t.Fatal(err)
				}
				pods[key] = s.Spec.Template.Spec
			case strings.HasPrefix(key, "Job/"):
				var j batchv1.Job
				if err := json.Unmarshal([]byte(js), &j); err != nil {
					t.Fatal(err)
				}
				pods[key] = j.Spec.Template.Spec
			}
		}
		if len(pods) != 2 {
			t.Fatalf("%s: want the StatefulSet and one Job, got %v", tc.story, pods)
		}
		for key, spec := range pods {
			for _, problem := range restrictedViolations(spec) {
				t.Errorf("%s: %s: %s", tc.story, key, problem)
			}
		}
		if sc := pods["StatefulSet/etcd"].SecurityContext; sc == nil || sc.FSGroup == nil || *sc.FSGroup != runAsID {
			t.Errorf("%s: etcd pods need fsGroup %d to write their volume: %+v", tc.story, runAsID, sc)
		}
	}
}

// restrictedViolations lists what keeps a pod from the "restricted" Pod Security Standard
// (baseline checks included), plus a mounted API token, which neither pod needs.
func restrictedViolations(spec corev1.PodSpec) []string {
	var out []string
	fail := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		fail("mounts a service account token")
	}
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		fail("shares a host namespace")
	}
	psc := spec.SecurityContext
	if psc == nil {
		return append(out, "no pod securityContext")
	}
	if psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		fail("runAsNonRoot not set")
	}
	if psc.RunAsUser == nil || *psc.RunAsUser == 0 || psc.RunAsGroup == nil || *psc.RunAsGroup == 0 {
		fail("no fixed non-root user and group: %+v", psc)
	}
	if psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		fail("seccomp profile %+v, want RuntimeDefault", psc.SeccompProfile)
	}
	for _, v := range spec.Volumes {
		s := v.VolumeSource
		if s.EmptyDir == nil && s.ConfigMap == nil && s.Secret == nil && s.PersistentVolumeClaim == nil && s.Projected == nil && s.DownwardAPI == nil {
			fail("volume %s is of a type the standard does not allow", v.Name)
		}
	}
	for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				fail("container %s uses host port %d", c.Name, p.HostPort)
			}
		}
		sc := c.SecurityContext
		if sc == nil {
			fail("container %s has no securityContext", c.Name)
			continue
		}
		if sc.Privileged != nil && *sc.Privileged {
			fail("container %s is privileged", c.Name)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			fail("container %s may escalate privileges", c.Name)
		}
		if sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) > 0 {
			fail("container %s capabilities %+v, want drop ALL and add none", c.Name, sc.Capabilities)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			fail("container %s writes to its image's filesystem", c.Name)
		}
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 || sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot {
			fail("container %s runs as root", c.Name)
		}
	}
	return out
}

// Each port gets TLS only when its Secret is named, and then requires client certificates
// from the mounted Secret's CA.
func TestEtcdFlagsTLS(t *testing.T) {
	cases := []struct {
		story    string
		tls      *v1alpha1.TLSSpec
		want     []string
		wantNone []string
	}{
		{"no TLS: plain URLs and no certificate flags", nil,
			[]string{"--listen-client-urls=http://0.0.0.0:2379", "--listen-peer-urls=http://0.0.0.0:2380"},
			[]string{"--cert-file=", "--peer-cert-file="}},
		{"client port only: server certificate, peers stay plain",
			&v1alpha1.TLSSpec{ServerSecret: "srv", ClientSecret: "cli"},
			[]string{"--cert-file=/etc/etcdops/tls/server/tls.crt", "--key-file=/etc/etcdops/tls/server/tls.key",
				"--trusted-ca-file=/etc/etcdops/tls/server/ca.crt", "--client-cert-auth=true"},
			[]string{"--peer-cert-file="}},
		{"both ports: each from its own Secret",
			&v1alpha1.TLSSpec{ServerSecret: "srv", ClientSecret: "cli", PeerSecret: "peer"},
			[]string{"--cert-file=/etc/etcdops/tls/server/tls.crt", "--peer-cert-file=/etc/etcdops/tls/peer/tls.crt",
				"--peer-key-file=/etc/etcdops/tls/peer/tls.key", "--peer-trusted-ca-file=/etc/etcdops/tls/peer/ca.crt",
				"--peer-client-cert-auth=true"},
			nil},
	}
	for _, tc := range cases {
		c := v1alpha1.EtcdCluster{}
		c.Name, c.Namespace = "etcd", "db"
		c.Spec.TLS = tc.tls
		got := strings.Join(etcdFlags(Config{ClusterDomain: "cluster.local"}, &c, wantedServing(&c)), " ") + " "
		for _, w := range tc.want {
			if !strings.Contains(got, w+" ") {
				t.Errorf("%s: missing %s in %s", tc.story, w, got)
			}
		}
		for _, n := range tc.wantNone {
			if strings.Contains(got, " "+n) || strings.HasPrefix(got, n) {
				t.Errorf("%s: unexpected %s in %s", tc.story, n, got)
			}
		}
	}
}

// TestMemberJobPodsAreNotServed: the Services and the disruption budget select the etcd pods,
// never a member Job's pod, which has no etcd listener and would take client traffic or count
// against the budget.
func TestMemberJobPodsAreNotServed(t *testing.T) {
	w := newSimWorld(t, 3, true)
	w.run(100)
	w.cluster.Spec.Size = ptrTo(int32(4))
	d := Plan(simConfig, w.observe())
	var svcs []corev1.Service
	var pdb policyv1.PodDisruptionBudget
	var sts appsv1.StatefulSet
	var job *batchv1.Job
	for key, js := range childrenOf(t, d) {
		switch kind, _, _ := strings.Cut(key, "/"); kind {
		case "Service":
			var s corev1.Service
			mustUnmarshal(t, js, &s)
			svcs = append(svcs, s)
		case "PodDisruptionBudget":
			mustUnmarshal(t, js, &pdb)
		case "StatefulSet":
			mustUnmarshal(t, js, &sts)
		case "Job":
			job = &batchv1.Job{}
			mustUnmarshal(t, js, job)
		}
	}
	if job == nil || len(svcs) != 2 {
		t.Fatalf("want a Job and two Services: %v", d.Action)
	}
	jobPod, etcdPod := labels.Set(job.Spec.Template.Labels), labels.Set(sts.Spec.Template.Labels)
	pdbSelector, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	selectors := map[string]labels.Selector{"PodDisruptionBudget": pdbSelector}
	for _, s := range svcs {
		selectors["Service "+s.Name] = labels.SelectorFromSet(s.Spec.Selector)
	}
	for name, sel := range selectors {
		if sel.Matches(jobPod) {
			t.Errorf("%s selects the member Job's pod (labels %v)", name, jobPod)
		}
		if !sel.Matches(etcdPod) {
			t.Errorf("%s does not select the etcd pods (labels %v)", name, etcdPod)
		}
	}
}

func mustUnmarshal(t *testing.T, js string, into any) {
	t.Helper()
	if err := json.Unmarshal([]byte(js), into); err != nil {
		t.Fatal(err)
	}
}
