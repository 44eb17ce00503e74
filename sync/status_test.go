package sync

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"etcdops.dev/etcdops/api/v1alpha1"
)

func TestWarnings(t *testing.T) {
	even4 := v1alpha1.EvenSizeWarning(4)
	for _, tc := range []struct {
		story   string
		size    int32
		storage bool
		want    []string
	}{
		{"three members with volumes: nothing to warn about", 3, true, nil},
		{"four members tolerate one failure, like three", 4, true, []string{even4}},
		{"without volumes a lost pod loses its data", 3, false, []string{noStorageWarning}},
		{"both, the size first", 4, false, []string{even4, noStorageWarning}},
		{"a single member is odd", 1, false, []string{noStorageWarning}},
	} {
		c := v1alpha1.EtcdCluster{}
		c.Spec.Size = &tc.size
		if tc.storage {
			c.Spec.StorageSpec = &v1alpha1.StorageSpec{VolumeSizeRequest: resource.MustParse("1Gi")}
		}
		if got := warnings(&c); !slices.Equal(got, tc.want) {
			t.Errorf("%s: warnings %q, want %q", tc.story, got, tc.want)
		}
	}
}
