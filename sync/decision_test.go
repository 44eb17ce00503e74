package sync

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestMissingChildren: an observed child of a name the planner renders that the desired set
// lacks is named, the first in the children's order; Jobs are left to the planner, which
// drops finished ones on purpose, and children of other names to adopted.
func TestMissingChildren(t *testing.T) {
	meta := func(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name} }
	desired := []Child{{Kind: "Service", Name: "etcd"}, {Kind: "StatefulSet", Name: "etcd"}, {Kind: "ConfigMap", Name: "etcd-join"}}
	for _, tc := range []struct {
		story    string
		observed Children
		want     string
	}{
		{"all desired", Children{Services: []corev1.Service{{ObjectMeta: meta("etcd")}}, StatefulSets: []appsv1.StatefulSet{{ObjectMeta: meta("etcd")}}}, ""},
		{"a Job", Children{Jobs: []batchv1.Job{{ObjectMeta: meta("etcd-remove-etcd-2-0123456789")}}}, ""},
		{"the same name, another kind", Children{PDBs: []policyv1.PodDisruptionBudget{{ObjectMeta: meta("etcd")}}}, "PodDisruptionBudget etcd"},
		{"first by kind", Children{
			StatefulSets: []appsv1.StatefulSet{{ObjectMeta: meta("other")}},
			Services:     []corev1.Service{{ObjectMeta: meta("etcd")}, {ObjectMeta: meta("zz")}, {ObjectMeta: meta("etcd-client")}},
		}, "Service etcd-client"},
		{"names no hook of this version renders", Children{
			ConfigMaps: []corev1.ConfigMap{{ObjectMeta: meta("b")}, {ObjectMeta: meta("etcd-join")}, {ObjectMeta: meta("a")}},
			PDBs:       []policyv1.PodDisruptionBudget{{ObjectMeta: meta("etcd-pdb")}},
		}, ""},
	} {
		if got := missingChildren(tc.observed, desired, "etcd"); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.story, got, tc.want)
		}
	}
}
