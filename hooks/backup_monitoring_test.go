package hooks_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"etcdops.dev/etcdops/hooks"
	"etcdops.dev/etcdops/test/prom"
)

// TestBackupAlertsReadServedMetrics: every hook metric the backup alerts
// (manifests/monitoring/backup-prometheusrule.yaml) read is one the hook serves after a sync of
// a cluster restored from a backup, backed up and drilled, and docs/monitoring.md lists it.
func TestBackupAlertsReadServedMetrics(t *testing.T) {
	var req map[string]any
	if err := json.Unmarshal([]byte(fixture(t, "steady-3")), &req); err != nil {
		t.Fatal(err)
	}
	parent := req["parent"].(map[string]any)
	dest := map[string]any{"s3": map[string]any{"endpoint": "https://s3.example.test", "bucket": "backups", "credentialsSecret": "s3"}}
	spec := parent["spec"].(map[string]any)
	spec["backup"] = map[string]any{"schedule": "0 */6 * * *", "destination": dest, "verify": map[string]any{"schedule": "@daily"}}
	spec["bootstrap"] = map[string]any{"fromBackup": map[string]any{"name": "latest", "s3": dest["s3"]}}
	status := parent["status"].(map[string]any)
	status["restoredFrom"], status["restoredRevision"], status["restoreDuration"] = "latest", 42, "2m10s"
	status["backup"] = map[string]any{
		"lastSuccessfulTime": "2026-11-29T12:00:00Z",
		"lastSuccessful":     map[string]any{"object": "s3://backups/default/etcd/x.db", "revision": 42, "size": 1, "time": "2026-11-29T12:00:00Z"},
		"lastDrill":          map[string]any{"job": "etcd-drill-x", "time": "2026-11-29T12:05:00Z", "result": "Passed", "restoreDuration": "14s"},
	}
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, hooks.Deps{Etcd: recorded(t, "steady-3")})
	if code, out := post(t, srv, "/sync", string(body)); code != 200 {
		t.Fatalf("%d %s", code, out)
	}
	served := scrape(t, metricsText(t, srv))
	raw, err := os.ReadFile("../manifests/monitoring/backup-prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rule prometheusRule
	if err := yaml.UnmarshalStrict(raw, &rule); err != nil {
		t.Fatalf("backup-prometheusrule.yaml: %v", err)
	}
	docs, err := os.ReadFile("../docs/monitoring.md")
	if err != nil {
		t.Fatal(err)
	}
	read := 0
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			for _, name := range prom.Metrics(r.Expr) {
				if !strings.HasPrefix(name, "etcdops_cluster_") {
					continue // the continuous backup's own: TestEveryAlertIsScraped
				}
				read++
				if served[name] == nil {
					t.Errorf("%s read by %s: the hook serves no such metric", name, r.Alert)
				}
				if !strings.Contains(string(docs), "`"+name) {
					t.Errorf("%s read by %s: docs/monitoring.md does not list it", name, r.Alert)
				}
			}
		}
	}
	if read < 5 {
		t.Errorf("the backup alerts read %d of the hook's metrics", read)
	}
}
