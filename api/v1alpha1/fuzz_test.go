package v1alpha1

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// FuzzDefaultAndValidate decodes arbitrary EtcdClusters, as a forged or broken parent would
// arrive, defaults and validates them. Nothing panics; defaulting is idempotent and leaves no
// field unset that validation needs; validation is deterministic and every problem it finds
// names the field; CheckUpgrade accepts a version moving to itself.
func FuzzDefaultAndValidate(f *testing.F) {
	for _, s := range []string{
		`{"spec":{}}`,
		`{"metadata":{"name":"etcd"},"spec":{"size":3,"version":"3.6.16","storageSpec":{"volumeSizeRequest":"1Gi"}}}`,
		`{"metadata":{"name":"e"},"spec":{"size":0,"version":"v3.5.0","imageRegistry":"r@sha256","etcdOptions":["--name=x","bad","--snapshot-count=1","--snapshot-count=2"]}}`,
		`{"spec":{"tls":{"serverSecret":"s","clientSecret":"c","peerSecret":"UPPER"}},"status":{"currentVersion":"v3.4.0"}}`,
		`{"spec":{"storageSpec":{"volumeSizeRequest":"-1","volumeSizeLimit":"1","accessModes":"ReadOnlyMany","whenDeleted":"x","storageClassName":"A"}}}`,
		`{"spec":{"podTemplate":{"metadata":{"labels":{"a/b/c":"x","k":"` + strings.Repeat("v", 70) + `"}},"spec":{"priorityClassName":"-"}}}}`,
		`{"metadata":{"name":"` + strings.Repeat("e", 60) + `"},"spec":{"size":10,"version":"v99999999999999999999.0.0"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var c EtcdCluster
		if json.Unmarshal(data, &c) != nil {
			return
		}
		d := Defaulted(c)
		if again := Defaulted(d); !reflect.DeepEqual(again.Spec, d.Spec) {
			t.Fatalf("defaulting twice differs:\n%+v\n%+v", d.Spec, again.Spec)
		}
		if d.Spec.Size == nil || d.Spec.Version == "" || d.Spec.ImageRegistry == "" {
			t.Fatalf("defaulted spec left a field unset: %+v", d.Spec)
		}
		err := Validate(d)
		if again := Validate(d); (err == nil) != (again == nil) || err != nil && err.Error() != again.Error() {
			t.Fatalf("validation is not deterministic: %v / %v", err, again)
		}
		var invalid *InvalidSpecError
		if err != nil {
			if !errors.As(err, &invalid) || len(invalid.Problems) == 0 {
				t.Fatalf("validation failed without problems: %v", err)
			}
			for _, p := range invalid.Problems {
				if !strings.HasPrefix(p, "spec.") && !strings.HasPrefix(p, "metadata.") {
					t.Fatalf("problem %q names no field", p)
				}
			}
		}
		if CheckUpgrade(d.Spec.Version, d.Spec.Version) != nil && CheckUpgrade("", d.Spec.Version) == nil {
			t.Fatalf("version %q is valid but cannot stay as it is", d.Spec.Version)
		}
	})
}
