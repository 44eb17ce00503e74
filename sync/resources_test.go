package sync

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// quotaRefusals is what a ResourceQuota on requests.cpu, requests.memory, limits.cpu and
// limits.memory refuses in a pod, as the API server's quota admission does when no
// LimitRange fills in defaults: every container, init containers too, must name each.
func quotaRefusals(spec corev1.PodSpec) []string {
	var out []string
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if _, ok := c.Resources.Requests[name]; !ok {
				out = append(out, fmt.Sprintf("container %s: must specify requests.%s", c.Name, name))
			}
			if _, ok := c.Resources.Limits[name]; !ok {
				out = append(out, fmt.Sprintf("container %s: must specify limits.%s", c.Name, name))
			}
		}
	}
	return out
}

// renderedPods are the pod specs among children (the StatefulSet's template, each Job's, the
// stream's), by child.
func renderedPods(t *testing.T, children map[string]string) map[string]corev1.PodSpec {
	t.Helper()
	pods := map[string]corev1.PodSpec{}
	for key, js := range children {
		kind, _, _ := strings.Cut(key, "/")
		switch kind {
		case "StatefulSet":
			var s appsv1.StatefulSet
			mustUnmarshal(t, js, &s)
			pods[key] = s.Spec.Template.Spec
		case "Deployment":
			var d appsv1.Deployment
			mustUnmarshal(t, js, &d)
			pods[key] = d.Spec.Template.Spec
		case "Job":
			var j batchv1.Job
			mustUnmarshal(t, js, &j)
			pods[key] = j.Spec.Template.Spec
		}
	}
	return pods
}

// TestEveryPodPassesAQuota: in a namespace whose ResourceQuota asks every container for cpu
// and memory requests and limits, every pod the operator renders is admitted once the etcd
// container has resources (spec.podTemplate.spec.resources, which the install container
// takes too): the member Jobs, the backup Job and the stream by their defaults. Every pod that
// runs the operator's image names its pull secrets, the etcd pods etcd's too, and the
// scratch volumes are bounded.
func TestEveryPodPassesAQuota(t *testing.T) {
	w, _ := created(t, 3, true)
	for _, m := range w.members {
		m.file = 700 << 20
	}
	etcdResources := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("1Gi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("2Gi")},
	}
	w.cluster.Spec.PodTemplate = &v1alpha1.PodTemplate{Spec: &v1alpha1.PodSpec{Resources: &etcdResources, ImagePullSecrets: []v1alpha1.SecretReference{{Name: "etcd-registry"}}}}
	w.cluster.Spec.Tool = &v1alpha1.ToolSpec{ImagePullSecrets: []v1alpha1.SecretReference{{Name: "tool-registry"}}}
	w.cluster.Spec.Backup = &v1alpha1.BackupSpec{Schedule: "@hourly", Destination: v1alpha1.BackupDestination{
		S3: &v1alpha1.S3Destination{Endpoint: "https://s3.example.test", Bucket: "backups", CredentialsSecret: "s3-credentials"}},
		Continuous: &v1alpha1.ContinuousBackup{}}
	w.run(200)
	w.now = w.now.Add(time.Hour)
	d := Plan(simConfig, w.observe())
	if d.Action.Type != TakeBackup {
		t.Fatalf("want a backup, got %v", d.Action)
	}
	pods := renderedPods(t, childrenOf(t, d))
	var kinds []string
	for key := range pods {
		kinds = append(kinds, strings.Split(key, "-")[0])
	}
	slices.Sort(kinds)
	if want := []string{"Deployment/etcd", "Job/etcd", "StatefulSet/etcd"}; !slices.Equal(kinds, want) {
		t.Fatalf("rendered pods of %v, want %v", kinds, want)
	}
	// Each kind of member Job, rendered on its own.
	c := v1alpha1.Defaulted(w.cluster)
	for _, verb := range []string{verbAddLearner, verbPromote, verbRemove, verbMoveLeader, verbCompact, verbDefragment, verbDisarm, verbUpdatePeerURL, verbExpandClaim, verbRestartPod} {
		j := memberJob{verb: verb, member: "etcd-1", id: 0x1001, endpoints: []string{"http://etcd-0.etcd.default.svc:2379"}}.render(simConfig, &c)
		b, err := json.Marshal(j.Object)
		if err != nil {
			t.Fatal(err)
		}
		maps.Copy(pods, renderedPods(t, map[string]string{"Job/" + j.Name: string(b)}))
	}
	// A restore drill runs etcd's image, the member tool copied in.
	drill := memberJob{verb: verbDrill, member: "etcd-1", endpoints: []string{"http://etcd-0.etcd.default.svc:2379"}, clusterID: "c1",
		image: "registry.example.test/etcd:v3.6.16", scratch: scratchLimit(2 * (700 << 20))}.render(simConfig, &c)
	b, err := json.Marshal(drill.Object)
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(pods, renderedPods(t, map[string]string{"Job/" + drill.Name: string(b)}))

	for key, spec := range pods {
		for _, problem := range quotaRefusals(spec) {
			t.Errorf("%s: %s", key, problem)
		}
		var secrets []string
		for _, r := range spec.ImagePullSecrets {
			secrets = append(secrets, r.Name)
		}
		want := []string{"tool-registry"}
		if strings.Contains(key, "-drill-") {
			want = []string{"etcd-registry", "tool-registry"}
		}
		if strings.HasPrefix(key, "StatefulSet/") {
			want = []string{"etcd-registry", "tool-registry"}
			etcd, install := spec.Containers[0], spec.InitContainers[0]
			if !equalResources(etcd.Resources, etcdResources) || !equalResources(install.Resources, etcdResources) {
				t.Errorf("%s: etcd's resources %v and the install container's %v, want spec.podTemplate.spec.resources for both", key, etcd.Resources, install.Resources)
			}
		}
		if !slices.Equal(secrets, want) {
			t.Errorf("%s: imagePullSecrets %v, want %v", key, secrets, want)
		}
		bound := "2Gi" // twice 700Mi, rounded up
		if strings.Contains(key, "-drill-") {
			bound = "4Gi" // a snapshot and its restored copy
		}
		for _, v := range spec.Volumes {
			if v.Name == volumeBackupWork && (v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.String() != bound) {
				t.Errorf("%s: scratch volume %+v, want an emptyDir bounded to %s", key, v.VolumeSource, bound)
			}
		}
	}
}

func equalResources(a, b corev1.ResourceRequirements) bool {
	return equalList(a.Requests, b.Requests) && equalList(a.Limits, b.Limits)
}

func equalList(a, b corev1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, q := range a {
		if o, ok := b[k]; !ok || o.Cmp(q) != 0 {
			return false
		}
	}
	return true
}

// TestQuotaRefusesWhatNoDefaultCovers: the check above would catch a container without
// resources; so would the API server. Without spec.podTemplate.spec.resources, the etcd pods
// have none, and the docs say to set them in a namespace with a ResourceQuota.
func TestQuotaRefusesWhatNoDefaultCovers(t *testing.T) {
	c := v1alpha1.Defaulted(newSimWorld(t, 3, true).cluster)
	var s appsv1.StatefulSet
	b, err := json.Marshal(renderPodSpec(simConfig, &c, serving{}).template)
	if err != nil {
		t.Fatal(err)
	}
	mustUnmarshal(t, string(b), &s.Spec.Template)
	got := quotaRefusals(s.Spec.Template.Spec)
	want := []string{
		"container install: must specify requests.cpu", "container install: must specify limits.cpu",
		"container install: must specify requests.memory", "container install: must specify limits.memory",
		"container etcd: must specify requests.cpu", "container etcd: must specify limits.cpu",
		"container etcd: must specify requests.memory", "container etcd: must specify limits.memory",
	}
	if !slices.Equal(got, want) {
		t.Errorf("quota refusals of an etcd pod without resources:\n got %q\nwant %q", got, want)
	}
}

// TestScratchLimit: twice the database, rounded up to a power of two, 1Gi at least; the same
// bound for every size within it, so a Job's name holds while the database grows.
func TestScratchLimit(t *testing.T) {
	for _, tc := range []struct {
		db   int64
		want string
	}{
		{0, "1Gi"},             // nothing reported yet
		{20 << 20, "1Gi"},      // a small database
		{512 << 20, "1Gi"},     // twice it is the floor exactly
		{512<<20 + 1, "2Gi"},   // past half the floor
		{1 << 30, "2Gi"},       // 1Gi: twice it
		{3 << 30, "8Gi"},       // 3Gi: 6Gi, rounded up
		{8 << 30, "16Gi"},      // etcd's suggested largest backend quota
		{600 << 30, "2Ti"},     // beyond any quota etcd takes
		{1 << 62, "4Ei"},       // the largest power of two, no overflow
		{-1, "1Gi"},            // a nonsense size bounds nothing less
		{(4 << 30) - 1, "8Gi"}, // just below a bound's half
		{(4 << 30) + 4096, "16Gi"} /* just above it */} {
		if got := scratchLimit(tc.db); got != tc.want {
			t.Errorf("scratchLimit(%d) = %s, want %s", tc.db, got, tc.want)
		}
	}
}

// TestResourcesChangeKeepsJobsInFlight: spec.tool.resources changed while a backup Job runs
// leaves that Job as it is (a Job is never returned changed under its name: the simulator
// fails the test on that), and the next Job of the same kind, with the new resources, has a
// name of its own.
func TestResourcesChangeKeepsJobsInFlight(t *testing.T) {
	w, _ := created(t, 3, true)
	w.cluster.Spec.Backup = &v1alpha1.BackupSpec{Schedule: "@hourly", Destination: v1alpha1.BackupDestination{
		S3: &v1alpha1.S3Destination{Endpoint: "https://s3.example.test", Bucket: "backups", CredentialsSecret: "s3-credentials"}}}
	w.backupTicks = 4
	w.now = w.now.Add(time.Hour)
	if d := w.step(); d.Action.Type != TakeBackup {
		t.Fatalf("want a backup started, got %v", d.Action)
	}
	first := slices.Collect(maps.Keys(w.jobs))
	w.cluster.Spec.Tool = &v1alpha1.ToolSpec{Resources: &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}}}
	w.cluster.Generation++
	for range 3 {
		if d := w.step(); d.Action.Type != Wait || !strings.Contains(d.Action.Reason, first[0]) {
			t.Fatalf("with the resources changed, want the backup Job %s waited for, got %v", first[0], d.Action)
		}
	}
	w.run(50)
	w.now = w.now.Add(time.Hour)
	if d := w.step(); d.Action.Type != TakeBackup {
		t.Fatalf("want the next backup started, got %v", d.Action)
	}
	var next string
	for name, j := range w.jobs {
		if j.state == jobRunning {
			next = name
		}
	}
	if next == "" || next == first[0] {
		t.Fatalf("the next backup's Job %q, want a new name beside %s", next, first[0])
	}
	var job batchv1.Job
	mustUnmarshal(t, string(w.applied["Job/"+next]), &job)
	if got := job.Spec.Template.Spec.Containers[0].Resources.Limits.Memory().String(); got != "1Gi" {
		t.Errorf("the next backup's memory limit %s, want spec.tool.resources' 1Gi", got)
	}
}

// TestStreamScratchOnlyGrows: the stream's scratch bound follows the largest database up, and
// keeps its bound when the database shrinks (a defragmentation) or its largest member misses
// a sync, so its pod is not restarted for either; a bound edited by hand is set back.
func TestStreamScratchOnlyGrows(t *testing.T) {
	w, _ := created(t, 3, true)
	w.cluster.Spec.Backup = &v1alpha1.BackupSpec{Schedule: "@daily", Destination: v1alpha1.BackupDestination{
		S3: &v1alpha1.S3Destination{Endpoint: "https://s3.example.test", Bucket: "backups", CredentialsSecret: "s3-credentials"}},
		Continuous: &v1alpha1.ContinuousBackup{}}
	bound := func() string {
		t.Helper()
		w.step()
		var d appsv1.Deployment
		mustUnmarshal(t, string(w.applied["Deployment/"+BackupStreamName("etcd")]), &d)
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == volumeBackupWork && v.EmptyDir != nil && v.EmptyDir.SizeLimit != nil {
				return v.EmptyDir.SizeLimit.String()
			}
		}
		t.Fatalf("the stream has no bounded scratch volume: %+v", d.Spec.Template.Spec.Volumes)
		return ""
	}
	files := func(n int64) {
		for _, m := range w.members {
			m.file, m.live, m.history = n, 0, 0
		}
	}
	files(100 << 20)
	if got := bound(); got != "1Gi" {
		t.Fatalf("a 100Mi database: bound %s, want 1Gi", got)
	}
	files(3 << 30)
	if got := bound(); got != "8Gi" {
		t.Fatalf("grown to 3Gi: bound %s, want 8Gi", got)
	}
	files(100 << 20)
	if got := bound(); got != "8Gi" {
		t.Fatalf("defragmented to 100Mi: bound %s, want 8Gi kept", got)
	}
	key := "Deployment/" + BackupStreamName("etcd")
	w.applied[key] = []byte(strings.Replace(string(w.applied[key]), `"sizeLimit":"8Gi"`, `"sizeLimit":"100Gi"`, 1))
	if got := bound(); got != "1Gi" {
		t.Fatalf("a bound of 100Gi edited by hand: bound %s, want it set back to 1Gi", got)
	}
}
