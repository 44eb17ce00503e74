package v1alpha1

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestValidateBackup(t *testing.T) {
	s3 := func() *S3Destination {
		return &S3Destination{Endpoint: "https://s3.eu-west-1.amazonaws.com", Bucket: "etcd-backups", CredentialsSecret: "s3"}
	}
	withBackup := func(change func(b *BackupSpec)) func(c *EtcdCluster) {
		return func(c *EtcdCluster) {
			c.Spec.Backup = &BackupSpec{Schedule: "0 */6 * * *", Destination: BackupDestination{S3: s3()}}
			change(c.Spec.Backup)
		}
	}
	withRestore := func(change func(f *FromBackup)) func(c *EtcdCluster) {
		return func(c *EtcdCluster) {
			f := &FromBackup{Name: LatestBackup, BackupDestination: BackupDestination{PersistentVolumeClaim: &PVCDestination{ClaimName: "backups"}}}
			change(f)
			c.Spec.Bootstrap = &BootstrapSpec{FromBackup: f}
		}
	}
	for _, tt := range []struct {
		story  string
		change func(c *EtcdCluster)
		want   string // "" means valid
	}{
		{"an S3 bucket every six hours", withBackup(func(*BackupSpec) {}), ""},
		{"a descriptor", withBackup(func(b *BackupSpec) { b.Schedule = "@every 2h" }), ""},
		{"a claim, kept for a week, ten at most", withBackup(func(b *BackupSpec) {
			n := int32(10)
			b.Destination = BackupDestination{PersistentVolumeClaim: &PVCDestination{ClaimName: "etcd-backups", Path: "prod/etcd"}}
			b.Retention = &BackupRetention{Keep: &n, KeepFor: &metav1.Duration{Duration: 168 * 3600e9}}
		}), ""},
		{"not cron", withBackup(func(b *BackupSpec) { b.Schedule = "every day" }), `spec.backup.schedule "every day" is not a cron schedule`},
		{"too often", withBackup(func(b *BackupSpec) { b.Schedule = "@every 10s" }), "more often than once a minute"},
		{"both destinations", withBackup(func(b *BackupSpec) { b.Destination.PersistentVolumeClaim = &PVCDestination{ClaimName: "x"} }), "must set exactly one of s3 and persistentVolumeClaim"},
		{"no destination", withBackup(func(b *BackupSpec) { b.Destination.S3 = nil }), "must set exactly one of s3 and persistentVolumeClaim"},
		{"an endpoint without scheme", withBackup(func(b *BackupSpec) { b.Destination.S3.Endpoint = "s3.amazonaws.com" }), "is not an endpoint URL"},
		{"an endpoint with a path", withBackup(func(b *BackupSpec) { b.Destination.S3.Endpoint = "https://minio:9000/bucket" }), "is not an endpoint URL"},
		{"a bucket name with capitals", withBackup(func(b *BackupSpec) { b.Destination.S3.Bucket = "Backups" }), "is not a bucket name"},
		{"no credentials", withBackup(func(b *BackupSpec) { b.Destination.S3.CredentialsSecret = "" }), "credentialsSecret"},
		{"a prefix that climbs out", withBackup(func(b *BackupSpec) { b.Destination.S3.Prefix = "../other" }), `must not start with "/" or contain ".."`},
		{"keep zero", withBackup(func(b *BackupSpec) { n := int32(0); b.Retention = &BackupRetention{Keep: &n} }), "retention.keep 0 is below 1"},
		{"tiers: a day of hours, a year of days", withBackup(func(b *BackupSpec) {
			h, d := int32(24), int32(365)
			b.Retention = &BackupRetention{KeepHourly: &h, KeepDaily: &d}
		}), ""},
		{"keepDaily zero", withBackup(func(b *BackupSpec) { n := int32(0); b.Retention = &BackupRetention{KeepDaily: &n} }), "retention.keepDaily 0 is below 1"},
		{"a daily drill", withBackup(func(b *BackupSpec) { b.Verify = &BackupVerify{Schedule: "@daily"} }), ""},
		{"a drill every ten minutes", withBackup(func(b *BackupSpec) { b.Verify = &BackupVerify{Schedule: "*/10 * * * *"} }),
			`spec.backup.verify.schedule "*/10 * * * *" runs a drill more often than once an hour`},
		{"a drill schedule that is not cron", withBackup(func(b *BackupSpec) { b.Verify = &BackupVerify{Schedule: "nightly"} }),
			`spec.backup.verify.schedule "nightly" is not a cron schedule`},
		{"risky steps guarded by a snapshot of the last 15 minutes", withBackup(func(b *BackupSpec) {
			b.BeforeRiskySteps = &RiskyStepSnapshots{MaxAge: &metav1.Duration{Duration: 15 * time.Minute}}
		}), ""},
		{"risky steps guarded by a snapshot of the last 10 seconds", withBackup(func(b *BackupSpec) {
			b.BeforeRiskySteps = &RiskyStepSnapshots{MaxAge: &metav1.Duration{Duration: 10 * time.Second}}
		}), "spec.backup.beforeRiskySteps.maxAge 10s is out of range; allowed: 1m0s to 24h0m0s"},
		{"continuous with the defaults", withBackup(func(b *BackupSpec) { b.Continuous = &ContinuousBackup{} }), ""},
		{"continuous every 5s in 1Mi chunks", withBackup(func(b *BackupSpec) {
			q := resource.MustParse("1Mi")
			b.Continuous = &ContinuousBackup{Interval: &metav1.Duration{Duration: 5 * time.Second}, MaxChunkSize: &q}
		}), ""},
		{"continuous every 100ms", withBackup(func(b *BackupSpec) {
			b.Continuous = &ContinuousBackup{Interval: &metav1.Duration{Duration: 100 * time.Millisecond}}
		}), "spec.backup.continuous.interval 100ms is out of range"},
		{"continuous in 1Ki chunks", withBackup(func(b *BackupSpec) {
			q := resource.MustParse("1Ki")
			b.Continuous = &ContinuousBackup{MaxChunkSize: &q}
		}), "spec.backup.continuous.maxChunkSize 1Ki is out of range"},
		{"restore the latest from a claim", withRestore(func(*FromBackup) {}), ""},
		{"restore to a revision", withRestore(func(f *FromBackup) { r := int64(42); f.Revision = &r }), ""},
		{"restore one snapshot to a revision", withRestore(func(f *FromBackup) {
			r := int64(42)
			f.Name, f.Revision = "etcd-20261201T090000Z-r42.db", &r
		}), `spec.bootstrap.fromBackup.revision 42 needs name "latest"`},
		{"restore one snapshot", withRestore(func(f *FromBackup) { f.Name = "etcd-20261201T090000Z-r42.db" }), ""},
		{"restore a path that climbs out", withRestore(func(f *FromBackup) { f.Name = "../x.db" }), "is not a snapshot name"},
		{"restore from nowhere", withRestore(func(f *FromBackup) { f.PersistentVolumeClaim = nil }), "spec.bootstrap.fromBackup must set exactly one"},
		{"restore to a time", withRestore(func(f *FromBackup) { f.Time = &metav1.Time{Time: time.Date(2026, 12, 1, 9, 12, 31, 0, time.UTC)} }), ""},
		{"restore to a time and a revision", withRestore(func(f *FromBackup) {
			r := int64(42)
			f.Time, f.Revision = &metav1.Time{Time: time.Date(2026, 12, 1, 9, 12, 31, 0, time.UTC)}, &r
		}), "spec.bootstrap.fromBackup.time 2026-12-01T09:12:31Z needs name \"latest\" (the snapshot is chosen by the time) and no revision"},
		{"restore one snapshot to a time", withRestore(func(f *FromBackup) {
			f.Name, f.Time = "etcd-20261201T090000Z-r42.db", &metav1.Time{Time: time.Date(2026, 12, 1, 9, 12, 31, 0, time.UTC)}
		}), "needs name \"latest\""},
		{"restore a lineage named", withRestore(func(f *FromBackup) { f.Lineage = "8e9e05c52164694d" }), ""},
		{"restore the legacy lineage", withRestore(func(f *FromBackup) { f.Lineage = LegacyLineage }), ""},
		{"restore a lineage in capitals", withRestore(func(f *FromBackup) { f.Lineage = "8E9E05C52164694D" }), `spec.bootstrap.fromBackup.lineage "8E9E05C52164694D" is not a lineage`},
		{"restore a lineage too long", withRestore(func(f *FromBackup) { f.Lineage = "8e9e05c52164694d0" }), "is not a lineage"},
	} {
		c := valid()
		tt.change(&c)
		err := Validate(Defaulted(c))
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v", tt.story, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: got %v, want %q", tt.story, err, tt.want)
		}
	}
}

func TestDefaultedBackup(t *testing.T) {
	c := valid()
	c.Spec.Backup = &BackupSpec{Schedule: "@daily"}
	c.Spec.Bootstrap = &BootstrapSpec{FromBackup: &FromBackup{}}
	d := Defaulted(c)
	if d.Spec.Backup.MaxBandwidth == nil || d.Spec.Backup.MaxBandwidth.String() != DefaultBackupMaxBandwidth || d.Spec.Bootstrap.FromBackup.Name != LatestBackup {
		t.Fatalf("defaults: %+v %+v", d.Spec.Backup, d.Spec.Bootstrap.FromBackup)
	}
	if d.Spec.Backup.BeforeRiskySteps != nil {
		t.Fatalf("beforeRiskySteps unset defaults to %+v: the planner's own default applies, as the API server leaves it unset", d.Spec.Backup.BeforeRiskySteps)
	}
	c.Spec.Backup.BeforeRiskySteps = &RiskyStepSnapshots{}
	if g := Defaulted(c).Spec.Backup.BeforeRiskySteps; g == nil || g.MaxAge == nil || g.MaxAge.Duration != DefaultRiskyStepMaxAge {
		t.Fatalf("beforeRiskySteps defaults: %+v", g)
	}
	if c.Spec.Backup.MaxBandwidth != nil || c.Spec.Backup.BeforeRiskySteps.MaxAge != nil || c.Spec.Bootstrap.FromBackup.Name != "" {
		t.Fatal("Defaulted changed its argument")
	}
	c.Spec.Backup.Continuous = &ContinuousBackup{}
	d = Defaulted(c)
	if cb := d.Spec.Backup.Continuous; cb.Interval == nil || cb.Interval.Duration != DefaultContinuousInterval || cb.MaxChunkSize == nil || cb.MaxChunkSize.String() != DefaultMaxChunkSize {
		t.Fatalf("continuous defaults: %+v", cb)
	}
	if c.Spec.Backup.Continuous.Interval != nil {
		t.Fatal("Defaulted changed its argument's continuous backup")
	}
}
