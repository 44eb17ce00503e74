package runbooks

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// command is one logical line of a shell block: its words after quote removal and variable
// expansion, the comment that ends it, and whether it runs in the background or pipes.
type command struct {
	line       string
	words      []string
	comment    string
	background bool
	pipe       bool
}

// lines splits a shell block into logical lines: a backslash before the newline continues
// it, and so does a quote left open (a single-quoted JSON over several lines).
func lines(block string) []string {
	var out []string
	var cur strings.Builder
	quote := rune(0)
	rs := []rune(block)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\\' && i+1 < len(rs) && rs[i+1] == '\n':
			cur.WriteString(" ")
			i++
			continue
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (cur.Len() == 0 || strings.ContainsRune(" \t", rs[i-1])):
			// A comment runs to the end of the line, whatever quotes it holds.
			for ; i < len(rs) && rs[i] != '\n'; i++ {
				cur.WriteRune(rs[i])
			}
			i--
			continue
		case r == '\n':
			if s := strings.TrimSpace(cur.String()); s != "" {
				out = append(out, s)
			}
			cur.Reset()
			continue
		}
		cur.WriteRune(r)
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

// parse splits one logical line into words as a POSIX shell would for the commands the
// runbooks use: single quotes literal, double quotes with $VAR, a backslash escaping one
// character, $VAR and ${VAR} expanded by vars, a trailing & and a | noted. It refuses what it
// does not know (command substitution, redirection) rather than guess.
func parse(line string, vars map[string]string) (command, error) {
	c := command{line: line}
	var word strings.Builder
	inWord := false
	end := func() {
		if inWord {
			c.words = append(c.words, word.String())
		}
		word.Reset()
		inWord = false
	}
	rs := []rune(line)
	expand := func(i int) (int, error) {
		j := i + 1
		var name string
		if j < len(rs) && rs[j] == '{' {
			k := slices.Index(rs[j:], '}')
			if k < 0 {
				return 0, fmt.Errorf("unclosed ${ in %q", line)
			}
			name, j = string(rs[j+1:j+k]), j+k+1
		} else {
			for j < len(rs) && (rs[j] == '_' || rs[j] >= 'A' && rs[j] <= 'Z' || rs[j] >= 'a' && rs[j] <= 'z' || rs[j] >= '0' && rs[j] <= '9') {
				j++
			}
			name = string(rs[i+1 : j])
		}
		if name == "" {
			return 0, fmt.Errorf("a $ the test does not expand in %q", line)
		}
		v, ok := vars[name]
		if !ok {
			return 0, fmt.Errorf("$%s is not set before %q", name, line)
		}
		word.WriteString(v)
		inWord = true
		return j - 1, nil
	}
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case r == '#' && !inWord:
			c.comment = strings.TrimSpace(string(rs[i+1:]))
			i = len(rs)
		case r == ' ' || r == '\t' || r == '\n':
			end()
		case r == '\'':
			k := slices.Index(rs[i+1:], '\'')
			if k < 0 {
				return c, fmt.Errorf("unclosed ' in %q", line)
			}
			word.WriteString(string(rs[i+1 : i+1+k]))
			inWord, i = true, i+1+k
		case r == '"':
			inWord = true
			for i++; i < len(rs) && rs[i] != '"'; i++ {
				switch {
				case rs[i] == '\\' && i+1 < len(rs) && strings.ContainsRune(`"\$`+"`", rs[i+1]):
					i++
					word.WriteRune(rs[i])
				case rs[i] == '$':
					j, err := expand(i)
					if err != nil {
						return c, err
					}
					i = j
				case rs[i] == '`':
					return c, fmt.Errorf("command substitution in %q", line)
				default:
					word.WriteRune(rs[i])
				}
			}
			if i == len(rs) {
				return c, fmt.Errorf("unclosed \" in %q", line)
			}
		case r == '\\' && i+1 < len(rs):
			i++
			word.WriteRune(rs[i])
			inWord = true
		case r == '$':
			if i+1 < len(rs) && rs[i+1] == '(' {
				return c, fmt.Errorf("command substitution in %q", line)
			}
			j, err := expand(i)
			if err != nil {
				return c, err
			}
			i = j
		case r == '|':
			end()
			c.pipe = true
			c.words = append(c.words, "|")
		case r == '&' && strings.TrimSpace(string(rs[i+1:])) == "" || r == '&' && strings.HasPrefix(strings.TrimSpace(string(rs[i+1:])), "#"):
			end()
			c.background = true
		case r == '<' || r == '>' || r == ';' || r == '`' || r == '&':
			return c, fmt.Errorf("%q: the test runs no redirections, lists or substitutions", line)
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	end()
	return c, nil
}

func TestParse(t *testing.T) {
	vars := map[string]string{"PEER": "http://p:2380"}
	for _, tc := range []struct {
		story string
		line  string
		want  []string
		bg    bool
	}{
		{"plain words", "etcdctl --endpoints=http://127.0.0.1:2379 endpoint status -w table", []string{"etcdctl", "--endpoints=http://127.0.0.1:2379", "endpoint", "status", "-w", "table"}, false},
		{"a variable, unquoted and in double quotes", `x --initial-cluster etcd-1=$PEER "${PEER}/"`, []string{"x", "--initial-cluster", "etcd-1=http://p:2380", "http://p:2380/"}, false},
		{"single quotes keep everything, an empty word stays", `get --prefix '<the token>' ""`, []string{"get", "--prefix", "<the token>", ""}, false},
		{"a background job with a comment", "kubectl port-forward pod/etcd-1 12379:2379 &   # forward", []string{"kubectl", "port-forward", "pod/etcd-1", "12379:2379"}, true},
		{"JSON over several lines in single quotes", "run --overrides='\n{\"a\": [1,\n 2]}'", []string{"run", "--overrides=\n{\"a\": [1,\n 2]}"}, false},
	} {
		c, err := parse(tc.line, vars)
		if err != nil {
			t.Errorf("%s: %v", tc.story, err)
			continue
		}
		if !slices.Equal(c.words, tc.want) || c.background != tc.bg {
			t.Errorf("%s: %q (background %v), want %q (%v)", tc.story, c.words, c.background, tc.want, tc.bg)
		}
	}
	for _, bad := range []string{"echo $(date)", "cat > x", "a; b", "echo $UNSET"} {
		if _, err := parse(bad, vars); err == nil {
			t.Errorf("%q parsed; the test must refuse what it cannot run as a shell would", bad)
		}
	}
}

func TestLines(t *testing.T) {
	got := lines("a \\\n  b  # c 'd\n\nx='\n{\n}'\n")
	want := []string{"a    b  # c 'd", "x='\n{\n}'"}
	if !slices.Equal(got, want) {
		t.Errorf("lines = %q, want %q", got, want)
	}
}
