package runbooks

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var (
	codeSpan = regexp.MustCompile("`([^`]+)`")
	mdLink   = regexp.MustCompile(`\]\(([^)\s]*)\)`)
)

func codeSpans(s string) []string {
	var out []string
	for _, m := range codeSpan.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// proseCodeSpans are the code spans of a Markdown file's text, paragraph by paragraph (a span
// may wrap), outside fenced blocks (whose backquotes would pair with the text's).
func proseCodeSpans(doc string) []string {
	var out []string
	var para []string
	inFence := false
	flush := func() {
		out = append(out, codeSpans(strings.Join(para, " "))...)
		para = nil
	}
	for _, line := range strings.Split(doc, "\n") {
		switch {
		case strings.HasPrefix(strings.TrimSpace(line), "```"):
			flush()
			inFence = !inFence
		case inFence:
		case strings.TrimSpace(line) == "" || strings.HasPrefix(line, "|"):
			flush()
			para = append(para, line)
			flush()
		default:
			para = append(para, line)
		}
	}
	flush()
	return out
}

// plannerReasons are the values of every Reason constant of the planner (sync/*.go).
func plannerReasons(t *testing.T) []string {
	t.Helper()
	pkgs, err := parser.ParseDir(token.NewFileSet(), "../../sync", func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, pkg := range pkgs {
		for _, f := range pkg.Files {
			for _, d := range f.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok || g.Tok != token.CONST {
					continue
				}
				for _, spec := range g.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, name := range vs.Names {
						if !strings.HasPrefix(name.Name, "Reason") || i >= len(vs.Values) {
							continue
						}
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							v, err := strconv.Unquote(lit.Value)
							if err != nil {
								t.Fatal(err)
							}
							out = append(out, v)
						}
					}
				}
			}
		}
	}
	if len(out) < 20 {
		t.Fatalf("found only %d Reason constants in sync/: %q", len(out), out)
	}
	return out
}

// conditionReasons reads docs/conditions.md's conditions table and the Degraded=True table (the
// planner's tests hold them to the code): the reasons of a condition in a state that asks
// for a look (bad), and those of a healthy one (good). Healthy: Available, BackedUp and
// VolumesExpanded True, Degraded False, Progressing True, and Steady.
func conditionReasons(t *testing.T) (bad, good []string) {
	t.Helper()
	table := ""
	for _, line := range strings.Split(readDoc(t, "conditions.md"), "\n") {
		switch {
		case strings.HasPrefix(line, "| condition | status | reasons |"):
			table = "conditions"
			continue
		case strings.HasPrefix(line, "Reasons of `Degraded=True`"):
			table = "degraded"
			continue
		case !strings.HasPrefix(line, "|") && line != "":
			table = ""
		}
		cells := strings.Split(line, "|")
		switch {
		case table == "conditions" && len(cells) > 4:
			typ, status := strings.Trim(strings.TrimSpace(cells[1]), "`"), strings.TrimSpace(cells[2])
			healthy := status == "True" && typ != "Degraded" || typ == "Degraded" && status == "False"
			for _, r := range codeSpans(cells[3]) {
				if healthy || r == "Steady" {
					good = append(good, r)
				} else {
					bad = append(bad, r)
				}
			}
		case table == "degraded" && len(cells) > 2:
			bad = append(bad, codeSpans(cells[1])...)
		}
	}
	if len(bad) < 20 || len(good) < 5 {
		t.Fatalf("docs/conditions.md's condition tables were not found (%d reasons to look at, %d healthy)", len(bad), len(good))
	}
	return bad, good
}

// alertNames are the alerts of every rule file in manifests/monitoring.
func alertNames(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../manifests/monitoring/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var rule struct {
			Kind string
			Spec struct {
				Groups []struct {
					Rules []struct{ Alert string }
				}
			}
		}
		if err := yaml.Unmarshal(data, &rule); err != nil || rule.Kind != "PrometheusRule" {
			continue
		}
		for _, g := range rule.Spec.Groups {
			for _, r := range g.Rules {
				if r.Alert != "" {
					out = append(out, r.Alert)
				}
			}
		}
	}
	if len(out) < 10 {
		t.Fatalf("found only %d alerts in manifests/monitoring: %q", len(out), out)
	}
	return out
}

// TestEveryReasonAndAlertHasARunbook: every reason the operator reports for a condition that
// asks for a look (every Reason constant of the planner that conditions.md does not list as
// a healthy one, and every such reason conditions.md lists) and every alert shipped in
// manifests/monitoring is named in docs/runbooks.md's symptoms table or a runbook of
// docs/runbooks-*.md: a new reason or alert cannot go undocumented.
func TestEveryReasonAndAlertHasARunbook(t *testing.T) {
	bad, good := conditionReasons(t)
	want := slices.Clone(bad)
	for _, r := range plannerReasons(t) {
		if !slices.Contains(good, r) {
			want = append(want, r)
		}
	}
	want = append(want, alertNames(t)...)
	var named []string
	for _, p := range runbookPages(t) {
		named = append(named, proseCodeSpans(readDoc(t, p))...)
	}
	slices.Sort(want)
	for _, w := range slices.Compact(want) {
		if !slices.Contains(named, w) {
			t.Errorf("%s is not named in the runbooks: add it to the symptoms table of docs/runbooks.md, with the runbook that says what to do", w)
		}
	}
}

// TestSymptomsTableCoversEveryRunbook: the symptoms table of runbooks.md links every runbook
// (each second-level section of the runbooks-*.md pages), and each of its links leads to a
// heading that exists.
func TestSymptomsTableCoversEveryRunbook(t *testing.T) {
	table := find(t, sections(readDoc(t, "runbooks.md")), "Symptoms")
	links := map[string]bool{}
	for _, line := range strings.Split(table.body, "\n") {
		if !strings.HasPrefix(line, "|") {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			links[m[1]] = true
			if !linkResolves(t, "runbooks.md", m[1]) {
				t.Errorf("the symptoms table links %s, which leads to no heading", m[1])
			}
		}
	}
	for _, page := range runbookPages(t)[1:] {
		for _, s := range sections(readDoc(t, page)) {
			if s.level == 2 && !links[page+"#"+s.anchor] {
				t.Errorf("runbook %q (%s#%s) is not in the symptoms table", s.title, page, s.anchor)
			}
		}
	}
}

// linkResolves: a Markdown link from file leads to a file of docs/ (or an outside URL), and
// to one of its headings when it names one.
func linkResolves(t *testing.T, from, link string) bool {
	t.Helper()
	if strings.Contains(link, "://") {
		return true
	}
	file, anchor, _ := strings.Cut(link, "#")
	if file == "" {
		file = from
	}
	data, err := os.ReadFile(filepath.Join(docsDir, file))
	if err != nil {
		return false
	}
	if anchor == "" {
		return true
	}
	for _, s := range sections(string(data)) {
		if s.anchor == anchor {
			return true
		}
	}
	return false
}

// TestTeardownReasonsMatchThePlanner: the reasons the stuck-deleting runbook lists are the
// ones the finalize hook reports (sync/plan.go; N stands for a count).
func TestTeardownReasonsMatchThePlanner(t *testing.T) {
	src, err := os.ReadFile("../../sync/plan.go")
	if err != nil {
		t.Fatal(err)
	}
	sec := find(t, runbookSections(t), "A cluster stuck deleting")
	n := 0
	for _, line := range strings.Split(sec.body, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || strings.HasPrefix(line, "|---") || strings.TrimSpace(cells[1]) == "reason" {
			continue
		}
		for _, r := range codeSpans(cells[1]) {
			n++
			literal := strconv.Quote(strings.ReplaceAll(r, " N ", " %d "))
			if !strings.Contains(string(src), literal) {
				t.Errorf("the runbook lists the teardown reason %q; sync/plan.go has no %s", r, literal)
			}
		}
	}
	if n < 5 {
		t.Errorf("found %d teardown reasons in the runbook's table, want every step's", n)
	}
}
