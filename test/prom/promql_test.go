package prom

import (
	"slices"
	"testing"
)

func TestMetrics(t *testing.T) {
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
		if got := Metrics(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.expr, got, tc.want)
		}
	}
}
