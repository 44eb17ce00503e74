package hooks_test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	gosync "sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/hooks"
)

// clock is a hook clock the test moves.
type clock struct {
	mu  gosync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// recorded answers every observation with a fixture's recorded etcd snapshot: the fixtures
// are what the hook saw of real etcd (test/fixtures), and no etcd runs behind their pod IPs.
func recorded(t *testing.T, fixture string) hooks.Observer {
	t.Helper()
	raw, err := os.ReadFile("../test/fixtures/" + fixture + ".etcd.json")
	if err != nil {
		t.Fatal(err)
	}
	var snap etcdstate.Snapshot
	if err := json.Unmarshal(raw, &snap); err != nil {
		t.Fatal(err)
	}
	return hooks.ObserverFunc(func(context.Context, etcdstate.Request) etcdstate.Snapshot { return snap })
}

func fixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../test/fixtures/" + name + ".json")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// scrape parses the hook's /metrics.
func scrape(t *testing.T, text string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return fams
}

// value is the gauge of the family whose labels include all of want; ok false when none.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		return m.GetGauge().GetValue(), true
	}
	return 0, false
}

// TestClusterMetrics: a sync of a steady cluster of three reports its state per cluster; the
// state goes two minutes after the last sync, the last sync's time an hour after, and both
// as soon as the cluster is finalized.
func TestClusterMetrics(t *testing.T) {
	// The fixtures were answered at 12:10 (test/fixtures/golden_test.go).
	synced := time.Date(2026, 11, 29, 12, 10, 0, 0, time.UTC)
	clk := &clock{now: synced}
	srv := newServer(t, hooks.Deps{Etcd: recorded(t, "steady-3"), Now: clk.Now})
	if code, body := post(t, srv, "/sync", fixture(t, "steady-3")); code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	clk.add(30 * time.Second)
	fams := scrape(t, metricsText(t, srv))
	cluster := map[string]string{"namespace": "default", "name": "etcd"}
	with := func(k, v string) map[string]string {
		m := map[string]string{k: v}
		for a, b := range cluster {
			m[a] = b
		}
		return m
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"etcdops_cluster_size", cluster, 3},
		{"etcdops_cluster_voters", cluster, 3},
		{"etcdops_cluster_healthy_voters", cluster, 3},
		{"etcdops_cluster_quorum_size", cluster, 2},
		{"etcdops_cluster_learners", cluster, 0},
		{"etcdops_cluster_leader_known", cluster, 1},
		{"etcdops_cluster_action", with("action", "Steady"), 1},
		{"etcdops_cluster_action", with("action", "ReplacePod"), 0},
		{"etcdops_cluster_member_job_failures", cluster, 0},
		{"etcdops_cluster_db_quota_bytes", cluster, 4 << 30},
		{"etcdops_member_db_size_bytes", with("ordinal", "2"), 2101248},
		{"etcdops_cluster_alarms", with("alarm", "NOSPACE"), 0},
		{"etcdops_cluster_condition", with("type", "Degraded"), 1},
		{"etcdops_cluster_last_sync_timestamp_seconds", cluster, float64(synced.Unix())},
	} {
		if got, ok := value(fams, tc.name, tc.labels); !ok || got != tc.want {
			t.Errorf("%s%v = %v (present %v), want %v", tc.name, tc.labels, got, ok, tc.want)
		}
	}
	if _, ok := value(fams, "etcdops_cluster_condition", map[string]string{"type": "Degraded", "status": "False", "reason": "Healthy"}); !ok {
		t.Errorf("the Degraded series does not carry status False, reason Healthy:\n%s", grep(metricsText(t, srv), "etcdops_cluster_condition"))
	}
	// The action's age is read when scraped, not when synced.
	if got, _ := value(fams, "etcdops_cluster_action_seconds", cluster); got < 30 {
		t.Errorf("etcdops_cluster_action_seconds %v, want at least the 30s since the sync", got)
	}

	clk.add(2 * time.Minute)
	fams = scrape(t, metricsText(t, srv))
	if _, ok := value(fams, "etcdops_cluster_healthy_voters", cluster); ok {
		t.Error("a cluster not synced for 2m30s still reports its state")
	}
	if _, ok := value(fams, "etcdops_cluster_last_sync_timestamp_seconds", cluster); !ok {
		t.Error("the time of the last sync went with the state")
	}
	clk.add(time.Hour)
	if m := metricsText(t, srv); strings.Contains(m, `name="etcd"`) {
		t.Errorf("a cluster not synced for an hour is still reported:\n%s", grep(m, `name="etcd"`))
	}

	// Finalized: gone at once.
	post(t, srv, "/sync", fixture(t, "steady-3"))
	if m := metricsText(t, srv); !strings.Contains(m, "etcdops_cluster_size{") {
		t.Fatal("synced again, and not reported")
	}
	deleted := `{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"default","uid":"u-1","deletionTimestamp":"2026-11-29T12:00:00Z"},"spec":{"size":3}}`
	if code, body := post(t, srv, "/finalize", syncBody(deleted, emptyChildren, `{}`)); code != 200 || !strings.Contains(string(body), `"finalized":true`) {
		t.Fatalf("finalize: %d %s", code, body)
	}
	if m := metricsText(t, srv); strings.Contains(m, `name="etcd"`) {
		t.Errorf("a finalized cluster is still reported:\n%s", grep(m, `name="etcd"`))
	}
}
