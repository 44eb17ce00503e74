package hooks

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	jsonv2 "github.com/go-json-experiment/json"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/sync"
)

// recordedRequests are the requests a real Metacontroller sent, kept outside the tree.
const recordedRequests = "../../shared/metacontroller/recorded"

// TestNarrowPlansAlike decodes every fixture and every recorded sync request twice, its pods
// whole and narrowed (podFields), and plans each: the decisions, and what the hook observes
// from the pods, must be the same to the byte. A field the planner reads and the narrow decode
// drops shows here as soon as a fixture or a recording holds it.
func TestNarrowPlansAlike(t *testing.T) {
	files, err := filepath.Glob("../test/fixtures/*.json")
	if err != nil {
		t.Fatal(err)
	}
	var requests []string
	for _, f := range files {
		base := filepath.Base(f)
		if !strings.HasSuffix(base, ".golden.json") && !strings.HasSuffix(base, ".etcd.json") && !strings.HasPrefix(base, "customize") {
			requests = append(requests, f)
		}
	}
	if len(requests) == 0 {
		t.Fatal("no fixtures")
	}
	recorded, _ := filepath.Glob(filepath.Join(recordedRequests, "*-sync.req.json"))
	finalize, _ := filepath.Glob(filepath.Join(recordedRequests, "*-finalize.req.json"))
	recorded = append(recorded, finalize...)
	if len(recorded) == 0 {
		t.Logf("no recorded requests in %s (../shared is absent): only the fixtures are planned both ways", recordedRequests)
	}
	narrowed := 0
	for _, f := range append(requests, recorded...) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var snap etcdstate.Snapshot
			if b, err := os.ReadFile(strings.TrimSuffix(f, ".json") + ".etcd.json"); err == nil {
				if err := json.Unmarshal(b, &snap); err != nil {
					t.Fatal(err)
				}
			}
			whole, wholePods := planned(t, raw, typeDecoders, snap)
			narrow, narrowPods := planned(t, raw, podOptions, snap)
			if whole != narrow {
				t.Errorf("planned differently with the pods narrowed:\nwhole:  %s\nnarrow: %s", whole, narrow)
			}
			if wholePods != narrowPods {
				narrowed++
			}
		})
	}
	if narrowed == 0 {
		t.Error("no request's pods lost anything to the narrow decode: the comparison proves nothing")
	}
}

// planned decodes a sync request's body with its pods decoded by pods, observes it as the
// hook does with etcd answering snap, and returns what the hook would act on (the needs and
// the decision, as JSON) and the pods as decoded.
func planned(t *testing.T, raw []byte, pods jsonv2.Options, snap etcdstate.Snapshot) (string, string) {
	t.Helper()
	req, err := decodeSyncRequest(bytes.NewBuffer(raw), pods)
	if err != nil {
		t.Fatal(err)
	}
	c, err := decodeParent(req.parent)
	if err != nil {
		t.Fatal(err)
	}
	children, err := req.observedChildren()
	if err != nil {
		t.Fatal(err)
	}
	cfg := sync.Config{ClusterDomain: "cluster.local", ToolImage: "etcdops/etcdops:v0.1.0"}
	observedPods, secrets := sortedIn(c.Namespace, req.related.pods), sortedIn(c.Namespace, req.related.secrets)
	need := sync.Need(cfg, &c, children, observedPods, secrets)
	obs := sync.Observed{
		Cluster: c, Children: children, Pods: observedPods,
		Claims: sortedIn(c.Namespace, req.related.claims), Classes: sorted(req.related.classes),
		Etcd: snap, CAs: need.CAs, CABundles: need.CABundles, Finalizing: req.finalizing,
		Now: time.Date(2026, 11, 29, 12, 10, 0, 0, time.UTC),
	}
	d := sync.Plan(cfg, obs)
	answer, err := json.Marshal(encodeDecision(d))
	if err != nil {
		t.Fatal(err)
	}
	acted, err := json.Marshal(struct {
		Endpoints      []etcdstate.Endpoint
		ClientSecret   string
		TLS            bool
		ProgressURL    string
		CAs, CABundles map[string]string
		Answer         json.RawMessage
		Action         sync.Action
		Events         []sync.Event
		Rolls          bool
	}{need.Endpoints, need.ClientSecret, need.TLS, need.ProgressURL, need.CAs, need.CABundles, answer, d.Action, d.Events, d.Rolls})
	if err != nil {
		t.Fatal(err)
	}
	decoded, err := json.Marshal(observedPods)
	if err != nil {
		t.Fatal(err)
	}
	return string(acted), string(decoded)
}

// TestNarrowKeepsWhatIsRead type-checks sync and hooks and fails for every field of a
// narrowed type (podFields) that their code selects and the narrow decode does not keep, and
// for every read of a whole pod or narrowed value (wholeReads: handed to encoding/json or fmt,
// say). It goes by type, not by path: a field read on a StatefulSet's pod template is kept on
// pods too, which costs little and cannot miss a read. A pod stored as an any and read later
// escapes it; TestNarrowPlansAlike would show that.
func TestNarrowKeepsWhatIsRead(t *testing.T) {
	pkgs := []string{"etcdops.dev/etcdops/sync", "etcdops.dev/etcdops/hooks"}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to type-check sync and hooks with")
	}
	out, err := exec.Command(goTool, append([]string{"list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}\t{{.Dir}}\t{{join .GoFiles \" \"}}"}, pkgs...)...).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			err = fmt.Errorf("%w: %s", err, exit.Stderr)
		}
		t.Fatalf("go list -export: %v", err)
	}
	type pkg struct{ export, dir, files string }
	listed := map[string]pkg{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		listed[f[0]] = pkg{f[1], f[2], f[3]}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) { return os.Open(listed[path].export) })

	narrowed := map[string]narrowing{}
	// Embedded structs lend their fields to the narrowed type that inlines them.
	inlined := map[string]narrowing{}
	for _, n := range podFields {
		narrowed[n.typ.String()] = n
		for _, f := range reflect.VisibleFields(n.typ) {
			if f.Anonymous {
				inlined[f.Type.String()] = n
			}
		}
	}
	// isNarrowed: t is a pod, a narrowed type, or holds one in a pointer, slice or array.
	isNarrowed := func(t types.Type) bool {
		for {
			switch u := t.(type) {
			case *types.Pointer:
				t = u.Elem()
				continue
			case *types.Slice:
				t = u.Elem()
				continue
			case *types.Array:
				t = u.Elem()
				continue
			}
			name := types.TypeString(t, func(p *types.Package) string { return p.Name() })
			_, ok := narrowed[name]
			return ok || name == "v1.Pod"
		}
	}
	checked := 0
	for _, path := range pkgs {
		p := listed[path]
		var files []*ast.File
		for _, name := range strings.Fields(p.files) {
			f, err := parser.ParseFile(fset, filepath.Join(p.dir, name), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		info := &types.Info{Selections: map[*ast.SelectorExpr]*types.Selection{}, Types: map[ast.Expr]types.TypeAndValue{}, Uses: map[*ast.Ident]types.Object{}}
		if _, err := (&types.Config{Importer: imp}).Check(path, fset, files, info); err != nil {
			t.Fatalf("type-checking %s: %v", path, err)
		}
		for _, f := range files {
			for _, whole := range wholeReads(info, f, isNarrowed) {
				t.Errorf("%s: a narrowed pod's decode is incomplete, and this reads all of it", fset.Position(whole))
			}
		}
		exprs := slices.SortedFunc(maps.Keys(info.Selections), func(a, b *ast.SelectorExpr) int { return cmp.Compare(a.Pos(), b.Pos()) })
		for _, expr := range exprs {
			sel := info.Selections[expr]
			if sel.Kind() != types.FieldVal {
				continue
			}
			recv := sel.Recv()
			if p, ok := recv.(*types.Pointer); ok {
				recv = p.Elem()
			}
			// As reflect names the type: corev1.PodSpec is "v1.PodSpec".
			name := strings.TrimPrefix(types.TypeString(recv, func(p *types.Package) string { return p.Name() }), "*")
			n, ok := narrowed[name]
			if !ok {
				if n, ok = inlined[name]; !ok {
					continue
				}
			}
			checked++
			field := sel.Obj().(*types.Var)
			if !kept(n, field.Name()) {
				t.Errorf("%s reads %s.%s, which the narrow decode of a pod skips: keep its JSON member in podFields", fset.Position(expr.Sel.Pos()), name, field.Name())
			}
		}
	}
	if checked == 0 {
		t.Error("no read of a narrowed type found: the check looks at nothing")
	}
}

// wholeReads are the places in f that read all of a value isNarrowed says is narrowed: handed
// to a function of another module (encoding/json, fmt, reflect; slices' and sort's functions
// only hand elements back to this module's own), or a method of its own called on it other
// than a deep copy (metadata's accessors are ObjectMeta's, kept whole).
func wholeReads(info *types.Info, f *ast.File, isNarrowed func(types.Type) bool) []token.Pos {
	var out []token.Pos
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			var id *ast.Ident
			switch fun := ast.Unparen(n.Fun).(type) {
			case *ast.Ident:
				id = fun
			case *ast.SelectorExpr:
				id = fun.Sel
			case *ast.IndexExpr:
				if sel, ok := fun.X.(*ast.SelectorExpr); ok {
					id = sel.Sel
				} else if i, ok := fun.X.(*ast.Ident); ok {
					id = i
				}
			}
			fn, ok := info.Uses[id].(*types.Func)
			if id == nil || !ok || fn.Pkg() == nil {
				return true
			}
			switch path := fn.Pkg().Path(); {
			case strings.HasPrefix(path, "etcdops.dev/"), path == "slices", path == "sort", path == "cmp":
				return true
			}
			for _, arg := range n.Args {
				if isNarrowed(info.Types[arg].Type) {
					out = append(out, arg.Pos())
				}
			}
		case *ast.SelectorExpr:
			sel, ok := info.Selections[n]
			if !ok || sel.Kind() == types.FieldVal {
				return true
			}
			recv := sel.Obj().(*types.Func).Type().(*types.Signature).Recv()
			if recv != nil && isNarrowed(recv.Type()) && !strings.HasPrefix(sel.Obj().Name(), "DeepCopy") {
				out = append(out, n.Pos())
			}
		}
		return true
	})
	return out
}

// kept: n keeps the Go field named field, or it is not a field of n's type at all.
func kept(n narrowing, field string) bool {
	for _, f := range reflect.VisibleFields(n.typ) {
		if f.Name != field {
			continue
		}
		if f.Anonymous {
			// An inlined struct read whole.
			return false
		}
		for _, i := range n.fields {
			if slices.Equal(i, f.Index) {
				return true
			}
		}
		return false
	}
	return true
}

// TestNarrowPod: a pod decoded narrow has what podFields keep as the whole decode has it, and
// nothing else of its spec and status; a kept member of the wrong type is still refused.
func TestNarrowPod(t *testing.T) {
	pod := `{"metadata":{"name":"etcd-0","namespace":"default","labels":{"app":"etcd"}},` +
		`"spec":{"nodeName":"n1","containers":[{"name":"etcd","image":"etcd:v3.6.5","command":["etcd"],"args":["--name=etcd-0"],` +
		`"env":[{"name":"A","value":"b"}],"resources":{"requests":{"cpu":"100m"}},"readinessProbe":{"httpGet":{"path":"/readyz","port":2379}}}],` +
		`"initContainers":[{"name":"install","image":"tool:v1","volumeMounts":[{"name":"bin","mountPath":"/bin"}]}],` +
		`"volumes":[{"name":"server-tls","secret":{"secretName":"srv"}},{"name":"kube-api-access","projected":{"sources":[]}},{"name":"data","emptyDir":{"sizeLimit":"1Gi"}}],` +
		`"tolerations":[{"key":"k","operator":"Exists"}]},` +
		`"status":{"phase":"Running","podIP":"127.0.0.1","hostIP":"127.0.0.2","qosClass":"Burstable","conditions":[{"type":"Ready","status":"True"}],` +
		`"containerStatuses":[{"name":"etcd","ready":true,"restartCount":2,"imageID":"sha256:x","state":{"running":{}},"lastState":{"terminated":{"exitCode":1,"message":"m"}}}]}}`
	decode := func(body string, opts jsonv2.Options) (corev1.Pod, error) {
		var p corev1.Pod
		err := jsonv2.Unmarshal([]byte(body), &p, decodeOptions[0], opts)
		return p, err
	}
	whole, err := decode(pod, typeDecoders)
	if err != nil {
		t.Fatal(err)
	}
	narrow, err := decode(pod, podOptions)
	if err != nil {
		t.Fatal(err)
	}
	want := whole.DeepCopy()
	want.Spec = corev1.PodSpec{Containers: want.Spec.Containers, InitContainers: want.Spec.InitContainers, Volumes: want.Spec.Volumes}
	for _, cs := range [][]corev1.Container{want.Spec.Containers, want.Spec.InitContainers} {
		for i, c := range cs {
			cs[i] = corev1.Container{Name: c.Name, Image: c.Image, Command: c.Command, Args: c.Args}
		}
	}
	for i, v := range want.Spec.Volumes {
		want.Spec.Volumes[i] = corev1.Volume{Name: v.Name, VolumeSource: corev1.VolumeSource{Secret: v.Secret, EmptyDir: v.EmptyDir}}
	}
	want.Status.HostIP, want.Status.QOSClass = "", ""
	want.Status.ContainerStatuses[0].ImageID = ""
	if !reflect.DeepEqual(&narrow, want) {
		t.Errorf("narrow decode:\n got %+v\nwant %+v", narrow, *want)
	}
	if narrow.Spec.Containers[0].Env != nil || narrow.Spec.NodeName != "" || narrow.Status.QOSClass != "" {
		t.Error("the narrow decode kept members podFields skip")
	}

	escaped := strings.Replace(pod, `"image":"etcd:v3.6.5"`, `"im\u0061ge":"etcd:v3.6.5"`, 1)
	if p, err := decode(escaped, podOptions); err != nil || p.Spec.Containers[0].Image != "etcd:v3.6.5" {
		t.Errorf("a kept member with an escaped name: image %q, error %v", p.Spec.Containers[0].Image, err)
	}
	if _, err := decode(strings.Replace(pod, `"podIP":"127.0.0.1"`, `"podIP":1`, 1), podOptions); err == nil {
		t.Error("a kept member of the wrong type was accepted")
	}
	if _, err := decode(strings.Replace(pod, `"spec":{`, `"spec":{"nodeName":"n2",`, 1), podOptions); err == nil {
		t.Error("a skipped member given twice was accepted")
	}
	if p, err := decode(`{"spec":null,"status":{"containerStatuses":[null]}}`, podOptions); err != nil || len(p.Status.ContainerStatuses) != 1 {
		t.Errorf("null spec and status entry: %+v, %v", p, err)
	}
	if _, err := decode(`{"spec":[]}`, podOptions); err == nil {
		t.Error("a spec that is no object was accepted")
	}
}

// BenchmarkDecodeSync decodes the steady-3 fixture's body alone, its pods whole and narrowed:
// what the narrow decode saves of one sync. "check" reads the body as the decoder does,
// checking every value, and decodes nothing: the least any reading of the request costs.
func BenchmarkDecodeSync(b *testing.B) {
	raw, err := os.ReadFile("../test/fixtures/steady-3.json")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("check", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			dec := getDecoder(bytes.NewBuffer(raw))
			if err := dec.SkipValue(); err != nil {
				b.Fatal(err)
			}
			putDecoder(dec)
		}
	})
	benchmarkDecodes(b, len(raw), []decodeVariant{{"whole", typeDecoders}, {"narrow", podOptions}}, func(pods jsonv2.Options) error {
		_, err := decodeSyncRequest(bytes.NewBuffer(raw), pods)
		return err
	})
}

// decodeVariant is a benchmark's decode with options of its own.
type decodeVariant struct {
	name string
	opts jsonv2.Options
}

// benchmarkDecodes runs decode, over size bytes, with each variant's options.
func benchmarkDecodes(b *testing.B, size int, variants []decodeVariant, decode func(jsonv2.Options) error) {
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				if err := decode(v.opts); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeChildren decodes the steady-3 fixture's children, each into its typed struct
// as decodeSyncRequest does: whole, and with everything but their metadata skipped (the
// StatefulSet's replicas and pod template kept, the template's pod spec narrowed as a pod's),
// which no narrowing of the children that the planner's reads allow could beat. The
// difference is the most narrowing children could save of a sync.
func BenchmarkDecodeChildren(b *testing.B) {
	raw, err := os.ReadFile("../test/fixtures/steady-3.json")
	if err != nil {
		b.Fatal(err)
	}
	var req struct {
		Children map[string]map[string]json.RawMessage `json:"children"`
	}
	if err := json.Unmarshal(raw, &req); err != nil {
		b.Fatal(err)
	}
	newObject := map[string]func() any{
		keyStatefulSet: func() any { return new(appsv1.StatefulSet) },
		keyService:     func() any { return new(corev1.Service) },
		keyConfigMap:   func() any { return new(corev1.ConfigMap) },
		keyPDB:         func() any { return new(policyv1.PodDisruptionBudget) },
		keyAccount:     func() any { return new(corev1.ServiceAccount) },
		keyRole:        func() any { return new(rbacv1.Role) },
		keyRoleBinding: func() any { return new(rbacv1.RoleBinding) },
	}
	type child struct {
		raw []byte
		new func() any
	}
	var children []child
	size := 0
	for typ, objs := range req.Children {
		for _, obj := range objs {
			if newObject[typ] == nil {
				b.Fatalf("no type for %s", typ)
			}
			children = append(children, child{obj, newObject[typ]})
			size += len(obj)
		}
	}
	u := slices.Clone(typeUnmarshalers)
	for _, n := range append(slices.Clone(podFields),
		keep[appsv1.StatefulSetSpec]("replicas", "template"),
		keep[corev1.ServiceSpec](),
		keep[corev1.ConfigMap]("metadata"),
		keep[policyv1.PodDisruptionBudget]("metadata"),
		keep[rbacv1.Role]("metadata"),
		keep[rbacv1.RoleBinding]("metadata"),
	) {
		u = append(u, n.unmarshal)
	}
	metadataOnly := jsonv2.WithUnmarshalers(jsonv2.JoinUnmarshalers(u...))
	benchmarkDecodes(b, size, []decodeVariant{{"whole", typeDecoders}, {"metadata-only", metadataOnly}}, func(opts jsonv2.Options) error {
		for _, ch := range children {
			if err := jsonv2.Unmarshal(ch.raw, ch.new(), decodeOptions[0], opts); err != nil {
				return err
			}
		}
		return nil
	})
}

// FuzzNarrowPod: a pod the whole decode reads, the narrow decode reads too, to the kept
// members of the whole decode's result (projected); a body neither reads is refused by both.
// The narrow decode may accept more: a skipped member of the wrong type is not looked at.
// Seeds are the pods of the fixtures.
func FuzzNarrowPod(f *testing.F) {
	files, _ := filepath.Glob("../test/fixtures/*.json")
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		var req struct {
			Related map[string]map[string]json.RawMessage `json:"related"`
		}
		if json.Unmarshal(raw, &req) != nil {
			continue
		}
		for _, pod := range req.Related[keyPod] {
			f.Add([]byte(pod))
		}
	}
	f.Add([]byte(`{"spec":{"containers":[null,{"name":"etcd","\u0069mage":"x"}]},"status":null}`))
	f.Add([]byte(`{"spec":{"containers":[{"name":"etcd","env":5}]}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var whole, narrow corev1.Pod
		wholeErr := jsonv2.Unmarshal(body, &whole, decodeOptions[0], typeDecoders)
		narrowErr := jsonv2.Unmarshal(body, &narrow, decodeOptions[0], podOptions)
		if wholeErr != nil {
			return
		}
		if narrowErr != nil {
			t.Fatalf("the whole decode reads it, the narrow one refuses it: %v", narrowErr)
		}
		want := project(reflect.ValueOf(&whole).Elem()).Interface().(corev1.Pod)
		if !reflect.DeepEqual(narrow, want) {
			t.Fatalf("narrow decode:\n got %+v\nwant %+v", narrow, want)
		}
	})
}

// project returns a copy of v with every member podFields skip zeroed, however deep.
func project(v reflect.Value) reflect.Value {
	out := reflect.New(v.Type()).Elem()
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			out.Set(project(v.Elem()).Addr())
		}
	case reflect.Slice:
		if !v.IsNil() {
			out.Set(reflect.MakeSlice(v.Type(), v.Len(), v.Len()))
			for i := range v.Len() {
				out.Index(i).Set(project(v.Index(i)))
			}
		}
	case reflect.Struct:
		var keep map[string][]int
		for _, n := range podFields {
			if n.typ == v.Type() {
				keep = n.fields
			}
		}
		if keep == nil {
			out.Set(v)
			for i := range v.NumField() {
				if v.Type().Field(i).IsExported() {
					out.Field(i).Set(project(v.Field(i)))
				}
			}
			return out
		}
		for _, i := range keep {
			out.FieldByIndex(i).Set(project(v.FieldByIndex(i)))
		}
	default:
		out.Set(v)
	}
	return out
}
