// Package v1alpha1 holds the EtcdCluster API (group etcdops.dev, version v1alpha1): the spec a
// user writes, the status the hook reports, and the pure defaulting and validation of both.
//
// Field names follow etcd-io/etcd-operator's v1alpha1 where the meaning is the same (size,
// version, imageRegistry, storageSpec, tls, etcdOptions, podTemplate), so a manifest moves
// between the two by changing apiVersion.
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
type EtcdCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   EtcdClusterSpec   `json:"spec,omitempty"`
	Status EtcdClusterStatus `json:"status,omitempty"`
}

// EtcdClusterSpec is the desired state of an etcd cluster.
type EtcdClusterSpec struct {
	// Size is the number of voting members, 1 to 9. Even sizes are allowed but flagged in
	// status: they tolerate no more failures than the odd size below them.
	Size *int32 `json:"size,omitempty"`
	// Version is the etcd release to run, e.g. "v3.6.16" (a leading "v" is optional).
	// Changes may only move one patch or one minor release forward.
	Version string `json:"version,omitempty"`
	// ImageRegistry is the image repository for etcd; the image is ImageRegistry:Version.
	ImageRegistry string `json:"imageRegistry,omitempty"`
	// StorageSpec gives each member a PersistentVolumeClaim. Absent, data lives in an
	// emptyDir and does not survive the loss of a pod.
	StorageSpec *StorageSpec `json:"storageSpec,omitempty"`
	// TLS names the Secrets holding certificates. Absent, etcd serves plain HTTP.
	TLS *TLSSpec `json:"tls,omitempty"`
	// EtcdOptions are extra etcd flags, each "--flag=value". Flags the operator owns
	// (names, URLs, data dir, initial cluster, TLS files) are rejected.
	EtcdOptions []string `json:"etcdOptions,omitempty"`
	// PodTemplate adds metadata and scheduling settings to every etcd pod.
	PodTemplate *PodTemplate `json:"podTemplate,omitempty"`
	// Paused stops every change: the hook only reports status.
	Paused bool `json:"paused,omitempty"`
}

// StorageSpec describes each member's PersistentVolumeClaim.
type StorageSpec struct {
	// AccessModes of the claim; ReadWriteOnce when empty. ReadOnlyMany is not allowed.
	AccessModes corev1.PersistentVolumeAccessMode `json:"accessModes,omitempty"`
	// StorageClassName of the claim; the cluster's default class when empty.
	StorageClassName string `json:"storageClassName,omitempty"`
	// VolumeSizeRequest is the requested size of each member's volume.
	VolumeSizeRequest resource.Quantity `json:"volumeSizeRequest"`
	// VolumeSizeLimit, when set, caps the volume's size.
	VolumeSizeLimit *resource.Quantity `json:"volumeSizeLimit,omitempty"`
	// WhenDeleted says what happens to the claims when the EtcdCluster is deleted:
	// Retain (default) keeps them, Delete removes them. A scaled-away member's claim is
	// always deleted so that its ordinal can never come back with stale data.
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
type TLSSpec struct {
	// ServerSecret is served on the client port (2379). Its SANs must cover
	// *.<name>.<namespace>.svc.<cluster-domain> and <name>-client.<namespace>.svc.
	ServerSecret string `json:"serverSecret,omitempty"`
	// PeerSecret is used between members on the peer port (2380); its SANs must cover
	// *.<name>.<namespace>.svc.<cluster-domain>.
	PeerSecret string `json:"peerSecret,omitempty"`
	// ClientSecret is the client certificate the operator and its Jobs present to etcd.
	ClientSecret string `json:"clientSecret,omitempty"`
}

// PodTemplate holds what a user may add to every etcd pod.
type PodTemplate struct {
	Metadata *PodMetadata `json:"metadata,omitempty"`
	Spec     *PodSpec     `json:"spec,omitempty"`
}

// PodMetadata is merged into the pods' metadata; operator-owned labels win.
type PodMetadata struct {
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// PodSpec is the subset of a pod spec a user may set.
type PodSpec struct {
	Resources         *corev1.ResourceRequirements `json:"resources,omitempty"`
	Affinity          *corev1.Affinity             `json:"affinity,omitempty"`
	NodeSelector      map[string]string            `json:"nodeSelector,omitempty"`
	Tolerations       []corev1.Toleration          `json:"tolerations,omitempty"`
	PriorityClassName string                       `json:"priorityClassName,omitempty"`
}

// EtcdClusterStatus is what the hook observed and decided. Metacontroller replaces the whole
// status with the hook's answer on every sync and adds observedGeneration.
type EtcdClusterStatus struct {
	// ObservedGeneration is written by Metacontroller.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase is a one-word summary: Creating, Running, Degraded, Unavailable, Paused, Invalid,
	// Deleting.
	Phase Phase `json:"phase,omitempty"`
	// ReadyMembers counts healthy voting members.
	ReadyMembers int32 `json:"readyMembers"`
	// Members lists every member etcd reports, by name.
	Members []MemberStatus `json:"members,omitempty"`
	// Leader is the name of the leader member.
	Leader string `json:"leader,omitempty"`
	// ClusterID is the etcd cluster ID in hex, recorded once the cluster first answers.
	ClusterID string `json:"clusterID,omitempty"`
	// CurrentVersion is the lowest etcd version the members run.
	CurrentVersion string `json:"currentVersion,omitempty"`
	// Conditions: Available, Progressing, Degraded.
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Action is what the operator is doing or waiting for.
	Action *Action `json:"action,omitempty"`
	// JobFailures counts consecutive failed member Jobs for the current action; retries stop
	// at a bound and the cluster is reported Degraded.
	JobFailures int32 `json:"jobFailures,omitempty"`
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
	Name      string `json:"name"`
	ID        string `json:"id"`
	Ordinal   int32  `json:"ordinal"`
	IsLearner bool   `json:"isLearner,omitempty"`
	IsLeader  bool   `json:"isLeader,omitempty"`
	Healthy   bool   `json:"healthy"`
	Version   string `json:"version,omitempty"`
}

// Action is the operator's current step: a membership change, a pod replacement, or a wait.
type Action struct {
	// Type: Bootstrap, AddLearner, PromoteLearner, RemoveMember, MoveLeader, ReplacePod,
	// ScaleStatefulSet, Wait, Hold.
	Type string `json:"type"`
	// Member is the pod name the action is about, if any.
	Member string `json:"member,omitempty"`
	// Reason says why, in words.
	Reason string `json:"reason"`
	// Since is when this action (same type and member) was first reported.
	Since metav1.Time `json:"since"`
}

// Condition types.
const (
	ConditionAvailable   = "Available"
	ConditionProgressing = "Progressing"
	ConditionDegraded    = "Degraded"
)
