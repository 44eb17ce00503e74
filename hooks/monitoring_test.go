package hooks_test

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"etcdops.dev/etcdops/hooks"
	"etcdops.dev/etcdops/test/prom"
)

// The alerts and the dashboard in manifests/monitoring, and docs/monitoring.md, must speak of
// the metrics the hook serves (prom.Metrics reads them off the expressions).

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
		names := prom.Metrics(expr)
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
		// up is Prometheus's own, per target: EtcdopsHookDown reads it of the hook's scrape.
		if served[name] == nil && name != "up" {
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
