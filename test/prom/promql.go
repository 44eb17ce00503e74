// Package prom answers, for the tests, what Prometheus would make of the monitoring we ship:
// which metrics an alert's expression reads (Metrics), and which pods a PodMonitor or a
// scrape_configs job scrapes (scrape.go).
//
// Prometheus's own PromQL parser would do the reading, but its module
// (github.com/prometheus/prometheus) raises grpc, otel and other versions the etcd client and
// server run with; Metrics is a tokenizer for the expressions used here, tested on its own.
package prom

import (
	"slices"
	"unicode"
)

// Metrics returns the metric names an expression selects: identifiers that are not
// functions, aggregations, keywords or label names.
func Metrics(expr string) []string {
	var out []string
	labelLists := map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
	// Keywords, and aggregations, which may take their modifier before their parentheses.
	keywords := map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true,
		"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true, "count": true,
		"count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true}
	isIdent := func(r byte) bool {
		return r == '_' || r == ':' || unicode.IsLetter(rune(r)) || unicode.IsDigit(rune(r))
	}
	skipString := func(i int) int { // index after the string starting at i
		q := expr[i]
		for i++; i < len(expr) && expr[i] != q; i++ {
			if expr[i] == '\\' && q != '`' {
				i++
			}
		}
		return i + 1
	}
	skip := func(i int, open, close byte) int { // index after the matching close
		depth := 0
		for i < len(expr) {
			switch c := expr[i]; {
			case c == '"' || c == '\'' || c == '`':
				i = skipString(i)
				continue
			case c == open:
				depth++
			case c == close:
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '{':
			i = skip(i, '{', '}')
		case c == '[':
			i = skip(i, '[', ']')
		case c == '"' || c == '\'' || c == '`':
			i = skipString(i)
		case c == '$' || unicode.IsDigit(rune(c)) || c == '.':
			// A dashboard variable, a number or a duration.
			for i++; i < len(expr) && (isIdent(expr[i]) || expr[i] == '.'); i++ {
			}
		case isIdent(c):
			j := i
			for ; j < len(expr) && isIdent(expr[j]); j++ {
			}
			word := expr[i:j]
			k := j
			for k < len(expr) && expr[k] == ' ' || k < len(expr) && expr[k] == '\n' {
				k++
			}
			switch {
			case labelLists[word] && k < len(expr) && expr[k] == '(':
				j = skip(k, '(', ')')
			case keywords[word] || k < len(expr) && expr[k] == '(':
				// A keyword, or a function or aggregation: its arguments are read on.
			default:
				if !slices.Contains(out, word) {
					out = append(out, word)
				}
			}
			i = j
		default:
			i++
		}
	}
	return out
}
