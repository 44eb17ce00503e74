package sync

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// LabelAttempt on a member Job counts earlier failed Jobs for the same step;
// AnnotationMemberID names the member a promote, remove or move-leader Job acts on, so its
// effect can be checked against the membership.
const (
	LabelAttempt       = "etcdops.dev/attempt"
	AnnotationMemberID = "etcdops.dev/member-id"
	// LabelAlarm on a disarm Job names the alarm it disarms.
	LabelAlarm = "etcdops.dev/alarm"
)

// Member Job settings.
const (
	jobBackoffLimit = 2
	jobDeadline     = 300 // seconds
	// maxJobAttempts failed Jobs for one step stop the retries: the cluster is reported
	// Degraded and waits for a person (deleting the failed Job runs it once more).
	maxJobAttempts = 5
	jobBackoffBase = 10 * time.Second
	jobBackoffMax  = 5 * time.Minute
	toolName       = "/etcdops-member"
)

// Member tool subcommands, which are also the etcdops.dev/action label values.
const (
	verbAddLearner = "add-learner"
	verbPromote    = "promote"
	verbRemove     = "remove"
	verbMoveLeader = "move-leader"
	verbCompact    = "compact"
	verbDefragment = "defragment"
	verbDisarm     = "disarm"
	// verbBackup: backup.go.
	// verbUpdatePeerURL is etcd's member update: a new peer URL for a member (tls.go).
	verbUpdatePeerURL = "update-peer-url"
)

// memberJob is one membership change or maintenance operation for the member tool to run.
type memberJob struct {
	verb   string
	member string // pod name the change is about; for move-leader the new leader
	// peerURL: add-learner, update-peer-url.
	peerURL string
	// id: promote, remove, move-leader, update-peer-url, defragment, restart-pod (the member on
	// the pod, if any), and disarm of one member's alarm.
	id uint64
	// alarm: disarm.
	alarm     string
	endpoints []string
	attempt   int
	// backupFor: backup, what it is for (backupTrigger.label); lineage, its lineage's flags
	// (view.lineageArgs).
	backupFor string
	lineage   []string
	// survivor: a backup from the survivor of a quorum recovery, which sees no leader.
	survivor bool
	// clusterID and image: drill, the lineage it restores and the etcd image it runs.
	clusterID, image string
	// clientSecret is the client certificate the tool presents; "" while no member serves TLS.
	clientSecret string
	// claim and size: expand-claim, the claim and the storage it is to ask for.
	claim, size string
	// podUID: restart-pod, the UID of the pod it deletes (the member's, as observed).
	podUID string
	// scratch: backup and drill, the bound of its scratch volume (scratchLimit).
	scratch string
	// create: expand-claim creates the claim when it is missing, as the StatefulSet would.
	create bool
}

// args is the member tool's command line (docs/architecture.md).
func (j memberJob) args(c *v1alpha1.EtcdCluster) []string {
	if j.verb == verbExpandClaim {
		// It talks to the Kubernetes API, not to etcd.
		args := []string{toolName, j.verb, "--member=" + j.member, "--namespace=" + c.Namespace, "--claim=" + j.claim, "--size=" + j.size}
		if j.create {
			args = append(args, createClaimArgs(c)...)
		}
		return args
	}
	args := []string{toolName, j.verb, "--endpoints=" + strings.Join(j.endpoints, ","), "--member=" + j.member}
	if j.verb == verbRestartPod {
		// It deletes the pod through the Kubernetes API once etcd says the member may go.
		args = append(args, "--namespace="+c.Namespace, "--uid="+j.podUID)
	}
	if j.peerURL != "" {
		args = append(args, "--peer-url="+j.peerURL)
	}
	if j.alarm != "" {
		args = append(args, "--alarm="+j.alarm)
	}
	if j.id != 0 {
		args = append(args, fmt.Sprintf("--id=%x", j.id))
	}
	if j.verb == verbCompact || j.verb == verbDefragment {
		// A large database takes minutes: give the tool most of the Job's deadline.
		args = append(args, "--timeout=4m")
	}
	if j.verb == verbBackup {
		args = append(args, backupArgs(c)...)
		args = append(args, j.lineage...)
		if j.survivor {
			args = append(args, "--survivor")
		}
	}
	if j.verb == verbDrill {
		// The Job runs the etcd image, the member tool copied in beside it (drillPod).
		args[0] = toolPath
		args = append(args, drillArgs(c, j.clusterID)...)
	}
	if j.clientSecret != "" {
		args = append(args, "--cacert="+ClientTLSDir+"/ca.crt", "--cert="+ClientTLSDir+"/tls.crt", "--key="+ClientTLSDir+"/tls.key")
	}
	return args
}

// render builds the Job. Its name ends in a hash of everything in it, so a Job is never
// changed under its name: a different step, target or attempt is a different Job.
func (j memberJob) render(cfg Config, c *v1alpha1.EtcdCluster) Child {
	labels := commonLabels(c)
	labels[LabelAction] = j.verb
	labels[LabelMember] = j.member
	labels[LabelAttempt] = strconv.Itoa(j.attempt)
	if j.alarm != "" {
		labels[LabelAlarm] = j.alarm
	}

	role := v1alpha1.ToolMemberJob
	switch j.verb {
	case verbBackup:
		role = v1alpha1.ToolBackup
	case verbDrill:
		role = v1alpha1.ToolDrill
	}
	container := object{"name": "member", "image": cfg.ToolImage, "command": j.args(c), "securityContext": containerSecurityContext(),
		"resources": toolResources(c, role)}
	// The member tool talks to etcd only, never to the Kubernetes API, but to patch a claim or
	// delete a pod (restart-pod asks etcd first).
	podSpec := object{
		"restartPolicy":                "Never",
		"containers":                   []any{container},
		"securityContext":              podSecurityContext(),
		"automountServiceAccountToken": false,
	}
	if refs := pullSecrets(c, false); len(refs) > 0 {
		podSpec["imagePullSecrets"] = refs
	}
	kube := j.verb == verbExpandClaim || j.verb == verbRestartPod
	if kube {
		podSpec["serviceAccountName"] = ClaimsAccountName(c.Name)
		podSpec["automountServiceAccountToken"] = true
	}
	if j.clientSecret != "" && j.verb != verbExpandClaim {
		container["volumeMounts"] = []volumeMount{{Name: "client-tls", MountPath: ClientTLSDir, ReadOnly: true}}
		podSpec["volumes"] = []volume{{Name: "client-tls", Secret: &secretSource{SecretName: j.clientSecret}}}
	}
	// No TTL: the planner drops the Job itself once membership shows its effect, and a Job
	// deleted by TTL while still returned would be created again.
	// The Job's pod carries no etcdops.dev/cluster label: the Services and the disruption
	// budget select the cluster's pods by it, and this pod has no etcd to serve.
	podLabels := map[string]string{LabelAction: j.verb, LabelMember: j.member}
	spec := object{
		"backoffLimit":          jobBackoffLimit,
		"activeDeadlineSeconds": jobDeadline,
		"template": object{
			"metadata": object{"labels": podLabels},
			"spec":     podSpec,
		},
	}
	switch j.verb {
	case verbBackup:
		backupPod(c, j, labels, podLabels, spec, podSpec, container)
	case verbDrill:
		drillPod(cfg, c, j, labels, podLabels, spec, podSpec, container)
	}
	hash := shortHash([]any{labels, j.id, spec})
	name := fmt.Sprintf("%s-%s-%s", c.Name, j.verb, j.member)
	// Job names become pod label values (at most 63 characters); the hash keeps a shortened
	// name unique.
	if len(name) > 52 {
		name = name[:52]
	}
	name += "-" + hash
	meta := metadata(c, name, labels)
	annotate := func(k, v string) {
		if meta.Annotations == nil {
			meta.Annotations = map[string]string{}
		}
		meta.Annotations[k] = v
	}
	if j.id != 0 {
		annotate(AnnotationMemberID, fmt.Sprintf("%x", j.id))
	}
	if j.size != "" {
		annotate(AnnotationClaimSize, j.size)
	}
	if j.podUID != "" {
		annotate(AnnotationPodUID, j.podUID)
	}
	return child("batch/v1", "Job", meta, spec)
}

// jobState is where an observed Job stands.
type jobState int

const (
	jobRunning jobState = iota
	jobSucceeded
	jobFailed
)

func stateOf(j *batchv1.Job) (jobState, time.Time) {
	for _, c := range j.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			return jobSucceeded, c.LastTransitionTime.Time
		case batchv1.JobFailed:
			return jobFailed, c.LastTransitionTime.Time
		}
	}
	return jobRunning, time.Time{}
}

// attemptOf reads a Job's attempt label; a missing one counts as the first attempt.
func attemptOf(j *batchv1.Job) int {
	n, err := strconv.Atoi(j.Labels[LabelAttempt])
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// jobBackoff is how long to wait after the attempt-th failure before trying again.
func jobBackoff(attempt int) time.Duration {
	d := jobBackoffBase
	for i := 0; i < attempt && d < jobBackoffMax; i++ {
		d *= 2
	}
	return min(d, jobBackoffMax)
}
