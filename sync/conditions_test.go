package sync

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	gosync "sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// documentedReasons reads docs/operate.md's closed lists of condition reasons: for each
// condition type and status, the reasons the tables allow.
var documentedReasons = gosync.OnceValues(func() (map[string][]string, error) {
	data, err := os.ReadFile("../docs/operate.md")
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	table := ""
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(line, "| condition | status | reasons |"):
			table = "conditions"
		case strings.HasPrefix(line, "Reasons of `Degraded=True`"):
			table = "degraded"
		case !strings.HasPrefix(line, "|") && line != "":
			table = ""
		}
		cells := strings.Split(line, "|")
		switch {
		case table == "conditions" && len(cells) > 4:
			key := strings.Trim(strings.TrimSpace(cells[1]), "`") + "=" + strings.TrimSpace(cells[2])
			out[key] = append(out[key], codeSpans(cells[3])...)
		case table == "degraded" && len(cells) > 2:
			out["Degraded=True"] = append(out["Degraded=True"], codeSpans(cells[1])...)
		}
	}
	return out, nil
})

var codeSpan = regexp.MustCompile("`([^`]+)`")

func codeSpans(s string) []string {
	var out []string
	for _, m := range codeSpan.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// reasonConstants reads the Reason constants of status.go, block by block.
func reasonConstants(t *testing.T) [][]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "status.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var blocks [][]string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		var block []string
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Reason") {
					continue
				}
				v, err := strconv.Unquote(vs.Values[i].(*ast.BasicLit).Value)
				if err != nil {
					t.Fatal(err)
				}
				block = append(block, v)
			}
		}
		if len(block) > 0 {
			blocks = append(blocks, block)
		}
	}
	return blocks
}

// TestConditionReasonsMatchTheDocs: the reasons of Degraded=True in status.go are exactly
// the documented ones, in the same order, and every other reason constant is documented.
func TestConditionReasonsMatchTheDocs(t *testing.T) {
	docs, err := documentedReasons()
	if err != nil {
		t.Fatal(err)
	}
	blocks := reasonConstants(t)
	if len(blocks) != 2 {
		t.Fatalf("status.go has %d blocks of Reason constants, want 2 (Degraded=True, the others)", len(blocks))
	}
	if got := docs["Degraded=True"]; !slices.Equal(got, blocks[0]) {
		t.Errorf("docs/operate.md lists the Degraded reasons\n  %q\nstatus.go has\n  %q", got, blocks[0])
	}
	var documented []string
	for key, rs := range docs {
		if key != "Degraded=True" {
			documented = append(documented, rs...)
		}
	}
	for _, r := range blocks[1] {
		if !slices.Contains(documented, r) {
			t.Errorf("reason %s is in status.go but not in the conditions table of docs/operate.md", r)
		}
	}
	for _, want := range []string{"Available=True", "Available=False", "Available=Unknown", "Progressing=True", "Progressing=False", "Degraded=False"} {
		if len(docs[want]) == 0 {
			t.Errorf("docs/operate.md lists no reason for %s", want)
		}
	}
}

var camelCase = regexp.MustCompile(`^[A-Z][a-zA-Z]*$`)

// checkConditions checks a decision's conditions against the API conventions and the
// documented closed lists: every sync of every simulated story goes through it (sim_test.go).
func checkConditions(t testing.TB, gen int64, d Decision) {
	t.Helper()
	if d.Action.Type == Teardown {
		return // a finalize sync reports its action only
	}
	docs, err := documentedReasons()
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, c := range d.Status.Conditions {
		types = append(types, c.Type)
		if !camelCase.MatchString(c.Reason) || !slices.Contains(docs[c.Type+"="+string(c.Status)], c.Reason) {
			t.Fatalf("%s=%s with reason %q, which docs/operate.md does not list for it (action %v)", c.Type, c.Status, c.Reason, d.Action)
		}
		if c.ObservedGeneration != gen || c.LastTransitionTime.IsZero() || c.Message == "" {
			t.Fatalf("condition %s: observedGeneration %d (want %d), lastTransitionTime %v, message %q", c.Type, c.ObservedGeneration, gen, c.LastTransitionTime, c.Message)
		}
	}
	// BackedUp follows the three for a cluster with spec.backup, then VolumesExpanded for one
	// with spec.storageSpec.
	want := []string{v1alpha1.ConditionAvailable, v1alpha1.ConditionProgressing, v1alpha1.ConditionDegraded}
	for _, opt := range []string{v1alpha1.ConditionBackedUp, v1alpha1.ConditionBackupVerified, v1alpha1.ConditionVolumesExpanded} {
		if len(types) > len(want) && types[len(want)] == opt {
			want = append(want, opt)
		}
	}
	if d.Action.Type != Bootstrap && !slices.Equal(types, want) {
		t.Fatalf("conditions %v, want %v", types, want)
	}
}

// transitions follows one story's statuses: how often each condition turned, and the phases
// and Degraded reasons seen.
type transitions struct {
	last    map[string]metav1.Condition
	turns   map[string]int
	phases  []v1alpha1.Phase
	reasons []string // of Degraded=True
}

func (tr *transitions) see(t *testing.T, now time.Time, st v1alpha1.EtcdClusterStatus) {
	t.Helper()
	if tr.last == nil {
		tr.last, tr.turns = map[string]metav1.Condition{}, map[string]int{}
	}
	for _, c := range st.Conditions {
		prev, seen := tr.last[c.Type]
		switch {
		case seen && prev.Status == c.Status && !prev.LastTransitionTime.Equal(&c.LastTransitionTime):
			t.Fatalf("%s stayed %s but its lastTransitionTime moved from %v to %v", c.Type, c.Status, prev.LastTransitionTime, c.LastTransitionTime)
		case seen && prev.Status != c.Status:
			tr.turns[c.Type]++
			if !c.LastTransitionTime.Time.Equal(now) {
				t.Fatalf("%s turned %s at %v, but its lastTransitionTime says %v", c.Type, c.Status, now, c.LastTransitionTime)
			}
		}
		tr.last[c.Type] = c
		if c.Type == v1alpha1.ConditionDegraded && c.Status == metav1.ConditionTrue && !slices.Contains(tr.reasons, c.Reason) {
			tr.reasons = append(tr.reasons, c.Reason)
		}
	}
	if len(tr.phases) == 0 || tr.phases[len(tr.phases)-1] != st.Phase {
		tr.phases = append(tr.phases, st.Phase)
	}
}

// follow steps a world until it converges, following its statuses.
func follow(t *testing.T, w *simWorld, limit int) *transitions {
	t.Helper()
	tr := &transitions{}
	tr.see(t, w.now, w.cluster.Status)
	for i := 0; i < limit; i++ {
		now := w.now
		d := w.step()
		tr.see(t, now, d.Status)
		if w.converged(d) {
			return tr
		}
	}
	t.Fatalf("not converged after %d syncs:\n%s", limit, w.describe())
	return nil
}

// TestPlannedWorkIsNotDegradation: a roll, an upgrade, a scale out or in never sets Degraded
// and stays Running; Progressing turns True once and back once, however many pods are
// replaced. A crash, a lost volume and a step past its deadline do set Degraded.
func TestPlannedWorkIsNotDegradation(t *testing.T) {
	options := func(w *simWorld) { w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=5000"} }
	for _, tc := range []struct {
		story   string
		size    int32
		storage bool
		change  func(*simWorld)
	}{
		{"rolling config change, 3 members with volumes", 3, true, options},
		{"rolling config change, 5 members, leader 3", 5, true, func(w *simWorld) { w.setLeader(3); options(w) }},
		{"rolling config change, 3 members without volumes", 3, false, options},
		{"rolling config change, 2 members (a temporary third joins)", 2, true, options},
		{"patch upgrade", 3, true, func(w *simWorld) { w.cluster.Spec.Version = "v3.6.17" }},
		{"patch upgrade, each pod's etcd stopped before its deletion is seen", 3, true, func(w *simWorld) {
			w.podsSeenLate = true
			w.cluster.Spec.Version = "v3.6.17"
		}},
		{"scale out 3→5", 3, true, func(w *simWorld) { w.cluster.Spec.Size = ptrTo(int32(5)) }},
		{"scale in 5→3, the leader at the top", 5, true, func(w *simWorld) { w.setLeader(4); w.cluster.Spec.Size = ptrTo(int32(3)) }},
		{"scale in 3→1", 3, true, func(w *simWorld) { w.cluster.Spec.Size = ptrTo(int32(1)) }},
	} {
		t.Run(tc.story, func(t *testing.T) {
			w, _ := created(t, tc.size, tc.storage)
			tc.change(w)
			w.cluster.Generation++
			tr := follow(t, w, 300)
			if len(tr.reasons) > 0 || !slices.Equal(tr.phases, []v1alpha1.Phase{v1alpha1.PhaseRunning}) {
				t.Errorf("phases %v, Degraded reasons %v; want Running throughout and never Degraded", tr.phases, tr.reasons)
			}
			if tr.turns[v1alpha1.ConditionProgressing] != 2 || tr.turns[v1alpha1.ConditionDegraded] != 0 || tr.turns[v1alpha1.ConditionAvailable] != 0 {
				t.Errorf("transitions %v; want Progressing to turn True and back once, the others never", tr.turns)
			}
		})
	}

	for _, tc := range []struct {
		story string
		fault func(*simWorld)
		want  []string
	}{
		{"a crash loop", func(w *simWorld) { w.pods[1].crash = true; w.faultUntilRemoved(1) }, []string{ReasonMemberUnhealthy}},
		{"a lost volume", func(w *simWorld) { delete(w.data, 2); w.pods[2].terminating = true }, []string{ReasonMemberUnhealthy}},
		{"a replaced pod whose member never recovers", func(w *simWorld) {
			options(w)
			// Down from its recreation until the planner gives up on the member and removes it.
			w.onTick = func() {
				if p := w.pods[2]; p != nil && p.spec == w.sts.updateSpec {
					p.down = w.memberAt(2) != nil
					if !p.down {
						w.onTick = nil
					}
				}
			}
		}, []string{ReasonProgressDeadlineExceeded}},
	} {
		t.Run(tc.story, func(t *testing.T) {
			w, _ := created(t, 3, true)
			tc.fault(w)
			w.cluster.Generation++
			tr := follow(t, w, 300)
			if !slices.Equal(tr.reasons, tc.want) || !slices.Contains(tr.phases, v1alpha1.PhaseDegraded) {
				t.Errorf("phases %v, Degraded reasons %v; want Degraded for %v", tr.phases, tr.reasons, tc.want)
			}
			if last := tr.last[v1alpha1.ConditionDegraded]; last.Status != metav1.ConditionFalse {
				t.Errorf("repaired, and still Degraded: %+v", last)
			}
		})
	}
}

// The API's comments on status.action.type and status.conditions (and so the CRD's field
// descriptions, kubectl explain) list every action type and condition type the planner writes.
func TestAPICommentsListEveryActionAndCondition(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "../api/v1alpha1/types.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	doc := func(typeName, field string) string {
		var out string
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || ts.Name.Name != typeName {
				return true
			}
			for _, fl := range ts.Type.(*ast.StructType).Fields.List {
				if len(fl.Names) == 1 && fl.Names[0].Name == field {
					out = fl.Doc.Text()
				}
			}
			return false
		})
		if out == "" {
			t.Fatalf("no comment on %s.%s in api/v1alpha1/types.go", typeName, field)
		}
		return out
	}
	actions := doc("Action", "Type")
	for _, a := range ActionTypes() {
		if !regexp.MustCompile(`\b` + a.String() + `\b`).MatchString(actions) {
			t.Errorf("the comment on status.action.type does not list %s", a)
		}
	}
	conditions := doc("EtcdClusterStatus", "Conditions")
	for _, c := range []string{v1alpha1.ConditionAvailable, v1alpha1.ConditionProgressing, v1alpha1.ConditionDegraded, v1alpha1.ConditionBackedUp, v1alpha1.ConditionVolumesExpanded} {
		if !strings.Contains(conditions, c) {
			t.Errorf("the comment on status.conditions does not list %s", c)
		}
	}
}
