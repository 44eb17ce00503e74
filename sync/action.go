package sync

// ActionType names what one sync decided. Each sync takes at most one action that changes
// the cluster; Steady, Wait and Hold change nothing.
type ActionType int

// Action types, in no particular order.
const (
	// Steady: nothing to do; the cluster matches its spec.
	Steady ActionType = iota
	// Wait: something in progress (a Job, a pod starting) must finish first.
	Wait
	// Hold: state is unknown, unsafe or the spec is invalid; nothing destructive is done.
	Hold
	// Bootstrap: first children and the one seed member.
	Bootstrap
	// AddLearner: a Job adds the next member as a learner.
	AddLearner
	// PromoteLearner: a Job promotes a caught-up learner.
	PromoteLearner
	// RemoveMember: a Job removes a member.
	RemoveMember
	// MoveLeader: a Job moves leadership before a leader's pod is disrupted.
	MoveLeader
	// ReplacePod: the StatefulSet partition is lowered so one pod is recreated.
	ReplacePod
	// ScaleStatefulSet: the StatefulSet's replicas change to follow membership.
	ScaleStatefulSet
	// Teardown: a finalize step.
	Teardown
	// Compact: a Job compacts the key space at the current revision (NOSPACE remediation).
	Compact
	// Defragment: a Job defragments one member's database.
	Defragment
	// DisarmAlarm: a Job disarms an alarm (NOSPACE once space is freed; CORRUPT of a member
	// that was replaced).
	DisarmAlarm
	// RecoverQuorum: a step of a quorum recovery from one surviving member.
	RecoverQuorum
	// TakeBackup: a Job takes a snapshot and stores it (spec.backup, or on request).
	TakeBackup
	// UpdatePeerURL: a Job updates a member's peer URL to the scheme its pod listens with.
	UpdatePeerURL
	// ExpandVolume: a Job asks for more storage on one member's claim.
	ExpandVolume
	// RestartPod: a Job deletes one member's pod so that its claim's file system grows when
	// the volume is mounted again (FileSystemResizePending).
	RestartPod
	// RestoreDrill: a Job restores the newest backup into a scratch directory and compares it
	// with the live cluster (spec.backup.verify).
	RestoreDrill
	// ApplyAuth: a Job makes etcd's users, roles and auth switch match spec.auth.
	ApplyAuth
)

var actionNames = [...]string{
	Steady:           "Steady",
	Wait:             "Wait",
	Hold:             "Hold",
	Bootstrap:        "Bootstrap",
	AddLearner:       "AddLearner",
	PromoteLearner:   "PromoteLearner",
	RemoveMember:     "RemoveMember",
	MoveLeader:       "MoveLeader",
	ReplacePod:       "ReplacePod",
	ScaleStatefulSet: "ScaleStatefulSet",
	Teardown:         "Teardown",
	Compact:          "Compact",
	Defragment:       "Defragment",
	DisarmAlarm:      "DisarmAlarm",
	RecoverQuorum:    "RecoverQuorum",
	TakeBackup:       "Backup",
	UpdatePeerURL:    "UpdatePeerURL",
	ExpandVolume:     "ExpandVolume",
	RestartPod:       "RestartPod",
	RestoreDrill:     "RestoreDrill",
	ApplyAuth:        "ApplyAuth",
}

func (t ActionType) String() string {
	if int(t) < len(actionNames) {
		return actionNames[t]
	}
	return "ActionType(?)"
}

// Action is the one thing a sync decided, with the member it concerns and why.
type Action struct {
	Type   ActionType
	Member string
	Reason string
}
