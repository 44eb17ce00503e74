// Package runbooks tests that the docs' runbooks can be followed as written: the helper pods
// they show pass the restricted Pod Security level and run as the etcd pods do, the quorum
// loss steps run against real etcd servers of each supported release, and every reason and
// alert the operator can raise leads to a runbook. Everything is read from the docs
// themselves, so a changed runbook changes what is checked and run. It also holds the docs
// together: every link and reference into them, from the docs, the code and the manifests,
// leads to a page and a heading that exist, and no page outgrows 25 KB.
package runbooks

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// docsDir is the repository's docs/, from this package's directory.
const docsDir = "../../docs"

// section is a heading of a Markdown file and what follows it up to the next heading of any
// level.
type section struct {
	level  int
	title  string
	anchor string
	body   string
	blocks []fence
}

// fence is a fenced code block: its info string ("sh", "yaml") and its text.
type fence struct {
	lang, text string
}

func readDoc(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(docsDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// sections splits a Markdown file at its headings. Text before the first heading is a
// section of level 0. Headings inside fenced blocks are code, not headings.
func sections(doc string) []section {
	out := []section{{}}
	seen := map[string]int{}
	var inFence bool
	var lang, indent string
	var code []string
	for _, line := range strings.SplitAfter(doc, "\n") {
		cur := &out[len(out)-1]
		trimmed := strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(strings.TrimSpace(trimmed), "```"):
			if inFence {
				cur.blocks = append(cur.blocks, fence{lang: lang, text: strings.Join(code, "")})
				inFence, code = false, nil
			} else {
				inFence, lang = true, strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(trimmed), "```"))
				indent = trimmed[:len(trimmed)-len(strings.TrimLeft(trimmed, " "))]
			}
			cur.body += line
		case inFence:
			// A block inside a list item is indented as the item is.
			code = append(code, strings.TrimPrefix(line, indent))
			cur.body += line
		case strings.HasPrefix(trimmed, "#"):
			level := len(trimmed) - len(strings.TrimLeft(trimmed, "#"))
			title := strings.TrimSpace(trimmed[level:])
			a := slug(title)
			if n := seen[a]; n > 0 {
				seen[a]++
				a += "-" + strconv.Itoa(n)
			} else {
				seen[a] = 1
			}
			out = append(out, section{level: level, title: title, anchor: a})
		default:
			cur.body += line
		}
	}
	return out
}

var slugDrop = regexp.MustCompile(`[^\p{L}\p{N} _-]`)

// slug is the anchor GitHub gives a heading: lower case, punctuation (backquotes, dots,
// commas, parentheses) dropped, spaces turned into hyphens.
func slug(title string) string {
	s := slugDrop.ReplaceAllString(strings.ToLower(title), "")
	return strings.ReplaceAll(s, " ", "-")
}

// find returns the section whose title is title, failing the test when there is none: a
// renamed heading must be renamed here too.
func find(t *testing.T, secs []section, title string) section {
	t.Helper()
	for _, s := range secs {
		if s.title == title {
			return s
		}
	}
	t.Fatalf("the runbooks have no heading %q", title)
	return section{}
}

// runbookPages are the runbooks' pages: runbooks.md, the index with the symptoms table, then
// runbooks-<topic>.md, each a group of runbooks.
func runbookPages(t *testing.T) []string {
	t.Helper()
	topics, err := filepath.Glob(filepath.Join(docsDir, "runbooks-*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(topics) == 0 {
		t.Fatalf("no runbooks-*.md in %s", docsDir)
	}
	out := []string{"runbooks.md"}
	for _, p := range topics {
		out = append(out, filepath.Base(p))
	}
	return out
}

// runbookSections are the sections of the runbooks-<topic>.md pages, page after page (the
// index only points to them).
func runbookSections(t *testing.T) []section {
	t.Helper()
	var out []section
	for _, p := range runbookPages(t)[1:] {
		out = append(out, sections(readDoc(t, p))...)
	}
	return out
}
