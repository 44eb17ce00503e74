package prom

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// Pod is a pod as a scrape discovers it: its namespace, labels and named container ports.
type Pod struct {
	Namespace string
	Labels    map[string]string
	Ports     []string
}

// PodOf is the pod a template makes in namespace.
func PodOf(namespace string, t corev1.PodTemplateSpec) Pod {
	p := Pod{Namespace: namespace, Labels: t.Labels}
	for _, c := range t.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name != "" {
				p.Ports = append(p.Ports, port.Name)
			}
		}
	}
	return p
}

// PodMonitor is the part of a Prometheus Operator PodMonitor that decides what it scrapes and
// the job label it gives.
type PodMonitor struct {
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		NamespaceSelector struct {
			Any        bool     `json:"any"`
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []struct {
			Port        string `json:"port"`
			HonorLabels bool   `json:"honorLabels"`
			Relabelings []struct {
				TargetLabel string `json:"targetLabel"`
				Replacement string `json:"replacement"`
			} `json:"relabelings"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// DecodePodMonitor reads a PodMonitor from YAML or JSON.
func DecodePodMonitor(data []byte) (PodMonitor, error) {
	var m PodMonitor
	if err := yaml.Unmarshal(data, &m); err != nil {
		return PodMonitor{}, err
	}
	return m, nil
}

// Scrape is one endpoint a scrape reads from a pod: the job label its series get, and whether
// the pod's own labels win over the target's (honor_labels).
type Scrape struct {
	Job         string
	HonorLabels bool
}

// Scrapes returns what m scrapes of pod p: one Scrape per endpoint whose port p has, when m's
// namespaces and selector take p. Without a namespaceSelector a PodMonitor looks only in its
// own namespace. The job is the one a relabeling sets, or the Operator's default
// <namespace>/<name>.
func (m PodMonitor) Scrapes(p Pod) ([]Scrape, error) {
	ns := m.Spec.NamespaceSelector
	switch {
	case ns.Any:
	case len(ns.MatchNames) > 0:
		if !slices.Contains(ns.MatchNames, p.Namespace) {
			return nil, nil
		}
	case p.Namespace != m.Metadata.Namespace:
		return nil, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(&m.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("PodMonitor %s: %w", m.Metadata.Name, err)
	}
	if sel.Empty() || !sel.Matches(labels.Set(p.Labels)) {
		return nil, nil
	}
	var out []Scrape
	for i, e := range m.Spec.PodMetricsEndpoints {
		if !slices.Contains(p.Ports, e.Port) {
			continue
		}
		out = append(out, Scrape{Job: m.Jobs()[i], HonorLabels: e.HonorLabels})
	}
	return out, nil
}

// ScrapeConfig is the part of a Prometheus configuration's scrape_configs that decides, for
// pods discovered by Kubernetes service discovery, which are kept.
type ScrapeConfig struct {
	ScrapeConfigs []ScrapeJob `json:"scrape_configs"`
}

// ScrapeJob is one scrape_configs entry.
type ScrapeJob struct {
	JobName             string `json:"job_name"`
	HonorLabels         bool   `json:"honor_labels"`
	KubernetesSDConfigs []struct {
		Role       string `json:"role"`
		Namespaces struct {
			Names []string `json:"names"`
		} `json:"namespaces"`
	} `json:"kubernetes_sd_configs"`
	RelabelConfigs []struct {
		SourceLabels []string `json:"source_labels"`
		Separator    string   `json:"separator"`
		Regex        string   `json:"regex"`
		Action       string   `json:"action"`
	} `json:"relabel_configs"`
}

// DecodeScrapeConfig reads scrape_configs from YAML.
func DecodeScrapeConfig(data []byte) (ScrapeConfig, error) {
	var c ScrapeConfig
	if err := yaml.Unmarshal(data, &c); err != nil {
		return ScrapeConfig{}, err
	}
	return c, nil
}

// Scrapes reports whether j keeps a target of pod p: one of its pod roles discovers p's
// namespace, and for one of p's named ports every keep and drop rule lets the target through,
// as Prometheus evaluates them on the discovered meta labels (a pod role makes one target per
// container port).
func (j ScrapeJob) Scrapes(p Pod) (bool, error) {
	discovered := false
	for _, sd := range j.KubernetesSDConfigs {
		if sd.Role == "pod" && (len(sd.Namespaces.Names) == 0 || slices.Contains(sd.Namespaces.Names, p.Namespace)) {
			discovered = true
		}
	}
	if !discovered {
		return false, nil
	}
	for _, port := range p.Ports {
		meta := map[string]string{
			"__meta_kubernetes_namespace":               p.Namespace,
			"__meta_kubernetes_pod_container_port_name": port,
		}
		for k, v := range p.Labels {
			meta["__meta_kubernetes_pod_label_"+sanitize(k)] = v
			meta["__meta_kubernetes_pod_labelpresent_"+sanitize(k)] = "true"
		}
		kept := true
		for _, r := range j.RelabelConfigs {
			if r.Action != "keep" && r.Action != "drop" {
				continue
			}
			re, err := regexp.Compile("^(?:" + r.Regex + ")$")
			if err != nil {
				return false, fmt.Errorf("job %s: %w", j.JobName, err)
			}
			sep := r.Separator
			if sep == "" {
				sep = ";"
			}
			values := make([]string, len(r.SourceLabels))
			for i, l := range r.SourceLabels {
				values[i] = meta[l]
			}
			if re.MatchString(strings.Join(values, sep)) != (r.Action == "keep") {
				kept = false
				break
			}
		}
		if kept {
			return true, nil
		}
	}
	return false, nil
}

// sanitize turns a Kubernetes label name into the meta label suffix Prometheus gives it.
func sanitize(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return '_'
	}, name)
}

// Jobs are the job labels m's endpoints give their series.
func (m PodMonitor) Jobs() []string {
	var out []string
	for _, e := range m.Spec.PodMetricsEndpoints {
		job := m.Metadata.Namespace + "/" + m.Metadata.Name
		for _, r := range e.Relabelings {
			if r.TargetLabel == "job" {
				job = r.Replacement
			}
		}
		out = append(out, job)
	}
	return out
}
