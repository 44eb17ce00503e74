package manifests

import (
	"encoding/json"
	"os"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// shardLabel is the label the hook's scrape gives every series: the shard's Deployment, which
// EtcdopsHookShardDown groups by.
const shardLabel = "deployment"

// podNameLabel is the pod label the scrape reads it from, as Prometheus names it.
const podNameLabel = "__meta_kubernetes_pod_label_app_kubernetes_io_name"

// TestHookScrapeLabelsTheShard: as installed with two shards (the chart with shards=2 and
// monitoring, kustomize's shards overlay beside manifests/monitoring, and scrape-config.yaml),
// the hook's scrape labels each series with its pod's app.kubernetes.io/name, and that label
// names each shard's Deployment and no other: the shard alert's deployment label is the
// Deployment to look at, one per shard.
func TestHookScrapeLabelsTheShard(t *testing.T) {
	t.Run("chart", func(t *testing.T) {
		checkShardScrape(t, renderChart(t, append(everything, "--set", "shards=2")...))
	})
	t.Run("kustomize", func(t *testing.T) {
		checkShardScrape(t, append(kustomizeBuildDir(t, twoShardsDir), kustomizeBuildDir(t, "monitoring")...))
	})
	t.Run("scrape-config", func(t *testing.T) {
		raw, err := os.ReadFile("monitoring/scrape-config.yaml")
		if err != nil {
			t.Fatal(err)
		}
		type relabelConfig struct {
			SourceLabels []string `json:"source_labels"`
			TargetLabel  string   `json:"target_label"`
			Action       string   `json:"action"`
		}
		var c struct {
			ScrapeConfigs []struct {
				JobName        string          `json:"job_name"`
				RelabelConfigs []relabelConfig `json:"relabel_configs"`
			} `json:"scrape_configs"`
		}
		if err := yaml.Unmarshal(raw, &c); err != nil {
			t.Fatal(err)
		}
		for _, j := range c.ScrapeConfigs {
			if j.JobName != hookJob {
				continue
			}
			if !slices.ContainsFunc(j.RelabelConfigs, func(r relabelConfig) bool {
				return r.TargetLabel == shardLabel && slices.Equal(r.SourceLabels, []string{podNameLabel}) && (r.Action == "" || r.Action == "replace")
			}) {
				t.Errorf("scrape-config.yaml: job %s does not set %s from %s", hookJob, shardLabel, podNameLabel)
			}
			return
		}
		t.Errorf("scrape-config.yaml has no job %s", hookJob)
	})
}

func checkShardScrape(t *testing.T, objects []*unstructured.Unstructured) {
	t.Helper()
	type relabeling struct {
		SourceLabels []string `json:"sourceLabels"`
		TargetLabel  string   `json:"targetLabel"`
		Replacement  *string  `json:"replacement"`
		Action       string   `json:"action"`
	}
	var podMonitors, deployments int
	names := map[string]int{} // app.kubernetes.io/name of the hook pods → Deployments with it
	for _, o := range objects {
		raw, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		switch o.GetKind() {
		case "PodMonitor":
			var m struct {
				Spec struct {
					PodMetricsEndpoints []struct {
						Relabelings []relabeling `json:"relabelings"`
					} `json:"podMetricsEndpoints"`
				} `json:"spec"`
			}
			if err := json.Unmarshal(raw, &m); err != nil {
				t.Fatal(err)
			}
			for _, e := range m.Spec.PodMetricsEndpoints {
				isHook := slices.ContainsFunc(e.Relabelings, func(r relabeling) bool {
					return r.TargetLabel == "job" && r.Replacement != nil && *r.Replacement == hookJob
				})
				if !isHook {
					continue
				}
				podMonitors++
				if !slices.ContainsFunc(e.Relabelings, func(r relabeling) bool {
					return r.TargetLabel == shardLabel && slices.Equal(r.SourceLabels, []string{podNameLabel}) && r.Replacement == nil && (r.Action == "" || r.Action == "replace")
				}) {
					t.Errorf("PodMonitor %s: the hook's endpoint does not set %s from %s", o.GetName(), shardLabel, podNameLabel)
				}
			}
		case "Deployment":
			labels := o.Object["spec"].(map[string]any)["template"].(map[string]any)["metadata"].(map[string]any)["labels"].(map[string]any)
			if labels["app.kubernetes.io/component"] != "sync-hook" {
				continue
			}
			deployments++
			name, _ := labels["app.kubernetes.io/name"].(string)
			if name != o.GetName() {
				t.Errorf("Deployment %s: its pods' app.kubernetes.io/name is %q, so the shard alert would not name it", o.GetName(), name)
			}
			names[name]++
		}
	}
	if podMonitors != 1 || deployments != 2 {
		t.Fatalf("%d hook PodMonitor endpoints, %d hook Deployments: want 1 and the two shards'", podMonitors, deployments)
	}
	for name, n := range names {
		if n > 1 {
			t.Errorf("%d hook Deployments label their pods %s: one shard alert would stand for both", n, name)
		}
	}
}
