package sync

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// Liveness probes and defragmentations that take time. etcd holds a member's backend for
// the whole run of a defragmentation: reads wait, so the member is not Ready and its /livez
// does not answer, while raft keeps it in the cluster. The simulated kubelet runs the pod's
// liveness probe as rendered (initial delay, period, failure threshold) and restarts the
// container once it fails often enough; the restart aborts the defragmentation, which the
// member tool's retries start over. The probe passes during a defragmentation only when
// rendered with --defrag-metrics: the member tool then reads etcd's own gauge of a
// defragmentation in flight (its behaviour on real etcd: membertool's
// TestProbeDuringDefragmentation).

type simProbes struct {
	// rate is how many bytes of a member's database a defragmentation copies per second.
	rate int64
	// busy is, per ordinal, the defragmentation that holds the member's backend.
	busy map[int]simDefrag
	// calls are the defragment Jobs' calls in flight: when each ends on the member, and the
	// member's ordinal. Keyed by Job, not name: a Job deleted and created again under its
	// name is a new pod, with its own call and timeout.
	calls   map[*simJob]time.Time
	callOrd map[*simJob]int
	// started is when each Job began, for the member tool's --timeout.
	started map[*simJob]time.Time
	// failures counts each ordinal's consecutive failed liveness probes; restartedAt is when
	// the kubelet last restarted its container for them.
	failures    map[int]int
	restartedAt map[int]time.Time
	restarts    int
	// begun counts the defragmentations begun on a member.
	begun int
}

// simDefrag is a defragmentation etcd runs on a member until end, whether or not the tool
// that asked for it still waits: on member id, in pod at its restarts then, whose etcd must
// run on to finish it.
type simDefrag struct {
	end      time.Time
	id       uint64
	pod      *simPod
	restarts int
}

func newSimProbes(rate int64) *simProbes {
	return &simProbes{rate: rate, busy: map[int]simDefrag{}, calls: map[*simJob]time.Time{}, callOrd: map[*simJob]int{},
		started: map[*simJob]time.Time{}, failures: map[int]int{}, restartedAt: map[int]time.Time{}}
}

// holds reports whether a defragmentation holds ord's backend at now.
func (p *simProbes) holds(ord int, now time.Time) bool {
	return p != nil && now.Before(p.busy[ord].end)
}

// slowDefragment plays a defragment Job whose call takes the member's database size over the
// rate: queued behind a defragmentation still running on the member (etcd runs one at a time),
// lost when the member's container restarts (the tool then calls again), given up at the
// tool's --timeout while etcd goes on (defragmentationsEnd). It reports whether it decided
// the Job's tick; false once the call has returned, and runJob completes the Job as an
// instant one.
func (w *simWorld) slowDefragment(j *simJob, fail func()) bool {
	p := w.probes
	if _, ok := p.started[j]; !ok {
		p.started[j] = w.now.Add(-simTick)
	}
	if j.timeout > 0 && w.now.Sub(p.started[j]) >= j.timeout {
		delete(p.calls, j)
		delete(p.callOrd, j)
		fail()
		return true
	}
	m := w.memberByID(j.id)
	if m == nil {
		return false
	}
	if end, ok := p.calls[j]; ok {
		if w.now.Before(end) {
			return true
		}
		delete(p.calls, j)
		delete(p.callOrd, j)
		return false
	}
	pod := w.pods[m.ord]
	if pod == nil || !pod.running || pod.blind {
		// The tool's dial fails and it retries within its timeout.
		return true
	}
	begin := w.now
	if p.holds(m.ord, w.now) {
		begin = p.busy[m.ord].end
	}
	took := time.Duration((m.live + m.history) / p.rate * int64(time.Second))
	p.busy[m.ord] = simDefrag{end: begin.Add(took), id: m.id, pod: pod, restarts: pod.restarts}
	p.calls[j], p.callOrd[j] = p.busy[m.ord].end, m.ord
	p.begun++
	return true
}

// defragmentationsEnd shrinks the database file of each member whose defragmentation ended,
// as etcd finishes one also after the tool that asked gave up at its --timeout; unless the
// member's etcd stopped meanwhile.
func (w *simWorld) defragmentationsEnd() {
	p := w.probes
	for ord, d := range p.busy {
		if w.now.Before(d.end) {
			continue
		}
		if m := w.memberByID(d.id); m != nil && w.pods[ord] == d.pod && d.pod.running && d.pod.restarts == d.restarts {
			m.file = m.live + m.history
		}
		delete(p.busy, ord)
	}
}

// livenessRestarts runs ord's liveness probe as its pod renders it, as often as its period
// fits in a tick, and reports whether the kubelet restarts the container now. A restart ends
// a defragmentation on the member and every call waiting on it.
func (w *simWorld) livenessRestarts(ord int, pod *simPod) bool {
	p := w.probes
	if p == nil || len(pod.tmpl.Spec.Containers) == 0 {
		return false
	}
	lp := pod.tmpl.Spec.Containers[0].LivenessProbe
	if lp == nil || w.now.Sub(p.restartedAt[ord]) < time.Duration(lp.InitialDelaySeconds)*time.Second {
		return false
	}
	if !p.holds(ord, w.now) || toleratesDefragmentation(lp) {
		p.failures[ord] = 0
		return false
	}
	period, threshold := time.Duration(max(lp.PeriodSeconds, 10))*time.Second, int(max(lp.FailureThreshold, 3))
	p.failures[ord] += max(1, int(simTick/period))
	if p.failures[ord] < threshold {
		return false
	}
	p.failures[ord] = 0
	p.restartedAt[ord] = w.now
	p.restarts++
	delete(p.busy, ord)
	for j, o := range p.callOrd {
		if o == ord {
			delete(p.calls, j)
			delete(p.callOrd, j)
		}
	}
	return true
}

// toleratesDefragmentation: the probe is the member tool's, told where etcd's metrics are.
func toleratesDefragmentation(lp *corev1.Probe) bool {
	if lp.Exec == nil {
		return false
	}
	for _, a := range lp.Exec.Command {
		if strings.HasPrefix(a, "--defrag-metrics=") {
			return true
		}
	}
	return false
}

// simDefragMinutes is how long each member's defragmentation takes in these tests: longer
// than the liveness budget of 8 probes 10 s apart, shorter than the member tool's 4 minutes.
const simDefragMinutes = 3

// slowDatabases gives every member a database of live bytes in a file of file bytes, and makes
// defragmenting it take simDefragMinutes.
func (w *simWorld) slowDatabases(live, file int64) {
	for _, m := range w.members {
		m.live, m.history, m.file = live, 0, file
	}
	w.probes = newSimProbes(live / (simDefragMinutes * 60))
}

// fragment leaves every member's database file four times what it holds, as a large delete
// and its compaction do: a scheduled defragmentation then has minutes of work on each.
func (w *simWorld) fragment() {
	for _, m := range w.members {
		m.file = max(m.file, 4*(m.live+m.history))
	}
}

// TestScheduledDefragmentationUnderLivenessProbes: a scheduled defragmentation of three
// minutes per member, under the kubelet's liveness probes, ends with every member
// defragmented and no container restarted.
func TestScheduledDefragmentationUnderLivenessProbes(t *testing.T) {
	w, _ := created(t, 3, true)
	w.slowDatabases(1<<30, 4<<30)
	stats := w.edit(func(w *simWorld) {
		w.cluster.Spec.Maintenance = &v1alpha1.MaintenanceSpec{Defragment: &v1alpha1.DefragmentSpec{InUseBelowPercent: 50, MinFree: ptrTo(resource.MustParse("1Mi"))}}
	})
	if w.probes.restarts > 0 {
		t.Errorf("%d containers restarted by their liveness probe during the defragmentations\n%s", w.probes.restarts, strings.Join(lastN(w.log, 20), "\n"))
	}
	for _, m := range w.members {
		if m.file != m.live {
			t.Errorf("%s: database file %d bytes, %d live: not defragmented", w.podName(m.ord), m.file, m.live)
		}
	}
	if stats.jobFailures > 0 {
		t.Errorf("%d Jobs failed", stats.jobFailures)
	}
}

// TestNoSpaceRemediationUnderLivenessProbes: a NOSPACE alarm is remediated by compacting and
// then defragmenting every member, each for three minutes, under the kubelet's liveness
// probes: the alarm is disarmed and no container restarted.
func TestNoSpaceRemediationUnderLivenessProbes(t *testing.T) {
	w := newSimWorld(t, 3, true)
	w.cluster.Spec.EtcdOptions = []string{"--quota-backend-bytes=2147483648"}
	w.run(200)
	w.slowDatabases(512<<20, 512<<20)
	w.growth = 256 << 20
	for i := 0; i < 20 && len(w.alarms) == 0; i++ {
		w.step()
	}
	if len(w.alarms) == 0 {
		t.Fatalf("no NOSPACE alarm:\n%s", w.describe())
	}
	w.growth = 0
	w.run(300)
	if len(w.alarms) > 0 {
		t.Errorf("alarms left: %v", w.alarms)
	}
	if w.probes.restarts > 0 {
		t.Errorf("%d containers restarted by their liveness probe during the remediation\n%s", w.probes.restarts, strings.Join(lastN(w.log, 20), "\n"))
	}
}
