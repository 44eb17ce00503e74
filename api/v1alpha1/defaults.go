package v1alpha1

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Defaults applied to an unset spec field.
const (
	DefaultSize          int32 = 3
	DefaultVersion             = "v3.6.16"
	DefaultImageRegistry       = "gcr.io/etcd-development/etcd"

	DefaultDefragmentInUseBelowPercent int32 = 50
	DefaultDefragmentMinFree                 = "64Mi"
	DefaultRecoveryAfter                     = 5 * time.Minute
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
	if s.DeletionProtection == nil {
		protected := true
		s.DeletionProtection = &protected
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
	if s.Maintenance != nil {
		m := *s.Maintenance
		if m.NoSpace == "" {
			m.NoSpace = NoSpaceRemediate
		}
		if m.Defragment != nil {
			d := *m.Defragment
			if d.InUseBelowPercent == 0 {
				d.InUseBelowPercent = DefaultDefragmentInUseBelowPercent
			}
			if d.MinFree == nil {
				q := resource.MustParse(DefaultDefragmentMinFree)
				d.MinFree = &q
			}
			m.Defragment = &d
		}
		s.Maintenance = &m
	}
	if s.Recovery != nil {
		r := *s.Recovery
		if r.QuorumLoss == "" {
			r.QuorumLoss = QuorumLossManual
		}
		if r.After == nil {
			r.After = &metav1.Duration{Duration: DefaultRecoveryAfter}
		}
		s.Recovery = &r
	}
	if s.Backup != nil {
		b := *s.Backup
		if b.MaxBandwidth == nil {
			q := resource.MustParse(DefaultBackupMaxBandwidth)
			b.MaxBandwidth = &q
		}
		if b.BeforeRiskySteps != nil && b.BeforeRiskySteps.MaxAge == nil {
			b.BeforeRiskySteps = &RiskyStepSnapshots{MaxAge: &metav1.Duration{Duration: DefaultRiskyStepMaxAge}}
		}
		if b.Continuous != nil {
			c := *b.Continuous
			if c.Interval == nil {
				c.Interval = &metav1.Duration{Duration: DefaultContinuousInterval}
			}
			if c.MaxChunkSize == nil {
				q := resource.MustParse(DefaultMaxChunkSize)
				c.MaxChunkSize = &q
			}
			b.Continuous = &c
		}
		s.Backup = &b
	}
	if s.Bootstrap != nil && s.Bootstrap.FromBackup != nil && s.Bootstrap.FromBackup.Name == "" {
		f := *s.Bootstrap.FromBackup
		f.Name = LatestBackup
		s.Bootstrap = &BootstrapSpec{FromBackup: &f}
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
