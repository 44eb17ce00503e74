package v1alpha1

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func ptr[T any](v T) *T { return &v }

func TestDefaulted(t *testing.T) {
	gi := resource.MustParse("8Gi")
	tests := []struct {
		name string
		in   EtcdClusterSpec
		want EtcdClusterSpec
	}{
		{
			name: "an empty spec gets three members of the default release from the default registry",
			in:   EtcdClusterSpec{},
			want: EtcdClusterSpec{Size: ptr(int32(3)), Version: DefaultVersion, ImageRegistry: DefaultImageRegistry, DeletionProtection: ptr(true)},
		},
		{
			name: "a version without the v gets one, and set fields stay as written",
			in:   EtcdClusterSpec{Size: ptr(int32(5)), Version: "3.5.21", ImageRegistry: "quay.io/coreos/etcd"},
			want: EtcdClusterSpec{Size: ptr(int32(5)), Version: "v3.5.21", ImageRegistry: "quay.io/coreos/etcd", DeletionProtection: ptr(true)},
		},
		{
			name: "size 0 is kept so validation can reject it rather than silently becoming 3",
			in:   EtcdClusterSpec{Size: ptr(int32(0))},
			want: EtcdClusterSpec{Size: ptr(int32(0)), Version: DefaultVersion, ImageRegistry: DefaultImageRegistry, DeletionProtection: ptr(true)},
		},
		{
			name: "a cluster is protected from deletion unless it says otherwise, and an unprotected one stays so",
			in:   EtcdClusterSpec{DeletionProtection: ptr(false)},
			want: EtcdClusterSpec{Size: ptr(int32(3)), Version: DefaultVersion, ImageRegistry: DefaultImageRegistry, DeletionProtection: ptr(false)},
		},
		{
			name: "storage gets ReadWriteOnce and Retain so deleting the cluster never deletes data by default",
			in:   EtcdClusterSpec{StorageSpec: &StorageSpec{VolumeSizeRequest: gi}},
			want: EtcdClusterSpec{Size: ptr(int32(3)), Version: DefaultVersion, ImageRegistry: DefaultImageRegistry, DeletionProtection: ptr(true),
				StorageSpec: &StorageSpec{VolumeSizeRequest: gi, AccessModes: corev1.ReadWriteOnce, WhenDeleted: PVCRetain}},
		},
		{
			name: "storage choices the user made are kept",
			in:   EtcdClusterSpec{StorageSpec: &StorageSpec{VolumeSizeRequest: gi, AccessModes: corev1.ReadWriteOncePod, WhenDeleted: PVCDelete}},
			want: EtcdClusterSpec{Size: ptr(int32(3)), Version: DefaultVersion, ImageRegistry: DefaultImageRegistry, DeletionProtection: ptr(true),
				StorageSpec: &StorageSpec{VolumeSizeRequest: gi, AccessModes: corev1.ReadWriteOncePod, WhenDeleted: PVCDelete}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Defaulted(EtcdCluster{Spec: tt.in})
			if !reflect.DeepEqual(got.Spec, tt.want) {
				t.Errorf("Defaulted:\n got %+v\nwant %+v", got.Spec, tt.want)
			}
		})
	}
}

func TestDefaultedLeavesInputAlone(t *testing.T) {
	// The hook defaults the parent it decoded and still returns the original in errors.
	in := EtcdCluster{Spec: EtcdClusterSpec{StorageSpec: &StorageSpec{}}}
	Defaulted(in)
	if in.Spec.Size != nil || in.Spec.Version != "" || in.Spec.StorageSpec.AccessModes != "" {
		t.Errorf("Defaulted modified its input: %+v", in.Spec)
	}
}

func TestEvenSizeWarning(t *testing.T) {
	tests := []struct {
		story string
		size  int32
		want  string
	}{
		{"an odd size is what we recommend: no warning", 3, ""},
		{"one member is odd too", 1, ""},
		{"four members tolerate one failure, like three", 4, "size 4 is even: it tolerates 1 failed member(s), the same as size 3; an odd size is recommended"},
		{"two members tolerate none, like one", 2, "size 2 is even: it tolerates 0 failed member(s), the same as size 1; an odd size is recommended"},
		{"an invalid size is validation's business, not a warning", 0, ""},
	}
	for _, tt := range tests {
		if got := EvenSizeWarning(tt.size); got != tt.want {
			t.Errorf("%s: EvenSizeWarning(%d) = %q, want %q", tt.story, tt.size, got, tt.want)
		}
	}
}
