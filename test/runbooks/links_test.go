package runbooks

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// maxPage is the most a page of docs/ may hold: past it a page is no longer read through, and
// a newcomer cannot walk it.
const maxPage = 25 * 1024

// repoRoot is the repository's root, from this package's directory.
const repoRoot = "../.."

var (
	// docMention is a path to a Markdown file with an anchor (<file>.md#<anchor>), as prose,
	// a code span, a Go string or a comment names it.
	docMention = regexp.MustCompile(`(?:^|[^\w./:-])((?:\.\./)*[\w./-]*\.md)#([\w-]+)`)
	// docsPath is a file of docs/ named from the root, anchored or not.
	docsPath = regexp.MustCompile(`\bdocs/[\w-]+\.md\b`)
	// titleRef is a reference by title, "(docs/<page>.md, <title>)", the title quoted or not
	// (a Go string escapes the quotes).
	titleRef = regexp.MustCompile(`\((docs/[\w-]+\.md), \\?"?([^)"\\]+)\\?"?\)`)
	// titleIn is the other way prose refers by title: "<title>" in `docs/<page>.md`.
	titleIn = regexp.MustCompile("\"([^\"]+)\" in `(docs/[\\w-]+\\.md)`")
)

// repoFiles calls fn with the path and text of every file of the repository that can name a
// doc: Markdown, Go, YAML, templates and golden text.
func repoFiles(t *testing.T, fn func(path, text string)) {
	t.Helper()
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == ".git" || d.Name() == "node_modules" {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".md", ".go", ".yaml", ".yml", ".tpl", ".txt":
		default:
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fn(path, string(data))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// anchorsOf are the anchors GitHub gives the headings of a Markdown file, memoised by path.
type anchorsOf map[string]map[string]bool

func (a anchorsOf) get(path string) (map[string]bool, bool) {
	path = filepath.Clean(path)
	if got, ok := a[path]; ok {
		return got, got != nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		a[path] = nil
		return nil, false
	}
	got := map[string]bool{}
	for _, s := range sections(string(data)) {
		if s.level > 0 {
			got[s.anchor] = true
		}
	}
	a[path] = got
	return got, true
}

// resolve finds the file a relative reference names: from the referring file's directory,
// or from the root (Go code and prose name docs from the root).
func resolve(from, target string) (string, bool) {
	for _, p := range []string{filepath.Join(filepath.Dir(from), target), filepath.Join(repoRoot, target)} {
		if _, err := os.Stat(p); err == nil {
			return p, true
		}
	}
	return "", false
}

// withoutFences is a Markdown file with its fenced blocks blanked: a link in a code block is
// code.
func withoutFences(doc string) string {
	var out []string
	inFence := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			out = append(out, "")
			continue
		}
		if inFence {
			line = ""
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

// TestDocLinksResolve: every relative Markdown link in the repository leads to a file that
// exists, and to a heading of it when it names one; so does every anchored file that a
// Go string, a comment, a manifest or prose names, every page of docs/ named, and every
// reference by title: moving or renaming a section must not
// strand a link a reader, an alert or a condition message gives. Anchors follow GitHub's
// rules (lower case, punctuation dropped, spaces to hyphens, -1, -2 for repeats).
func TestDocLinksResolve(t *testing.T) {
	anchors := anchorsOf{}
	checkAnchor := func(where, file, anchor string) {
		t.Helper()
		if !strings.HasSuffix(file, ".md") {
			return
		}
		if got, ok := anchors.get(file); !ok || !got[anchor] {
			t.Errorf("%s: %s has no heading #%s", where, file, anchor)
		}
	}
	links, mentions, titles := 0, 0, 0
	repoFiles(t, func(path, text string) {
		if strings.HasSuffix(path, ".md") {
			for _, m := range mdLink.FindAllStringSubmatch(withoutFences(text), -1) {
				target := m[1]
				if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				file, anchor, _ := strings.Cut(target, "#")
				full := path
				if file != "" {
					full = filepath.Join(filepath.Dir(path), file)
					if _, err := os.Stat(full); err != nil {
						t.Errorf("%s links %s, which does not exist", path, target)
						continue
					}
				}
				if anchor != "" {
					checkAnchor(path+" links "+target, full, anchor)
				}
			}
		}
		for _, m := range docMention.FindAllStringSubmatch(text, -1) {
			mentions++
			file, ok := resolve(path, m[1])
			if !ok {
				t.Errorf("%s names %s#%s: no such file", path, m[1], m[2])
				continue
			}
			checkAnchor(path+" names "+m[1]+"#"+m[2], file, m[2])
		}
		for _, m := range docsPath.FindAllString(text, -1) {
			mentions++
			if _, err := os.Stat(filepath.Join(repoRoot, m)); err != nil {
				t.Errorf("%s names %s, which does not exist", path, m)
			}
		}
		// Wrapped comments and YAML fold lines: join them before looking for a title.
		flat := strings.Join(strings.Fields(strings.NewReplacer("//", " ", "#", " ").Replace(text)), " ")
		for _, m := range titleRef.FindAllStringSubmatch(flat, -1) {
			titles++
			if !hasTitle(t, filepath.Join(repoRoot, m[1]), m[2]) {
				t.Errorf("%s refers to %q in %s, which is no heading of it", path, m[2], m[1])
			}
		}
		for _, m := range titleIn.FindAllStringSubmatch(flat, -1) {
			titles++
			if !hasTitle(t, filepath.Join(repoRoot, m[2]), m[1]) {
				t.Errorf("%s refers to %q in %s, which is no heading of it", path, m[1], m[2])
			}
		}
	})
	t.Logf("%d links, %d files named, %d references by title", links, mentions, titles)
	if links < 100 || mentions < 50 || titles < 10 {
		t.Errorf("found %d links, %d files named and %d references by title: the search no longer finds them", links, mentions, titles)
	}
}

// hasTitle: the Markdown file has a heading of that title, in any case.
func hasTitle(t *testing.T, file, title string) bool {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		return false
	}
	for _, s := range sections(string(data)) {
		if s.level > 0 && strings.EqualFold(s.title, strings.TrimSpace(title)) {
			return true
		}
	}
	return false
}

// TestDocPagesAreShort: no page of docs/ is over 25 KB.
func TestDocPagesAreShort(t *testing.T) {
	err := filepath.WalkDir(docsDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".md" {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Size() > maxPage {
			t.Errorf("%s is %d bytes, over %d: split it into an index and topic pages", path, info.Size(), maxPage)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestKeptAnchorsResolve: every anchor the split pages had (testdata/kept-anchors.txt) is
// still a heading of the same page, the index it became: links people have kept from before
// the split still lead to the section, or to a line that says where it went.
func TestKeptAnchorsResolve(t *testing.T) {
	data, err := os.ReadFile("testdata/kept-anchors.txt")
	if err != nil {
		t.Fatal(err)
	}
	anchors := anchorsOf{}
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		n++
		file, anchor, _ := strings.Cut(line, "#")
		if got, ok := anchors.get(filepath.Join(repoRoot, file)); !ok || !got[anchor] {
			t.Errorf("%s: a kept link no longer leads anywhere: keep the heading in %s, with a line saying where its section went", line, file)
		}
	}
	if n < 100 {
		t.Errorf("testdata/kept-anchors.txt lists %d anchors", n)
	}
}

// TestReadmeLayoutNamesEveryPackage: the README's layout table names every directory that
// holds Go code (or a directory above it, as `cmd/hook-server/` covers its hookserver), so that
// a newcomer finds each package there. The tools' own modules and testdata are left out.
func TestReadmeLayoutNamesEveryPackage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	layout := readme[strings.Index(readme, "## Layout"):]
	named := func(dir string) bool {
		for d := dir; d != "."; d = filepath.Dir(d) {
			if strings.Contains(layout, "`"+d+"`") || strings.Contains(layout, "`"+d+"/`") {
				return true
			}
		}
		return false
	}
	dirs := map[string]bool{}
	err = filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repoRoot, path)
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" || rel == "tools") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") {
			dirs[filepath.Dir(rel)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 20 {
		t.Fatalf("found %d directories of Go code: the walk is broken", len(dirs))
	}
	for dir := range dirs {
		if !named(dir) {
			t.Errorf("README.md's layout table does not name %s", dir)
		}
	}
}
