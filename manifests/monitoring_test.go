package manifests

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/prom"
)

// The jobs the shipped scrapes give their series, which alerts select on.
const (
	hookJob    = "etcdops-hook"
	membersJob = "etcd"
	streamsJob = "etcdops-backup-stream"
)

// prometheusPod is where docs/monitoring.md and the defaults take Prometheus to run.
var prometheusPod = prom.Pod{Namespace: "monitoring", Labels: map[string]string{"app.kubernetes.io/name": "prometheus"}}

// upJob reads the job an alert on up selects.
var upJob = regexp.MustCompile(`\bup\{[^}]*job="([^"]+)"`)

// jobOfMetric is the scrape that collects metric: the job up names, the continuous backup's
// and the hook's by their prefixes, and etcd's own for the rest (the member alerts select
// job="etcd" on each, TestMemberMonitoringReadsEtcdMetrics).
func jobOfMetric(expr, metric string) string {
	switch {
	case metric == "up":
		if m := upJob.FindStringSubmatch(expr); m != nil {
			return m[1]
		}
		return ""
	case strings.HasPrefix(metric, "etcdops_backup_stream_"):
		return streamsJob
	case strings.HasPrefix(metric, "etcdops_"):
		return hookJob
	}
	return membersJob
}

// TestEveryAlertIsScraped: as installed, every alert can fire. Each metric an alert reads is
// collected by a scrape the same install ships (kustomize with manifests/monitoring, the
// chart with monitoring on, and scrape-config.yaml for a Prometheus without the Operator),
// whose selector and port take the pods that serve it (the hook's as the install renders
// them, an etcd pod as the planner renders it; the continuous backup's pod is checked in
// sync, TestBackupStreamIsScraped); the hook's scrape keeps the cluster labels the hook
// writes; and the hook's NetworkPolicy admits Prometheus to that port.
func TestEveryAlertIsScraped(t *testing.T) {
	etcdPod := renderedEtcdPod(t)
	rawScrapes, err := os.ReadFile("monitoring/scrape-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	scrapeConfig, err := prom.DecodeScrapeConfig(rawScrapes)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("kustomize", func(t *testing.T) {
		in := append(kustomizeBuild(t), kustomizeBuildDir(t, "monitoring")...)
		checkScraped(t, in, etcdPod, &scrapeConfig)
	})
	t.Run("chart", func(t *testing.T) {
		checkScraped(t, renderChart(t, everything...), etcdPod, nil)
	})
}

// checkScraped checks one install's objects, and the scrape_configs beside it when given.
func checkScraped(t *testing.T, objects []*unstructured.Unstructured, etcdPod prom.Pod, scrapeConfig *prom.ScrapeConfig) {
	var monitors []prom.PodMonitor
	var policies []networkingv1.NetworkPolicy
	var hook *appsv1.Deployment
	alerts := map[string]string{}
	for _, o := range objects {
		raw, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		switch o.GetKind() {
		case "PodMonitor":
			m, err := prom.DecodePodMonitor(raw)
			if err != nil {
				t.Fatalf("%s: %v", objectKey(o), err)
			}
			monitors = append(monitors, m)
		case "NetworkPolicy":
			var np networkingv1.NetworkPolicy
			decode(t, o, &np)
			policies = append(policies, np)
		case "Deployment":
			hook = &appsv1.Deployment{}
			decode(t, o, hook)
		case "PrometheusRule":
			var r struct {
				Spec struct {
					Groups []struct {
						Rules []struct {
							Alert string `json:"alert"`
							Expr  string `json:"expr"`
						} `json:"rules"`
					} `json:"groups"`
				} `json:"spec"`
			}
			if err := yaml.Unmarshal(raw, &r); err != nil {
				t.Fatal(err)
			}
			for _, g := range r.Spec.Groups {
				for _, rule := range g.Rules {
					alerts[rule.Alert] = rule.Expr
				}
			}
		}
	}
	if hook == nil || len(alerts) < 20 {
		t.Fatalf("hook Deployment %v, %d alerts: the install is not what it ships", hook != nil, len(alerts))
	}
	hookPod := prom.PodOf(hook.Namespace, hook.Spec.Template)

	needed := map[string][]string{} // job → the alerts that need it
	for alert, expr := range alerts {
		for _, metric := range prom.Metrics(expr) {
			job := jobOfMetric(expr, metric)
			if !slices.Contains(needed[job], alert) {
				needed[job] = append(needed[job], alert)
			}
		}
	}
	for job, by := range needed {
		slices.Sort(by)
		found := false
		for _, m := range monitors {
			switch job {
			case hookJob:
				found = found || scrapedAs(t, m, hookPod, job, true)
			case membersJob:
				found = found || scrapedAs(t, m, etcdPod, job, false)
			case streamsJob:
				found = found || slices.Contains(m.Jobs(), job)
			default:
				t.Errorf("%s read a metric of job %q, which nothing we ship scrapes", strings.Join(by, ", "), job)
			}
		}
		if !found {
			t.Errorf("no PodMonitor scrapes job %s, which %s read", job, strings.Join(by, ", "))
		}
		if scrapeConfig == nil {
			continue
		}
		// The same for a Prometheus without the Operator.
		jobFound := false
		for _, j := range scrapeConfig.ScrapeConfigs {
			if j.JobName != job {
				continue
			}
			jobFound = true
			pod := map[string]prom.Pod{hookJob: hookPod, membersJob: etcdPod}[job]
			if pod.Labels == nil {
				continue // the stream's pod: sync checks it
			}
			if ok, err := j.Scrapes(pod); err != nil || !ok {
				t.Errorf("scrape-config.yaml: job %s does not keep the pod %v (%v)", job, pod, err)
			}
			if job == hookJob && !j.HonorLabels {
				t.Errorf("scrape-config.yaml: job %s renames the hook's namespace label: want honor_labels", job)
			}
		}
		if !jobFound {
			t.Errorf("scrape-config.yaml has no job %s, which %s read", job, strings.Join(by, ", "))
		}
	}
	if len(needed[hookJob]) == 0 || len(needed[membersJob]) == 0 || len(needed[streamsJob]) == 0 {
		t.Errorf("the alerts read the hook's, etcd's and the backup stream's metrics, found only %v", needed)
	}

	// Prometheus reaches the hook's metrics port through every policy that selects the hook.
	port := containerPort(hook.Spec.Template, "http")
	for _, np := range policies {
		if np.Namespace != hook.Namespace || !matches(np.Spec.PodSelector, hookPod.Labels) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			continue
		}
		if !admits(np, prometheusPod, "http", port) {
			t.Errorf("NetworkPolicy %s does not admit Prometheus (%v) to the hook's metrics port", np.Name, prometheusPod)
		}
	}
}

// scrapedAs reports whether m scrapes pod as job, and fails when it does without the hook's
// cluster labels where they are needed.
func scrapedAs(t *testing.T, m prom.PodMonitor, pod prom.Pod, job string, honorLabels bool) bool {
	t.Helper()
	scrapes, err := m.Scrapes(pod)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range scrapes {
		if s.Job != job {
			continue
		}
		if honorLabels && !s.HonorLabels {
			t.Errorf("PodMonitor %s scrapes job %s without honorLabels: the hook's namespace label would become exported_namespace", m.Metadata.Name, job)
		}
		return true
	}
	return false
}

// renderedEtcdPod is an etcd pod of a cluster the planner bootstraps from the sample with
// backups, in a namespace of its own.
func renderedEtcdPod(t *testing.T) prom.Pod {
	t.Helper()
	var c v1alpha1.EtcdCluster
	data, err := FS.ReadFile(samplesDir + "/backup-3.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		t.Fatal(err)
	}
	c.Namespace, c.UID = "apps", "0c1d6c2e-5d1c-4d34-9f3c-0d6f3d2b4f10"
	d := sync.Plan(sync.Config{ClusterDomain: "cluster.local", ToolImage: "etcdops/etcdops:test"}, sync.Observed{Cluster: c, Now: time.Unix(1e9, 0)})
	for _, ch := range d.Children {
		if ch.Kind != "StatefulSet" {
			continue
		}
		raw, err := json.Marshal(ch.Object)
		if err != nil {
			t.Fatal(err)
		}
		var sts appsv1.StatefulSet
		if err := json.Unmarshal(raw, &sts); err != nil {
			t.Fatal(err)
		}
		return prom.PodOf(c.Namespace, sts.Spec.Template)
	}
	t.Fatalf("the planner rendered no StatefulSet: %+v", d.Children)
	return prom.Pod{}
}

func containerPort(t corev1.PodTemplateSpec, name string) int32 {
	for _, c := range t.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return p.ContainerPort
			}
		}
	}
	return 0
}

func matches(s metav1.LabelSelector, l map[string]string) bool {
	sel, err := metav1.LabelSelectorAsSelector(&s)
	return err == nil && sel.Matches(labels.Set(l))
}

// admits reports whether one of np's ingress rules lets a pod reach the port (by name or
// number), as a network plugin reads them: a peer with only a pod selector is of np's own
// namespace; a rule without peers or ports admits every peer or port.
func admits(np networkingv1.NetworkPolicy, from prom.Pod, portName string, port int32) bool {
	for _, rule := range np.Spec.Ingress {
		peerOK := len(rule.From) == 0
		for _, p := range rule.From {
			nsOK := p.NamespaceSelector == nil && from.Namespace == np.Namespace ||
				p.NamespaceSelector != nil && matches(*p.NamespaceSelector, map[string]string{"kubernetes.io/metadata.name": from.Namespace})
			podOK := p.PodSelector == nil || matches(*p.PodSelector, from.Labels)
			peerOK = peerOK || p.IPBlock == nil && nsOK && podOK
		}
		portOK := len(rule.Ports) == 0
		for _, p := range rule.Ports {
			portOK = portOK || p.Port == nil || p.Port.String() == portName || p.Port.IntValue() == int(port)
		}
		if peerOK && portOK {
			return true
		}
	}
	return false
}
