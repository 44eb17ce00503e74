package hooks

import (
	"encoding/json"

	jsonv2 "github.com/go-json-experiment/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// Keys of Metacontroller's children and related maps: Kind.version for the core group,
// Kind.group/version otherwise.
const (
	keyStatefulSet = "StatefulSet.apps/v1"
	keyService     = "Service.v1"
	keyConfigMap   = "ConfigMap.v1"
	keyPDB         = "PodDisruptionBudget.policy/v1"
	keyJob         = "Job.batch/v1"
	keyDeployment  = "Deployment.apps/v1"
	keyPod         = "Pod.v1"
	keySecret      = "Secret.v1"
	keyClaim       = "PersistentVolumeClaim.v1"
	keyClass       = "StorageClass.storage.k8s.io/v1"
	keyAccount     = "ServiceAccount.v1"
	keyRole        = "Role.rbac.authorization.k8s.io/v1"
	keyRoleBinding = "RoleBinding.rbac.authorization.k8s.io/v1"
)

// syncResponse is the answer to a sync or finalize call. Every field is always present:
// Metacontroller's v2 decoding is strict about unknown fields, not about missing ones, and a
// fixed shape keeps the bytes stable.
type syncResponse struct {
	Status             v1alpha1.EtcdClusterStatus `json:"status"`
	Children           []any                      `json:"children"`
	ResyncAfterSeconds float64                    `json:"resyncAfterSeconds"`
	Finalized          bool                       `json:"finalized"`
}

// customizeResponse names the related objects sync and finalize need to see.
type customizeResponse struct {
	RelatedResources []relatedRule `json:"relatedResources"`
}

// relatedRule selects related objects either by label selector (in a namespace, or for a
// cluster-scoped type in none) or by namespace and names; Metacontroller rejects names with
// a selector.
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

// decodeParent checks that raw is an EtcdCluster this hook serves and decodes it as
// encoding/json would, without its managed fields (parentOptions), once when it is one.
// Only a parent that does not decode is read again for its kind, so that a parent of
// another kind is refused as such rather than for not matching the schema.
func decodeParent(raw json.RawMessage) (v1alpha1.EtcdCluster, error) {
	var c v1alpha1.EtcdCluster
	if len(raw) == 0 || string(raw) == "null" {
		return c, refuse(errUnprocessable, "the request has no parent")
	}
	decodeErr := jsonv2.Unmarshal(raw, &c, parentOptions...)
	tm := c.TypeMeta
	if decodeErr != nil {
		tm = metav1.TypeMeta{}
		if err := json.Unmarshal(raw, &tm); err != nil {
			return c, refuse(errUnprocessable, "parent: %v", err)
		}
	}
	if tm.APIVersion != v1alpha1.APIVersion || tm.Kind != v1alpha1.Kind {
		return c, refuse(errUnprocessable, "the parent is %q %q; this hook serves apiVersion %q kind %q", tm.APIVersion, tm.Kind, v1alpha1.APIVersion, v1alpha1.Kind)
	}
	if decodeErr != nil {
		return c, refuse(errUnprocessable, "parent does not match the EtcdCluster schema: %v", decodeErr)
	}
	if c.Name == "" || c.Namespace == "" {
		return c, refuse(errUnprocessable, "the parent has no metadata.name or metadata.namespace")
	}
	return c, nil
}
