// Package launcher decides how an etcd pod starts. Decide is pure: from the cluster's join
// state, the pod's name and what is on its volume, it says which flags etcd gets, whether
// the data dir must be wiped first, or why the pod must not start. Prepare does the I/O
// around it (read the join state, inspect, wipe, write the marker) and returns etcd's argv.
package launcher

import (
	"fmt"
	"strings"

	"etcdops.dev/etcdops/joinstate"
)

// Kind is what a starting pod does.
type Kind int

const (
	// Start runs etcd with the decided flags, after wiping the data dir if told.
	Start Kind = iota
	// Wait exits non-zero so the kubelet restarts the pod, by when the mounted join state
	// may have caught up.
	Wait
	// Refuse exits non-zero because starting could harm the cluster; the planner sees a
	// failing member and replaces it.
	Refuse
)

func (k Kind) String() string {
	switch k {
	case Start:
		return "start"
	case Wait:
		return "wait"
	case Refuse:
		return "refuse"
	default:
		return fmt.Sprintf("Kind(%d)", int(k))
	}
}

// Volume is what the launcher found on the member's volume.
type Volume struct {
	// HasData is true when the data dir exists and is not empty.
	HasData bool
	// HasMarker is true when the incarnation marker exists; Incarnation is its value.
	HasMarker   bool
	Incarnation int64
	// Token is the join state token of the cluster whose member wrote the data dir, or ""
	// on a volume written before the launcher recorded it.
	Token string
	// ClusterID, on a volume without a token, is the etcd cluster ID its data dir's write-ahead
	// log records, in hex; "" when it has none or it cannot be read.
	ClusterID string
	// Recovered is the token of the last quorum recovery this volume started with
	// --force-new-cluster, or "".
	Recovered string
	// Restored is the join state token of the cluster whose snapshot restore wrote the data
	// dir, or "".
	Restored string
	// Established is true when the member of the marker's incarnation was seen a voter
	// (RecordEstablished).
	Established bool
}

// Input is everything the decision depends on.
type Input struct {
	Join    joinstate.State
	Name    string // the pod name, which is the member name
	DataDir string
	Volume  Volume
	// Answering are the other established members of the join state heard on their peer
	// URLs, asked only before a quorum recovery would force a new cluster (Prepare's
	// AnswersFor).
	Answering []string
}

// Decision is how the pod starts, or why it does not.
type Decision struct {
	Kind   Kind
	Reason string
	// Wipe empties the data dir before start: it holds an older incarnation's data.
	Wipe bool
	// Incarnation is written to the marker before etcd starts, and Token, the cluster's,
	// beside it.
	Incarnation int64
	Token       string
	// Recovered, when set, is the quorum recovery token written to the volume before etcd
	// starts with --force-new-cluster, so that it does so once.
	Recovered string
	// Restore: the data dir is written from the join state's snapshot before etcd starts.
	Restore bool
	// Args are the flags the launcher owns, added to the pod's static etcd flags.
	Args []string
}

// OwnedFlags are the etcd flags Decide sets; the pod's static flags must not set them.
var OwnedFlags = []string{"name", "data-dir", "initial-cluster", "initial-cluster-state", "initial-cluster-token", "force-new-cluster"}

// Decide is the start decision of member in.Name. In order, first match wins:
//  1. not in the join state → wait (the mounted file lags behind the ConfigMap)
//  2. join state without a token → wait (malformed; never start with etcd's default token)
//  3. data that another cluster's member wrote (an earlier cluster of the same name whose
//     claims were kept) → refuse; nothing of it is wiped. Another cluster's markers beside
//     an empty data dir are ignored. A volume without a token was written before the
//     launcher recorded one: it counts as this cluster's unless its data is of another etcd
//     cluster ID than the one on record (refused likewise); the start records the token.
//  4. marker newer than the join state → wait (the file lags behind the incarnation)
//  5. data without a marker → refuse (nobody knows which incarnation wrote it)
//  6. fenced by a quorum recovery from another member → wait (its data belongs to the lost
//     quorum; started, it could form that quorum again beside the recovered cluster)
//  7. established member whose data is missing or stale → refuse (starting empty could fork
//     the cluster: a seed would form a new one, a voter would vote without its log)
//  8. the seed of a new cluster bootstrapped from a snapshot: an empty volume → restore the
//     snapshot, then start; data restored for this cluster → restart with it; any other
//     data → refuse (a restore never lands on a volume that holds a cluster already)
//  9. the survivor of a quorum recovery not yet applied to this volume → wait while another
//     established member answers on its peer URL (it runs on the old membership, and two of them could
//     keep a quorum of it beside the recovered cluster); else start once with
//     --force-new-cluster, recording the recovery's token first
//  10. otherwise start; wipe the data first when an older incarnation wrote it.
//
// With data kept, the --initial-* flags are harmless: etcd reads them only for an empty dir.
func Decide(in Input) Decision {
	me, ok := in.Join.Find(in.Name)
	if !ok {
		return Decision{Kind: Wait, Reason: fmt.Sprintf("member %s is not in the join state yet", in.Name)}
	}
	if in.Join.Token == "" {
		return Decision{Kind: Wait, Reason: "join state has no initial cluster token"}
	}
	v := in.Volume
	if v.Token != "" && v.Token != in.Join.Token {
		if v.HasData {
			return Decision{Kind: Refuse, Reason: fmt.Sprintf("%s%s, not of this cluster %s: neither started on nor wiped (docs/runbooks.md, a volume of another cluster)",
				joinstate.ForeignCluster, v.Token, in.Join.Token)}
		}
		v = Volume{}
	}
	if v.HasData && v.Token == "" && v.ClusterID != "" && in.Join.ClusterID != "" && v.ClusterID != in.Join.ClusterID {
		return Decision{Kind: Refuse, Reason: fmt.Sprintf("%s%s (its etcd cluster ID; written before launchers recorded cluster tokens), not of this cluster, etcd cluster %s: neither started on nor wiped (docs/runbooks.md, a volume of another cluster)",
			joinstate.ForeignCluster, v.ClusterID, in.Join.ClusterID)}
	}
	if v.HasMarker && v.Incarnation > me.Incarnation {
		return Decision{Kind: Wait, Reason: fmt.Sprintf("volume is incarnation %d, join state still says %d", v.Incarnation, me.Incarnation)}
	}
	if v.HasData && !v.HasMarker {
		return Decision{Kind: Refuse, Reason: fmt.Sprintf("data dir %s has no incarnation marker", in.DataDir)}
	}
	if me.Fenced {
		survivor := "another member"
		if r := in.Join.Recovery; r != nil {
			survivor = r.Survivor
		}
		return Decision{Kind: Wait, Reason: fmt.Sprintf("fenced: quorum is being recovered from %s; %s starts again once added back", survivor, in.Name)}
	}
	stale := v.HasData && v.Incarnation < me.Incarnation
	// The volume may know before the join state does: a voter's pod reads its established
	// flag a minute or two after the promotion, and a data dir lost meanwhile must not let
	// the member start again with an empty log.
	established := me.Established || v.HasMarker && v.Established && v.Incarnation == me.Incarnation
	if established && (!v.HasData || stale) {
		return Decision{Kind: Refuse, Reason: fmt.Sprintf("%sestablished member %s has no data of incarnation %d in %s", joinstate.DataLost, in.Name, me.Incarnation, in.DataDir)}
	}
	d := Decision{Kind: Start, Wipe: stale, Incarnation: me.Incarnation, Token: in.Join.Token, Args: []string{
		"--name=" + in.Name,
		"--data-dir=" + in.DataDir,
		"--initial-cluster=" + initialCluster(in.Join),
		"--initial-cluster-state=" + in.Join.ClusterState,
		"--initial-cluster-token=" + in.Join.Token,
	}}
	if r := in.Join.Restore; r != nil && r.Member == in.Name && in.Join.ClusterState == joinstate.StateNew {
		switch {
		case !v.HasData:
			d.Restore = true
			d.Reason = fmt.Sprintf("restore snapshot %s into a new cluster, then start it", r.Backup)
			return d
		case v.Restored != in.Join.Token || stale:
			return Decision{Kind: Refuse, Reason: fmt.Sprintf("the cluster is to start from snapshot %s, but data dir %s holds data it was not restored to: "+
				"a restore starts only on an empty volume; delete the old cluster's volume claims first (docs/runbooks.md, restore over an existing cluster)", r.Backup, in.DataDir)}
		}
	}
	if RecoveryPending(in.Join, in.Name, v) && v.HasData && !stale {
		r := in.Join.Recovery
		if len(in.Answering) > 0 {
			return Decision{Kind: Wait, Reason: fmt.Sprintf("not forcing a new cluster (recovery %s) while %s still answer(s) on the peer URL: the old membership may still have a quorum", r.Token, strings.Join(in.Answering, ", "))}
		}
		d.Reason = fmt.Sprintf("recover quorum: start once with --force-new-cluster from the data of incarnation %d (recovery %s)", me.Incarnation, r.Token)
		d.Recovered = r.Token
		d.Args = append(d.Args, "--force-new-cluster")
		return d
	}
	reason := fmt.Sprintf("restart with data of incarnation %d", me.Incarnation)
	switch {
	case stale:
		reason = fmt.Sprintf("wipe data of incarnation %d, join as incarnation %d", v.Incarnation, me.Incarnation)
	case !v.HasData && in.Join.ClusterState == joinstate.StateNew:
		reason = "start a new cluster"
	case !v.HasData:
		reason = "join the existing cluster"
	}
	d.Reason = reason
	return d
}

// RecoveryPending reports whether member name is the survivor of a quorum recovery that its
// volume has not started from yet: its running etcd must restart, through the launcher, with
// --force-new-cluster. The liveness probe fails while it is, so the kubelet restarts it.
func RecoveryPending(join joinstate.State, name string, v Volume) bool {
	r := join.Recovery
	return r != nil && r.Survivor == name && r.Token != v.Recovered
}

// initialCluster lists every member of the join state as etcd wants it, name=peerURL.
func initialCluster(s joinstate.State) string {
	parts := make([]string, 0, len(s.Members))
	for _, m := range s.Members {
		parts = append(parts, m.Name+"="+m.PeerURL)
	}
	return strings.Join(parts, ",")
}
