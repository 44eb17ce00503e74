package sync

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// TestRenderedBytesDoNotChange pins, for specs the golden fixtures do not cover (TLS stages,
// a restore, user pod settings, member and backup Jobs), the pod template's hashes and a
// digest of the whole rendered StatefulSet or Job. A pod template hash that changes restarts
// every pod of every cluster on upgrade, and a Job's name is a hash of its content: a change
// to how children are built must leave every byte as it was.
func TestRenderedBytesDoNotChange(t *testing.T) {
	cluster := func(edit func(*v1alpha1.EtcdCluster)) *v1alpha1.EtcdCluster {
		c := v1alpha1.EtcdCluster{}
		c.Name, c.Namespace, c.UID = "etcd", "db", "u-1"
		c.Spec.StorageSpec = &v1alpha1.StorageSpec{VolumeSizeRequest: resource.MustParse("8Gi")}
		if edit != nil {
			edit(&c)
		}
		c = v1alpha1.Defaulted(c)
		return &c
	}
	s3 := v1alpha1.BackupDestination{S3: &v1alpha1.S3Destination{Endpoint: "https://s3.example", Bucket: "b", Region: "r", CredentialsSecret: "creds", CASecret: "ca"}}
	toolSettings := func(c *v1alpha1.EtcdCluster) {
		c.Spec.PodTemplate = &v1alpha1.PodTemplate{Spec: &v1alpha1.PodSpec{ImagePullSecrets: []v1alpha1.SecretReference{{Name: "etcd-registry"}, {Name: "shared"}}}}
		c.Spec.Tool = &v1alpha1.ToolSpec{
			ImagePullSecrets: []v1alpha1.SecretReference{{Name: "tool-registry"}, {Name: "shared"}},
			Resources: &corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("20m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")},
			},
		}
	}
	pvc := v1alpha1.BackupDestination{PersistentVolumeClaim: &v1alpha1.PVCDestination{ClaimName: "backups", Path: "p"}}
	for _, tc := range []struct {
		story                     string
		c                         *v1alpha1.EtcdCluster
		s                         serving
		config, spec, statefulSet string
	}{
		{"plain", cluster(nil), serving{}, "22040c19db", "50b101b03d", "3d41a298217ca68c"},
		{"no storage, options", cluster(func(c *v1alpha1.EtcdCluster) {
			c.Spec.StorageSpec = nil
			c.Spec.EtcdOptions = []string{"--quota-backend-bytes=4294967296", "--log-level=warn"}
		}), serving{}, "8376fe3391", "2f3be343d5", "79c9bf9fe93cb304"},
		{"storage class, limit, delete", cluster(func(c *v1alpha1.EtcdCluster) {
			c.Spec.StorageSpec.StorageClassName, c.Spec.StorageSpec.WhenDeleted = "fast", v1alpha1.PVCDelete
			c.Spec.StorageSpec.VolumeSizeLimit = ptrTo(resource.MustParse("16Gi"))
		}), serving{}, "22040c19db", "50b101b03d", "e97651ee8dc82577"},
		{"client port on both schemes", cluster(nil), serving{client: clientBoth, serverSecret: "srv", trust: "0123456789"}, "4b01c5d1a1", "254fd699ae", "a49bc47009f41db5"},
		{"client TLS", cluster(nil), serving{client: clientTLS, serverSecret: "srv"}, "6904460617", "29f506c34c", "7518f9fa5aad52fd"},
		{"peer certificate on an http listener", cluster(nil), serving{peer: peerDial, peerSecret: "peer"}, "f91d256cc3", "698eff997f", "22d5a290ce1de7ad"},
		{"everything TLS", cluster(nil), serving{client: clientTLS, peer: peerTLS, serverSecret: "srv", peerSecret: "peer", trust: "0123456789"}, "b42423820b", "548dcddc36", "e5c370c90a3a0321"},
		{"user pod settings", cluster(func(c *v1alpha1.EtcdCluster) {
			c.Spec.PodTemplate = &v1alpha1.PodTemplate{
				Metadata: &v1alpha1.PodMetadata{Labels: map[string]string{"team": "db", LabelCluster: "spoofed"}, Annotations: map[string]string{"a": "<&>"}},
				Spec: &v1alpha1.PodSpec{
					Resources: &corev1.ResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("1Gi")},
						Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")},
					},
					NodeSelector:      map[string]string{"disk": "ssd"},
					Tolerations:       []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "etcd", Effect: corev1.TaintEffectNoSchedule}},
					PriorityClassName: "critical",
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
						Weight: 100, PodAffinityTerm: corev1.PodAffinityTerm{TopologyKey: "kubernetes.io/hostname"},
					}}}},
				},
			}
		}), serving{}, "f5f5e242e2", "888659ccd0", "dd5cdd37a8c050ba"},
		{"pull secrets, tool resources", cluster(toolSettings), serving{}, "ebfabc5886", "84a07f6fc4", "70c293bdca451760"},
		{"restore from S3", cluster(func(c *v1alpha1.EtcdCluster) {
			c.Spec.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: &v1alpha1.FromBackup{BackupDestination: s3, Name: "latest"}}
		}), serving{}, "177eab8ad1", "f8d2dbbd0a", "3e84fb8bb162b055"},
		{"restore from a claim, TLS", cluster(func(c *v1alpha1.EtcdCluster) {
			c.Spec.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: &v1alpha1.FromBackup{BackupDestination: pvc, Name: "snap.db"}}
		}), serving{client: clientTLS, peer: peerTLS, serverSecret: "srv", peerSecret: "peer"}, "5d59094119", "8fd75eb0b0", "f3a606932e00b4ef"},
	} {
		ps := renderPodSpec(simConfig, tc.c, tc.s)
		sts := digest(t, statefulSet(tc.c, tc.c.Spec.StorageSpec, labelsOf(tc.c), ps, 3, 1, retainClaims).Object)
		if ps.configHash != tc.config || ps.specHash != tc.spec || sts != tc.statefulSet {
			t.Errorf("%s: config hash %s, spec hash %s, StatefulSet %s; want %s, %s, %s", tc.story, ps.configHash, ps.specHash, sts, tc.config, tc.spec, tc.statefulSet)
		}
	}

	backup := func(d v1alpha1.BackupDestination) *v1alpha1.EtcdCluster {
		return cluster(func(c *v1alpha1.EtcdCluster) {
			c.Spec.Backup = &v1alpha1.BackupSpec{Schedule: "@daily", Destination: d,
				Retention: &v1alpha1.BackupRetention{Keep: ptrTo(int32(7))}, MaxBandwidth: ptrTo(resource.MustParse("10Mi"))}
		})
	}
	endpoints := []string{"http://etcd-0.etcd.db.svc.cluster.local:2379"}
	for _, tc := range []struct {
		story string
		c     *v1alpha1.EtcdCluster
		j     memberJob
		want  string
	}{
		{"add a learner", cluster(nil), memberJob{verb: verbAddLearner, member: "etcd-3", peerURL: "http://etcd-3.etcd.db.svc.cluster.local:2380", endpoints: endpoints}, "etcd-add-learner-etcd-3-11b54589b1 8d186688968b967d"},
		{"remove over TLS", cluster(nil), memberJob{verb: verbRemove, member: "etcd-2", id: 0xabc, endpoints: endpoints, attempt: 2, clientSecret: "cli"}, "etcd-remove-etcd-2-d4aff0b250 20d9699bdc5775ab"},
		{"backup to S3", backup(s3), memberJob{verb: verbBackup, member: "etcd-0", endpoints: endpoints, backupFor: "scheduled", scratch: "1Gi"}, "etcd-backup-etcd-0-b0b1c7b0f3 9878e647b8e07a3f"},
		{"backup to a claim over TLS", backup(pvc), memberJob{verb: verbBackup, member: "etcd-0", endpoints: endpoints, backupFor: "now", clientSecret: "cli", scratch: "4Gi"}, "etcd-backup-etcd-0-f16d89727e 64c834b76d27a959"},
		{"a learner with pull secrets and resources", cluster(toolSettings), memberJob{verb: verbAddLearner, member: "etcd-3", peerURL: "http://etcd-3.etcd.db.svc.cluster.local:2380", endpoints: endpoints}, "etcd-add-learner-etcd-3-07e03fc226 9b22d2d6644d8b79"},
	} {
		j := tc.j.render(simConfig, tc.c)
		if got := j.Name + " " + digest(t, j.Object); got != tc.want {
			t.Errorf("%s: Job %s, want %s", tc.story, got, tc.want)
		}
	}
}

// digest is a short digest of v's JSON as the hook sends it.
func digest(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// TestObjectFieldsAreInKeyOrder: every struct the children are built of declares its fields
// in the sorted order of their JSON names, the order a map's keys encode in, which the hashes
// of running pods and the names of Jobs were taken over.
func TestObjectFieldsAreInKeyOrder(t *testing.T) {
	seen := map[reflect.Type]bool{}
	var check func(reflect.Type)
	check = func(typ reflect.Type) {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct || seen[typ] {
			return
		}
		seen[typ] = true
		prev := ""
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name <= prev {
				t.Errorf("%s.%s: JSON name %q does not sort after %q", typ.Name(), f.Name, name, prev)
			}
			prev = name
			check(f.Type)
		}
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[apiObject](), reflect.TypeFor[serviceSpec](), reflect.TypeFor[pdbSpec](), reflect.TypeFor[statefulSetSpec]()} {
		check(typ)
	}
	if len(seen) < 30 {
		t.Errorf("only %d structs checked", len(seen))
	}
}
