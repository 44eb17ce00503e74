package sync

import (
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/backupresult"
	"etcdops.dev/etcdops/etcdstate"
)

// Config is the hook's own settings that shape what the planner renders.
type Config struct {
	// ClusterDomain is the cluster's DNS domain, e.g. "cluster.local".
	ClusterDomain string
	// ToolImage is the image holding etcdops-member: member Jobs run it and etcd pods copy
	// its launcher in through an init container.
	ToolImage string
}

// Observed is everything one sync knows: the parent, its children, the related pods, one
// etcd snapshot, and the time. The planner reads nothing else.
type Observed struct {
	Cluster  v1alpha1.EtcdCluster
	Children Children
	Pods     []corev1.Pod
	// Claims are the members' PersistentVolumeClaims and Classes every StorageClass, with
	// spec.storageSpec: what a volume expansion reads (volumes.go).
	Claims  []corev1.PersistentVolumeClaim
	Classes []storagev1.StorageClass
	Etcd    etcdstate.Snapshot
	// CAs digests, per Secret that spec.tls or status.tls names and Metacontroller sent, its
	// ca.crt (Need); a Secret not in it was not sent. The planner sees no key material.
	CAs map[string]string
	// CABundles are the same Secrets' CA bundles (Need): certificates, public, which the
	// client ConfigMap hands to applications.
	CABundles map[string]string
	// CertProblems says, per TLS Secret whose certificate members would reject, why
	// (CertificateCheck); no TLS change moves onto such a Secret.
	CertProblems map[string]string
	// Credentials digests, per credential Secret of the operator's etcd users (auth.go) that
	// Metacontroller sent, its password; a Secret not in it is not there. The planner sees
	// no password.
	Credentials map[string]string
	// BackupStream is the continuous backup's progress, read from its Service.
	BackupStream StreamProgress
	// RollWait, when set, says why no roll may begin now: the hook bounds how many clusters
	// roll at once (Decision.Rolls). A roll then waits with its pods on their templates.
	RollWait   string
	Finalizing bool
	Now        time.Time
}

// StreamProgress is the continuous backup's progress as the hook read it from the stream
// (backupresult.Progress); Known is false when it could not be read, and Err says why.
type StreamProgress struct {
	Known    bool
	Err      string
	Progress backupresult.Progress
}

// Children are the observed children, by type, as Metacontroller sent them.
type Children struct {
	StatefulSets []appsv1.StatefulSet
	Services     []corev1.Service
	ConfigMaps   []corev1.ConfigMap
	PDBs         []policyv1.PodDisruptionBudget
	Jobs         []batchv1.Job
	// Accounts, Roles and RoleBindings let the expand-claim Job patch the claims.
	Accounts     []corev1.ServiceAccount
	Roles        []rbacv1.Role
	RoleBindings []rbacv1.RoleBinding
	Deployments  []appsv1.Deployment
}

// Decision is the planner's answer: the complete desired children, the status, the one action
// taken (or the wait), and when to look again.
type Decision struct {
	// Children is the complete desired set, sorted by kind and name. An observed child left
	// out is deleted by Metacontroller.
	Children []Child
	Status   v1alpha1.EtcdClusterStatus
	// Action is what this sync decided; Type Wait or Hold when it decided to do nothing new.
	Action Action
	// ResyncAfterSeconds asks Metacontroller to sync again after this long (0: its default).
	ResyncAfterSeconds float64
	// Finalized, on a finalize sync, says teardown is complete.
	Finalized bool
	// Rolls: pods run an outdated template, so a roll is under way or due; the hook counts
	// such clusters against its bound (Observed.RollWait).
	Rolls bool
	// Events tell what this decision changed: steps started and ended, a hold, conditions
	// turned (events.go). The hook emits them on the EtcdCluster; they are not in the answer.
	Events []Event
}

// Child is one desired child object. Object marshals to JSON with only the fields the
// operator owns (no creationTimestamp: null, no status: {}), so that the same decision
// always encodes to the same bytes.
type Child struct {
	APIVersion string
	Kind       string
	Name       string
	Object     any
}
