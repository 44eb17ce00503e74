package v1alpha1

import (
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// BackupSpec schedules snapshots of the cluster's key space. The names follow a Kubernetes
// CronJob's where the meaning is the same (schedule, suspend, status.lastScheduleTime,
// status.lastSuccessfulTime).
//
// +kubebuilder:validation:XValidation:rule="!has(self.maxBandwidth) || quantity(string(self.maxBandwidth)).isGreaterThan(quantity('0'))",message="spec.backup.maxBandwidth must be greater than zero"
type BackupSpec struct {
	// Schedule is when a backup is taken, in cron syntax, in UTC: five fields
	// ("0 */6 * * *"), or a descriptor such as "@daily" or "@every 2h". A backup that falls
	// due while the cluster changes membership waits until the change is done.
	//
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Schedule string `json:"schedule"`
	// Suspend stops scheduled backups; an on-demand backup (annotation
	// etcdops.dev/backup-now) is still taken.
	//
	// +optional
	Suspend bool `json:"suspend,omitempty"`
	// Destination is where the snapshots go.
	Destination BackupDestination `json:"destination"`
	// Retention says which snapshots are kept; absent, every snapshot is kept.
	//
	// +optional
	Retention *BackupRetention `json:"retention,omitempty"`
	// MaxBandwidth bounds how fast the snapshot is read from etcd, per second, so that a
	// backup never takes the disk and network a member needs to serve.
	//
	// +kubebuilder:default="32Mi"
	// +optional
	MaxBandwidth *resource.Quantity `json:"maxBandwidth,omitempty"`
	// Continuous, when set, also stores every change between snapshots, so that a restore
	// can reach any revision up to the newest stored change (docs/backup.md, point-in-time
	// restore).
	//
	// +optional
	Continuous *ContinuousBackup `json:"continuous,omitempty"`
	// Verify, when set, proves the backups by restoring them on a schedule: a restore drill
	// restores the newest snapshot and its stored changes as a real restore does, into a
	// scratch directory of a Job, and compares every key with the live cluster
	// (docs/backup.md, restore drills).
	//
	// +optional
	Verify *BackupVerify `json:"verify,omitempty"`
	// BeforeRiskySteps says how fresh a snapshot must be for a risky step to go ahead: a
	// minor-version upgrade, a scale-in, a roll of every member and a forced quorum recovery
	// are each preceded by a snapshot unless the newest is younger than maxAge (docs/backup.md,
	// a snapshot before every risky step). Unset: maxAge 5m.
	//
	// +optional
	BeforeRiskySteps *RiskyStepSnapshots `json:"beforeRiskySteps,omitempty"`
}

// BackupVerify schedules restore drills.
type BackupVerify struct {
	// Schedule is when a drill runs, in cron syntax, in UTC, as spec.backup.schedule; at
	// most once an hour. A drill restores the whole key space: daily or weekly is usual.
	//
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Schedule string `json:"schedule"`
}

// RiskyStepSnapshots says when a risky step needs a snapshot of its own.
type RiskyStepSnapshots struct {
	// MaxAge: a snapshot stored at most this long before a risky step starts guards it; with
	// an older newest snapshot, one is taken first and the step waits for it. 1m to 24h.
	//
	// +kubebuilder:default="5m"
	// +optional
	MaxAge *metav1.Duration `json:"maxAge,omitempty"`
}

// Bounds of spec.backup.beforeRiskySteps.maxAge, and its default.
const (
	DefaultRiskyStepMaxAge = 5 * time.Minute
	MinRiskyStepMaxAge     = time.Minute
	MaxRiskyStepMaxAge     = 24 * time.Hour
)

// MinDrillInterval bounds how often spec.backup.verify.schedule runs a drill: each restores
// the whole key space.
const MinDrillInterval = time.Hour

// AnnotationDrillNow on an EtcdCluster with spec.backup.verify asks for one restore drill now;
// its value names the request, so setting a new value asks again
// (status.backup.lastDrillRequest records the last one taken).
const AnnotationDrillNow = "etcdops.dev/drill-now"

// AnnotationProceedWithoutSnapshot on an EtcdCluster lets the risky step it names (the step
// in status.backup.guard.step, e.g. "upgrade-v3.7.3") go ahead without the snapshot that
// would guard it: for a backup that keeps failing while the step cannot wait.
const AnnotationProceedWithoutSnapshot = "etcdops.dev/proceed-without-snapshot"

// ContinuousBackup streams the cluster's changes after the newest snapshot to the backup's
// destination, in chunks.
type ContinuousBackup struct {
	// Interval bounds how long a change waits before it is stored: the recovery point.
	// Shorter costs more requests to the storage (one per interval while changes come).
	//
	// +kubebuilder:default="30s"
	// +optional
	Interval *metav1.Duration `json:"interval,omitempty"`
	// MaxChunkSize bounds one stored chunk; a chunk holds whole revisions, so a single
	// revision larger than it is a chunk of its own.
	//
	// +kubebuilder:default="4Mi"
	// +optional
	MaxChunkSize *resource.Quantity `json:"maxChunkSize,omitempty"`
}

// Defaults and bounds of spec.backup.continuous.
const (
	DefaultContinuousInterval = 30 * time.Second
	DefaultMaxChunkSize       = "4Mi"
	MinContinuousInterval     = time.Second
	MaxContinuousInterval     = time.Hour
	MinChunkSize              = 64 << 10
	MaxChunkSize              = 256 << 20
)

// BackupDestination is S3-compatible object storage or a PersistentVolumeClaim; exactly one.
//
// +kubebuilder:validation:XValidation:rule="has(self.s3) != has(self.persistentVolumeClaim)",message="set exactly one of s3 and persistentVolumeClaim"
type BackupDestination struct {
	// S3 is an S3-compatible bucket (AWS S3, MinIO, Ceph RGW, GCS in interoperability mode).
	//
	// +optional
	S3 *S3Destination `json:"s3,omitempty"`
	// PersistentVolumeClaim is a claim in the cluster's namespace; the snapshots are files in
	// a directory of it.
	//
	// +optional
	PersistentVolumeClaim *PVCDestination `json:"persistentVolumeClaim,omitempty"`
}

// S3Destination is a bucket and a prefix in S3-compatible object storage.
type S3Destination struct {
	// Endpoint is the storage's URL, with its scheme: https://s3.eu-west-1.amazonaws.com,
	// http://minio.storage.svc:9000.
	//
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	Endpoint string `json:"endpoint"`
	// Bucket holds the snapshots; it must exist.
	//
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=63
	Bucket string `json:"bucket"`
	// Prefix is prepended to every object name; "<namespace>/<name>/" when empty. The
	// operator lists, keeps and deletes only its own snapshots under it.
	//
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Prefix string `json:"prefix,omitempty"`
	// Region of the bucket; the storage's default when empty.
	//
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Region string `json:"region,omitempty"`
	// CredentialsSecret names a Secret in the cluster's namespace with the keys
	// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN, optional). It is
	// mounted into the backup Jobs and the continuous backup (and, while it bootstraps, into
	// the etcd pods of a cluster restored from it); the operator itself never reads it.
	//
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	CredentialsSecret string `json:"credentialsSecret"`
	// CASecret, when set, names a Secret whose key ca.crt is the CA bundle (PEM) that the
	// endpoint's certificate is verified with, instead of the system's.
	//
	// +kubebuilder:validation:MaxLength=253
	// +optional
	CASecret string `json:"caSecret,omitempty"`
}

// PVCDestination is a directory on a PersistentVolumeClaim.
type PVCDestination struct {
	// ClaimName is a claim in the cluster's namespace. Backup Jobs run on any node, so a
	// ReadWriteMany claim is the one that always mounts.
	//
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	ClaimName string `json:"claimName"`
	// Path is the directory inside the claim; "<namespace>/<name>" when empty.
	//
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Path string `json:"path,omitempty"`
}

// BackupRetention says which snapshots are kept after each backup, in tiers: the newest;
// those within keep and keepFor (with both set, a snapshot beyond either goes); and, beyond
// them, the newest snapshot of each of the keepHourly most recent hours and of the keepDaily
// most recent days (UTC) that hold one. A snapshot no tier keeps goes, with its chain of
// changes (docs/backup.md, retention).
type BackupRetention struct {
	// Keep is how many snapshots are kept, newest first.
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	Keep *int32 `json:"keep,omitempty"`
	// KeepFor is how long a snapshot is kept, e.g. 720h.
	//
	// +optional
	KeepFor *metav1.Duration `json:"keepFor,omitempty"`
	// KeepHourly also keeps the newest snapshot of each of this many most recent hours that
	// hold one, e.g. 24.
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	KeepHourly *int32 `json:"keepHourly,omitempty"`
	// KeepDaily also keeps the newest snapshot of each of this many most recent days (UTC)
	// that hold one, e.g. 30, or 365 for a year.
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	KeepDaily *int32 `json:"keepDaily,omitempty"`
}

// BootstrapSpec says how a new cluster starts. It is fixed at creation.
type BootstrapSpec struct {
	// FromBackup starts the cluster from a snapshot: the seed restores it before etcd starts
	// (a new cluster ID; members are recreated), and the other members join it as learners.
	//
	// +optional
	FromBackup *FromBackup `json:"fromBackup,omitempty"`
}

// FromBackup names the snapshot a new cluster starts from.
//
// +kubebuilder:validation:XValidation:rule="!has(self.revision) || !has(self.time)",message="set at most one of revision and time"
type FromBackup struct {
	// Where the snapshot is: S3-compatible object storage or a PersistentVolumeClaim, as in
	// spec.backup.destination. The default prefix or path is this cluster's own
	// ("<namespace>/<name>"), which is right for a cluster re-created under the same name.
	BackupDestination `json:",inline"`
	// Lineage names the lineage restored from: the etcd cluster ID (hex) of the cluster that
	// stored it, or "legacy" for what an older release stored directly below the prefix
	// (docs/backup.md, lineages). Unset: with name latest, the lineage whose newest stored
	// point is the newest by time; with a snapshot's name, the lineage that holds it.
	//
	// +kubebuilder:validation:Pattern=`^([0-9a-f]{1,16}|legacy)$`
	// +optional
	Lineage string `json:"lineage,omitempty"`
	// Name is the snapshot's object or file name below the prefix or path (or below
	// lineages/<lineage>/ there), or "latest" for the newest point of the lineage.
	//
	// +kubebuilder:default=latest
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Name string `json:"name,omitempty"`
	// Revision, when set, restores the key space as it was at that revision of the lineage:
	// the newest snapshot at or before it, then the stored changes after the snapshot up to
	// it (spec.backup.continuous). Unset, and time unset, the newest stored change. A
	// revision the stored changes do not reach without a gap is refused, naming the gap. Only
	// with name latest.
	//
	// +kubebuilder:validation:Minimum=1
	// +optional
	Revision *int64 `json:"revision,omitempty"`
	// Time (RFC 3339), instead of revision, restores the last revision of the lineage stored
	// at or before it: a snapshot's time is when it was taken, a change's when the continuous
	// backup received it (docs/backup.md, restore to a time). A time before the first or
	// after the newest point stored is refused, naming the range stored. Only with name
	// latest.
	//
	// +optional
	Time *metav1.Time `json:"time,omitempty"`
}

// LatestBackup as FromBackup.Name restores the newest snapshot.
const LatestBackup = "latest"

// LegacyLineage as FromBackup.Lineage names what an older release stored directly below the
// prefix.
const LegacyLineage = "legacy"

var lineagePattern = regexp.MustCompile(`^([0-9a-f]{1,16}|legacy)$`)

// AnnotationBackupNow on an EtcdCluster asks for one backup now; its value names the
// request, so setting a new value asks again (status.backup.lastRequest records the last
// one taken).
const AnnotationBackupNow = "etcdops.dev/backup-now"

// DefaultBackupMaxBandwidth is spec.backup.maxBandwidth when unset.
const DefaultBackupMaxBandwidth = "32Mi"

// BackupStatus is what the operator knows of the cluster's backups.
type BackupStatus struct {
	// LastScheduleTime is the schedule's last time a backup was started for.
	//
	// +optional
	LastScheduleTime *metav1.Time `json:"lastScheduleTime,omitempty"`
	// LastRequest is the value of the etcdops.dev/backup-now annotation last taken.
	//
	// +optional
	LastRequest string `json:"lastRequest,omitempty"`
	// LastSuccessfulTime is when the last successful backup finished.
	//
	// +optional
	LastSuccessfulTime *metav1.Time `json:"lastSuccessfulTime,omitempty"`
	// LastSuccessful is the last snapshot stored.
	//
	// +optional
	LastSuccessful *BackupRecord `json:"lastSuccessful,omitempty"`
	// LastFailure is the last backup that failed, and why.
	//
	// +optional
	LastFailure *BackupFailure `json:"lastFailure,omitempty"`
	// Continuous is the continuous backup's recovery point (spec.backup.continuous), as the
	// operator last read it from the stream.
	//
	// +optional
	Continuous *ContinuousBackupStatus `json:"continuous,omitempty"`
	// LastDrillScheduleTime is spec.backup.verify's last schedule time a drill was started for.
	//
	// +optional
	LastDrillScheduleTime *metav1.Time `json:"lastDrillScheduleTime,omitempty"`
	// LastDrillRequest is the value of the etcdops.dev/drill-now annotation last taken.
	//
	// +optional
	LastDrillRequest string `json:"lastDrillRequest,omitempty"`
	// LastDrill is the last restore drill that finished.
	//
	// +optional
	LastDrill *DrillRecord `json:"lastDrill,omitempty"`
	// Guard is the snapshot that guards the risky step under way, or the last one that did.
	//
	// +optional
	Guard *StepGuard `json:"guard,omitempty"`
}

// DrillRecord is one restore drill.
type DrillRecord struct {
	// Job is the drill's Job.
	Job string `json:"job"`
	// Time is when it finished.
	Time metav1.Time `json:"time"`
	// Result: Passed; Mismatch (the restored copy differs from the live cluster: the message
	// names the first difference); RestoreFailed (the backup could not be restored); Error
	// (the drill could not read the live cluster, or its Job gave no report).
	Result string `json:"result"`
	// Message says what was restored and compared, or what differs or failed.
	//
	// +optional
	Message string `json:"message,omitempty"`
	// Lineage and Snapshot are the lineage and snapshot restored.
	//
	// +optional
	Lineage string `json:"lineage,omitempty"`
	// +optional
	Snapshot string `json:"snapshot,omitempty"`
	// RestoredRevision is the revision restored; Revision the revision compared at.
	//
	// +optional
	RestoredRevision int64 `json:"restoredRevision,omitempty"`
	// +optional
	Revision int64 `json:"revision,omitempty"`
	// Keys counts the restored copy's keys, and Digest is its digest: SHA-256 over every
	// key, value, create and modification revision, version and lease.
	//
	// +optional
	Keys int64 `json:"keys,omitempty"`
	// +optional
	Digest string `json:"digest,omitempty"`
	// RestoreDuration is how long the restore took: fetching, checking, restoring and
	// replaying.
	//
	// +optional
	RestoreDuration *metav1.Duration `json:"restoreDuration,omitempty"`
}

// Results of a restore drill (DrillRecord.Result).
const (
	DrillPassed        = "Passed"
	DrillMismatch      = "Mismatch"
	DrillRestoreFailed = "RestoreFailed"
	DrillError         = "Error"
)

// StepGuard is the snapshot taken, or found fresh enough, before a risky step.
type StepGuard struct {
	// Step names the risky step: upgrade-<version> (a minor-version upgrade),
	// scale-in-<size>, roll-<configuration hash> (a roll of every member), or
	// recovery-<token> (a forced quorum recovery). AnnotationProceedWithoutSnapshot names it.
	Step string `json:"step"`
	// Since is when the step first asked for its snapshot.
	Since metav1.Time `json:"since"`
	// Requested is when a snapshot was last asked for it; unset when one was fresh enough.
	//
	// +optional
	Requested *metav1.Time `json:"requested,omitempty"`
	// Failure says why the last snapshot asked for it failed, at FailureTime: the step holds
	// until one succeeds.
	//
	// +optional
	Failure string `json:"failure,omitempty"`
	// +optional
	FailureTime *metav1.Time `json:"failureTime,omitempty"`
	// Snapshot is the snapshot that guards the step (object name), of Revision, stored at
	// SnapshotTime; unset while it is taken.
	//
	// +optional
	Snapshot string `json:"snapshot,omitempty"`
	// +optional
	Revision int64 `json:"revision,omitempty"`
	// +optional
	SnapshotTime *metav1.Time `json:"snapshotTime,omitempty"`
	// Skipped: a person let the step go ahead without a snapshot
	// (AnnotationProceedWithoutSnapshot).
	//
	// +optional
	Skipped bool `json:"skipped,omitempty"`
	// Done is when the step was over (nothing risky left to do, or another step guarded); the
	// record stays as the last guard.
	//
	// +optional
	Done *metav1.Time `json:"done,omitempty"`
}

// ContinuousBackupStatus is how far the continuous backup has stored the cluster's changes.
type ContinuousBackupStatus struct {
	// StoredRevision: every change up to this revision is stored; a restore reaches it.
	//
	// +optional
	StoredRevision int64 `json:"storedRevision,omitempty"`
	// StoredTime is when the stream last stored a chunk of changes.
	//
	// +optional
	StoredTime *metav1.Time `json:"storedTime,omitempty"`
	// BehindSince, set while the stream is behind (a change has waited more than
	// StreamBehindAfter beyond the interval unstored, or its watch has been down as long), is
	// about when it was last caught up. An idle cluster is never behind.
	//
	// +optional
	BehindSince *metav1.Time `json:"behindSince,omitempty"`
	// Message says why the stream is behind (its last error) or why its progress is not
	// known; empty while it is caught up.
	//
	// +optional
	Message string `json:"message,omitempty"`
	// SupersededBy, set while the stream the operator runs finds its lineage claimed by
	// another writer after it, names that writer: this stream stores nothing (docs/runbooks.md,
	// a superseded continuous backup).
	//
	// +optional
	SupersededBy string `json:"supersededBy,omitempty"`
}

// StreamBehindAfter is how much longer than spec.backup.continuous.interval a change may
// wait unstored before the continuous backup counts as behind: the EtcdBackupStreamBehind
// alert's 5 minutes.
const StreamBehindAfter = 5 * time.Minute

// BackupRecord is one stored snapshot.
type BackupRecord struct {
	// Object is the snapshot's full object name (S3) or path in the claim.
	Object string `json:"object"`
	// Revision is the etcd revision the snapshot holds: every write acknowledged at or before
	// it is in the snapshot.
	Revision int64 `json:"revision"`
	// Size is the snapshot's size in bytes.
	Size int64 `json:"size"`
	// SHA256 is the snapshot file's checksum, hex.
	//
	// +optional
	SHA256 string `json:"sha256,omitempty"`
	// Member is the member the snapshot was read from.
	//
	// +optional
	Member string `json:"member,omitempty"`
	// Time is when the snapshot was stored.
	Time metav1.Time `json:"time"`
}

// BackupFailure is a backup that did not store a snapshot.
type BackupFailure struct {
	// Job is the backup Job that failed.
	Job string `json:"job"`
	// Reason says why, as the member tool reported it.
	Reason string `json:"reason"`
	// Time is when the Job failed.
	Time metav1.Time `json:"time"`
}

// ConditionBackedUp is the condition of a cluster with spec.backup: True while the last
// backup succeeded.
const ConditionBackedUp = "BackedUp"

// ConditionBackupVerified is the condition of a cluster with spec.backup.verify: True while
// the last restore drill passed.
const ConditionBackupVerified = "BackupVerified"

// scheduleProbe is any fixed time: how often a schedule fires is read from two of its times.
var scheduleProbe = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// ParseSchedule parses spec.backup.schedule as the operator does.
func ParseSchedule(s string) (cron.Schedule, error) {
	return cron.ParseStandard(s)
}

// BackupPrefix is where the snapshots of cluster namespace/name go by default: the S3 prefix
// and the directory in a claim.
func BackupPrefix(namespace, name string) string {
	return namespace + "/" + name + "/"
}

func checkBackup(s EtcdClusterSpec) []string {
	var p []string
	if b := s.Backup; b != nil {
		if sched, err := ParseSchedule(b.Schedule); err != nil {
			p = append(p, fmt.Sprintf("spec.backup.schedule %q is not a cron schedule (%v); allowed: five fields such as \"0 */6 * * *\", or @hourly, @daily, @every 2h", b.Schedule, err))
		} else if t := sched.Next(scheduleProbe); sched.Next(t).Sub(t) < time.Minute {
			p = append(p, fmt.Sprintf("spec.backup.schedule %q takes a backup more often than once a minute; allowed: at most once a minute", b.Schedule))
		}
		p = append(p, checkDestination("spec.backup.destination", b.Destination)...)
		if r := b.Retention; r != nil {
			if r.Keep != nil && *r.Keep < 1 {
				p = append(p, fmt.Sprintf("spec.backup.retention.keep %d is below 1; allowed: 1 or more (the newest snapshot is always kept)", *r.Keep))
			}
			for _, tier := range []struct {
				field string
				n     *int32
			}{{"keepHourly", r.KeepHourly}, {"keepDaily", r.KeepDaily}} {
				if tier.n != nil && *tier.n < 1 {
					p = append(p, fmt.Sprintf("spec.backup.retention.%s %d is below 1; allowed: 1 or more, or unset", tier.field, *tier.n))
				}
			}
			if r.KeepFor != nil && r.KeepFor.Duration <= 0 {
				p = append(p, fmt.Sprintf("spec.backup.retention.keepFor %s is not positive", r.KeepFor.Duration))
			}
		}
		if v := b.Verify; v != nil {
			if sched, err := ParseSchedule(v.Schedule); err != nil {
				p = append(p, fmt.Sprintf("spec.backup.verify.schedule %q is not a cron schedule (%v); allowed: five fields such as \"0 3 * * *\", or @daily, @weekly", v.Schedule, err))
			} else if t := sched.Next(scheduleProbe); sched.Next(t).Sub(t) < MinDrillInterval {
				p = append(p, fmt.Sprintf("spec.backup.verify.schedule %q runs a drill more often than once an hour; allowed: at most once an hour (each drill restores the whole key space)", v.Schedule))
			}
		}
		if g := b.BeforeRiskySteps; g != nil && g.MaxAge != nil && (g.MaxAge.Duration < MinRiskyStepMaxAge || g.MaxAge.Duration > MaxRiskyStepMaxAge) {
			p = append(p, fmt.Sprintf("spec.backup.beforeRiskySteps.maxAge %s is out of range; allowed: %s to %s", g.MaxAge.Duration, MinRiskyStepMaxAge, MaxRiskyStepMaxAge))
		}
		if q := b.MaxBandwidth; q != nil && q.Sign() <= 0 {
			p = append(p, fmt.Sprintf("spec.backup.maxBandwidth %s must be greater than zero, e.g. 32Mi", q.String()))
		}
		if c := b.Continuous; c != nil {
			if c.Interval != nil && (c.Interval.Duration < MinContinuousInterval || c.Interval.Duration > MaxContinuousInterval) {
				p = append(p, fmt.Sprintf("spec.backup.continuous.interval %s is out of range; allowed: %s to %s", c.Interval.Duration, MinContinuousInterval, MaxContinuousInterval))
			}
			if q := c.MaxChunkSize; q != nil && (q.Value() < MinChunkSize || q.Value() > MaxChunkSize) {
				p = append(p, fmt.Sprintf("spec.backup.continuous.maxChunkSize %s is out of range; allowed: 64Ki to 256Mi", q.String()))
			}
		}
	}
	if bs := s.Bootstrap; bs != nil && bs.FromBackup != nil {
		f := bs.FromBackup
		p = append(p, checkDestination("spec.bootstrap.fromBackup", f.BackupDestination)...)
		if f.Name != LatestBackup && (f.Name == "" || strings.HasPrefix(f.Name, "/") || path.Clean(f.Name) != f.Name || strings.HasPrefix(f.Name, "..")) {
			p = append(p, fmt.Sprintf("spec.bootstrap.fromBackup.name %q is not a snapshot name; allowed: %q or a name below the prefix, without leading \"/\" or \"..\"", f.Name, LatestBackup))
		}
		if r := f.Revision; r != nil && (*r < 1 || f.Name != LatestBackup) {
			p = append(p, fmt.Sprintf("spec.bootstrap.fromBackup.revision %d needs name %q (the snapshot is chosen by the revision) and a revision of 1 or more", *r, LatestBackup))
		}
		if f.Time != nil && (f.Revision != nil || f.Name != LatestBackup) {
			p = append(p, fmt.Sprintf("spec.bootstrap.fromBackup.time %s needs name %q (the snapshot is chosen by the time) and no revision: set one of revision and time",
				f.Time.UTC().Format(time.RFC3339), LatestBackup))
		}
		if f.Lineage != "" && !lineagePattern.MatchString(f.Lineage) {
			p = append(p, fmt.Sprintf("spec.bootstrap.fromBackup.lineage %q is not a lineage; allowed: an etcd cluster ID in lower-case hex (up to 16 digits), or %q", f.Lineage, LegacyLineage))
		}
	}
	return p
}

func checkDestination(field string, d BackupDestination) []string {
	var p []string
	switch {
	case (d.S3 == nil) == (d.PersistentVolumeClaim == nil):
		return []string{field + " must set exactly one of s3 and persistentVolumeClaim"}
	case d.S3 != nil:
		s := d.S3
		if u, err := url.Parse(s.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			p = append(p, fmt.Sprintf("%s.s3.endpoint %q is not an endpoint URL; allowed: http(s)://host[:port], e.g. https://s3.eu-west-1.amazonaws.com", field, s.Endpoint))
		}
		if errs := validation.IsDNS1123Subdomain(s.Bucket); len(errs) > 0 || len(s.Bucket) < 3 || len(s.Bucket) > 63 {
			p = append(p, fmt.Sprintf("%s.s3.bucket %q is not a bucket name; allowed: 3 to 63 lower-case letters, digits, dots and dashes", field, s.Bucket))
		}
		if strings.HasPrefix(s.Prefix, "/") || strings.Contains(s.Prefix, "..") {
			p = append(p, fmt.Sprintf("%s.s3.prefix %q must not start with \"/\" or contain \"..\"", field, s.Prefix))
		}
		p = append(p, checkSecretName(field+".s3.credentialsSecret", s.CredentialsSecret)...)
		if s.CASecret != "" {
			p = append(p, checkSecretName(field+".s3.caSecret", s.CASecret)...)
		}
	default:
		c := d.PersistentVolumeClaim
		if errs := validation.IsDNS1123Subdomain(c.ClaimName); len(errs) > 0 {
			p = append(p, fmt.Sprintf("%s.persistentVolumeClaim.claimName %q is not a valid claim name (%s)", field, c.ClaimName, strings.Join(errs, ", ")))
		}
		if strings.HasPrefix(c.Path, "/") || strings.Contains(c.Path, "..") {
			p = append(p, fmt.Sprintf("%s.persistentVolumeClaim.path %q must be relative and must not contain \"..\"", field, c.Path))
		}
	}
	return p
}
