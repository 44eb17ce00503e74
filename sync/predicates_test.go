package sync

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/joinstate"
)

func TestIsCaughtUp(t *testing.T) {
	leader := etcdstate.Member{Reachable: true, Healthy: true, RaftIndex: 1000}
	for _, tc := range []struct {
		name    string
		learner etcdstate.Member
		leader  etcdstate.Member
		want    bool
	}{
		{"at the leader's index", etcdstate.Member{Reachable: true, Healthy: true, RaftIndex: 1000}, leader, true},
		{"at 90%, etcd's own bound", etcdstate.Member{Reachable: true, Healthy: true, RaftIndex: 900}, leader, true},
		{"just below 90%", etcdstate.Member{Reachable: true, Healthy: true, RaftIndex: 899}, leader, false},
		{"not answering", etcdstate.Member{RaftIndex: 1000}, leader, false},
		{"answering with errors", etcdstate.Member{Reachable: true, RaftIndex: 1000}, leader, false},
		{"the leader's index unknown", etcdstate.Member{Reachable: true, Healthy: true, RaftIndex: 5}, etcdstate.Member{}, false},
	} {
		if got := isCaughtUp(tc.learner, tc.leader); got != tc.want {
			t.Errorf("%s: isCaughtUp = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestIsCrashLooping(t *testing.T) {
	backoff := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	for _, tc := range []struct {
		name string
		cs   corev1.ContainerStatus
		want bool
	}{
		{"backing off after five restarts", corev1.ContainerStatus{Name: "etcd", RestartCount: 5, State: backoff}, true},
		{"backing off after two: still starting", corev1.ContainerStatus{Name: "etcd", RestartCount: 2, State: backoff}, false},
		{"running again after many restarts", corev1.ContainerStatus{Name: "etcd", RestartCount: 9, State: running}, false},
		{"another container crashing", corev1.ContainerStatus{Name: "sidecar", RestartCount: 9, State: backoff}, false},
	} {
		p := &corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{tc.cs}}}
		if got := isCrashLooping(p); got != tc.want {
			t.Errorf("%s: isCrashLooping = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestJobBackoff(t *testing.T) {
	for _, tc := range []struct {
		attempt int
		want    string
	}{
		{0, "10s"}, {1, "20s"}, {2, "40s"}, {3, "1m20s"}, {5, "5m0s"}, {50, "5m0s"},
	} {
		if got := jobBackoff(tc.attempt).String(); got != tc.want {
			t.Errorf("jobBackoff(%d) = %s, want %s", tc.attempt, got, tc.want)
		}
	}
}

// TestMemberOrdinal: a member is ours by its peer URL, and once started also by its name.
func TestMemberOrdinal(t *testing.T) {
	w := newSimWorld(t, 3, true)
	c := w.cluster
	v := &view{cfg: simConfig, c: &c}
	for _, tc := range []struct {
		name string // "" until the member started
		peer string
		want int
		ok   bool
	}{
		{"", "http://etcd-3.etcd.default.svc.cluster.local:2380", 3, true},    // ours, by peer URL
		{"", "https://etcd-3.etcd.default.svc.cluster.local:2380", 3, true},   // after TLS was turned on
		{"", "http://etcd-3.etcd.other.svc.cluster.local:2380", 0, false},     // another namespace
		{"", "http://etcd-x-3.etcd.default.svc.cluster.local:2380", 0, false}, // not an ordinal of ours
		{"", "http://10.0.0.4:2380", 0, false},                                // an address, not our name (data only: nothing dials it)
		{"etcd-3", "http://etcd-3.etcd.default.svc.cluster.local:2380", 3, true},
		{"etcd-1", "http://etcd-3.etcd.default.svc.cluster.local:2380", 0, false}, // started under another pod's name
		{"other-3", "http://etcd-3.etcd.default.svc.cluster.local:2380", 0, false},
	} {
		got, ok := v.memberOrdinal(etcdstate.Member{Name: tc.name, PeerURLs: []string{tc.peer}})
		if got != tc.want || ok != tc.ok {
			t.Errorf("memberOrdinal(%q, %s) = %d, %v; want %d, %v", tc.name, tc.peer, got, ok, tc.want, tc.ok)
		}
	}
}

func TestLowestVersion(t *testing.T) {
	for _, tc := range []struct {
		versions []string
		want     string
	}{
		{[]string{"3.5.21", "3.6.0"}, "v3.5.21"},
		{[]string{"3.6.10", "3.6.9"}, "v3.6.9"}, // numeric, not lexical
		{[]string{"", "3.6.10"}, "v3.6.10"},     // a member that did not answer has none
		{[]string{"3.7.0-rc.1", "3.7.0"}, "v3.7.0-rc.1"},
		{[]string{""}, ""},
	} {
		var ms []etcdstate.Member
		for _, v := range tc.versions {
			ms = append(ms, etcdstate.Member{Version: v})
		}
		if got := lowestVersion(ms); got != tc.want {
			t.Errorf("lowestVersion(%v) = %q, want %q", tc.versions, got, tc.want)
		}
	}
}

// TestUpgradePath: the planner rolls an allowed version change and holds, unchanged, on any
// other (the rule itself is v1alpha1.CheckUpgrade's).
func TestUpgradePath(t *testing.T) {
	for _, tc := range []struct {
		to   string
		want ActionType
	}{
		{"v3.6.17", ReplacePod}, // patch forward
		{"v3.7.0", ReplacePod},  // one minor forward
		{"v3.8.0", Hold},        // skips a minor
		{"v3.6.15", Hold},       // patch downgrade
		{"v3.5.21", Hold},       // minor downgrade
		{"v4.0.0", Hold},        // major change
		{"latest", Hold},        // not a version
	} {
		w := newSimWorld(t, 3, true)
		w.run(100)
		w.cluster.Spec.Version = tc.to
		w.closeBudget()
		d := Plan(simConfig, w.observe())
		if d.Action.Type != tc.want {
			t.Errorf("v3.6.16 → %s: %v, want %v", tc.to, d.Action, tc.want)
		}
	}
}

func TestPodStartFailure(t *testing.T) {
	const foreign = joinstate.Refused + joinstate.ForeignCluster + "default/etcd/uid-1, not of this cluster default/etcd/uid-2"
	// refused: the container backs off after it ended with message, as a refusing launcher's does.
	refused := func(message string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: "etcd", RestartCount: 6, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 3, Message: message}}}
	}
	running := func(cs corev1.ContainerStatus) corev1.ContainerStatus {
		cs.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
		return cs
	}
	waiting := func(reason string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: "etcd", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}}
	}
	for _, tc := range []struct {
		name string
		pod  corev1.Pod
		want string
	}{
		{"image cannot be pulled", corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{waiting("ImagePullBackOff")}}}, "etcd container: ImagePullBackOff"},
		{"crash-looping: it did start", corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{waiting("CrashLoopBackOff")}}}, ""},
		{"no node fits", corev1.Pod{Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "0/3 nodes"}}}}, "unschedulable: 0/3 nodes"},
		{"running", corev1.Pod{}, ""},
		{"its launcher found another cluster's data", corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{refused(foreign)}}},
			"its launcher refuses: " + foreign[len(joinstate.Refused):]},
		{"its launcher refused while etcd ran before: the refusal is the last word",
			corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "etcd", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 3, Message: foreign}}}}}},
			"its launcher refuses: " + foreign[len(joinstate.Refused):]},
		{"etcd runs again after a refusal", corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{running(refused(foreign))}}}, ""},
		{"a refusal a replacement fixes (an established member without its data) is a failure, not a start failure",
			corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{refused(joinstate.Refused + joinstate.DataLost + "established member etcd-1 has no data of incarnation 0 in /var/lib/etcd/data")}}}, ""},
		{"etcd's own exit", corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{refused("panic: tocommit(9) is out of range")}}}, ""},
	} {
		if got := podStartFailure(&tc.pod); got != tc.want {
			t.Errorf("%s: podStartFailure = %q, want %q", tc.name, got, tc.want)
		}
	}
}
