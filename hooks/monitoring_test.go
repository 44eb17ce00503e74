package hooks_test

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode"

	"sigs.k8s.io/yaml"

	"etcdops.dev/etcdops/hooks"
)

// The alerts and the dashboard in manifests/monitoring, and docs/monitoring.md, must speak of
// the metrics the hook serves. Prometheus's own PromQL parser would do the reading, but its
// module (github.com/prometheus/prometheus) raises grpc, otel and other versions the etcd
// client and server run with; promqlMetrics below is a tokenizer for the expressions used
// here, tested on its own.

// promqlMetrics returns the metric names an expression selects: identifiers that are not
// functions, aggregations, keywords or label names.
func promqlMetrics(expr string) []string {
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

func TestPromqlMetrics(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`sum by (job, instance) (rate(http_requests_total{code=~"5..", path!="/by (x)"}[5m] offset 1h))`, []string{"http_requests_total"}},
		{`a / on (namespace) group_left (ordinal) b > 0.8 and on(x) c == bool 1e3`, []string{"a", "b", "c"}},
		{"time() - max without (instance) (last_seen_seconds)\n  > 300", []string{"last_seen_seconds"}},
		{`max(etcdops_x{namespace="$namespace"}) unless histogram_quantile(0.9, y_bucket[$__rate_interval])`, []string{"etcdops_x", "y_bucket"}},
		{`sum(x) by (le) or vector(0)`, []string{"x"}},
		{`count_values("version", build_info) * -1`, []string{"build_info"}},
		{`rec:rule:sum`, []string{"rec:rule:sum"}},
	} {
		if got := promqlMetrics(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// prometheusRule is the part of a PrometheusRule the alerts use; unknown fields are errors.
type prometheusRule struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// dashboard is the part of a Grafana dashboard that holds queries.
type dashboard struct {
	Panels []struct {
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query string `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// labelValues reads Grafana's label_values(selector, label) variable query.
var labelValues = regexp.MustCompile(`^label_values\((.*),\s*[a-zA-Z_]+\)$`)

// TestMonitoringSpeaksOfServedMetrics: every metric a hook alert or a dashboard query above
// the etcd members row reads is one the hook serves after a sync; every alert and every per-cluster metric is in
// docs/monitoring.md.
func TestMonitoringSpeaksOfServedMetrics(t *testing.T) {
	srv := newServer(t, hooks.Deps{Etcd: recorded(t, "steady-3")})
	if code, body := post(t, srv, "/sync", fixture(t, "steady-3")); code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	served := scrape(t, metricsText(t, srv))

	used := map[string][]string{} // metric → where
	use := func(where, expr string) {
		names := promqlMetrics(expr)
		if len(names) == 0 {
			t.Errorf("%s: %q reads no metric", where, expr)
		}
		for _, n := range names {
			used[n] = append(used[n], where)
		}
	}
	raw, err := os.ReadFile("../manifests/monitoring/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rule prometheusRule
	if err := yaml.UnmarshalStrict(raw, &rule); err != nil {
		t.Fatalf("prometheusrule.yaml: %v", err)
	}
	if rule.APIVersion != "monitoring.coreos.com/v1" || rule.Kind != "PrometheusRule" || len(rule.Spec.Groups) == 0 {
		t.Fatalf("prometheusrule.yaml is a %s %s with %d groups", rule.APIVersion, rule.Kind, len(rule.Spec.Groups))
	}
	docs, err := os.ReadFile("../docs/monitoring.md")
	if err != nil {
		t.Fatal(err)
	}
	var alerts []string
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			use("alert "+r.Alert, r.Expr)
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("alert %s has no severity or summary", r.Alert)
			}
			if !strings.Contains(string(docs), "| `"+r.Alert+"` |") {
				t.Errorf("alert %s is not in the alerts table of docs/monitoring.md", r.Alert)
			}
		}
	}
	for _, want := range []string{"EtcdClusterQuorumAtRisk", "EtcdClusterNoLeader", "EtcdClusterStepOverdue", "EtcdClusterNoSpaceSoon", "EtcdClusterMemberJobFailing"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no alert %s", want)
		}
	}

	raw, err = os.ReadFile("../manifests/monitoring/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash dashboard
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	for _, p := range dash.Panels {
		// The member row's panels read etcd's own metrics: manifests' tests check those
		// against a real etcd.
		if p.Type == "row" && p.Title == "etcd members" {
			break
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			use("panel "+p.Title, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Query)
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(selector, label)", v.Name, v.Query)
			continue
		}
		use("variable "+v.Name, m[1])
	}

	for name, where := range used {
		if served[name] == nil {
			t.Errorf("%s read by %s: the hook serves no such metric", name, strings.Join(where, ", "))
		}
	}
	var ours []string
	for name := range served {
		if strings.HasPrefix(name, "etcdops_") {
			ours = append(ours, name)
		}
	}
	sort.Strings(ours)
	for _, name := range ours {
		if !strings.Contains(string(docs), "`"+name) {
			t.Errorf("%s is served but docs/monitoring.md does not list it", name)
		}
	}
	if len(used) < 10 {
		t.Errorf("the alerts and the dashboard read only %d metrics: %v", len(used), used)
	}
}
