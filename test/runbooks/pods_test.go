package runbooks

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/yaml"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/joinstate"
	"etcdops.dev/etcdops/sync"
)

// docPod is a pod the docs tell a reader to create: a Pod in a YAML block, the template of a
// workload in one, or what a `kubectl run ... --overrides=` line creates.
type docPod struct {
	where string // file and pod name, for messages
	meta  *corev1.Pod
}

// docPods reads every pod of every Markdown file in docs/ and of the README.
func docPods(t *testing.T) []docPod {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(docsDir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(docsDir, "..", "README.md"))
	var out []docPod
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(file)
		for _, sec := range sections(string(data)) {
			for _, b := range sec.blocks {
				switch b.lang {
				case "yaml":
					out = append(out, yamlPods(t, name, b.text)...)
				case "sh", "bash", "shell":
					for _, l := range lines(b.text) {
						if p, ok := runPod(t, name, l); ok {
							out = append(out, p)
						}
					}
				}
			}
		}
	}
	return out
}

// yamlPods decodes the pods and pod templates of one YAML block, strictly: a misspelt field
// would be dropped by the API server and the reader left without the setting.
func yamlPods(t *testing.T, file, block string) []docPod {
	t.Helper()
	var out []docPod
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(block, -1) {
		var head struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			continue // a fragment; TestDocsYAML (manifests) checks that it parses
		}
		var template *corev1.PodTemplateSpec
		var pod corev1.Pod
		strict := func(obj any) {
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Errorf("%s: a %s in the docs does not decode: %v", file, head.Kind, err)
			}
		}
		switch head.Kind {
		case "Pod":
			strict(&pod)
		case "Deployment":
			var d appsv1.Deployment
			strict(&d)
			pod.Name, template = d.Name, &d.Spec.Template
		case "StatefulSet":
			var s appsv1.StatefulSet
			strict(&s)
			pod.Name, template = s.Name, &s.Spec.Template
		case "DaemonSet":
			var d appsv1.DaemonSet
			strict(&d)
			pod.Name, template = d.Name, &d.Spec.Template
		case "Job":
			var j batchv1.Job
			strict(&j)
			pod.Name, template = j.Name, &j.Spec.Template
		case "CronJob":
			var j batchv1.CronJob
			strict(&j)
			pod.Name, template = j.Name, &j.Spec.JobTemplate.Spec.Template
		default:
			continue
		}
		if template != nil {
			pod.Labels, pod.Annotations, pod.Spec = template.Labels, template.Annotations, template.Spec
		}
		out = append(out, docPod{where: fmt.Sprintf("%s: %s %s", file, head.Kind, pod.Name), meta: &pod})
	}
	return out
}

// runPod is the pod a `kubectl run` line creates: kubectl's own (one container named after
// the pod, the --image, the --restart policy, label run=<name>) with --overrides applied as
// kubectl applies it by default, a JSON merge patch (RFC 7386), so its containers replace
// kubectl's. Any other line is not one.
func runPod(t *testing.T, file, line string) (docPod, bool) {
	t.Helper()
	if !strings.HasPrefix(line, "kubectl ") || !strings.Contains(line, " run ") {
		return docPod{}, false
	}
	c, err := parse(line, nil)
	if err != nil {
		t.Errorf("%s: %v", file, err)
		return docPod{}, false
	}
	i := slices.Index(c.words, "run")
	if i < 0 || i+1 >= len(c.words) {
		return docPod{}, false
	}
	name := c.words[i+1]
	flags := map[string]string{}
	for _, w := range c.words[i+2:] {
		if k, v, ok := strings.Cut(w, "="); ok && strings.HasPrefix(k, "--") {
			flags[k] = v
		}
	}
	restart := map[string]string{"Never": "Never", "OnFailure": "OnFailure", "": "Always", "Always": "Always"}[flags["--restart"]]
	var obj any = map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "labels": map[string]any{"run": name}},
		"spec": map[string]any{
			"containers":    []any{map[string]any{"name": name, "image": flags["--image"]}},
			"restartPolicy": restart,
		},
	}
	if o := flags["--overrides"]; o != "" {
		var patch any
		if err := json.Unmarshal([]byte(o), &patch); err != nil {
			t.Errorf("%s: kubectl run %s: --overrides is not JSON: %v", file, name, err)
			return docPod{}, false
		}
		obj = mergePatch(obj, patch)
	}
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&pod); err != nil {
		t.Errorf("%s: kubectl run %s: the pod does not decode: %v", file, name, err)
		return docPod{}, false
	}
	return docPod{where: fmt.Sprintf("%s: kubectl run %s", file, name), meta: &pod}, true
}

// mergePatch applies a JSON merge patch (RFC 7386): objects merge key by key, null deletes,
// anything else (lists included) replaces.
func mergePatch(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	t, ok := target.(map[string]any)
	if !ok {
		t = map[string]any{}
	}
	for k, v := range p {
		if v == nil {
			delete(t, k)
		} else {
			t[k] = mergePatch(t[k], v)
		}
	}
	return t
}

// restrictedProblems is why Kubernetes' Pod Security admission refuses pod at the restricted
// level of the newest policy version, or "" when it admits it.
func restrictedProblems(pod *corev1.Pod) string {
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		panic(err)
	}
	res := policy.AggregateCheckResults(eval.EvaluatePod(api.LevelVersion{Level: api.LevelRestricted, Version: api.LatestVersion()}, &pod.ObjectMeta, &pod.Spec))
	if res.Allowed {
		return ""
	}
	return res.ForbiddenReason() + ": " + res.ForbiddenDetail()
}

// renderedEtcdPod is the pod template the planner renders for the persistent-3 sample, the
// cluster the runbooks' examples use (etcd in namespace etcd).
func renderedEtcdPod(t *testing.T) corev1.PodSpec {
	t.Helper()
	spec, _ := rendered(t, "")
	return spec
}

// rendered is what the planner answers for a new persistent-3 sample (of release version,
// or the sample's when empty): the etcd pods' template and the join state's token.
func rendered(t *testing.T, version string) (corev1.PodSpec, string) {
	t.Helper()
	data, err := os.ReadFile("../../manifests/metacontroller/samples/persistent-3.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c v1alpha1.EtcdCluster
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		t.Fatal(err)
	}
	c.Namespace, c.UID, c.Generation = "etcd", "0e7c7f0e-0000-4000-8000-000000000001", 1
	if version != "" {
		c.Spec.Version = version
	}
	d := sync.Plan(sync.Config{ClusterDomain: "cluster.local", ToolImage: "etcdops/etcdops:v0.1.0"}, sync.Observed{Cluster: c, Now: time.Unix(1_800_000_000, 0)})
	var spec *corev1.PodSpec
	token := ""
	for _, ch := range d.Children {
		raw, err := json.Marshal(ch.Object)
		if err != nil {
			t.Fatal(err)
		}
		switch ch.Kind {
		case "StatefulSet":
			var s appsv1.StatefulSet
			if err := json.Unmarshal(raw, &s); err != nil {
				t.Fatal(err)
			}
			spec = &s.Spec.Template.Spec
		case "ConfigMap":
			var cm corev1.ConfigMap
			if err := json.Unmarshal(raw, &cm); err != nil {
				t.Fatal(err)
			}
			if js, ok := cm.Data[joinstate.ConfigMapKey]; ok {
				st, err := joinstate.Decode([]byte(js))
				if err != nil {
					t.Fatal(err)
				}
				token = st.Token
			}
		}
	}
	if spec == nil || token == "" {
		t.Fatalf("the planner rendered no StatefulSet or join state for the sample: %v", d.Action)
	}
	return *spec, token
}

// memberVolume is where the rendered etcd container mounts the member's volume, and the data
// dir it gives etcd below it.
func memberVolume(t *testing.T, spec corev1.PodSpec) (mountPath, dataDir string) {
	t.Helper()
	etcd := spec.Containers[0]
	for _, m := range etcd.VolumeMounts {
		if m.Name == "data" {
			mountPath = m.MountPath
		}
	}
	for _, a := range etcd.Command {
		if v, ok := strings.CutPrefix(a, "--data-dir="); ok {
			dataDir = v
		}
	}
	if mountPath == "" || dataDir == "" {
		t.Fatalf("the rendered etcd container has no data volume mount or --data-dir: %+v", etcd)
	}
	return mountPath, dataDir
}

var memberClaim = regexp.MustCompile(`^data-[a-z0-9-]+-[0-9]+$`)

// TestDocPodsAreRestricted: every pod the docs show passes the restricted Pod Security level
// as Kubernetes' own admission code evaluates it, so it is admitted where security.md says to
// enforce it; and every pod that mounts a member's volume (a claim data-<cluster>-<i>) runs
// as the etcd pods the planner renders do: the same user, group, fsGroup and policy, the
// volume at the same path, etcd's data dir the same, and etcd the cluster's image. Files it
// writes there are then the member's own.
func TestDocPodsAreRestricted(t *testing.T) {
	pods := docPods(t)
	etcdPod := renderedEtcdPod(t)
	mountPath, dataDir := memberVolume(t, etcdPod)
	var names []string
	for _, p := range pods {
		names = append(names, p.meta.Name)
		if why := restrictedProblems(p.meta); why != "" {
			t.Errorf("%s: refused at the restricted level: %s", p.where, why)
		}
		for _, problem := range memberVolumeProblems(p, etcdPod, mountPath, dataDir) {
			t.Error(problem)
		}
	}
	// The docs' helper pods must be found, or the test would pass on nothing.
	for _, want := range []string{"etcd-recover", "etcd-restore"} {
		if !slices.Contains(names, want) {
			t.Errorf("no pod %s found in the docs (found %q): the runbooks changed, or this test no longer reads them", want, names)
		}
	}
	t.Logf("pods checked: %q", names)
}

// memberVolumeProblems says how a pod that mounts a member's volume differs from the etcd
// pods in who writes it and where.
func memberVolumeProblems(p docPod, etcdPod corev1.PodSpec, mountPath, dataDir string) []string {
	var out []string
	fail := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	spec := p.meta.Spec
	claims := map[string]string{}
	for _, v := range spec.Volumes {
		if v.PersistentVolumeClaim != nil && memberClaim.MatchString(v.PersistentVolumeClaim.ClaimName) {
			claims[v.Name] = v.PersistentVolumeClaim.ClaimName
		}
	}
	if len(claims) == 0 {
		return nil
	}
	want, got := etcdPod.SecurityContext, spec.SecurityContext
	if got == nil {
		got = &corev1.PodSecurityContext{}
	}
	for _, f := range []struct {
		field     string
		want, got any
	}{
		{"runAsUser", want.RunAsUser, got.RunAsUser},
		{"runAsGroup", want.RunAsGroup, got.RunAsGroup},
		{"runAsNonRoot", want.RunAsNonRoot, got.RunAsNonRoot},
		{"fsGroup", want.FSGroup, got.FSGroup},
		{"fsGroupChangePolicy", want.FSGroupChangePolicy, got.FSGroupChangePolicy},
	} {
		if !reflect.DeepEqual(f.want, f.got) {
			fail("%s mounts a member's volume: securityContext.%s is %s, the etcd pods' %s", p.where, f.field, deref(f.got), deref(f.want))
		}
	}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		if c.SecurityContext != nil && (c.SecurityContext.RunAsUser != nil || c.SecurityContext.RunAsGroup != nil) {
			fail("%s: container %s sets its own user or group; the pod's must hold, as in the etcd pods", p.where, c.Name)
		}
		for _, m := range c.VolumeMounts {
			if claim, ok := claims[m.Name]; ok && (m.MountPath != mountPath || m.SubPath != "") {
				fail("%s: container %s mounts %s at %s (subPath %q); the etcd pods mount it at %s", p.where, c.Name, claim, m.MountPath, m.SubPath, mountPath)
			}
		}
		for _, a := range append(slices.Clone(c.Command), c.Args...) {
			if v, ok := strings.CutPrefix(a, "--data-dir="); ok && v != dataDir {
				fail("%s: container %s gives etcd --data-dir=%s; the etcd pods' is %s", p.where, c.Name, v, dataDir)
			}
		}
		if strings.HasPrefix(c.Image, v1alpha1.DefaultImageRegistry+":") && c.Image != etcdPod.Containers[0].Image {
			fail("%s: container %s runs %s; the sample cluster runs %s", p.where, c.Name, c.Image, etcdPod.Containers[0].Image)
		}
	}
	return out
}

func deref(v any) string {
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return "unset"
		}
		return fmt.Sprint(rv.Elem().Interface())
	}
	return fmt.Sprint(v)
}

// TestRestrictedCheckRefusesRootHelpers: the check above refuses what the runbooks showed
// before their helpers had a security context (a root busybox with the member's volume), and
// the member-volume check catches a helper that passes the level under another user.
func TestRestrictedCheckRefusesRootHelpers(t *testing.T) {
	old := `kubectl -n etcd run etcd-restore --image=busybox:1.37 --restart=Never --overrides='{"spec":{"containers":[{"name":"etcd-restore","image":"busybox:1.37","command":["sleep","3600"],"volumeMounts":[{"name":"data","mountPath":"/var/lib/etcd"}]}],"volumes":[{"name":"data","persistentVolumeClaim":{"claimName":"data-etcd-1"}}]}}'`
	p, ok := runPod(t, "old", old)
	if !ok {
		t.Fatal("the old helper line was not read as a pod")
	}
	why := restrictedProblems(p.meta)
	for _, want := range []string{"allowPrivilegeEscalation", "runAsNonRoot", "seccompProfile", "unrestricted capabilities"} {
		if !strings.Contains(why, want) {
			t.Errorf("the root helper is refused with %q, which does not name %s", why, want)
		}
	}

	nobody := int64(65534)
	p.meta.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptr(true), RunAsUser: &nobody, SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	p.meta.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: ptr(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
	if why := restrictedProblems(p.meta); why != "" {
		t.Fatalf("a helper as nobody should pass the level: %s", why)
	}
	etcdPod := renderedEtcdPod(t)
	mountPath, dataDir := memberVolume(t, etcdPod)
	if len(memberVolumeProblems(p, etcdPod, mountPath, dataDir)) == 0 {
		t.Error("a helper that writes the member's volume as nobody, without fsGroup, passed the member-volume check")
	}
}

func ptr[T any](v T) *T { return &v }
