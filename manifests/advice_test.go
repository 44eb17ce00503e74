package manifests

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/sync"
)

// docFiles are the documents whose commands a user runs as written.
var docFiles = []string{"../README.md", "../docs/install.md", "../docs/operate.md", "../docs/runbooks.md", "../docs/backup.md", "../docs/security.md", "../docs/monitoring.md"}

// adviceSources are the packages whose messages reach a user: the hook's status reasons and
// the API server's refusals.
var adviceSources = []string{"../sync", "../api/v1alpha1"}

// Advice the operator gives about the EtcdCluster itself names an edit the API server takes:
// every `kubectl patch etcdcluster` in the docs, every "remove spec.<field>" and every
// "spec.<field>: <value>" in a message of the hook or the CRD, applied on the real API server
// with the CRD's rules, to a cluster that has every field they touch set, are accepted. And
// the hook's answer to spec.bootstrap on a running cluster, which the CRD keeps from being
// removed, names a new EtcdCluster instead.
func testAdvice(t *testing.T, s *apiServer) {
	n := 0
	apply := func(where string, patchType types.PatchType, patch string) {
		t.Helper()
		n++
		name := fmt.Sprintf("advice-%d", n)
		base := adviceBase(name)
		created, err := s.clusters().Create(t.Context(), toUnstructured(t, base), strictCreate)
		if err != nil {
			t.Fatalf("%s: creating the cluster to apply it to: %v", where, err)
		}
		created.SetFinalizers([]string{"metacontroller.io/compositecontroller-etcdops"})
		if _, err := s.clusters().Update(t.Context(), created, strictUpdate); err != nil {
			t.Fatalf("%s: adding Metacontroller's finalizer: %v", where, err)
		}
		if _, err := s.clusters().Patch(t.Context(), name, patchType, []byte(patch), metav1.PatchOptions{FieldValidation: "Strict"}); err != nil {
			t.Errorf("%s: the API server refuses %s: %v", where, patch, err)
		}
	}

	patches := 0
	for _, file := range docFiles {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			m := kubectlPatch.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			patches++
			pt := types.MergePatchType
			if m[1] == "json" {
				pt = types.JSONPatchType
			}
			apply(fmt.Sprintf("%s:%d", file, i+1), pt, m[2])
		}
	}
	if patches < 5 {
		t.Errorf("found %d kubectl patch commands in the docs; the pattern no longer matches how they are written", patches)
	}

	for _, msg := range adviceStrings(t) {
		for _, m := range removeAdvice.FindAllStringSubmatch(msg.text, -1) {
			apply(msg.where+": "+m[0], types.JSONPatchType, fmt.Sprintf(`[{"op":"remove","path":%q}]`, jsonPath(m[1])))
		}
		for _, m := range setAdvice.FindAllStringSubmatch(msg.text, -1) {
			apply(msg.where+": "+m[0], types.MergePatchType, mergePatch(m[1], m[2]))
		}
	}

	// The restore the CRD keeps in place: the hook's reason names nothing the CRD refuses.
	c := adviceBase("running")
	obs := sync.Observed{Cluster: c, Now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	obs.Cluster.Status.ClusterID = "c1"
	d := sync.Plan(sync.Config{ClusterDomain: "cluster.local", ToolImage: "etcdops:test"}, obs)
	reason := d.Status.Action.Reason
	if !strings.Contains(reason, "spec.bootstrap.fromBackup is set on a cluster that already runs") || !strings.Contains(reason, "create it again") {
		t.Fatalf("spec.bootstrap on a running cluster: the hook says %q", reason)
	}
	for _, m := range removeAdvice.FindAllStringSubmatch(reason, -1) {
		apply("the hook's reason: "+m[0], types.JSONPatchType, fmt.Sprintf(`[{"op":"remove","path":%q}]`, jsonPath(m[1])))
	}
}

var (
	kubectlPatch = regexp.MustCompile(`kubectl .*patch (?:etcdcluster|ec) \S+ --type[ =](merge|json) -p '([^']+)'`)
	removeAdvice = regexp.MustCompile(`remove (spec(?:\.[a-zA-Z]+)+)`)
	setAdvice    = regexp.MustCompile(`(spec(?:\.[a-zA-Z]+)+): ([A-Z][a-zA-Z]+)\b`)
)

// adviceBase is a cluster with every field advice may touch set: storage, TLS, recovery,
// backup, and a bootstrap from a snapshot.
func adviceBase(name string) v1alpha1.EtcdCluster {
	c := sampleCluster(name)
	c.Namespace = testNamespace
	c.Spec.TLS = &v1alpha1.TLSSpec{ServerSecret: "server", PeerSecret: "peer", ClientSecret: "client"}
	c.Spec.Recovery = &v1alpha1.RecoverySpec{}
	c.Spec.Maintenance = &v1alpha1.MaintenanceSpec{}
	dest := v1alpha1.BackupDestination{S3: &v1alpha1.S3Destination{Endpoint: "https://s3.example.test", Bucket: "backups", CredentialsSecret: "s3"}}
	c.Spec.Backup = &v1alpha1.BackupSpec{Schedule: "@daily", Destination: dest}
	c.Spec.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: &v1alpha1.FromBackup{BackupDestination: dest, Name: v1alpha1.LatestBackup}}
	return c
}

func jsonPath(field string) string {
	return "/" + strings.ReplaceAll(field, ".", "/")
}

// mergePatch sets field (spec.a.b) to value.
func mergePatch(field, value string) string {
	var v any = value
	for _, part := range reversed(strings.Split(field, ".")) {
		v = map[string]any{part: v}
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func reversed(parts []string) []string {
	out := make([]string, len(parts))
	for i, p := range parts {
		out[len(parts)-1-i] = p
	}
	return out
}

type adviceString struct{ where, text string }

// adviceStrings are the string literals of the advice sources' Go files and their kubebuilder
// validation messages (comments), each with where it is.
func adviceStrings(t *testing.T) []adviceString {
	var out []adviceString
	fset := token.NewFileSet()
	for _, dir := range adviceSources {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, file, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if s, err := strconv.Unquote(lit.Value); err == nil {
						out = append(out, adviceString{fset.Position(lit.Pos()).String(), s})
					}
				}
				return true
			})
			for _, cg := range f.Comments {
				for _, c := range cg.List {
					if strings.Contains(c.Text, "message=") {
						out = append(out, adviceString{fset.Position(c.Pos()).String(), c.Text[strings.Index(c.Text, "message="):]})
					}
				}
			}
		}
	}
	return out
}
