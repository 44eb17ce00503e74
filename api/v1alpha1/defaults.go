package v1alpha1

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Defaults applied to an unset spec field.
const (
	DefaultSize          int32 = 3
	DefaultVersion             = "v3.6.16"
	DefaultImageRegistry       = "gcr.io/etcd-development/etcd"
)

// Defaulted returns a copy of c with every unset spec field defaulted and the version
// normalised to a leading "v". c itself is not modified; fields Defaulted does not touch
// (slices, maps, pod template) are shared with c.
func Defaulted(c EtcdCluster) EtcdCluster {
	s := &c.Spec
	size := DefaultSize
	if s.Size != nil {
		size = *s.Size
	}
	s.Size = &size
	if s.Version == "" {
		s.Version = DefaultVersion
	}
	s.Version = NormalizeVersion(s.Version)
	if s.ImageRegistry == "" {
		s.ImageRegistry = DefaultImageRegistry
	}
	if s.StorageSpec != nil {
		st := *s.StorageSpec
		if st.AccessModes == "" {
			st.AccessModes = corev1.ReadWriteOnce
		}
		if st.WhenDeleted == "" {
			st.WhenDeleted = PVCRetain
		}
		s.StorageSpec = &st
	}
	return c
}

// NormalizeVersion adds the leading "v" etcd's release tags carry ("3.6.5" → "v3.6.5").
// etcd itself reports versions without it, so both forms meet here. Empty stays empty.
func NormalizeVersion(v string) string {
	if v == "" || strings.HasPrefix(v, "v") {
		return v
	}
	return "v" + v
}

// EvenSizeWarning is the status message for an even size, or "" for an odd one. An even
// cluster tolerates no more failed members than the odd size below it, and costs one more.
func EvenSizeWarning(size int32) string {
	if size <= 0 || size%2 != 0 {
		return ""
	}
	tolerated := size - (size/2 + 1)
	return fmt.Sprintf("size %d is even: it tolerates %d failed member(s), the same as size %d; an odd size is recommended",
		size, tolerated, size-1)
}
