package sync

import (
	"encoding/json"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// Safety state that outlives a status. status.v2LogIndex and status.recovery gate what the
// planner may do: the first keeps v3.7 off a raft log that may hold v2 requests, the second
// keeps the fences of a quorum recovery up until the survivor can no longer force a new
// cluster. A status is lost with the EtcdCluster's (a restore of the object without it), and
// an older hook replica writes it without the fields it does not know; either would switch
// the gate off in silence. So both have a copy beside the ledger, as annotations of the join
// ConfigMap, written by the same sync, and the planner reads the later of the two records. A
// copy lost too leaves the safe fallbacks: the highest raft index seen as the v2 bound
// (versions.go), and no recovery, which a recovery still needed starts again from Chosen.
// A recovery phase this build does not know (a newer hook's) is not acted on at all.

// Annotations of the join ConfigMap that copy status.v2LogIndex and status.recovery.
const (
	AnnotationV2LogIndex = "etcdops.dev/v2-log-index"
	AnnotationRecovery   = "etcdops.dev/recovery"
)

// noV2Log is status.v2LogIndex of a cluster that never ran etcd v3.5: created on v3.6 or
// later, so its raft log holds no v2 request and the move to v3.7 waits for nothing.
const noV2Log = -1

// durable is what the join ConfigMap copies of status besides the ledger and the cluster ID.
type durable struct {
	v2LogIndex int64
	recovery   *v1alpha1.RecoveryStatus
}

// annotate writes d into the join ConfigMap's annotations.
func (d durable) annotate(ann map[string]string) {
	if d.v2LogIndex != 0 {
		ann[AnnotationV2LogIndex] = strconv.FormatInt(d.v2LogIndex, 10)
	}
	if d.recovery != nil {
		b, err := json.Marshal(d.recovery)
		if err != nil {
			panic(fmt.Sprintf("sync: encoding a recovery cannot fail: %v", err))
		}
		ann[AnnotationRecovery] = string(b)
	}
}

// mergedDurable reads both records of status and of the join ConfigMap cm (nil when missing)
// and keeps the safer, or later, of each: the highest v2 index (a positive index over "none",
// which over nothing known), and the recovery whose phase began later (status's on a tie).
func mergedDurable(st v1alpha1.EtcdClusterStatus, cm *corev1.ConfigMap) durable {
	d := durable{v2LogIndex: st.V2LogIndex, recovery: st.Recovery}
	if cm == nil {
		return d
	}
	if n, err := strconv.ParseInt(cm.Annotations[AnnotationV2LogIndex], 10, 64); err == nil && (n > d.v2LogIndex || d.v2LogIndex == 0) {
		d.v2LogIndex = n
	}
	var r v1alpha1.RecoveryStatus
	if raw := cm.Annotations[AnnotationRecovery]; raw != "" && json.Unmarshal([]byte(raw), &r) == nil {
		if d.recovery == nil || r.Since.After(d.recovery.Since.Time) {
			d.recovery = &r
		}
	}
	return d
}

// knownRecoveryPhase: this build knows what phase means, and so what it may do next.
func knownRecoveryPhase(phase string) bool {
	switch phase {
	case recoveryChosen, recoveryFencing, recoveryForcing, recoveryDone, recoveryWithdrawing, recoveryCancelled:
		return true
	}
	return false
}
