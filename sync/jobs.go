package sync

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
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
	// switchover: move-leader, the record of the switchover request it serves, if it does.
	switchover *v1alpha1.SwitchoverRecord
	// guard: backup, the risky step's guard it is taken for, if it is (guard.go).
	guard *v1alpha1.StepGuard
	// auth: the declaration an auth Job applies (JSON), its digest, whether it turns auth on,
	// and the applications' users and roles it leaves in etcd.
	auth, authDigest, authDeclaration string
	authEnabled                       bool
	authUsers, authRoles              []string
}

// stepKey names a step: its verb, and the member it acts on ("" for one of the whole
// cluster). A member Job carries it in its labels (LabelAction, LabelMember), so the Jobs of
// one step, its attempts, share it.
type stepKey struct{ verb, member string }

func (j memberJob) key() stepKey { return stepKey{j.verb, j.member} }

// keyOf is the step an observed member Job is of.
func keyOf(j *batchv1.Job) stepKey { return stepKey{j.Labels[LabelAction], j.Labels[LabelMember]} }

// args is the member tool's command line (docs/architecture-member.md).
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
	if j.verb == verbAuth {
		// It creates the credential Secrets that are missing through the Kubernetes API,
		// owned by the EtcdCluster.
		args = append(args, "--namespace="+c.Namespace, "--cluster="+c.Name, "--cluster-uid="+string(c.UID), "--declaration="+j.auth)
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
	kube := j.verb == verbExpandClaim || j.verb == verbRestartPod || j.verb == verbAuth
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
	if j.verb != verbExpandClaim {
		authLogin(c, container, podSpec)
	}
	hash := shortHash([]any{labels, j.id, spec})
	name := fmt.Sprintf("%s-%s-%s", c.Name, j.verb, j.member)
	if j.member == "" {
		// A step of the whole cluster (auth).
		name = c.Name + "-" + j.verb
	}
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
	// Records of strings, bools and times: marshalling them cannot fail.
	if j.switchover != nil {
		raw, _ := json.Marshal(j.switchover)
		annotate(AnnotationSwitchover, string(raw))
	}
	if j.guard != nil {
		raw, _ := json.Marshal(j.guard)
		annotate(AnnotationGuard, string(raw))
	}
	if j.verb == verbAuth {
		annotate(AnnotationAuthDigest, j.authDigest)
		annotate(AnnotationAuthDeclaration, j.authDeclaration)
		annotate(AnnotationAuthEnabled, strconv.FormatBool(j.authEnabled))
		annotate(AnnotationAuthUsers, strings.Join(j.authUsers, ","))
		annotate(AnnotationAuthRoles, strings.Join(j.authRoles, ","))
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

// The Job stage (phase 6) and the steps that start a member Job.

// jobStage is what phase 6 found among the observed Jobs, for the phases after it.
type jobStage struct {
	// waiting, when set, is a Job outstanding: the sync waits for it and decides nothing else.
	waiting *step
	// keep are observed Jobs returned unchanged: the one in flight, or one whose outcome is
	// still to be seen or waited out.
	keep []*batchv1.Job
	// failures counts failed Jobs of the step retry, dropped after their backoff; the same
	// step, planned again, runs as the next attempt.
	failures int
	retry    stepKey
	// exhausted is a failed Job at its attempt limit. It blocks only its own step: when the
	// phases decide anything else (its member is gone, the spec changed), it is dropped.
	exhausted *batchv1.Job
	// done are the steps whose Jobs succeeded and are dropped in this sync: maintenance that
	// leaves nothing in the membership to show for it reads them here.
	done []stepKey
	// backup is status.backup with the outcomes of finished backup Jobs recorded; nil when
	// none finished.
	backup *v1alpha1.BackupStatus
	// backupWait, when set, waits for a backup Job still outstanding: it defers the normal
	// phases, never a fix (backup.go).
	backupWait *step
	// auth is status.auth as the auth Job that succeeded in this sync applied it; nil when
	// none did.
	auth *v1alpha1.AuthStatus
	// backupRetry is what a failed backup Job whose database outgrew its scratch volume was
	// for (its backupFor): taken again now (backup.go, outgrewScratch).
	backupRetry string
	// switchover is status.lastSwitchover as an observed move-leader Job records it, while
	// the status handed in lacks it (switchover.go).
	switchover *v1alpha1.SwitchoverRecord
}

// memberJobs is the Job stage: it reads the observed Jobs. A member Job in flight is returned unchanged and
// waited for; one that succeeded is dropped once membership shows its effect; one that failed
// is kept through its backoff, then dropped so that the step is planned again as the next
// attempt. One that failed as often as allowed waits for a person, but only if its step is
// still wanted (see decideStep).
func (p *planner) memberJobs() jobStage {
	var js jobStage
	backup := &backupRecord{prev: p.obs.Cluster.Status.Backup}
	for _, j := range p.foreignJobs {
		// Not a Job this hook names, so what it does is unknown: one that may still run may be
		// changing membership and is waited for like any member Job; a finished one goes.
		if state, _ := stateOf(j); state == jobRunning {
			js.keep = append(js.keep, j)
			if js.waiting == nil {
				s := p.wait("", "Job "+j.Name+" was not started by this hook's naming and may still act on the cluster: waiting for it to finish", resyncSoon)
				js.waiting = &s
			}
		}
	}
	for _, j := range p.jobs {
		verb, who := j.Labels[LabelAction], j.Labels[LabelMember]
		if verb == verbBackup || verb == verbDrill {
			// A backup's or a drill's outcome goes into status.backup, not into a retry
			// (backup.go, drill.go). One outstanding is kept, and waited for only by what a fix
			// does not need.
			jobOf := p.backupJob
			if verb == verbDrill {
				jobOf = p.drillJob
			}
			switch s, keep := jobOf(j, backup); {
			case keep:
				js.keep = append(js.keep, j)
				if js.backupWait == nil {
					js.backupWait = &s
				}
			case verb == verbBackup && p.outgrewScratch(j):
				js.backupRetry = j.Labels[LabelBackupFor]
			case !p.outcomeHandedIn(j):
				// Its outcome is in this answer's status, but Metacontroller may hand the
				// next sync the EtcdCluster as its cache held it before that status was
				// written, and write that sync's status over it: the finished Job, the
				// outcome's only other record, stays (not waited for) until a sync is
				// handed the outcome in status, which every later status carries.
				js.keep = append(js.keep, j)
			}
			continue
		}
		state, at := stateOf(j)
		record := p.switchoverJob(j)
		if record != nil {
			js.switchover = record
		}
		var s step
		switch state {
		case jobRunning:
			s = p.wait(who, fmt.Sprintf("%s %s: Job %s running", verb, who, j.Name), resyncSoon)
		case jobSucceeded:
			if p.effectShows(j) {
				js.done = append(js.done, keyOf(j))
				if record != nil {
					// The switchover's only record but for this answer's status, which a sync
					// on a stale parent may overwrite: it stays, not waited for.
					js.keep = append(js.keep, j)
				}
				if verb == verbAuth {
					js.auth = p.authApplied(j)
				}
				continue
			}
			s = p.wait(who, fmt.Sprintf("%s %s: Job %s done, membership does not show it yet", verb, who, j.Name), resyncSoon)
		case jobFailed:
			failures := attemptOf(j) + 1
			if failures >= maxJobAttempts {
				js.exhausted = j
				continue
			}
			// The reason names the retry time, not the time left, so status stays the same
			// from sync to sync while waiting.
			// The resync is rounded up to whole seconds: never before the retry time (that sync
			// would only wait again), and never 0, which Metacontroller reads as its default.
			if retryAt := at.Add(jobBackoff(failures - 1)); retryAt.After(p.obs.Now) {
				resync := math.Ceil(retryAt.Sub(p.obs.Now).Seconds())
				s = p.wait(who, fmt.Sprintf("%s %s: Job %s failed (%d of %d), retrying at %s", verb, who, j.Name, failures, maxJobAttempts, retryAt.UTC().Format(time.RFC3339)), resync)
				s.degraded, s.degradedBy = s.action.Reason, ReasonJobFailing
				break
			}
			js.failures, js.retry = failures, keyOf(j)
			continue
		}
		js.keep = append(js.keep, j)
		if js.waiting == nil {
			js.waiting = &s
		}
	}
	js.backup = backup.st
	if js.waiting != nil && js.exhausted != nil {
		// Whether it is still wanted is decided once nothing else is outstanding.
		js.keep = append(js.keep, js.exhausted)
	}
	// One membership change at a time: nothing else starts while a Job is outstanding.
	return js
}

// exhaustedHold reports a Job that failed as often as allowed and whose step is still wanted.
func (p *planner) exhaustedHold(j *batchv1.Job) step {
	verb, who := j.Labels[LabelAction], j.Labels[LabelMember]
	s := p.wait(who, fmt.Sprintf("%s %s failed %d times; delete Job %s to try once more", verb, who, attemptOf(j)+1, j.Name), resyncHold)
	s.action.Type = Hold
	s.degraded, s.degradedBy = s.action.Reason, ReasonJobAttemptsExhausted
	return s
}

// effectShows reports whether membership reflects a succeeded Job.
func (p *planner) effectShows(j *batchv1.Job) bool {
	who := j.Labels[LabelMember]
	ord, _ := Ordinal(p.c.Name, who)
	m := p.byOrd[ord]
	switch j.Labels[LabelAction] {
	case verbAddLearner:
		return m != nil
	case verbPromote:
		return m == nil || !m.IsLearner
	case verbUpdatePeerURL:
		url, ok := "", false
		if m != nil {
			url, ok = p.listenedPeerURL(m)
		}
		return !ok || slices.Equal(m.PeerURLs, []string{url})
	case verbRemove:
		id := j.Annotations[AnnotationMemberID]
		for _, m := range p.members {
			if fmt.Sprintf("%x", m.ID) == id {
				return false
			}
		}
		return true
	case verbExpandClaim:
		return p.expandedClaim(ClaimName(p.c.Name, ord), j.Annotations[AnnotationClaimSize])
	case verbRestartPod:
		return p.podRestarted(ord, j.Annotations[AnnotationPodUID])
	case verbAuth:
		a := p.obs.Etcd.Auth
		return a.Known && a.Enabled == (j.Annotations[AnnotationAuthEnabled] == "true")
	case verbDisarm:
		alarm, id := j.Labels[LabelAlarm], j.Annotations[AnnotationMemberID]
		for _, a := range p.obs.Etcd.Alarms {
			if a.Type == alarm && (id == "" || fmt.Sprintf("%x", a.MemberID) == id) {
				return false
			}
		}
		return true
	}
	// A leader move has no lasting effect to check: leadership may move again on its own. If
	// it moved back, the move is planned again as the next attempt (attemptFor). Compaction
	// and defragmentation are read from done, and from the members' database sizes.
	return true
}

// runJob starts a member Job. Its endpoints are every voter's client URL: stable while the
// membership is, so a replayed sync renders the same Job under the same name. A step that ran
// as often as allowed without a lasting effect (leadership that keeps moving back) waits for
// a person instead, keeping its last Job so that the count survives.
func (p *planner) runJob(j memberJob, t ActionType, reason string) step {
	secure := p.jobTLS()
	for _, m := range p.voters() {
		j.endpoints = append(j.endpoints, clientURLOf(p.c, m.name, p.cfg.ClusterDomain, secure))
	}
	j.clientSecret = p.tls.clientSecret
	j.attempt = p.attemptFor(j)
	if j.attempt >= maxJobAttempts {
		s := p.wait(j.member, fmt.Sprintf("%s %s ran %d times without a lasting effect (%s); delete its Jobs to try again", j.verb, j.member, j.attempt, reason), resyncHold)
		s.degraded, s.degradedBy = s.action.Reason, ReasonJobAttemptsExhausted
		s.keep = p.jobsOf(j)
		return s
	}
	if what := p.accessWait(j); what != "" {
		return p.wait(j.member, reason+": waiting for "+what+", applied with this answer", resyncSoon)
	}
	s := p.base(Action{Type: t, Member: j.member, Reason: reason}, resyncSoon)
	s.job = &j
	return s
}

// attemptFor numbers a Job among the earlier attempts at the same step: after a failed Job
// dropped in this sync, after the last status when it reported the same step, and after every
// observed Job of the step, so that a step whose effect was undone (leadership moved back)
// runs again under a new name rather than being answered by the completed Job forever.
func (p *planner) attemptFor(j memberJob) int {
	n := 0
	if p.stage.retry == j.key() {
		n = p.stage.failures
	} else if a := p.obs.Cluster.Status.Action; a != nil && a.Member == j.member && a.Type == actionOfVerb(j.verb).String() {
		n = int(p.obs.Cluster.Status.JobFailures)
	}
	for _, o := range p.jobsOf(j) {
		n = max(n, attemptOf(o)+1)
	}
	return n
}

// jobsOf are the observed Jobs of the same step as j.
func (p *planner) jobsOf(j memberJob) []*batchv1.Job {
	var out []*batchv1.Job
	for _, o := range p.jobs {
		if keyOf(o) == j.key() {
			out = append(out, o)
		}
	}
	return out
}

func actionOfVerb(verb string) ActionType {
	switch verb {
	case verbAddLearner:
		return AddLearner
	case verbPromote:
		return PromoteLearner
	case verbRemove:
		return RemoveMember
	case verbCompact:
		return Compact
	case verbDefragment:
		return Defragment
	case verbDisarm:
		return DisarmAlarm
	case verbUpdatePeerURL:
		return UpdatePeerURL
	case verbExpandClaim:
		return ExpandVolume
	case verbRestartPod:
		return RestartPod
	case verbAuth:
		return ApplyAuth
	case verbBackup:
		return TakeBackup
	case verbDrill:
		return RestoreDrill
	}
	return MoveLeader
}
