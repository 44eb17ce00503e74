package manifests

import (
	"fmt"
	"io/fs"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// HookServer returns the hook's Deployment as it ships, decoded strictly, and its
// hook-server container.
func HookServer() (*appsv1.Deployment, *corev1.Container, error) {
	raw, err := fs.ReadFile(FS, "metacontroller/deployment.yaml")
	if err != nil {
		return nil, nil, err
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(raw, &d); err != nil {
		return nil, nil, fmt.Errorf("the hook's Deployment: %w", err)
	}
	for i, c := range d.Spec.Template.Spec.Containers {
		if c.Name == "hook-server" {
			return &d, &d.Spec.Template.Spec.Containers[i], nil
		}
	}
	return nil, nil, fmt.Errorf("the hook's Deployment has no hook-server container")
}
