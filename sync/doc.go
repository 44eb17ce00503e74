// Package sync is the operator's functional core: from one observation of an EtcdCluster, its
// children, its pods and its etcd membership, it decides the one next step and renders the
// complete set of desired children. It does no I/O and reads no clock: time comes in as
// Observed.Now.
//
// # The loop
//
// Metacontroller calls the hook on every change and periodically; the hook observes etcd and
// calls Plan, which derives everything from that one observation. Everything in a Decision is
// a function of the request, except the timestamp of a transition (an action's since, a
// condition's lastTransitionTime, a step's start and end in status.history), which is the
// clock's reading at the sync that made it and is carried unchanged from then on. Deadlines
// (a failed Job's back-off, a learner's time to catch up, a step's deadline) are measured
// against the same reading, and a resync that waits for one is rounded up to whole seconds. So a replayed or repeated sync gives the same answer, byte for byte,
// except at a transition and while it waits out a back-off. Plan runs the workflow's phases in
// order (see Plan) and the first phase that decides wins: problems are fixed before any normal
// operation.
//
// # One change per sync
//
// A sync makes at most one change that moves the cluster: one member Job (add a learner,
// promote it, remove a member, move leadership), or one StatefulSet change (grow or shrink
// by following membership, or lower the partition so exactly one pod is recreated). The next
// sync observes the result before anything else happens. Membership is never changed here:
// Jobs running etcdops-member do it, and each of their operations is idempotent.
//
// A backup (backup.go) is a member Job too: one at a time, and never started while a learner
// joins or a member and its pod are apart. It changes no membership, so while it runs only the
// normal phases wait for it; a repair does not. A restore drill (drill.go) is one as well, and
// reads only. With spec.backup, a risky step (a roll of every member, a scale-in, a minor
// upgrade, a forced quorum recovery) waits for a snapshot that guards it (guard.go).
//
// Member Jobs are named after their content and never change under a name; a Job in flight
// is returned unchanged and waited for, a succeeded one is dropped once membership shows its
// effect, a failed one is retried under a new name after a back-off, a bounded number of
// times.
//
// # Safety
//
// Every decision is checked against the invariants before it is returned (checkInvariants): at
// most one change, never a second learner, never a backup while a learner joins, never a
// removal or pod replacement that leaves the voters without a healthy quorum, never a shrink
// below a member (nor a deleted StatefulSet re-created below a member's pod), never two pods
// exposed to the StatefulSet's rolling update at once, the partition lowered onto a pod only
// once the pods above it are replaced and up (the StatefulSet controller would otherwise
// replace it later, unchecked), disturbing a healthy voter only when every other member
// answered, never removing or replacing a member only the hook cannot reach, never
// replacing the leader's pod while another voter could lead, and, with spec.backup, never
// disturbing a healthy voter for a risky step, nor forcing a new cluster, before a snapshot
// guards it.
// Teardown and bootstrap have checks of their own. A violation becomes a hold whose reason
// starts with "internal:".
// When etcd's state is unknown (not asked, inconsistent, a second membership answering, a
// stranger in the member list, another cluster ID) the observed children are returned
// unchanged, with any that are missing rendered again; only when no pod may serve may one
// outdated pod be recreated (nothing serves, no quorum is left to lose). A member that does
// not answer the hook while its pod is Ready, or marked not Ready only by the node controller,
// is unknown, not failed: it is never removed or replaced on that view alone. Children of
// names the planner does not render are kept as they are, or go when keeping them would harm
// (a second disruption budget, a finished Job).
//
// The join state (ConfigMap <cluster>-join) lists every member as etcd's membership has it,
// with an incarnation per member name that changes whenever the name is reused by a new member
// (kept in the ConfigMap's ledger annotation and, durably, in status.ledger), and marks
// members seen as started voters as established, so their launcher refuses an empty data dir.
package sync
