package v1alpha1

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestToolResourcesPassAQuota: unset, every role asks for cpu and memory and is limited in
// both, as a ResourceQuota on requests.cpu, requests.memory, limits.cpu and limits.memory
// requires of every container; the stream's memory grows with its chunk; set, the user's
// resources replace every default and are a copy.
func TestToolResourcesPassAQuota(t *testing.T) {
	spec := valid().Spec
	for _, role := range []ToolRole{ToolMemberJob, ToolBackup, ToolStream, ToolDrill} {
		r := ToolResources(spec, role)
		for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, limit := r.Requests[name], r.Limits[name]
			if req.Sign() <= 0 || limit.Sign() <= 0 || req.Cmp(limit) > 0 {
				t.Errorf("role %d: %s request %s, limit %s; want both set, the request at most the limit", role, name, req.String(), limit.String())
			}
		}
		if m := r.Limits[corev1.ResourceMemory]; m.Cmp(resource.MustParse(MinToolMemory)) < 0 {
			t.Errorf("role %d: default memory limit %s is below the least a user may set, %s", role, m.String(), MinToolMemory)
		}
	}

	stream := func(chunk string) string {
		s := valid().Spec
		q := resource.MustParse(chunk)
		s.Backup = &BackupSpec{Continuous: &ContinuousBackup{MaxChunkSize: &q}}
		m := ToolResources(s, ToolStream).Limits[corev1.ResourceMemory]
		return m.String()
	}
	for chunk, want := range map[string]string{"4Mi": "76Mi", "64Mi": "256Mi", "256Mi": "832Mi"} {
		if got := stream(chunk); got != want {
			t.Errorf("stream with %s chunks: memory limit %s, want %s", chunk, got, want)
		}
	}
	if got, want := ToolResources(spec, ToolStream).Limits[corev1.ResourceMemory], resource.MustParse("76Mi"); got.Cmp(want) != 0 {
		t.Errorf("stream without spec.backup: memory limit %s, want %s (the default chunk)", got.String(), want.String())
	}

	mine := corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}}
	spec.Tool = &ToolSpec{Resources: &mine}
	for _, role := range []ToolRole{ToolMemberJob, ToolBackup, ToolStream, ToolDrill} {
		r := ToolResources(spec, role)
		if len(r.Requests) != 0 || len(r.Limits) != 1 || r.Limits.Memory().String() != "1Gi" {
			t.Errorf("role %d with spec.tool.resources: %v, want the user's alone", role, r)
		}
		r.Limits[corev1.ResourceCPU] = resource.MustParse("1")
	}
	if len(mine.Limits) != 1 {
		t.Errorf("ToolResources returned the spec's own map: changing the result changed the spec to %v", mine)
	}
}
