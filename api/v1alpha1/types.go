// Package v1alpha1 holds the EtcdCluster API (group etcdops.dev, version v1alpha1): the spec a
// user writes, the status the hook reports, and the pure defaulting and validation of both.
//
// Field names follow etcd-io/etcd-operator's v1alpha1 where the meaning is the same (size,
// version, imageRegistry, storageSpec, tls, etcdOptions, podTemplate), so a manifest moves
// between the two by changing apiVersion.
//
// The kubebuilder markers below generate the CustomResourceDefinition in
// manifests/metacontroller/crd (go generate ./manifests).
//
// +groupName=etcdops.dev
package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group, Version and Kind of the parent resource.
const (
	Group    = "etcdops.dev"
	Version  = "v1alpha1"
	Kind     = "EtcdCluster"
	Resource = "etcdclusters"
)

// APIVersion is the apiVersion string of an EtcdCluster.
var APIVersion = schema.GroupVersion{Group: Group, Version: Version}.String()

// EtcdCluster is one etcd cluster managed by the operator.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=etcdclusters,singular=etcdcluster,scope=Namespaced,shortName=ec,categories=etcdops
// +kubebuilder:printcolumn:name="Size",type=integer,JSONPath=`.spec.size`,description="Desired number of voting members"
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyMembers`,description="Healthy voting members"
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.status.currentVersion`,description="Lowest etcd version the members run"
// +kubebuilder:printcolumn:name="Leader",type=string,JSONPath=`.status.leader`,description="Member that leads the cluster"
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`,description="One-word summary of the cluster's state"
// +kubebuilder:printcolumn:name="Action",type=string,JSONPath=`.status.action.type`,description="What the operator is doing or waiting for"
// +kubebuilder:printcolumn:name="Member",type=string,JSONPath=`.status.action.member`,priority=1,description="Member the current action is about"
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.action.reason`,priority=1,description="Why the operator took the current action"
// +kubebuilder:printcolumn:name="Degraded",type=string,JSONPath=`.status.conditions[?(@.type=="Degraded")].reason`,priority=1,description="Why the cluster is Degraded; Healthy or PlannedDisruption when it is not"
// +kubebuilder:printcolumn:name="Wanted",type=string,JSONPath=`.spec.version`,priority=1,description="etcd version the spec asks for"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 52",message="metadata.name must be at most 52 characters so that pod labels fit"
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS-1035 label: it names Services and pods"
type EtcdCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state of the cluster.
	//
	// +kubebuilder:default={}
	Spec EtcdClusterSpec `json:"spec,omitempty"`
	// Status is what the operator last observed and decided; written by Metacontroller
	// from the sync hook's answer.
	//
	// +optional
	Status EtcdClusterStatus `json:"status,omitempty"`
}

// EtcdClusterSpec is the desired state of an etcd cluster.
//
// +kubebuilder:validation:XValidation:rule="has(self.storageSpec) == has(oldSelf.storageSpec)",message="storageSpec cannot be added or removed after creation: the StatefulSet's volume claim templates are immutable"
// +kubebuilder:validation:XValidation:rule="has(self.bootstrap) == has(oldSelf.bootstrap) && (!has(self.bootstrap) || self.bootstrap == oldSelf.bootstrap)",message="spec.bootstrap is fixed at creation: a restore makes a new cluster and is never applied to a running one in place (docs/runbooks-backup.md, restore over an existing cluster)"
type EtcdClusterSpec struct {
	// Size is the number of voting members, 1 to 9. Even sizes are allowed but flagged in
	// status: they tolerate no more failures than the odd size below them.
	//
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=9
	// +optional
	Size *int32 `json:"size,omitempty"`
	// Version is the etcd release to run, e.g. "v3.6.16" (a leading "v" is optional).
	// Changes may only move forward: to any later patch, or to the next minor release.
	//
	// +kubebuilder:default="v3.6.16"
	// +kubebuilder:validation:Pattern=`^v?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Version string `json:"version,omitempty"`
	// ImageRegistry is the image repository for etcd, without tag or digest; the image is
	// ImageRegistry:Version.
	//
	// +kubebuilder:default="gcr.io/etcd-development/etcd"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[^\s@]+$`
	// +kubebuilder:validation:XValidation:rule="!self.substring(self.lastIndexOf('/') + 1).contains(':')",message="imageRegistry must not carry a tag: the image is imageRegistry:version"
	// +optional
	ImageRegistry string `json:"imageRegistry,omitempty"`
	// StorageSpec gives each member a PersistentVolumeClaim. Absent, data lives in an
	// emptyDir and does not survive the loss of a pod. It cannot be added or removed after
	// creation.
	//
	// +optional
	StorageSpec *StorageSpec `json:"storageSpec,omitempty"`
	// TLS names the Secrets holding certificates. Absent, etcd serves plain HTTP.
	//
	// +optional
	TLS *TLSSpec `json:"tls,omitempty"`
	// Auth turns etcd's authentication on and declares users and roles for applications,
	// each user's password in a Secret the operator creates (docs/auth.md). Absent, auth
	// stays as it is: off for a new cluster.
	//
	// +optional
	Auth *AuthSpec `json:"auth,omitempty"`
	// EtcdOptions are extra etcd flags, each "--flag=value". Flags the operator owns
	// (names, URLs, data dir, initial cluster, TLS files) are rejected.
	//
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=1024
	// +kubebuilder:validation:items:Pattern=`^--[a-z0-9._][a-z0-9._-]*(=.*)?$`
	// +kubebuilder:validation:XValidation:rule="self.all(o, !(o.substring(2).split('=')[0] in ['name', 'data-dir', 'wal-dir', 'initial-cluster', 'initial-cluster-state', 'initial-cluster-token', 'initial-advertise-peer-urls', 'cert-file', 'key-file', 'trusted-ca-file', 'client-cert-auth', 'auto-tls', 'force-new-cluster', 'config-file']))",message="etcdOptions must not set a flag the operator owns: names, data dirs, the initial cluster, TLS files, --force-new-cluster, --config-file"
	// +kubebuilder:validation:XValidation:rule="self.all(o, !['listen-', 'advertise-', 'peer-', 'discovery'].exists(p, o.substring(2).startsWith(p)))",message="etcdOptions must not set listen, advertise, peer or discovery flags: the operator owns them"
	// +listType=atomic
	// +optional
	EtcdOptions []string `json:"etcdOptions,omitempty"`
	// PodTemplate adds metadata and scheduling settings to every etcd pod.
	//
	// +optional
	PodTemplate *PodTemplate `json:"podTemplate,omitempty"`
	// Tool sets what the containers running the operator's own image (the hook's
	// --tool-image, with etcdops-member) get: every pod the operator runs besides the etcd
	// pods (member and backup Jobs, the continuous backup) and the etcd pods' install
	// container (docs/create.md, "Resources and pull secrets").
	//
	// +optional
	Tool *ToolSpec `json:"tool,omitempty"`
	// Paused stops every change: the hook only reports status.
	//
	// +optional
	Paused bool `json:"paused,omitempty"`
	// DeletionProtection, true unless set false, makes the API server refuse to delete the
	// EtcdCluster: the ValidatingAdmissionPolicy the operator's manifests ship checks it
	// (docs/create.md, "Deletion protection"). Set it false to delete the cluster on purpose.
	// A cluster created before the field existed is protected.
	//
	// +kubebuilder:default=true
	// +optional
	DeletionProtection *bool `json:"deletionProtection,omitempty"`
	// Maintenance says what the operator does on its own to keep etcd's database in shape.
	// Absent, a NOSPACE alarm is remediated and nothing is defragmented on a schedule.
	//
	// +optional
	Maintenance *MaintenanceSpec `json:"maintenance,omitempty"`
	// Recovery says what the operator may do when quorum is lost. Absent, it only reports and
	// waits for a person.
	//
	// +optional
	Recovery *RecoverySpec `json:"recovery,omitempty"`
	// Backup schedules snapshots to object storage or a volume (docs/backup.md).
	//
	// +optional
	Backup *BackupSpec `json:"backup,omitempty"`
	// Bootstrap says how the cluster starts: from nothing, or from a snapshot. Fixed at
	// creation.
	//
	// +optional
	Bootstrap *BootstrapSpec `json:"bootstrap,omitempty"`
}

// MaintenanceSpec configures the operator's database maintenance.
type MaintenanceSpec struct {
	// NoSpace is what happens when a member raises etcd's NOSPACE alarm: Remediate compacts
	// the key space at the current revision, defragments the members one at a time (the
	// leader last) and disarms the alarm once every member's database is below 90% of its
	// quota; Report only reports the alarm.
	//
	// +kubebuilder:validation:Enum=Remediate;Report
	// +kubebuilder:default=Remediate
	// +optional
	NoSpace NoSpacePolicy `json:"noSpace,omitempty"`
	// Defragment, when set, defragments a member whose database file is mostly free space,
	// one member at a time and the leader last, only while every member is healthy and
	// nothing else is in progress.
	//
	// +optional
	Defragment *DefragmentSpec `json:"defragment,omitempty"`
}

// NoSpacePolicy is what the operator does about a NOSPACE alarm.
type NoSpacePolicy string

// NoSpace policies.
const (
	NoSpaceRemediate NoSpacePolicy = "Remediate"
	NoSpaceReport    NoSpacePolicy = "Report"
)

// DefragmentSpec says when a member's database is fragmented enough to defragment.
type DefragmentSpec struct {
	// InUseBelowPercent: a member qualifies when the share of its database file in use is
	// below this.
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=99
	// +kubebuilder:default=50
	// +optional
	InUseBelowPercent int32 `json:"inUseBelowPercent,omitempty"`
	// MinFree: and when defragmenting it would free at least this much.
	//
	// +kubebuilder:default="64Mi"
	// +optional
	MinFree *resource.Quantity `json:"minFree,omitempty"`
}

// RecoverySpec configures what the operator may do after quorum is lost.
type RecoverySpec struct {
	// QuorumLoss: Manual reports a lost quorum and waits for a person (docs/runbooks.md).
	// ForceNewCluster, once quorum has stayed lost for After and the kubelet reports every
	// other voter's etcd not running, restarts the surviving member with the highest raft
	// index once with --force-new-cluster and rebuilds the others from it. It loses the
	// writes only the lost members had, and forks the cluster if a lost member comes back
	// with its data outside the operator's fence: choose it only where a lost member stays
	// lost (its node is gone, not partitioned). The annotation
	// etcdops.dev/force-new-cluster-from=<member> asks for the same once, from that member,
	// whatever this says.
	//
	// +kubebuilder:validation:Enum=Manual;ForceNewCluster
	// +kubebuilder:default=Manual
	// +optional
	QuorumLoss QuorumLossPolicy `json:"quorumLoss,omitempty"`
	// After is how long quorum must stay lost before ForceNewCluster acts; at least 1m.
	//
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m')",message="spec.recovery.after must be at least 1m, so that a restart or a brief partition is not taken for a lost quorum"
	// +kubebuilder:default="5m0s"
	// +optional
	After *metav1.Duration `json:"after,omitempty"`
}

// QuorumLossPolicy is what the operator does about a lost quorum.
type QuorumLossPolicy string

// Quorum loss policies.
const (
	QuorumLossManual          QuorumLossPolicy = "Manual"
	QuorumLossForceNewCluster QuorumLossPolicy = "ForceNewCluster"
)

// StorageSpec describes each member's PersistentVolumeClaim. Everything but whenDeleted and a
// growing volumeSizeRequest is fixed at creation: a StatefulSet's volume claim templates cannot
// change, and a claim can grow but never shrink.
//
// +kubebuilder:validation:XValidation:rule="has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)",message="storageClassName cannot change after creation"
// +kubebuilder:validation:XValidation:rule="has(self.volumeSizeLimit) == has(oldSelf.volumeSizeLimit) && (!has(self.volumeSizeLimit) || self.volumeSizeLimit == oldSelf.volumeSizeLimit)",message="volumeSizeLimit cannot change after creation"
// +kubebuilder:validation:XValidation:rule="!has(self.volumeSizeLimit) || quantity(string(self.volumeSizeLimit)).compareTo(quantity(string(self.volumeSizeRequest))) >= 0",message="volumeSizeLimit must be at least volumeSizeRequest"
type StorageSpec struct {
	// AccessModes of the claim; ReadWriteOnce when empty. ReadOnlyMany is not allowed.
	//
	// +kubebuilder:default=ReadWriteOnce
	// +kubebuilder:validation:Enum=ReadWriteOnce;ReadWriteOncePod;ReadWriteMany
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="accessModes cannot change after creation"
	// +optional
	AccessModes corev1.PersistentVolumeAccessMode `json:"accessModes,omitempty"`
	// StorageClassName of the claim; the cluster's default class when empty.
	//
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +optional
	StorageClassName string `json:"storageClassName,omitempty"`
	// VolumeSizeRequest is the requested size of each member's volume, e.g. 8Gi. It may grow:
	// every member's claim is then expanded, where its StorageClass allows expansion
	// (status.members[].volume, condition VolumesExpanded). It never shrinks.
	//
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="volumeSizeRequest must be greater than zero"
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity(string(oldSelf))) >= 0",message="volumeSizeRequest can only grow: a volume cannot shrink (to use less space, create a new cluster from a backup)"
	// +required
	VolumeSizeRequest resource.Quantity `json:"volumeSizeRequest"`
	// VolumeSizeLimit, when set, caps the volume's size; at least volumeSizeRequest.
	//
	// +optional
	VolumeSizeLimit *resource.Quantity `json:"volumeSizeLimit,omitempty"`
	// WhenDeleted says what happens to the claims when the EtcdCluster is deleted:
	// Retain (default) keeps them, Delete removes them with the teardown. Nothing else
	// deletes a claim but the scale-in that removed its member: not the StatefulSet deleted
	// or re-created, not its replicas dropped.
	//
	// +kubebuilder:default=Retain
	// +kubebuilder:validation:Enum=Retain;Delete
	// +optional
	WhenDeleted PVCRetention `json:"whenDeleted,omitempty"`
}

// PVCRetention is what happens to member volumes when the cluster is deleted.
type PVCRetention string

// PVC retention choices.
const (
	PVCRetain PVCRetention = "Retain"
	PVCDelete PVCRetention = "Delete"
)

// TLSSpec names Secrets of type kubernetes.io/tls, each with tls.crt, tls.key and ca.crt.
//
// serverSecret and clientSecret go together: with a server certificate etcd requires client
// certificates, and the operator presents clientSecret to observe the cluster. peerSecret is
// independent of both.
//
// Turning TLS on or off on a running cluster is a staged roll (docs/tls.md, "Turn TLS on or
// off"); so is a new CA, which etcd reads only at start. A Secret cannot be swapped for
// another while its field is set: the new Secret's certificates may come from a CA the
// running members do not trust, and members that reject each other lose quorum.
//
// +kubebuilder:validation:XValidation:rule="(has(self.serverSecret) && self.serverSecret.size() > 0) == (has(self.clientSecret) && self.clientSecret.size() > 0)",message="serverSecret and clientSecret go together: with serverSecret etcd requires client certificates and the operator needs clientSecret to observe the cluster"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.serverSecret) || !has(self.serverSecret) || self.serverSecret == oldSelf.serverSecret",message="spec.tls.serverSecret cannot name another Secret while it is set: renew the certificate inside the named Secret (a new leaf is reloaded without a restart; a new CA rolls the pods), or remove serverSecret and clientSecret, wait for status.tls.client to be http, then set the new names"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.peerSecret) || !has(self.peerSecret) || self.peerSecret == oldSelf.peerSecret",message="spec.tls.peerSecret cannot name another Secret while it is set: renew the certificate inside the named Secret (a new leaf is reloaded without a restart; a new CA rolls the pods), or remove peerSecret, wait for status.tls.peer to be http, then set the new name"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.clientSecret) || !has(self.clientSecret) || self.clientSecret == oldSelf.clientSecret",message="spec.tls.clientSecret cannot name another Secret while it is set: renew the certificate inside the named Secret, or remove serverSecret and clientSecret, wait for status.tls.client to be http, then set the new names"
type TLSSpec struct {
	// ServerSecret is served on the client port (2379). Its SANs must cover
	// *.<name>.<namespace>.svc.<cluster-domain> and <name>-client.<namespace>.svc.
	//
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +optional
	ServerSecret string `json:"serverSecret,omitempty"`
	// PeerSecret is used between members on the peer port (2380); its SANs must cover
	// *.<name>.<namespace>.svc.<cluster-domain>.
	//
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +optional
	PeerSecret string `json:"peerSecret,omitempty"`
	// ClientSecret is the client certificate the operator and its Jobs present to etcd.
	//
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +optional
	ClientSecret string `json:"clientSecret,omitempty"`
}

// PodTemplate holds what a user may add to every etcd pod.
type PodTemplate struct {
	// Metadata adds labels and annotations to every etcd pod.
	//
	// +optional
	Metadata *PodMetadata `json:"metadata,omitempty"`
	// Spec adds resources and scheduling settings to every etcd pod.
	//
	// +optional
	Spec *PodSpec `json:"spec,omitempty"`
}

// PodMetadata is merged into the pods' metadata; operator-owned labels win.
type PodMetadata struct {
	// Labels added to every etcd pod. Labels the operator sets (etcdops.dev/*,
	// app.kubernetes.io/*) keep the operator's value.
	//
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// Annotations added to every etcd pod.
	//
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// PodSpec is the subset of a pod spec a user may set.
type PodSpec struct {
	// Resources of the etcd container, and of the pods' install container, which runs
	// before it: it costs the pod nothing beyond etcd's own (a pod asks for the larger of its
	// init containers' and the sum of its containers'), and a namespace whose ResourceQuota
	// admits etcd's container admits it. Unset, neither has any: in a namespace with a
	// ResourceQuota and no LimitRange, set it.
	//
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	// ImagePullSecrets of the etcd pods, for pulling the etcd image (imageRegistry). The
	// operator's own image's are spec.tool.imagePullSecrets, which the etcd pods get too.
	//
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	ImagePullSecrets []SecretReference `json:"imagePullSecrets,omitempty"`
	// Affinity of the etcd pods, e.g. a pod anti-affinity that spreads members over nodes.
	//
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
	// NodeSelector of the etcd pods.
	//
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Tolerations of the etcd pods.
	//
	// +listType=atomic
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// PriorityClassName of the etcd pods.
	//
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
}

// ToolSpec is what the containers running the operator's image get.
type ToolSpec struct {
	// ImagePullSecrets for pulling the operator's image: every pod that runs it gets them,
	// every pod of the operator's own (member and backup Jobs, the continuous backup) and the
	// etcd pods (for their install container).
	//
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	ImagePullSecrets []SecretReference `json:"imagePullSecrets,omitempty"`
	// Resources of every container in the pods the operator runs besides the etcd pods:
	// member and backup Jobs, the continuous backup. Unset, each gets a
	// default with requests and limits, measured for what it does (docs/create.md,
	// "Resources and pull secrets"), so that a namespace's ResourceQuota admits it. Set, it
	// replaces every default as a whole. The etcd pods' install container takes
	// spec.podTemplate.spec.resources instead.
	//
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
}

// SecretReference names a Secret in the cluster's namespace; the same shape as a pod's
// imagePullSecrets entries.
type SecretReference struct {
	// Name of the Secret.
	//
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
}

// EtcdClusterStatus is what the hook observed and decided. Metacontroller replaces the whole
// status with the hook's answer on every sync and adds observedGeneration.
type EtcdClusterStatus struct {
	// ObservedGeneration is written by Metacontroller.
	//
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase is a one-word summary: Creating, Running, Degraded, Unavailable, Paused, Invalid,
	// Deleting. Planned work (a roll, a scale, an upgrade) runs as Running, with the
	// Progressing condition True.
	//
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// ReadyMembers counts healthy voting members.
	//
	// +optional
	ReadyMembers int32 `json:"readyMembers"`
	// Members lists every member etcd reports, by name.
	//
	// +listType=atomic
	// +optional
	Members []MemberStatus `json:"members,omitempty"`
	// Leader is the name of the leader member.
	//
	// +optional
	Leader string `json:"leader,omitempty"`
	// ClusterID is the etcd cluster ID in hex, recorded once the cluster first answers.
	//
	// +optional
	ClusterID string `json:"clusterID,omitempty"`
	// CurrentVersion is the lowest etcd version the members run.
	//
	// +optional
	CurrentVersion string `json:"currentVersion,omitempty"`
	// V2LogIndex is the raft index up to which etcd v3.5 members may have written etcd v2
	// requests to the raft log, recorded when the last v3.5 member left (or, with no record,
	// the highest raft index seen when v3.7 is asked for). etcd v3.7 cannot apply them, so the
	// move to v3.7 waits until every member has taken a raft snapshot past it. -1: the cluster
	// was created on v3.6 or later and never ran v3.5. Cleared once every member runs v3.7.
	// The join ConfigMap keeps a copy (annotation etcdops.dev/v2-log-index).
	//
	// +optional
	V2LogIndex int64 `json:"v2LogIndex,omitempty"`
	// ForkSeenSince is when the syncs began to see a second membership answer (EtcdForked). A
	// sync that sees one holds; it is reported only from a sync at least 5 seconds after the
	// first, so that one observation caught mid-election, or a pod IP reused while the caches
	// lag, is not reported. Cleared by a sync that sees none.
	//
	// +optional
	ForkSeenSince *metav1.Time `json:"forkSeenSince,omitempty"`
	// Conditions: Available, Progressing, Degraded; BackedUp with spec.backup; BackupVerified
	// with spec.backup.verify; VolumesExpanded once a volume grows (docs/conditions.md,
	// "Conditions").
	//
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Warnings name what the spec allows but whoever runs the cluster should know: an even
	// size, no storageSpec. They follow from the spec alone and change only with it; they do
	// not make the cluster Degraded.
	//
	// +listType=atomic
	// +optional
	Warnings []string `json:"warnings,omitempty"`
	// Action is what the operator is doing or waiting for.
	//
	// +optional
	Action *Action `json:"action,omitempty"`
	// JobFailures counts consecutive failed member Jobs for the current action; retries stop
	// at a bound and the cluster is reported Degraded.
	//
	// +optional
	JobFailures int32 `json:"jobFailures,omitempty"`
	// History is the story of the last steps the operator took, oldest first, at most
	// MaxHistory. The hook also tells it as Events, which expire; this stays. An entry is
	// added only when the operator starts a new step, so a repeated sync changes nothing here.
	//
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10
	// +optional
	History []StepRecord `json:"history,omitempty"`
	// Ledger is the durable copy of the join ConfigMap's ledger: every member name the cluster
	// has used, with the member ID it last had, its incarnation and whether it was established.
	// The ConfigMap is rebuilt from it when deleted, so a member is never mistaken for a new one.
	//
	// +listType=map
	// +listMapKey=name
	// +optional
	Ledger []LedgerRecord `json:"ledger,omitempty"`
	// Maintenance is the database maintenance in progress, or the last one done.
	//
	// +optional
	Maintenance *MaintenanceStatus `json:"maintenance,omitempty"`
	// Recovery is the quorum recovery in progress, or the last one done. The join ConfigMap
	// keeps a copy (annotation etcdops.dev/recovery); the later of the two is read. A phase
	// the hook does not know stops every change.
	//
	// +optional
	Recovery *RecoveryStatus `json:"recovery,omitempty"`
	// Backup is what the operator knows of the cluster's backups.
	//
	// +optional
	Backup *BackupStatus `json:"backup,omitempty"`
	// RestoredFrom, on a cluster bootstrapped from a snapshot, names the snapshot asked for
	// (spec.bootstrap.fromBackup.name); kept so that a restore is told apart from one asked
	// for over a running cluster.
	//
	// +optional
	RestoredFrom string `json:"restoredFrom,omitempty"`
	// RestoredRevision, on a cluster bootstrapped from a snapshot, is the revision the seed
	// restored: every change up to it (the snapshot's, then the stored changes replayed after
	// it), none after. Recorded once the seed reports it.
	//
	// +optional
	RestoredRevision int64 `json:"restoredRevision,omitempty"`
	// RestoredTime is when the revision restored was stored: the snapshot taken, or the
	// change received by the continuous backup (docs/backup-continuous.md, restore to a time). Unset
	// when the backup does not say.
	//
	// +optional
	RestoredTime *metav1.MicroTime `json:"restoredTime,omitempty"`
	// RestoreDuration is how long the seed's restore took: fetching and checking the snapshot,
	// restoring it and replaying the changes after it. Unset when the seed does not say.
	//
	// +optional
	RestoreDuration *metav1.Duration `json:"restoreDuration,omitempty"`
	// RestoredLineage is the lineage the seed restored from: the etcd cluster ID (hex) of
	// the cluster that stored it, or "legacy".
	//
	// +optional
	RestoredLineage string `json:"restoredLineage,omitempty"`
	// TLS is what the members serve and, while TLS is turned on or off, how far the roll got.
	//
	// +optional
	TLS *TLSStatus `json:"tls,omitempty"`
	// Client is how applications reach the cluster; the ConfigMap it names holds the same,
	// with the CA bundle, for them to mount.
	//
	// +optional
	Client *ClientStatus `json:"client,omitempty"`
	// Auth is etcd's authentication as the operator last applied it.
	//
	// +optional
	Auth *AuthStatus `json:"auth,omitempty"`
	// LastSwitchover is the last switchover request (annotation etcdops.dev/switchover-to)
	// served; a request of the same value is not served again.
	//
	// +optional
	LastSwitchover *SwitchoverRecord `json:"lastSwitchover,omitempty"`
}

// ClientStatus is how applications reach the cluster, kept current as members come and go and
// as TLS is turned on or off.
type ClientStatus struct {
	// Endpoints are the voters' client URLs, one per member, as clientv3's balancer takes them.
	//
	// +optional
	Endpoints []string `json:"endpoints,omitempty"`
	// Service is the client Service's URL, for a client that takes one address.
	//
	// +optional
	Service string `json:"service,omitempty"`
	// Scheme is http or https: what every voter serves now.
	//
	// +optional
	Scheme string `json:"scheme,omitempty"`
	// ClientSecret names the Secret with the client certificate the members require (with
	// https); empty when they require none.
	//
	// +optional
	ClientSecret string `json:"clientSecret,omitempty"`
	// ConfigMap names the ConfigMap with these details and the CA bundle (ca.crt).
	//
	// +optional
	ConfigMap string `json:"configMap,omitempty"`
	// Users are the applications' etcd users (spec.auth) and the Secrets with their
	// credentials.
	//
	// +optional
	Users []ClientUser `json:"users,omitempty"`
}

// TLSStatus is what the members' pods are configured to serve, and the Secrets the operator
// uses for it. A Secret removed from spec.tls stays here while a member still serves TLS with
// it: turning TLS off needs the client certificate until the last member serves plain HTTP.
type TLSStatus struct {
	// Client is what the client port (2379) is rolled to: http, https, or http+https while
	// client TLS is turned on or off (both on the same port).
	//
	// +optional
	Client string `json:"client,omitempty"`
	// Peer is what members speak among themselves (2380): http, https, or "http, dialing
	// https" while peer TLS is turned on or off (each member holds the peer certificate, so
	// it reaches members already on https).
	//
	// +optional
	Peer string `json:"peer,omitempty"`
	// ServerSecret is the Secret served on the client port.
	//
	// +optional
	ServerSecret string `json:"serverSecret,omitempty"`
	// PeerSecret is the Secret used between members.
	//
	// +optional
	PeerSecret string `json:"peerSecret,omitempty"`
	// ClientSecret is the client certificate the operator and its Jobs present.
	//
	// +optional
	ClientSecret string `json:"clientSecret,omitempty"`
	// Progress says where a TLS change stands, e.g. "client TLS on, stage 1 of 2: 1 of 3 pods
	// rolled". Empty when no change is under way.
	//
	// +optional
	Progress string `json:"progress,omitempty"`
}

// MaintenanceStatus records a NOSPACE remediation or a scheduled defragmentation.
type MaintenanceStatus struct {
	// Operation: NoSpace (remediating a NOSPACE alarm) or Defragment (scheduled).
	Operation string `json:"operation"`
	// Phase: Compacting, Defragmenting, Disarming, Done, or Stuck (space cannot be freed).
	Phase string `json:"phase"`
	// Member is the member being defragmented, if any.
	//
	// +optional
	Member string `json:"member,omitempty"`
	// Defragmented are the members a NOSPACE remediation has defragmented since it compacted.
	//
	// +listType=atomic
	// +optional
	Defragmented []string `json:"defragmented,omitempty"`
	// Since is when the phase began.
	Since metav1.Time `json:"since"`
	// LastDisarmed is when a NOSPACE alarm was last disarmed; a new one within 10 minutes is
	// reported, not remediated again.
	//
	// +optional
	LastDisarmed *metav1.Time `json:"lastDisarmed,omitempty"`
}

// RecoveryStatus records a quorum recovery from one surviving member.
type RecoveryStatus struct {
	// Survivor is the member quorum is recovered from, ID its member ID in hex, RaftIndex its
	// raft index when it was chosen.
	Survivor  string `json:"survivor"`
	ID        string `json:"id"`
	RaftIndex uint64 `json:"raftIndex"`
	// Trigger: Automatic (spec.recovery) or Annotation.
	Trigger string `json:"trigger"`
	// Phase: Chosen (recorded; the others are fenced in the join state), Fencing (waiting
	// until every other voter's etcd is reported stopped and the fences have stood long enough
	// for every kubelet to mount them), Forcing (the survivor is told to restart with
	// --force-new-cluster), Done (the survivor leads a cluster of one; the others are rebuilt
	// through the normal path), Withdrawing (quorum came back after the survivor was told; the
	// fences stay until its mount cannot still carry the force), Cancelled.
	Phase string `json:"phase"`
	// Token identifies this recovery in the join state and on the survivor's volume, so that
	// --force-new-cluster is used once.
	Token string `json:"token"`
	// Since is when the phase began.
	Since metav1.Time `json:"since"`
}

// LedgerRecord is what the operator remembers of one member name.
type LedgerRecord struct {
	// Name is the member (and pod) name.
	Name string `json:"name"`
	// ID is the etcd member ID in hex that last carried the name; empty before etcd gave one.
	//
	// +optional
	ID string `json:"id,omitempty"`
	// Incarnation increases each time the name is reused by a new member; a data dir of an
	// older incarnation is wiped before the member starts.
	Incarnation int64 `json:"incarnation"`
	// Established is true once the member was seen started as a voter: its pod refuses to
	// start on an empty data dir.
	//
	// +optional
	Established bool `json:"established,omitempty"`
	// PastIDs are the member IDs in hex the name carried before ID, oldest first, the last
	// few kept: an answer under one of them at the name's pod is a member removed from the
	// cluster that still runs there, not a second membership.
	//
	// +optional
	// +kubebuilder:validation:MaxItems=8
	PastIDs []string `json:"pastIDs,omitempty"`
}

// Phase summarises the cluster's state.
type Phase string

// Phases.
const (
	PhaseCreating    Phase = "Creating"
	PhaseRunning     Phase = "Running"
	PhaseDegraded    Phase = "Degraded"
	PhaseUnavailable Phase = "Unavailable"
	PhasePaused      Phase = "Paused"
	PhaseInvalid     Phase = "Invalid"
	PhaseDeleting    Phase = "Deleting"
)

// MemberStatus is one etcd member as last observed.
type MemberStatus struct {
	// Name is the member's name, which is its pod's name.
	//
	// +optional
	Name string `json:"name"`
	// ID is the etcd member ID in hex.
	//
	// +optional
	ID string `json:"id"`
	// Ordinal is the StatefulSet ordinal of the member's pod.
	//
	// +optional
	Ordinal int32 `json:"ordinal"`
	// IsLearner is true for a learner: it replicates but does not vote.
	//
	// +optional
	IsLearner bool `json:"isLearner,omitempty"`
	// IsLeader is true for the leader.
	//
	// +optional
	IsLeader bool `json:"isLeader,omitempty"`
	// Healthy is true when the member answered a read and reported no alarm.
	//
	// +optional
	Healthy bool `json:"healthy"`
	// Version is the etcd version the member runs.
	//
	// +optional
	Version string `json:"version,omitempty"`
	// UnansweredSince is when the hook first found the member not answering while its pod
	// was Ready. Such a member is unknown, not failed: it is reported and never replaced on the
	// hook's view alone.
	//
	// +optional
	UnansweredSince *metav1.Time `json:"unansweredSince,omitempty"`
	// UnhealthySince is when the hook first found the member unhealthy, on a pod that can
	// start and while the hook reaches it or its pod is not Ready. A voter's grace period runs
	// from here, whatever the operator does meanwhile (a backup, a leader move).
	//
	// +optional
	UnhealthySince *metav1.Time `json:"unhealthySince,omitempty"`
	// RunningSince is when the hook first found the learner's etcd container started (its
	// pod past Pending). A learner's time to catch up runs from here, not while its pod waits
	// for a node, a volume or an image.
	//
	// +optional
	RunningSince *metav1.Time `json:"runningSince,omitempty"`
	// AppliedIndex is the highest raft index the learner was seen to have applied.
	//
	// +optional
	AppliedIndex uint64 `json:"appliedIndex,omitempty"`
	// ProgressSince is when AppliedIndex last rose. A learner that keeps applying is waited
	// for, however long it takes.
	//
	// +optional
	ProgressSince *metav1.Time `json:"progressSince,omitempty"`
	// LaunchRefused is why the launcher in the member's pod last refused to start etcd (for
	// example: its volume lost the member's data, or holds another cluster's), while the pod
	// does not run etcd.
	//
	// +optional
	LaunchRefused string `json:"launchRefused,omitempty"`
	// Volume is the member's claim as last observed, with spec.storageSpec.
	//
	// +optional
	Volume *VolumeStatus `json:"volume,omitempty"`
}

// VolumeStatus is one member's claim: what it asks for and what it has.
type VolumeStatus struct {
	// Requested is the claim's spec.resources.requests.storage.
	//
	// +optional
	Requested string `json:"requested,omitempty"`
	// Capacity is the claim's status.capacity.storage: the size the volume has.
	//
	// +optional
	Capacity string `json:"capacity,omitempty"`
	// Resizing, while the volume grows, is where: Resizing (the storage system
	// grows the volume), FileSystemResizePending (the volume grew, its file system grows when
	// the node next mounts it), or Requested (the claim asks for more, nothing reported yet).
	//
	// +optional
	Resizing string `json:"resizing,omitempty"`
}

// Action is the operator's current step: a membership change, a pod replacement, or a wait.
type Action struct {
	// Type: Steady, Wait, Hold, Bootstrap, AddLearner, PromoteLearner, RemoveMember,
	// MoveLeader, ReplacePod, ScaleStatefulSet, Teardown, Compact, Defragment, DisarmAlarm,
	// RecoverQuorum, Backup, UpdatePeerURL, ExpandVolume, RestartPod, RestoreDrill, ApplyAuth
	// (docs/status.md, "Actions").
	//
	// +optional
	Type string `json:"type"`
	// Member is the pod name the action is about, if any.
	//
	// +optional
	Member string `json:"member,omitempty"`
	// Reason says why, in words.
	//
	// +optional
	Reason string `json:"reason"`
	// Since is when this action (same type and member) was first reported.
	//
	// +optional
	Since metav1.Time `json:"since"`
}

// AnnotationForceNewClusterFrom on an EtcdCluster asks, once, for a quorum recovery from the
// member it names (see RecoverySpec), whatever spec.recovery says. It acts only while quorum
// is lost and that member answers.
const AnnotationForceNewClusterFrom = "etcdops.dev/force-new-cluster-from"

// MaxHistory bounds status.history.
const MaxHistory = 10

// StepRecord is one step the operator took: a membership change, a pod replacement, a change
// of the StatefulSet's size, bootstrap or teardown.
type StepRecord struct {
	// Type is the action type of the step (AddLearner, ReplacePod, ...).
	Type string `json:"type"`
	// Member is the pod name the step is about, if any.
	//
	// +optional
	Member string `json:"member,omitempty"`
	// Reason says why the step was taken, in words.
	//
	// +optional
	Reason string `json:"reason,omitempty"`
	// Job is the member Job that carries out a membership change.
	//
	// +optional
	Job string `json:"job,omitempty"`
	// Result: Running, Succeeded, Failed (its Job failed; a retry is a step of its own) or
	// Interrupted (the operator moved on before it finished, to repair something or because
	// the spec changed).
	Result string `json:"result"`
	// Repair is true for a step taken while the cluster was Degraded by something the
	// operator did not plan: a member it takes down then keeps the cluster Degraded.
	//
	// +optional
	Repair bool `json:"repair,omitempty"`
	// Started is when the step was decided.
	Started metav1.Time `json:"started"`
	// Finished is when its result was first known.
	//
	// +optional
	Finished *metav1.Time `json:"finished,omitempty"`
}

// Results of a step in status.history.
const (
	StepRunning     = "Running"
	StepSucceeded   = "Succeeded"
	StepFailed      = "Failed"
	StepInterrupted = "Interrupted"
)

// AnnotationAcceptClusterID on an EtcdCluster accepts an etcd cluster ID other than
// status.clusterID, in hex, on purpose (after a restore that made a new cluster). Without it
// the hook holds when etcd answers with another cluster's ID.
const AnnotationAcceptClusterID = "etcdops.dev/accept-cluster-id"

// Condition types.
const (
	ConditionAvailable   = "Available"
	ConditionProgressing = "Progressing"
	ConditionDegraded    = "Degraded"
	// ConditionVolumesExpanded, with spec.storageSpec, says whether every member's volume
	// has the size volumeSizeRequest asks for.
	ConditionVolumesExpanded = "VolumesExpanded"
)
