package harness

import "k8s.io/apimachinery/pkg/runtime/schema"

func gvk(apiVersion, kind string) schema.GroupVersionKind {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		panic("harness: bad built-in apiVersion " + apiVersion)
	}
	return gv.WithKind(kind)
}
