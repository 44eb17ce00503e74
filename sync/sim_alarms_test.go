package sync

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
)

// The simulator's model of what etcd's alarms depend on, beyond sim_test.go's: each member's
// etcd enforces the backend quota its pod was started with (so a roll that changes the quota
// leaves the members not yet rolled on the old one), or one set on the member itself, and
// reports it in Status as etcd 3.6 does, or reports none as 3.5 does; and the CORRUPT alarm of
// member ID 0, which etcd raises when the members' hashes disagree and no majority says which
// one is wrong. checkAlarmDecision holds every decision to what that asks: no alarm disarmed
// without a member, NOSPACE disarmed only when every member answered below the quota it
// enforces, and nothing removed, replaced, disarmed or recovered on an alarm of member 0.

// simAlarms is the simulator's state of the members' quotas.
type simAlarms struct {
	// quota, by member ID, is a quota the member's etcd runs with whatever its pod's flags
	// say: started by hand, or through an environment variable the template does not show.
	quota map[uint64]int64
	// unreported, by member ID: the member's etcd reports no quota, as etcd 3.5 does.
	unreported map[uint64]bool
}

// enforcedQuota is the backend quota m's etcd enforces: the member's own, else its pod's
// --quota-backend-bytes (etcd's default without one), else, without a pod, the spec's.
func (w *simWorld) enforcedQuota(m *simMember) int64 {
	if q, ok := w.alarmSim.quota[m.id]; ok {
		return q
	}
	if p := w.pods[m.ord]; p != nil {
		for _, c := range p.tmpl.Spec.Containers {
			if c.Name == "etcd" {
				return quotaBytes(append(append([]string(nil), c.Command...), c.Args...))
			}
		}
	}
	return quotaBytes(w.cluster.Spec.EtcdOptions)
}

// reportedQuota is the quota m's Status carries: the one it enforces, none from a 3.5 member.
func (w *simWorld) reportedQuota(m *simMember) int64 {
	if p := w.pods[m.ord]; w.alarmSim.unreported[m.id] || p != nil && strings.HasPrefix(p.version, "v3.5") {
		return 0
	}
	return w.enforcedQuota(m)
}

// setQuota makes m's etcd enforce and report q, whatever its pod says.
func (w *simWorld) setQuota(m *simMember, q int64) {
	if w.alarmSim.quota == nil {
		w.alarmSim.quota = map[uint64]int64{}
	}
	w.alarmSim.quota[m.id] = q
	delete(w.alarmSim.unreported, m.id)
}

// unreportQuota makes m report no quota, as 3.5 does. Only a member that enforces what its pod
// says: the planner then takes the spec's, which is what a rolled 3.5 pod runs with.
func (w *simWorld) unreportQuota(m *simMember) {
	if w.alarmSim.unreported == nil {
		w.alarmSim.unreported = map[uint64]bool{}
	}
	w.alarmSim.unreported[m.id] = true
	delete(w.alarmSim.quota, m.id)
}

// clearQuotas lets every member run and report what its pod says again.
func (w *simWorld) clearQuotas() {
	w.alarmSim = simAlarms{}
}

// disarmUnplaced is a person disarming the alarms of member 0, once they found the member at
// fault (docs/runbooks.md).
func (w *simWorld) disarmUnplaced() {
	var kept []etcdstate.Alarm
	for _, a := range w.alarms {
		if a.MemberID != 0 {
			kept = append(kept, a)
		}
	}
	w.alarms = kept
}

// alarmCommand runs the scenario commands of this model:
//
//	quota POD SIZE|none    POD's etcd enforces and reports SIZE whatever its pod says; none:
//	                       it reports no quota (3.5) and enforces its pod's
//	alarm TYPE 0           etcd raises TYPE of member 0 (CORRUPT: it cannot place a corruption)
//	disarm TYPE 0          a person disarms it
func (w *simWorld) alarmCommand(line, cmd string, args []string) {
	w.t.Helper()
	if len(args) != 2 {
		w.t.Fatalf("%q: want two arguments", line)
	}
	switch cmd {
	case "quota":
		m := w.memberAt(w.ordinalOf(args[0]))
		if m == nil {
			w.t.Fatalf("%q: %s has no member", line, args[0])
		}
		if args[1] == "none" {
			w.unreportQuota(m)
			return
		}
		q := resource.MustParse(args[1])
		w.setQuota(m, q.Value())
	case "alarm", "disarm":
		id, err := strconv.ParseUint(args[1], 16, 64)
		if err != nil || id != 0 {
			w.t.Fatalf("%q: only member 0's alarms are raised and disarmed here (fault POD does a member's)", line)
		}
		if cmd == "alarm" {
			w.raise(0, args[0])
			return
		}
		w.disarmUnplaced()
	}
}

// checkAlarmDecision fails the run when d, planned on obs, starts what the alarms forbid.
func (w *simWorld) checkAlarmDecision(obs Observed, d Decision) {
	w.t.Helper()
	for _, c := range d.Children {
		if c.Kind != "Job" || w.jobs[c.Name] != nil {
			continue
		}
		verb, alarm, id := w.disarmOf(c)
		if verb != verbDisarm {
			continue
		}
		if id == 0 {
			w.t.Fatalf("sync %d: Job %s disarms %s without naming a member", w.stats.syncs, c.Name, alarm)
		}
		if alarm == "NOSPACE" {
			w.checkNoSpaceDisarm(obs)
		}
	}
	var unplaced []string
	for _, a := range obs.Etcd.Alarms {
		if a.MemberID == 0 {
			unplaced = append(unplaced, a.Type)
		}
	}
	if len(unplaced) == 0 {
		return
	}
	switch d.Action.Type {
	case RemoveMember, ReplacePod, DisarmAlarm:
		w.t.Fatalf("sync %d: %s %s under a %s alarm of member 0: %s", w.stats.syncs, d.Action.Type, d.Action.Member, strings.Join(unplaced, ", "), d.Action.Reason)
	}
	prev, r := obs.Cluster.Status.Recovery, d.Status.Recovery
	if r != nil && r.Trigger == triggerAutomatic && r.Phase == recoveryChosen && (prev == nil || prev.Token != r.Token) {
		w.t.Fatalf("sync %d: a quorum recovery from %s chosen under a %s alarm of member 0", w.stats.syncs, r.Survivor, strings.Join(unplaced, ", "))
	}
}

// checkNoSpaceDisarm: a NOSPACE disarm starts only when every member answered and each one's
// database is below noSpaceDisarmBelowPercent of the quota its etcd enforces.
func (w *simWorld) checkNoSpaceDisarm(obs Observed) {
	w.t.Helper()
	for _, em := range obs.Etcd.Members {
		m := w.memberByID(em.ID)
		switch {
		case !em.Reachable:
			w.t.Fatalf("sync %d: NOSPACE disarmed while %s did not answer\n%s", w.stats.syncs, w.podName(m.ord), w.describe())
		case em.DBSize*100 >= w.enforcedQuota(m)*noSpaceDisarmBelowPercent:
			w.t.Fatalf("sync %d: NOSPACE disarmed while %s fills %d of the %d bytes its etcd enforces\n%s", w.stats.syncs, w.podName(m.ord), em.DBSize, w.enforcedQuota(m), w.describe())
		}
	}
}

// disarmOf reads a rendered Job's verb, and the alarm and member ID it names.
func (w *simWorld) disarmOf(c Child) (verb, alarm string, id uint64) {
	w.t.Helper()
	b, err := json.Marshal(c.Object)
	if err != nil {
		w.t.Fatal(err)
	}
	var j batchv1.Job
	w.decode(b, &j)
	for _, a := range j.Spec.Template.Spec.Containers[0].Command {
		if v, ok := strings.CutPrefix(a, "--id="); ok {
			fmt.Sscanf(v, "%x", &id)
		}
	}
	return j.Labels[LabelAction], j.Labels[LabelAlarm], id
}

// TestRandomAlarms mixes the alarms' faults with scale, quota and version changes: a writer
// filling the databases to NOSPACE, members the hook cannot reach or that crash meanwhile,
// members running (and reporting) another quota than their pods say or reporting none (3.5),
// a roll that changes the quota while the alarm stands, a member found CORRUPT, and a CORRUPT
// alarm of member 0 that only a person clears. Every step keeps the invariants and
// checkAlarmDecision; the cluster converges once the world heals.
func TestRandomAlarms(t *testing.T) {
	for seed := int64(1); seed <= seeds(6); seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewSource(seed))
			w, _ := created(t, 3, seed%2 == 1)
			w.faulty = true
			changes := []func(){
				func() { w.cluster.Spec.EtcdOptions = []string{"--quota-backend-bytes=" + strconv.Itoa(3<<30)} },
				func() { w.cluster.Spec.Size = ptrTo(int32(5)) },
				func() { w.cluster.Spec.EtcdOptions = nil },
				func() { w.cluster.Spec.Version = "v3.6.17" },
				func() { w.cluster.Spec.Size = ptrTo(int32(3)) },
			}
			member := func() *simMember {
				if len(w.members) == 0 {
					return nil
				}
				return w.members[rng.Intn(len(w.members))]
			}
			var heal []func()
			faults := []func(){
				func() { // a writer fills the databases to NOSPACE
					w.growth = 300 << 20
					heal = append(heal, func() { w.growth = 0 })
				},
				func() { // the hook alone loses a member
					if p := w.randomPod(rng); p != nil {
						p.blind = true
						heal = append(heal, func() { p.blind = false })
					}
				},
				func() { // a crash
					if p := w.randomPod(rng); p != nil {
						p.crash = true
						heal = append(heal, func() { p.crash = false })
					}
				},
				func() { // a member runs with a quota its pod does not show, lower or higher
					if m := member(); m != nil {
						w.setQuota(m, int64(1+rng.Intn(4))<<30)
						heal = append(heal, w.clearQuotas)
					}
				},
				func() { // a member reports no quota, as 3.5 does
					if m := member(); m != nil {
						w.unreportQuota(m)
						heal = append(heal, w.clearQuotas)
					}
				},
				func() { // etcd finds a member's data corrupt
					if m := member(); m != nil {
						w.raise(m.id, "CORRUPT")
					}
				},
				func() { // etcd cannot tell which member's data is corrupt
					w.raise(0, "CORRUPT")
					heal = append(heal, w.disarmUnplaced)
				},
			}
			healAll := func() {
				for _, h := range heal {
					h()
				}
				heal = nil
			}
			for _, change := range changes {
				change()
				w.cluster.Generation++
				w.faultsDuring(rng, faults, 4, healAll)
				w.run(500)
			}
		})
	}
}

// TestUnplacedAlarmIsLeftAlone: with a CORRUPT alarm of member 0 standing, whatever else
// happens (a member fails, the spec changes, quorum is lost with automatic recovery on), the
// operator reports it as what it is and does nothing on it; once a person disarms it, the
// cluster converges.
func TestUnplacedAlarmIsLeftAlone(t *testing.T) {
	w, _ := created(t, 3, true)
	w.raise(0, "CORRUPT")
	for range 3 {
		w.step()
	}
	cond := func() (string, string) {
		for _, c := range w.cluster.Status.Conditions {
			if c.Type == v1alpha1.ConditionDegraded {
				return c.Reason, c.Message
			}
		}
		return "", ""
	}
	if reason, msg := cond(); reason != ReasonUnplacedAlarm || !strings.Contains(msg, "CORRUPT alarm of member 0") {
		t.Fatalf("Degraded %s: %s; want %s naming the alarm", reason, msg, ReasonUnplacedAlarm)
	}
	w.pods[2].crash = true
	w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=5000"}
	w.cluster.Generation++
	for range 80 {
		w.step()
	}
	if w.stats.removes != 0 || w.stats.replacements != 0 {
		t.Fatalf("%d removals, %d pod replacements under an alarm of member 0", w.stats.removes, w.stats.replacements)
	}
	// Quorum lost as well, every other voter's etcd stopped: no forced recovery is advised,
	// and with automatic recovery asked for, none is made.
	w.faulty = true
	w.pods[1].crash = true
	for range 10 {
		w.step()
	}
	if r := w.cluster.Status.Action.Reason; !strings.HasPrefix(r, "quorum lost") || strings.Contains(r, v1alpha1.AnnotationForceNewClusterFrom) || strings.Contains(r, "ForceNewCluster") {
		t.Fatalf("quorum lost under an alarm of member 0: %s", r)
	}
	w.cluster.Spec.Recovery = &v1alpha1.RecoverySpec{QuorumLoss: v1alpha1.QuorumLossForceNewCluster}
	w.cluster.Generation++
	for range 80 {
		w.step()
	}
	if w.stats.forced != 0 {
		t.Fatalf("a new cluster forced under an alarm of member 0")
	}
	w.pods[1].crash, w.pods[2].crash = false, false
	w.disarmUnplaced()
	w.run(400)
}
