package hooks

import (
	"cmp"
	"encoding/json"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/sync"
)

// Keys of Metacontroller's children and related maps: Kind.version for the core group,
// Kind.group/version otherwise.
const (
	keyStatefulSet = "StatefulSet.apps/v1"
	keyService     = "Service.v1"
	keyConfigMap   = "ConfigMap.v1"
	keyPDB         = "PodDisruptionBudget.policy/v1"
	keyJob         = "Job.batch/v1"
	keyPod         = "Pod.v1"
	keySecret      = "Secret.v1"
)

// knownChildren are the child types the CompositeController declares.
var knownChildren = []string{keyStatefulSet, keyService, keyConfigMap, keyPDB, keyJob}

// objectMap is one inner map of children or related: keyed "name" (hook v1) or
// "namespace/name" (hook v2). The keys are not used: each object carries its own name.
type objectMap map[string]json.RawMessage

// syncRequest is the body of a sync or finalize call. The controller object is not read.
type syncRequest struct {
	Parent     json.RawMessage      `json:"parent"`
	Children   map[string]objectMap `json:"children"`
	Related    map[string]objectMap `json:"related"`
	Finalizing bool                 `json:"finalizing"`
}

// syncResponse is the answer to a sync or finalize call. Every field is always present:
// Metacontroller's v2 decoding is strict about unknown fields, not about missing ones, and a
// fixed shape keeps the bytes stable.
type syncResponse struct {
	Status             v1alpha1.EtcdClusterStatus `json:"status"`
	Children           []any                      `json:"children"`
	ResyncAfterSeconds float64                    `json:"resyncAfterSeconds"`
	Finalized          bool                       `json:"finalized"`
}

// customizeRequest is the body of a customize call.
type customizeRequest struct {
	Parent json.RawMessage `json:"parent"`
}

// customizeResponse names the related objects sync and finalize need to see.
type customizeResponse struct {
	RelatedResources []relatedRule `json:"relatedResources"`
}

// relatedRule selects related objects either by label selector or by namespace and names;
// Metacontroller rejects a rule with both.
type relatedRule struct {
	APIVersion    string                `json:"apiVersion"`
	Resource      string                `json:"resource"`
	LabelSelector *metav1.LabelSelector `json:"labelSelector,omitempty"`
	Namespace     string                `json:"namespace,omitempty"`
	Names         []string              `json:"names,omitempty"`
}

// errorBody is the body of every non-200 answer.
type errorBody struct {
	Error  string `json:"error"`
	Detail string `json:"detail"`
}

// decodeParent checks that raw is an EtcdCluster this hook serves and decodes it.
func decodeParent(raw json.RawMessage) (v1alpha1.EtcdCluster, error) {
	var c v1alpha1.EtcdCluster
	if len(raw) == 0 || string(raw) == "null" {
		return c, refuse(errUnprocessable, "the request has no parent")
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(raw, &tm); err != nil {
		return c, refuse(errUnprocessable, "parent: %v", err)
	}
	if tm.APIVersion != v1alpha1.APIVersion || tm.Kind != v1alpha1.Kind {
		return c, refuse(errUnprocessable, "the parent is %q %q; this hook serves apiVersion %q kind %q", tm.APIVersion, tm.Kind, v1alpha1.APIVersion, v1alpha1.Kind)
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return c, refuse(errUnprocessable, "parent does not match the EtcdCluster schema: %v", err)
	}
	if c.Name == "" || c.Namespace == "" {
		return c, refuse(errUnprocessable, "the parent has no metadata.name or metadata.namespace")
	}
	return c, nil
}

// decodeChildren decodes every declared child type. A non-empty map of a type this hook does
// not know makes the request unanswerable: the complete desired set would leave those
// objects out and Metacontroller would delete them.
func decodeChildren(in map[string]objectMap) (sync.Children, error) {
	var out sync.Children
	for _, key := range sortedKeys(in) {
		if !slices.Contains(knownChildren, key) && len(in[key]) > 0 {
			return out, refuse(errUnprocessable, "children of type %q are not managed by this hook; remove that child resource from the CompositeController", key)
		}
	}
	var err error
	if out.StatefulSets, err = decodeObjects[appsv1.StatefulSet](in, keyStatefulSet); err != nil {
		return out, err
	}
	if out.Services, err = decodeObjects[corev1.Service](in, keyService); err != nil {
		return out, err
	}
	if out.ConfigMaps, err = decodeObjects[corev1.ConfigMap](in, keyConfigMap); err != nil {
		return out, err
	}
	if out.PDBs, err = decodeObjects[policyv1.PodDisruptionBudget](in, keyPDB); err != nil {
		return out, err
	}
	out.Jobs, err = decodeObjects[batchv1.Job](in, keyJob)
	return out, err
}

// decodeObjects decodes one inner map into objects sorted by namespace and name, so the
// planner sees the same order whatever the map's key style.
func decodeObjects[T any, P interface {
	*T
	metav1.Object
}](in map[string]objectMap, key string) ([]T, error) {
	m := in[key]
	if len(m) == 0 {
		return nil, nil
	}
	out := make([]T, 0, len(m))
	for _, k := range sortedKeys(m) {
		if string(m[k]) == "null" {
			continue
		}
		var obj T
		if err := json.Unmarshal(m[k], &obj); err != nil {
			return nil, refuse(errMalformed, "%s %q: %v", key, k, err)
		}
		out = append(out, obj)
	}
	slices.SortFunc(out, func(a, b T) int {
		pa, pb := P(&a), P(&b)
		return cmp.Or(cmp.Compare(pa.GetNamespace(), pb.GetNamespace()), cmp.Compare(pa.GetName(), pb.GetName()))
	})
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
