// Package strictdecode decodes JSON into typed Kubernetes structs the way the API server does
// with fieldValidation=Strict: a field the type does not have, a field given twice, a key
// whose case differs from the type's, or a value of the wrong type is an error. The planner
// renders children as maps, so a misspelled field compiles and would be dropped by the API
// server without a word; tests decode every rendered child through here to catch it.
package strictdecode

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	kjson "sigs.k8s.io/json"
)

// Object decodes one object into the typed struct of its apiVersion and kind, among the
// kinds Kubernetes itself serves.
func Object(data []byte) (runtime.Object, error) {
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(data, &tm); err != nil {
		return nil, err
	}
	gv, err := schema.ParseGroupVersion(tm.APIVersion)
	if err != nil {
		return nil, err
	}
	obj, err := scheme.Scheme.New(gv.WithKind(tm.Kind))
	if err != nil {
		return nil, err
	}
	if err := Into(data, obj); err != nil {
		return nil, fmt.Errorf("%s %q: %w", tm.Kind, tm.Metadata.Name, err)
	}
	return obj, nil
}

// Into decodes data into v, any typed value (a status, a spec).
func Into(data []byte, v any) error {
	strict, err := kjson.UnmarshalStrict(data, v)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}
