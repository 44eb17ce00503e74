package prom

import (
	"slices"
	"testing"
)

func TestPodMonitorScrapes(t *testing.T) {
	monitor := func(y string) PodMonitor {
		m, err := DecodePodMonitor([]byte(y))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	own := monitor(`
metadata: {name: hook, namespace: ops}
spec:
  selector: {matchLabels: {app: hook}}
  podMetricsEndpoints:
  - port: http
    honorLabels: true
    relabelings: [{targetLabel: job, replacement: hook}]
`)
	anyNS := monitor(`
metadata: {name: members, namespace: ops}
spec:
  namespaceSelector: {any: true}
  selector: {matchExpressions: [{key: cluster, operator: Exists}]}
  podMetricsEndpoints: [{port: metrics}]
`)
	for _, tc := range []struct {
		story string
		m     PodMonitor
		pod   Pod
		want  []Scrape
	}{
		{"the hook's pod, in the monitor's namespace", own, Pod{"ops", map[string]string{"app": "hook"}, []string{"http"}}, []Scrape{{"hook", true}}},
		{"without a namespaceSelector, only the monitor's own namespace", own, Pod{"apps", map[string]string{"app": "hook"}, []string{"http"}}, nil},
		{"a pod without the port", own, Pod{"ops", map[string]string{"app": "hook"}, []string{"metrics"}}, nil},
		{"a pod the selector does not take", own, Pod{"ops", map[string]string{"app": "other"}, []string{"http"}}, nil},
		{"any namespace; the job is namespace/name unless relabelled", anyNS, Pod{"apps", map[string]string{"cluster": "a"}, []string{"metrics"}}, []Scrape{{"ops/members", false}}},
	} {
		got, err := tc.m.Scrapes(tc.pod)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %+v (%v), want %+v", tc.story, got, err, tc.want)
		}
	}
}

func TestScrapeJobScrapes(t *testing.T) {
	c, err := DecodeScrapeConfig([]byte(`
scrape_configs:
- job_name: hook
  kubernetes_sd_configs: [{role: pod, namespaces: {names: [ops]}}]
  relabel_configs:
  - {source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_name], regex: hook, action: keep}
  - {source_labels: [__meta_kubernetes_pod_container_port_name], regex: http, action: keep}
  - {source_labels: [__meta_kubernetes_namespace], target_label: namespace}
- job_name: members
  kubernetes_sd_configs: [{role: pod}]
  relabel_configs:
  - {source_labels: [__meta_kubernetes_pod_label_a, __meta_kubernetes_pod_labelpresent_b_c], regex: x;true, action: keep}
  - {source_labels: [__meta_kubernetes_pod_container_port_name], regex: peer, action: drop}
`))
	if err != nil {
		t.Fatal(err)
	}
	hook, members := c.ScrapeConfigs[0], c.ScrapeConfigs[1]
	for _, tc := range []struct {
		story string
		job   ScrapeJob
		pod   Pod
		want  bool
	}{
		{"label and port kept", hook, Pod{"ops", map[string]string{"app.kubernetes.io/name": "hook"}, []string{"http"}}, true},
		{"a namespace the discovery does not list", hook, Pod{"apps", map[string]string{"app.kubernetes.io/name": "hook"}, []string{"http"}}, false},
		{"the regex is anchored", hook, Pod{"ops", map[string]string{"app.kubernetes.io/name": "hook-2"}, []string{"http"}}, false},
		{"one of the pod's ports is enough", hook, Pod{"ops", map[string]string{"app.kubernetes.io/name": "hook"}, []string{"grpc", "http"}}, true},
		{"labels joined by ;, presence of a sanitized name", members, Pod{"apps", map[string]string{"a": "x", "b.c": ""}, []string{"metrics"}}, true},
		{"a label missing", members, Pod{"apps", map[string]string{"a": "x"}, []string{"metrics"}}, false},
		{"a dropped port only", members, Pod{"apps", map[string]string{"a": "x", "b.c": ""}, []string{"peer"}}, false},
	} {
		if got, err := tc.job.Scrapes(tc.pod); err != nil || got != tc.want {
			t.Errorf("%s: %v (%v), want %v", tc.story, got, err, tc.want)
		}
	}
}
