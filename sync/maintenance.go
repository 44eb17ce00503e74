package sync

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
)

// Database maintenance: an alarm of no member reported and left alone (unplacedAlarm), alarms of
// members that are gone disarmed (staleAlarm), a NOSPACE alarm remediated in the fix stage
// (noSpace), and scheduled defragmentation once everything else is done (defragment). Each is one Job at a time, and
// status.maintenance records where a remediation stands, so that a sync picks it up where the
// last one left it.

// Maintenance operations and phases, as status.maintenance records them.
const (
	opNoSpace    = "NoSpace"
	opDefragment = "Defragment"

	phaseCompacting    = "Compacting"
	phaseDefragmenting = "Defragmenting"
	phaseDisarming     = "Disarming"
	phaseDone          = "Done"
	phaseStuck         = "Stuck"
)

// Thresholds of the NOSPACE remediation.
const (
	// noSpaceDisarmBelowPercent: the alarm is disarmed once every member's database file is
	// below this share of its quota; at the quota itself the next write raises it again.
	noSpaceDisarmBelowPercent = 90
	// noSpaceThrottle: a NOSPACE alarm again this soon after one was disarmed is reported, not
	// remediated again: the data grows faster than compaction frees it.
	noSpaceThrottle = 10 * time.Minute
	// noSpaceMinFree: once the remediation has defragmented every member, one is
	// defragmented again when it shows at least this much free.
	noSpaceMinFree = 1 << 20
)

// unplacedAlarm: an alarm of member ID 0 names no member: etcd raises CORRUPT so when the members'
// hashes disagree and no majority says which one is wrong, and every write is refused. The
// operator cannot place it, so it acts on none of it: the alarm is reported, never disarmed,
// no member is replaced on it, and no quorum is recovered from it (quorumLost); a person finds the
// odd member by its hash (docs/runbooks.md).
func (p *planner) unplacedAlarm() (step, bool) {
	types := p.unplacedAlarms()
	if len(types) == 0 {
		return step{}, false
	}
	reason := fmt.Sprintf("%s alarm of member 0: etcd cannot tell which member is at fault and refuses writes; it is not disarmed, and no member is replaced or recovered from on it: compare every member's hash at one revision (etcdctl endpoint hashkv --rev=N) to find the odd one (docs/runbooks.md)",
		strings.Join(types, ", "))
	return p.blocked("", reason, ReasonUnplacedAlarm), true
}

// unplacedAlarms are the types of the alarms of member ID 0, sorted.
func (v *view) unplacedAlarms() []string {
	var out []string
	for _, a := range v.obs.Etcd.Alarms {
		if a.MemberID == 0 && !slices.Contains(out, a.Type) {
			out = append(out, a.Type)
		}
	}
	slices.Sort(out)
	return out
}

// staleAlarm: an alarm of a member no longer in the membership (a CORRUPT member that was removed to
// be replaced) is disarmed: etcd keeps it, and a CORRUPT alarm keeps the whole cluster from
// serving. unplacedAlarm has taken the alarms of member 0 before; a NOSPACE alarm is
// disarmed by the remediation (noSpace), once the members that remain have room.
func (p *planner) staleAlarm() (step, bool) {
	for _, a := range p.obs.Etcd.Alarms {
		if p.memberByID(a.MemberID) != nil || a.Type == "NOSPACE" {
			continue
		}
		reason := fmt.Sprintf("%s alarm of member %x, which is no longer a member: disarming it", a.Type, a.MemberID)
		return p.runJob(memberJob{verb: verbDisarm, member: p.leaderName(), alarm: a.Type, id: a.MemberID}, DisarmAlarm, reason), true
	}
	return step{}, false
}

// noSpace: a NOSPACE alarm stops every write. Remediated (spec.maintenance.noSpace, by default):
// compact the key space at the current revision; then defragment the members one per sync,
// the leader last; then disarm the alarms, one member's per sync, once every member answered
// and each one's database is below noSpaceDisarmBelowPercent of the quota it reports (the
// spec's where it reports none). When that cannot be reached, say what to raise, and let a
// roll that raises the quota go ahead. A new alarm soon after a disarm is only reported.
func (p *planner) noSpace() (step, bool) {
	a := p.noSpaceAlarms()
	prev := p.obs.Cluster.Status.Maintenance
	ongoing := prev != nil && prev.Operation == opNoSpace && prev.Phase != phaseDone
	if len(a.alarmed) == 0 && len(a.removed) == 0 {
		if ongoing {
			// Disarmed, by the remediation or by a person.
			now := metav1.NewTime(p.obs.Now)
			return step{maintenance: &v1alpha1.MaintenanceStatus{Operation: opNoSpace, Phase: phaseDone, Since: now, LastDisarmed: &now}}, false
		}
		return step{}, false
	}
	if m := p.c.Spec.Maintenance; m != nil && m.NoSpace == v1alpha1.NoSpaceReport {
		reason := "NOSPACE alarm raised by " + a.names + ": writes are refused; spec.maintenance.noSpace is Report: compact, defragment each member, then disarm the alarm (docs/runbooks.md)"
		return p.blocked(a.holder, reason, ReasonNoSpace), true
	}
	if !ongoing && prev != nil && prev.LastDisarmed != nil && p.obs.Now.Sub(prev.LastDisarmed.Time) < noSpaceThrottle {
		reason := fmt.Sprintf("NOSPACE alarm raised by %s again within %s of the last remediation (%s): the data grows faster than compaction frees it; raise --quota-backend-bytes in spec.etcdOptions or compact more often",
			a.names, noSpaceThrottle, prev.LastDisarmed.UTC().Format(time.RFC3339))
		return p.blocked(a.holder, reason, ReasonNoSpace), true
	}
	phase := phaseCompacting
	if ongoing {
		phase = prev.Phase
	}
	if p.finished(stepKey{verb: verbCompact}) {
		phase = phaseDefragmenting
	}
	if phase == phaseCompacting {
		s := p.runJob(memberJob{verb: verbCompact, member: p.leaderName()}, Compact, "NOSPACE alarm raised by "+a.names+": compacting the key space at the current revision")
		return p.maintaining(s, opNoSpace, phaseCompacting, ""), true
	}
	if s, ok := p.noSpaceDefragment(a, phase); ok {
		return s, true
	}
	if p.anyDrifted() {
		// A roll, which may raise the quota, goes first; the alarm is disarmed after it.
		return step{maintenance: p.record(opNoSpace, phaseStuck, "")}, false
	}
	return p.noSpaceDisarm(a, phase), true
}

// noSpaceAlarms are the NOSPACE alarms that stand, and how a step names them.
type noSpaceAlarms struct {
	alarmed []*member // members in the membership with the alarm, by ordinal
	removed []uint64  // IDs of members since removed with the alarm
	// names lists who raised them; holder is whom a Hold names: the first member that raised
	// one, else the leader.
	names, holder string
}

// noSpaceAlarms: the alarm of a member since removed is disarmed on the same terms as the
// others', who may be as full. A Job about it names the leader.
func (p *planner) noSpaceAlarms() noSpaceAlarms {
	a := noSpaceAlarms{alarmed: p.alarmed("NOSPACE"), removed: p.removedAlarms("NOSPACE"), holder: p.leaderName()}
	holders := make([]string, 0, len(a.alarmed)+len(a.removed))
	for _, m := range a.alarmed {
		holders = append(holders, m.name)
	}
	for _, id := range a.removed {
		holders = append(holders, fmt.Sprintf("removed member %x", id))
	}
	a.names = strings.Join(holders, ", ")
	if len(a.alarmed) > 0 {
		a.holder = a.alarmed[0].name
	}
	return a
}

// noSpaceDefragment defragments the next member due after the compaction. Every member is
// defragmented once after it, whatever it reports free: until a member commits a write after
// the compaction, the pages it freed still count as in use (and under NOSPACE nothing
// writes), while defragmenting copies only what is live. Past that phase, a member is
// defragmented again only when it shows free space (keys deleted and compacted since).
func (p *planner) noSpaceDefragment(a noSpaceAlarms, phase string) (step, bool) {
	due := func(m *member) bool { return m.DBSize-m.DBSizeInUse >= noSpaceMinFree }
	if phase == phaseDefragmenting {
		done := p.defragmented()
		due = func(m *member) bool { return !slices.Contains(done, m.name) }
	}
	m := p.nextToDefragment(due)
	if m == nil {
		return step{}, false
	}
	return p.repairFirst(p.defragmentStep(m, opNoSpace, "NOSPACE alarm raised by "+a.names+": compacted", phase)), true
}

// noSpaceDisarm disarms the alarms, one member's per sync, only on a complete view (a member
// that did not answer may be the full one) and once every database is below
// noSpaceDisarmBelowPercent of its quota; otherwise it says what to raise.
func (p *planner) noSpaceDisarm(a noSpaceAlarms, phase string) step {
	var silent, full []*member
	for _, m := range p.members {
		switch {
		case !m.Reachable:
			silent = append(silent, m)
		case m.DBSize*100 >= p.quotaOf(m)*noSpaceDisarmBelowPercent:
			full = append(full, m)
		}
	}
	if len(silent) > 0 {
		reason := fmt.Sprintf("NOSPACE alarm raised by %s: %s did not answer, so whether every database is below its quota is not known: the alarm stays until every member answers",
			a.names, memberNames(silent))
		return p.repairFirst(p.maintaining(p.blocked(silent[0].name, reason, ReasonNoSpace), opNoSpace, phase, ""))
	}
	if len(full) == 0 {
		j, whose := memberJob{verb: verbDisarm, member: p.leaderName(), alarm: "NOSPACE"}, ""
		if len(a.alarmed) > 0 {
			j.member, j.id, whose = a.alarmed[0].name, a.alarmed[0].ID, a.alarmed[0].name
		} else {
			j.id, whose = a.removed[0], fmt.Sprintf("removed member %x", a.removed[0])
		}
		s := p.runJob(j, DisarmAlarm,
			fmt.Sprintf("NOSPACE: every member's database is below %d%% of its %s quota: disarming the alarm of %s", noSpaceDisarmBelowPercent, p.quotas(p.members), whose))
		return p.maintaining(s, opNoSpace, phaseDisarming, "")
	}
	sizes := make([]string, len(full))
	for i, m := range full {
		sizes[i] = fmt.Sprintf("%s %s", m.name, bytesString(m.DBSize))
	}
	reason := fmt.Sprintf("NOSPACE: after compaction and defragmentation the database still fills %d%% or more of its %s quota (%s): the data in use needs the room; raise --quota-backend-bytes in spec.etcdOptions (the pods roll one at a time) or delete keys",
		noSpaceDisarmBelowPercent, p.quotas(full), strings.Join(sizes, ", "))
	return p.maintaining(p.blocked(a.holder, reason, ReasonNoSpace), opNoSpace, phaseStuck, "")
}

// repairFirst: while the remediation waits on a member (one that did not answer, or whose
// pause would cost quorum), the repairs among the fixes go first when they have a step to
// take, as membership changes are allowed under NOSPACE: a failed or corrupt member replaced, a
// learner or a pod without a member seen to. Otherwise the alarm, disarmed only once every
// member answers, would wait for the repairs it keeps from running.
func (p *planner) repairFirst(waiting step) step {
	if waiting.job != nil || waiting.action.Type == ReplacePod {
		return waiting
	}
	for _, repair := range []func() (step, bool){p.memberWithoutPod, p.learner, p.podWithoutMember, p.failedMember} {
		if s, ok := repair(); ok && s.action.Type != Hold {
			return s
		}
	}
	return waiting
}

// quotaOf is the backend quota m reports it runs with (etcd 3.6 on), which a roll may not have
// changed yet; the spec's where it reports none (3.5).
func (p *planner) quotaOf(m *member) int64 {
	if m.DBSizeQuota > 0 {
		return m.DBSizeQuota
	}
	return quotaBytes(p.c.Spec.EtcdOptions)
}

// quotas says the quota of ms: one size when they share it, else each member's.
func (p *planner) quotas(ms []*member) string {
	same := true
	for _, m := range ms {
		same = same && p.quotaOf(m) == p.quotaOf(ms[0])
	}
	if same {
		return bytesString(p.quotaOf(ms[0]))
	}
	each := make([]string, len(ms))
	for i, m := range ms {
		each[i] = fmt.Sprintf("%s %s", m.name, bytesString(p.quotaOf(m)))
	}
	return "own (" + strings.Join(each, ", ") + ")"
}

// defragment: scheduled defragmentation (spec.maintenance.defragment): a member whose database file
// is mostly free pages is defragmented, one per sync and the leader last, only now that every
// earlier phase found nothing to do: every voter healthy, no learner, no alarm, the spec
// applied.
func (p *planner) defragment() (step, bool) {
	m := p.c.Spec.Maintenance
	if m == nil || m.Defragment == nil || len(p.learners()) > 0 || p.healthyVoters() < len(p.voters()) || len(p.obs.Etcd.Alarms) > 0 {
		return step{}, false
	}
	threshold, minFree := int64(m.Defragment.InUseBelowPercent), quantityBytes(m.Defragment.MinFree)
	target := p.nextToDefragment(func(m *member) bool {
		free := m.DBSize - m.DBSizeInUse
		return m.DBSizeInUse > 0 && m.DBSizeInUse*100 < m.DBSize*threshold && free >= minFree
	})
	if target == nil {
		return step{}, false
	}
	return p.defragmentStep(target, opDefragment, fmt.Sprintf("%s's database is less than %d%% in use", target.name, threshold), phaseDefragmenting), true
}

// nextToDefragment is the next member to defragment among those fragmented says qualify:
// followers first, highest ordinal first, the leader last.
func (p *planner) nextToDefragment(fragmented func(*member) bool) *member {
	var leader *member
	for i := len(p.members) - 1; i >= 0; i-- {
		m := p.members[i]
		if !m.Reachable || !fragmented(m) || p.finished(stepKey{verbDefragment, m.name}) {
			continue
		}
		if m != p.leader {
			return m
		}
		leader = m
	}
	return leader
}

// defragmentStep defragments m; a leader hands leadership over first when another voter can
// take it (and every member answered, to judge where leadership goes), and a member whose
// pause would cost quorum waits.
func (p *planner) defragmentStep(m *member, op, why, phase string) step {
	if m == p.leader && len(p.voters()) > 1 {
		for _, o := range p.members {
			if !o.Reachable {
				return p.maintaining(p.wait(o.name, why+": "+m.name+" leads and is to be defragmented; waiting for "+o.name+" to answer before moving leadership", resyncHold), op, phase, m.name)
			}
		}
		if s, ok := p.moveLeader(m, why+": "+m.name+" is the last to defragment and leads"); ok {
			return p.maintaining(s, op, phase, m.name)
		}
	}
	// Under NOSPACE writes are refused already: a cluster of two may pause a member for it.
	if !m.IsLearner && !etcdstate.QuorumWhileOneIsDown(len(p.voters()), p.healthyVoters()-1) && !(op == opNoSpace && len(p.voters()) == 2) {
		return p.maintaining(p.wait(m.name, why+": defragmenting "+m.name+" pauses it, which would leave no healthy quorum", resyncHold), op, phase, m.name)
	}
	s := p.runJob(memberJob{verb: verbDefragment, member: m.name, id: m.ID}, Defragment,
		fmt.Sprintf("%s: defragmenting %s (%s file, %s in use)", why, m.name, bytesString(m.DBSize), bytesString(m.DBSizeInUse)))
	if s.job != nil {
		// Defragmentation is the member's own maintenance: only its endpoint is asked.
		s.job.endpoints = []string{clientURLOf(p.c, m.name, p.cfg.ClusterDomain, p.memberClientTLS(m))}
	}
	return p.maintaining(s, op, phase, m.name)
}

// defragmented are the members the NOSPACE remediation in progress has defragmented since it
// compacted, this sync's included.
func (p *planner) defragmented() []string {
	var out []string
	if prev := p.obs.Cluster.Status.Maintenance; prev != nil && prev.Operation == opNoSpace && prev.Phase == phaseDefragmenting {
		out = slices.Clone(prev.Defragmented)
	}
	for _, m := range p.members {
		if p.finished(stepKey{verbDefragment, m.name}) && !slices.Contains(out, m.name) {
			out = append(out, m.name)
		}
	}
	slices.Sort(out)
	return out
}

// maintaining records the maintenance phase a step is in. (While a NOSPACE alarm stands the
// cluster is Degraded, however well the remediation goes: status says so from the alarm.)
func (p *planner) maintaining(s step, op, phase, member string) step {
	done := []string(nil)
	if s.maintenance != nil {
		done = s.maintenance.Defragmented
	} else if op == opNoSpace && phase == phaseDefragmenting {
		done = p.defragmented()
	}
	s.maintenance = p.record(op, phase, member)
	s.maintenance.Defragmented = done
	return s
}

// record is status.maintenance for op in phase: its time carried while phase and member
// stay, and the last disarm kept.
func (p *planner) record(op, phase, member string) *v1alpha1.MaintenanceStatus {
	r := &v1alpha1.MaintenanceStatus{Operation: op, Phase: phase, Member: member, Since: metav1.NewTime(p.obs.Now)}
	if prev := p.obs.Cluster.Status.Maintenance; prev != nil {
		r.LastDisarmed = prev.LastDisarmed
		if prev.Operation == op && prev.Phase == phase && prev.Member == member {
			r.Since = prev.Since
		}
	}
	return r
}

// finished: a Job of step k succeeded and is dropped in this sync; a key without a member
// asks for a Job of the verb on any member.
func (p *planner) finished(k stepKey) bool {
	return slices.ContainsFunc(p.stage.done, func(d stepKey) bool {
		return d.verb == k.verb && (k.member == "" || d.member == k.member)
	})
}

// alarmed are the members with the alarm, by ordinal.
func (v *view) alarmed(alarm string) []*member {
	return v.filter(func(m *member) bool { return hasAlarm(m.Member, alarm) })
}

// removedAlarms are the IDs of the members no longer in the membership with the alarm.
func (v *view) removedAlarms(alarm string) []uint64 {
	var out []uint64
	for _, a := range v.obs.Etcd.Alarms {
		if a.Type == alarm && a.MemberID != 0 && v.memberByID(a.MemberID) == nil {
			out = append(out, a.MemberID)
		}
	}
	return out
}

func (v *view) memberByID(id uint64) *member {
	for _, m := range v.members {
		if m.ID == id {
			return m
		}
	}
	return nil
}

// leaderName names the member a cluster-wide Job is about: the leader, else the lowest
// ordinal.
func (v *view) leaderName() string {
	if v.leader != nil {
		return v.leader.name
	}
	return v.members[0].name
}

// anyDrifted: a pod still runs a configuration other than the spec's.
func (v *view) anyDrifted() bool {
	for _, pod := range v.pods {
		if !isTerminating(pod) && v.drifted(pod) {
			return true
		}
	}
	return false
}

func quantityBytes(q *resource.Quantity) int64 {
	if q == nil {
		return 0
	}
	return q.Value()
}

// bytesString is a size in binary units, to one decimal.
func bytesString(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
