// Package etcdstate holds what the operator asks of an etcd cluster and what it observed, as
// plain values. The hooks package builds a Request, the membership package answers it with a
// Snapshot from live etcd, and the planner in sync reads the Snapshot. Neither side's I/O
// leaks through: this package has no dependencies.
package etcdstate

// Snapshot is one observation of an etcd cluster, taken under one deadline.
//
// Asked tells "etcd says X" apart from "could not ask": when Asked is false, Members is
// empty and Err says why, and nothing may be concluded about membership.
type Snapshot struct {
	// Asked is true when a voter answered MemberList.
	Asked bool `json:"asked"`
	// Err explains why the cluster (or some member) could not be asked; empty otherwise.
	Err string `json:"err,omitempty"`
	// ClusterID as reported in the MemberList response header.
	ClusterID uint64 `json:"clusterID,omitempty"`
	// Members as the MemberList response has them, sorted by ID.
	Members []Member `json:"members,omitempty"`
	// Complete is true when every member in the list answered Status.
	Complete bool `json:"complete"`
	// Inconsistent is set when members disagree (e.g. two leaders, a member that reports a
	// different cluster ID or a member ID the list lacks); the planner holds on it.
	Inconsistent string `json:"inconsistent,omitempty"`
	// Forked names the endpoints (pod names) whose answers say that a second membership is
	// alive: another cluster ID, or a second member that reports itself leader, also one
	// outside the member list. Inconsistent says what each answered.
	Forked []string `json:"forked,omitempty"`
	// Unlisted are the endpoints that answered under this cluster's ID as a member the list
	// lacks, without claiming leadership: a removed member that has not yet learnt of its
	// removal (etcd stops it when it does), or a copy of a member's data started on its own.
	// Only the planner, which remembers each pod's member IDs, can tell the two apart.
	Unlisted []Unlisted `json:"unlisted,omitempty"`
	// Alarms are the cluster's active alarms, also those of members no longer in the list,
	// and those of member ID 0, which etcd raises when it cannot tell which member is at fault.
	Alarms []Alarm `json:"alarms,omitempty"`
	// Auth is whether etcd's authentication is on, as the members' anonymous reads showed.
	Auth AuthState `json:"auth"`
}

// AuthState is whether etcd's authentication is on. Known is false when no member answered
// a read, so nothing can be said either way.
type AuthState struct {
	Known   bool `json:"known,omitempty"`
	Enabled bool `json:"enabled,omitempty"`
}

// Unlisted is one answer from outside the member list.
type Unlisted struct {
	// Endpoint is the pod name.
	Endpoint string `json:"endpoint"`
	// MemberID is the member ID it answered under.
	MemberID uint64 `json:"memberID"`
}

// Alarm is one active etcd alarm.
type Alarm struct {
	MemberID uint64 `json:"memberID"`
	Type     string `json:"type"` // NOSPACE, CORRUPT
}

// Member is one etcd member and, when it answered, its Status.
type Member struct {
	ID         uint64   `json:"id"`
	Name       string   `json:"name,omitempty"` // empty until the member has started
	PeerURLs   []string `json:"peerURLs,omitempty"`
	ClientURLs []string `json:"clientURLs,omitempty"`
	IsLearner  bool     `json:"isLearner,omitempty"`

	// Reachable is true when the member answered Status within the deadline.
	Reachable bool `json:"reachable"`
	// Healthy is etcdctl's notion: Status without errors and a serializable read served.
	Healthy bool `json:"healthy"`
	// IsLeader is true when the member reports itself as leader.
	IsLeader         bool     `json:"isLeader,omitempty"`
	RaftIndex        uint64   `json:"raftIndex,omitempty"`
	RaftAppliedIndex uint64   `json:"raftAppliedIndex,omitempty"`
	RaftTerm         uint64   `json:"raftTerm,omitempty"`
	Version          string   `json:"version,omitempty"`
	DBSize           int64    `json:"dbSize,omitempty"`
	DBSizeInUse      int64    `json:"dbSizeInUse,omitempty"` // logically in use; the rest is free pages
	DBSizeQuota      int64    `json:"dbSizeQuota,omitempty"` // the backend quota it reports running with (3.6 on); 0 from 3.5
	Alarms           []string `json:"alarms,omitempty"`      // e.g. NOSPACE, CORRUPT
	Errors           []string `json:"errors,omitempty"`      // Status errors and why it was unreachable
}

// Started reports whether the member has ever started (etcd learns its name on start).
func (m Member) Started() bool { return m.Name != "" }

// Voters returns the members that are not learners.
func (s Snapshot) Voters() []Member {
	var out []Member
	for _, m := range s.Members {
		if !m.IsLearner {
			out = append(out, m)
		}
	}
	return out
}

// Learners returns the learner members.
func (s Snapshot) Learners() []Member {
	var out []Member
	for _, m := range s.Members {
		if m.IsLearner {
			out = append(out, m)
		}
	}
	return out
}

// Leader returns the member that reports itself leader, if any.
func (s Snapshot) Leader() (Member, bool) {
	for _, m := range s.Members {
		if m.IsLeader {
			return m, true
		}
	}
	return Member{}, false
}

// Endpoint is where to reach one member's client port.
type Endpoint struct {
	// Member is the pod name.
	Member string `json:"member"`
	// Address is host:port to dial: the pod IP and the client port when the pod has an IP.
	Address string `json:"address"`
	// ServerName is the member's stable DNS name: the TLS server name, and the address to
	// fall back to when the pod has no IP yet.
	ServerName string `json:"serverName"`
	// TLS is true when the member is asked over https: its pod serves TLS on the client port.
	TLS bool `json:"tls,omitempty"`
}

// Request names the cluster to observe: Key identifies it in the observer's client cache (for
// example namespace/name/uid), Endpoints are its pods, TLS is nil for plain HTTP.
type Request struct {
	Key       string
	Endpoints []Endpoint
	TLS       *TLS
	// Login is the user the observer logs in as while etcd's auth is on; nil: none.
	Login *Login
}

// AuthDeclaration is what an auth Job applies to etcd: whether auth is on, every user it
// manages (each with the Secret holding its password) and role, and the users and roles to
// delete. The member tool reads it from its command line.
type AuthDeclaration struct {
	Enabled     bool               `json:"enabled"`
	Users       []AuthDeclaredUser `json:"users"`
	Roles       []AuthDeclaredRole `json:"roles"`
	RemoveUsers []string           `json:"removeUsers,omitempty"`
	RemoveRoles []string           `json:"removeRoles,omitempty"`
}

// AuthDeclaredUser is a user, the Secret with its password, and its roles.
type AuthDeclaredUser struct {
	Name   string   `json:"name"`
	Secret string   `json:"secret"`
	Roles  []string `json:"roles,omitempty"`
}

// AuthDeclaredRole is a role and its permissions.
type AuthDeclaredRole struct {
	Name        string                   `json:"name"`
	Permissions []AuthDeclaredPermission `json:"permissions,omitempty"`
}

// AuthDeclaredPermission is read, write or readwrite on a key, or with Prefix on every key
// starting with it.
type AuthDeclaredPermission struct {
	Type   string `json:"type"`
	Key    string `json:"key,omitempty"`
	Prefix bool   `json:"prefix,omitempty"`
}

// Login is an etcd user name and password.
type Login struct {
	User, Password string
}

// TLS is PEM material for talking to a cluster that serves client TLS. Cert and Key are the
// client certificate; both may be empty when the cluster does not ask for one.
type TLS struct {
	CA, Cert, Key []byte
}
