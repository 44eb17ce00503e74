package manifests

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"sigs.k8s.io/yaml"

	"etcdops.dev/etcdops/test/etcdtest"
)

// ruleFiles are the PrometheusRules and the Prometheus rule files their specs are written to
// for promtool, under the names the unit tests in monitoring/tests load.
var ruleFiles = map[string]string{
	"monitoring/prometheusrule.yaml":         "prometheusrule.rules.yaml",
	"monitoring/members-prometheusrule.yaml": "members-prometheusrule.rules.yaml",
	"monitoring/backup-prometheusrule.yaml":  "backup-prometheusrule.rules.yaml",
}

// promtoolTests is the part of a promtool unit test file the coverage check reads.
type promtoolTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		Name          string        `json:"name"`
		InputSeries   []inputSeries `json:"input_series"`
		AlertRuleTest []struct {
			AlertName string     `json:"alertname"`
			ExpAlerts []expAlert `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

type inputSeries struct {
	Series string `json:"series"`
}

type expAlert struct {
	ExpLabels map[string]string `json:"exp_labels"`
}

// alertRules reads a PrometheusRule: its spec as written, and each alert's expression.
func alertRules(t *testing.T, file string) (spec map[string]any, alerts map[string]string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Kind string         `json:"kind"`
		Spec map[string]any `json:"spec"`
	}
	var typed struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
					Expr  string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &raw); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if err := yaml.Unmarshal(data, &typed); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if raw.Kind != "PrometheusRule" {
		t.Fatalf("%s is a %s", file, raw.Kind)
	}
	alerts = map[string]string{}
	for _, g := range typed.Spec.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = r.Expr
		}
	}
	return raw.Spec, alerts
}

// Every alert rule passes promtool check rules, and its unit test in monitoring/tests
// passes promtool test rules. Each alert must be tested firing for a cluster named "broken"
// while a cluster named "healthy", with series of its own, stays quiet; and each is in the
// alerts table of docs/monitoring.md.
func TestAlertRules(t *testing.T) {
	promtool := tool(t, "promtool")
	dir := t.TempDir()
	docs, err := os.ReadFile("../docs/monitoring.md")
	if err != nil {
		t.Fatal(err)
	}

	alerts := map[string]bool{} // alert → tested both ways
	// An alert on the hook itself (EtcdopsHookDown) names no cluster: it is tested both ways
	// when one test fires it and another, with series of its own, keeps it quiet.
	firesUnnamed, quiet := map[string]bool{}, map[string]bool{}
	var written []string
	for source, rules := range ruleFiles {
		spec, names := alertRules(t, source)
		data, err := yaml.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, rules), data, 0o600); err != nil {
			t.Fatal(err)
		}
		written = append(written, rules)
		for name := range names {
			alerts[name] = false
			if !strings.Contains(string(docs), "| `"+name+"` |") {
				t.Errorf("alert %s (%s) is not in the alerts table of docs/monitoring.md", name, source)
			}
		}
	}
	run(t, dir, nil, promtool, append([]string{"check", "rules", "--lint-fatal"}, written...)...)

	testFiles, err := filepath.Glob("monitoring/tests/*.test.yaml")
	if err != nil || len(testFiles) == 0 {
		t.Fatalf("no unit tests in monitoring/tests (%v)", err)
	}
	var copied []string
	for _, f := range testFiles {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var tests promtoolTests
		if err := yaml.Unmarshal(data, &tests); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, rf := range tests.RuleFiles {
			if !slices.Contains(written, rf) {
				t.Errorf("%s loads %s, which is none of the PrometheusRules' rule files %v", f, rf, written)
			}
		}
		for _, tc := range tests.Tests {
			healthy := slices.ContainsFunc(tc.InputSeries, func(s inputSeries) bool {
				return strings.Contains(s.Series, `name="healthy"`)
			})
			silent := map[string]bool{}
			for _, a := range tc.AlertRuleTest {
				if _, ok := alerts[a.AlertName]; !ok {
					t.Errorf("%s, %q: no alert %s", f, tc.Name, a.AlertName)
					continue
				}
				fires := len(a.ExpAlerts) > 0 && !slices.ContainsFunc(a.ExpAlerts, func(e expAlert) bool {
					return e.ExpLabels["name"] != "broken"
				})
				if fires && healthy {
					alerts[a.AlertName] = true
				}
				if len(a.ExpAlerts) > 0 && !slices.ContainsFunc(a.ExpAlerts, func(e expAlert) bool { return e.ExpLabels["name"] != "" }) {
					firesUnnamed[a.AlertName] = true
				}
				if _, seen := silent[a.AlertName]; !seen {
					silent[a.AlertName] = true
				}
				silent[a.AlertName] = silent[a.AlertName] && len(a.ExpAlerts) == 0
			}
			for name, s := range silent {
				quiet[name] = quiet[name] || s && len(tc.InputSeries) > 0
			}
		}
		copied = append(copied, filepath.Base(f))
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for name, tested := range alerts {
		if !tested && !(firesUnnamed[name] && quiet[name]) {
			t.Errorf("alert %s has no unit test that fires it for cluster broken while cluster healthy has series", name)
		}
	}
	run(t, dir, nil, promtool, append([]string{"test", "rules"}, copied...)...)
}

// The scrape configuration for Prometheus without the operator is one Prometheus accepts.
func TestScrapeConfig(t *testing.T) {
	promtool := tool(t, "promtool")
	abs, err := filepath.Abs("monitoring/scrape-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	run(t, "", nil, promtool, "check", "config", "--syntax-only", abs)
}

// memberSelector finds the metrics an expression on etcd members reads: every one is
// selected with job="etcd", as podmonitor.yaml and scrape-config.yaml label them.
var memberSelector = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\{job="etcd"`)

// Every metric the member alerts and the dashboard's member panels read is one a real etcd
// member serves on its metrics port, with --metrics=extensive as docs/monitoring.md asks.
func TestMemberMonitoringReadsEtcdMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	metricsURL := etcdtest.FreeURL(t)
	client := etcdtest.FreeURL(t)
	cfg := etcdtest.Config("metrics-test", t.TempDir(), etcdtest.FreeURL(t), client)
	cfg.ListenMetricsUrls = []url.URL{metricsURL}
	cfg.Metrics = "extensive"
	etcdtest.Start(t, cfg)

	// A write and a read, so the per-request series exist.
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{client.String()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}

	served := map[string]bool{"up": true} // up is Prometheus's own, per target
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL.String()+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(nil, 1<<20)
	for lines.Scan() {
		line := lines.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		served[strings.FieldsFunc(line, func(r rune) bool { return r == '{' || r == ' ' })[0]] = true
	}
	if err := lines.Err(); err != nil {
		t.Fatal(err)
	}

	exprs := map[string]string{}
	_, alerts := alertRules(t, "monitoring/members-prometheusrule.yaml")
	for name, expr := range alerts {
		exprs["alert "+name] = expr
	}
	for title, expr := range memberPanels(t) {
		exprs["panel "+title] = expr
	}
	for where, expr := range exprs {
		names := memberSelector.FindAllStringSubmatch(expr, -1)
		if len(names) == 0 {
			t.Errorf("%s selects no metric with job=\"etcd\": %s", where, expr)
		}
		for _, n := range names {
			if !served[n[1]] {
				t.Errorf("%s reads %s, which etcd does not serve", where, n[1])
			}
		}
	}
}

// memberRow is the dashboard row whose panels read etcd's own metrics; the panels before it
// read the hook's (hooks/monitoring_test.go checks those).
const memberRow = "etcd members"

// memberPanels returns the queries of the dashboard's panels below the member row, by panel
// title and query.
func memberPanels(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile("monitoring/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	exprs := map[string]string{}
	below := false
	for _, p := range dash.Panels {
		if p.Type == "row" {
			below = p.Title == memberRow
			continue
		}
		if !below {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs[p.Title+" "+tg.RefID] = tg.Expr
		}
	}
	if len(exprs) == 0 {
		t.Fatalf("the dashboard has no panels below the row %q", memberRow)
	}
	return exprs
}
