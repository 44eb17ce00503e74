package sync

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AnnotationLastApplied is where Metacontroller keeps what the hook last returned for a child.
const AnnotationLastApplied = "metacontroller.k8s.io/last-applied-configuration"

// Server-set metadata that must not be returned as desired state.
var serverSetMetadata = []string{
	"uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
	"deletionGracePeriodSeconds", "managedFields", "selfLink", "ownerReferences",
}

// unchanged returns an observed child as the hook last asked for it: Metacontroller's
// last-applied annotation when it holds an object (so a hold re-applies exactly what was
// applied before), else the object without server-set fields and status. The JSON is made
// only when the answer is encoded: most syncs read no more of an observed child than its
// kind and name.
func unchanged(apiVersion, kind string, meta metav1.ObjectMeta, obj any) Child {
	return Child{APIVersion: apiVersion, Kind: kind, Name: meta.Name, Object: observedObject{apiVersion: apiVersion, kind: kind, meta: &meta, obj: obj}}
}

// observedObject is an observed child that encodes as unchanged describes.
type observedObject struct {
	apiVersion, kind string
	meta             *metav1.ObjectMeta
	obj              any
}

// MarshalJSON encodes the last-applied object as it was applied, or the stripped observed one.
func (o observedObject) MarshalJSON() ([]byte, error) {
	if last := o.meta.Annotations[AnnotationLastApplied]; isJSONObject(last) {
		return []byte(last), nil
	}
	b, err := json.Marshal(o.obj)
	if err != nil {
		return nil, fmt.Errorf("sync: encoding an observed %s: %w", o.kind, err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("sync: decoding an observed %s: %w", o.kind, err)
	}
	delete(m, "status")
	m["apiVersion"], m["kind"] = o.apiVersion, o.kind
	if md, ok := m["metadata"].(map[string]any); ok {
		for _, k := range serverSetMetadata {
			delete(md, k)
		}
		if ann, ok := md["annotations"].(map[string]any); ok {
			delete(ann, AnnotationLastApplied)
			if len(ann) == 0 {
				delete(md, "annotations")
			}
		}
	}
	return json.Marshal(prune(m))
}

// retentionSet encodes an observed StatefulSet as unchanged does, with its claims' retention
// replaced.
type retentionSet struct {
	observed  observedObject
	retention claimRetention
}

func (o retentionSet) MarshalJSON() ([]byte, error) {
	b, err := o.observed.MarshalJSON()
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("sync: decoding an observed StatefulSet: %w", err)
	}
	spec, ok := m["spec"].(map[string]any)
	if !ok {
		return nil, errors.New("sync: an observed StatefulSet without a spec")
	}
	spec["persistentVolumeClaimRetentionPolicy"] = o.retention
	return json.Marshal(m)
}

// isJSONObject reports whether s is one valid JSON object.
func isJSONObject(s string) bool {
	t := strings.TrimLeft(s, " \t\r\n")
	return strings.HasPrefix(t, "{") && json.Valid([]byte(t))
}

// prune drops nulls and empty status objects that typed API structs emit for fields the
// server, not the hook, owns.
func prune(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			if st, ok := x.(map[string]any); x == nil || (k == "status" && ok && len(st) == 0) {
				delete(t, k)
				continue
			}
			t[k] = prune(x)
		}
	case []any:
		for i, x := range t {
			t[i] = prune(x)
		}
	}
	return v
}

// observedChildren returns every observed child unchanged, sorted: the answer of a sync that
// holds.
func observedChildren(ch Children) []Child {
	var out []Child
	out = unchangedEach(out, "apps/v1", "StatefulSet", ch.StatefulSets)
	out = unchangedEach(out, "v1", "Service", ch.Services)
	out = unchangedEach(out, "v1", "ConfigMap", ch.ConfigMaps)
	out = unchangedEach(out, "policy/v1", "PodDisruptionBudget", ch.PDBs)
	out = unchangedEach(out, "batch/v1", "Job", ch.Jobs)
	out = unchangedEach(out, "v1", "ServiceAccount", ch.Accounts)
	out = unchangedEach(out, "rbac.authorization.k8s.io/v1", "Role", ch.Roles)
	out = unchangedEach(out, "rbac.authorization.k8s.io/v1", "RoleBinding", ch.RoleBindings)
	out = unchangedEach(out, "apps/v1", "Deployment", ch.Deployments)
	sortChildren(out)
	return out
}

// unchangedEach appends every object of one kind, unchanged.
func unchangedEach[T any, P interface {
	*T
	metav1.ObjectMetaAccessor
}](out []Child, apiVersion, kind string, objs []T) []Child {
	for i := range objs {
		o := P(&objs[i])
		out = append(out, unchanged(apiVersion, kind, *o.GetObjectMeta().(*metav1.ObjectMeta), o))
	}
	return out
}

// sortChildren orders children by kind, then name, as Decision promises.
func sortChildren(cs []Child) {
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].Kind != cs[j].Kind {
			return cs[i].Kind < cs[j].Kind
		}
		return cs[i].Name < cs[j].Name
	})
}
