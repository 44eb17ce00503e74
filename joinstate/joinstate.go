// Package joinstate is the cluster's join state: what a starting etcd pod needs to know to
// start safely. The planner (sync) renders it into a ConfigMap; the launcher in each etcd pod
// reads it from the mounted file. Changing it never restarts a running pod.
package joinstate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ConfigMapKey is the key of the join state in the ConfigMap and the file name in the pod.
const ConfigMapKey = "join-state.json"

// A launcher that refuses to start etcd says why in its container's termination message,
// which the planner reads from the pod's status: Refused begins the message; ForeignCluster
// begins the reason when the volume holds another cluster's data, DataLost when it lacks the
// data of a member that was established (its claim was lost or replaced).
const (
	Refused        = "launch refused: "
	ForeignCluster = "the volume holds data of cluster "
	DataLost       = "the volume lost the member's data: "
)

// The seed of a cluster bootstrapped from a snapshot says which revision it restored the
// same way: it ends its container once with a termination message of Restored and the
// revision, and starts etcd on the restored data when the container restarts. A restore that
// fails ends the container with RestoreFailed and the reason; the kubelet starts it again.
const (
	Restored      = "launch restored: revision "
	RestoreFailed = "launch restore failed: "
)

// RestoredPoint is what a seed restored: the revision, when it was stored (zero when the
// backup does not say), the lineage and the snapshot object it came from, and how long the
// restore took (zero when not said).
type RestoredPoint struct {
	Revision int64
	Time     time.Time
	Lineage  string
	Object   string
	Took     time.Duration
}

// RestoredMessage is the seed's termination message after it restored p:
// "launch restored: revision R [at TIME] [of lineage L] [in DURATION] from OBJECT".
func RestoredMessage(p RestoredPoint) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s%d", Restored, p.Revision)
	if !p.Time.IsZero() {
		b.WriteString(" at " + p.Time.UTC().Format(time.RFC3339Nano))
	}
	if p.Lineage != "" {
		b.WriteString(" of lineage " + p.Lineage)
	}
	if p.Took > 0 {
		b.WriteString(" in " + p.Took.Round(time.Millisecond).String())
	}
	b.WriteString(" from " + p.Object)
	return b.String()
}

// ParseRestored reads a termination message of RestoredMessage (or of an older launcher,
// which said the revision and the object only); false for any other.
func ParseRestored(msg string) (RestoredPoint, bool) {
	rest, ok := strings.CutPrefix(msg, Restored)
	if !ok {
		return RestoredPoint{}, false
	}
	num, rest, _ := strings.Cut(rest, " ")
	rev, err := strconv.ParseInt(num, 10, 64)
	if err != nil || rev <= 0 {
		return RestoredPoint{}, false
	}
	p := RestoredPoint{Revision: rev}
	if at, ok := strings.CutPrefix(rest, "at "); ok {
		var ts string
		ts, rest, _ = strings.Cut(at, " ")
		if p.Time, err = time.Parse(time.RFC3339Nano, ts); err != nil {
			return RestoredPoint{}, false
		}
	}
	if l, ok := strings.CutPrefix(rest, "of lineage "); ok {
		p.Lineage, rest, _ = strings.Cut(l, " ")
	}
	if in, ok := strings.CutPrefix(rest, "in "); ok {
		var d string
		d, rest, _ = strings.Cut(in, " ")
		if p.Took, err = time.ParseDuration(d); err != nil {
			return RestoredPoint{}, false
		}
	}
	p.Object, _ = strings.CutPrefix(rest, "from ")
	return p, true
}

// Cluster states, as etcd's --initial-cluster-state takes them.
const (
	StateNew      = "new"
	StateExisting = "existing"
)

// State is the join state of one cluster.
type State struct {
	// Token is --initial-cluster-token: unique per cluster incarnation (namespace, name, uid).
	Token string `json:"token"`
	// ClusterState is "new" only until the cluster ID is first recorded; "existing" after.
	ClusterState string `json:"clusterState"`
	// ClusterID is the etcd cluster ID on record, in hex; "" before the cluster first
	// answered. A volume written before launchers recorded the cluster token is taken as this
	// cluster's only when its data is of this ID.
	ClusterID string `json:"clusterID,omitempty"`
	// Members are all current members, each as etcd's membership has it (the name is the
	// pod's name, also for a member added but not yet started). Sorted by name.
	Members []Member `json:"members"`
	// Recovery, while a quorum recovery is in progress, names the survivor that restarts once
	// with --force-new-cluster; every other member is fenced.
	Recovery *Recovery `json:"recovery,omitempty"`
	// Restore, on a cluster bootstrapped from a snapshot, names the member that restores it
	// before its first start. It acts only while ClusterState is "new".
	Restore *Restore `json:"restore,omitempty"`
}

// Restore is the snapshot a new cluster starts from.
type Restore struct {
	// Member is the seed that restores the snapshot into its empty volume.
	Member string `json:"member"`
	// Backup is the snapshot asked for: its name, or "latest".
	Backup string `json:"backup"`
	// Revision, with "latest", is the revision to restore to: the snapshot at or before it
	// and the stored changes after it. 0: the newest change stored.
	Revision int64 `json:"revision,omitempty"`
	// Time (RFC 3339), with "latest" and instead of Revision, asks for the last revision
	// stored at or before it.
	Time string `json:"time,omitempty"`
	// Lineage names the lineage to restore from; empty: latest's default, or the one
	// holding the snapshot named.
	Lineage string `json:"lineage,omitempty"`
}

// Recovery is a quorum recovery from one surviving member.
type Recovery struct {
	// Survivor is the member that restarts with --force-new-cluster.
	Survivor string `json:"survivor"`
	// Token identifies the recovery; the survivor's volume records it once applied, so the
	// flag is used once.
	Token string `json:"token"`
}

// Member is one member's join record.
type Member struct {
	// Name is the pod name, which is also etcd's --name.
	Name string `json:"name"`
	// PeerURL is the member's advertised peer URL.
	PeerURL string `json:"peerURL"`
	// Incarnation increases each time the member is replaced. A data dir written by an
	// older incarnation is stale and must be wiped before the member starts.
	Incarnation int64 `json:"incarnation"`
	// Established is true once the member has been seen started as a voter. An established
	// member must never start on an empty data dir: that could fork the cluster.
	Established bool `json:"established,omitempty"`
	// Fenced is true while a quorum recovery is in progress from another member: this
	// member's data belongs to the lost quorum, and starting on it could form that quorum
	// again beside the recovered cluster. It waits until it is added back anew.
	Fenced bool `json:"fenced,omitempty"`
	// Learner is true while the membership has the member as a learner. Its pod is not Ready
	// then: a learner refuses what clients send through the client Service, and a member that
	// has just joined does not know it is a learner until it applies its own addition.
	Learner bool `json:"learner,omitempty"`
}

// Find returns the member named name.
func (s State) Find(name string) (Member, bool) {
	for _, m := range s.Members {
		if m.Name == name {
			return m, true
		}
	}
	return Member{}, false
}

// Encode renders s as the ConfigMap value: stable, indented JSON and a newline.
func Encode(s State) string {
	e := encoders.Get().(*encoder)
	defer encoders.Put(e)
	e.buf.Reset()
	if err := e.enc.Encode(s); err != nil {
		panic(fmt.Sprintf("joinstate: encoding plain values cannot fail: %v", err))
	}
	return e.buf.String()
}

// encoders keep an indenting Encoder and its buffers from one Encode to the next: the planner
// encodes the join state on every sync, and json.MarshalIndent would allocate the compact
// and the indented copy each time. An Encoder writes what MarshalIndent does, and the
// newline.
var encoders = sync.Pool{New: func() any {
	e := &encoder{}
	e.enc = json.NewEncoder(&e.buf)
	e.enc.SetIndent("", "  ")
	return e
}}

type encoder struct {
	buf bytes.Buffer
	enc *json.Encoder
}

// Decode parses a ConfigMap value.
func Decode(data []byte) (State, error) {
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return State{}, fmt.Errorf("join state: %w", err)
	}
	if s.ClusterState != StateNew && s.ClusterState != StateExisting {
		return State{}, fmt.Errorf("join state: clusterState %q is neither %q nor %q", s.ClusterState, StateNew, StateExisting)
	}
	return s, nil
}
