package sync

import (
	"testing"

	"etcdops.dev/etcdops/etcdstate"
)

func TestQuotaBytes(t *testing.T) {
	for _, tc := range []struct {
		story string
		opts  []string
		want  int64
	}{
		{"no option: etcd's default of 2 GiB", nil, 2 << 30},
		{"other options only", []string{"--snapshot-count=5000"}, 2 << 30},
		{"8 GiB asked for", []string{"--quota-backend-bytes=8589934592"}, 8 << 30},
		{"0 means the default, as in etcd", []string{"--quota-backend-bytes=0"}, 2 << 30},
		{"negative disables the quota", []string{"--quota-backend-bytes=-1"}, 0},
		{"a value etcd could not parse either: no quota to report", []string{"--quota-backend-bytes=8Gi"}, 0},
		{"a flag that only starts alike is another flag", []string{"--quota-backend-bytes-extra=1"}, 2 << 30},
	} {
		if got := quotaBytes(tc.opts); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.story, got, tc.want)
		}
	}
}

// TestMetricsFollowTheDecision: the metrics of a sync tell what its decision and observation
// say, and nothing about health or leadership when etcd's answer was not used.
func TestMetricsFollowTheDecision(t *testing.T) {
	w, _ := created(t, 3, true)
	w.cluster.Spec.Size = ptrTo(int32(4))
	w.step() // AddLearner
	w.step() // ScaleStatefulSet: etcd-3 is a learner now
	w.step() // its pod starts
	w.raise(w.memberAt(1).id, "NOSPACE")
	obs := w.observe()
	for i := range obs.Etcd.Members {
		obs.Etcd.Members[i].DBSize = int64(1000 * (i + 1))
	}
	d := Plan(simConfig, obs)
	m := Metrics(obs, d)
	if m.Namespace != "default" || m.Name != "etcd" || m.Size != 4 || m.Voters != 3 || m.Learners != 1 || m.QuorumSize != 2 {
		t.Errorf("cluster %s/%s size %d voters %d learners %d quorum %d; want default/etcd 4 3 1 2", m.Namespace, m.Name, m.Size, m.Voters, m.Learners, m.QuorumSize)
	}
	// A NOSPACE alarm refuses writes, but its member still reads and votes: healthy.
	if m.HealthyVoters != 3 || !m.LeaderKnown || m.Alarms["NOSPACE"] != 1 || m.Alarms["CORRUPT"] != 0 || m.QuotaBytes != 2<<30 {
		t.Errorf("healthy %d leader %v alarms %v quota %d; want 3, true, NOSPACE 1 CORRUPT 0, 2 GiB", m.HealthyVoters, m.LeaderKnown, m.Alarms, m.QuotaBytes)
	}
	if m.Action != d.Action.Type || !m.ActionSince.Equal(d.Status.Action.Since.Time) || len(m.Conditions) != len(d.Status.Conditions) || len(m.Conditions) != 4 {
		t.Errorf("action %v since %v, %d conditions; want the decision's", m.Action, m.ActionSince, len(m.Conditions))
	}
	// Every member that answered has a size, the learner too.
	sizes := map[int]int64{}
	for _, mm := range m.Members {
		sizes[mm.Ordinal] = mm.DBSizeBytes
	}
	if len(sizes) != 4 || sizes[0] != 1000 || sizes[3] != 4000 {
		t.Errorf("member sizes by ordinal %v, want four, from 1000 to 4000", sizes)
	}

	// A CORRUPT alarm of member 0 is counted though no member raised it.
	obs.Etcd.Alarms = append(obs.Etcd.Alarms, etcdstate.Alarm{MemberID: 0, Type: "CORRUPT"})
	if m = Metrics(obs, Plan(simConfig, obs)); m.Alarms["CORRUPT"] != 1 || m.Alarms["NOSPACE"] != 1 {
		t.Errorf("alarms %v with a CORRUPT alarm of member 0; want NOSPACE 1 CORRUPT 1", m.Alarms)
	}

	// A stranger in the member list: the answer is held on, membership is the last known,
	// and nothing is claimed about health, leadership, sizes or alarms.
	obs.Etcd.Members = append(obs.Etcd.Members, etcdstate.Member{ID: 0xbad, Name: "other-0", Reachable: true, Healthy: true, IsLeader: true,
		PeerURLs: []string{"http://other-0.other.default.svc.cluster.local:2380"}})
	m = Metrics(obs, Plan(simConfig, obs))
	if m.Voters != 3 || m.HealthyVoters != 0 || m.LeaderKnown || len(m.Members) != 0 || m.Alarms["NOSPACE"] != 0 {
		t.Errorf("untrusted answer: voters %d healthy %d leader %v members %v alarms %v; want 3 and nothing else", m.Voters, m.HealthyVoters, m.LeaderKnown, m.Members, m.Alarms)
	}
}
