package membership

import (
	"errors"
	"slices"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"etcdops.dev/etcdops/etcdstate"
)

const testClusterID = 7

// said is what member id says of itself: leader is whom it follows, 0 for none.
func said(clusterID, id, leader, term uint64) endpointStatus {
	return endpointStatus{status: &clientv3.StatusResponse{
		Header:   &pb.ResponseHeader{ClusterId: clusterID, MemberId: id},
		Leader:   leader,
		RaftTerm: term,
		Version:  "3.7.3",
	}}
}

func endpoints(names ...string) []*memberClient {
	var out []*memberClient
	for _, n := range names {
		out = append(out, &memberClient{endpoint: etcdstate.Endpoint{Member: n}})
	}
	return out
}

// threeMembers is a member list of e-0 (1), e-1 (2) and e-2 (3).
func threeMembers() *clientv3.MemberListResponse {
	return &clientv3.MemberListResponse{
		Header: &pb.ResponseHeader{ClusterId: testClusterID},
		Members: []*pb.Member{
			{ID: 3, Name: "e-2"}, {ID: 1, Name: "e-0"}, {ID: 2, Name: "e-1"},
		},
	}
}

func TestAssemble(t *testing.T) {
	down := endpointStatus{statusErr: errors.New("connection refused")}
	for _, tc := range []struct {
		story        string
		statuses     []endpointStatus
		complete     bool
		leader       uint64 // 0: none
		inconsistent string // substring; empty: consistent
		err          string // substring of Snapshot.Err; empty: none
		forked       string // Snapshot.Forked, comma-separated
	}{
		{"all answer, e-0 leads",
			[]endpointStatus{said(testClusterID, 1, 1, 5), said(testClusterID, 2, 1, 5), said(testClusterID, 3, 1, 5)}, true, 1, "", "", ""},
		{"e-2 is down: partial, its error kept on the member",
			[]endpointStatus{said(testClusterID, 1, 1, 5), said(testClusterID, 2, 1, 5), down}, false, 1, "", "", ""},
		{"e-0 and e-1 both lead term 5: raft allows one",
			[]endpointStatus{said(testClusterID, 1, 1, 5), said(testClusterID, 2, 2, 5), said(testClusterID, 3, 1, 5)}, true, 1, "e-0 (term 5), e-1 (term 5) each report themselves leader", "", "e-0,e-1"},
		{"e-0 leads term 5 and e-2 term 9: two memberships",
			[]endpointStatus{said(testClusterID, 1, 1, 5), said(testClusterID, 2, 1, 5), said(testClusterID, 3, 3, 9)}, true, 1, "e-0 (term 5), e-2 (term 9) each report themselves leader", "", "e-0,e-2"},
		{"e-2's address reaches a member of another cluster",
			[]endpointStatus{said(testClusterID, 1, 1, 5), said(testClusterID, 2, 1, 5), said(99, 3, 3, 1)}, false, 1, "cluster 63", "", "e-2"},
		{"two pods answer as the same member",
			[]endpointStatus{said(testClusterID, 1, 1, 5), said(testClusterID, 1, 1, 5), said(testClusterID, 3, 1, 5)}, false, 1, "both answer as member 1", "", ""},
		{"e-1's pod answers as e-2",
			[]endpointStatus{said(testClusterID, 1, 1, 5), said(testClusterID, 3, 1, 5), down}, false, 1, "endpoint of e-1 answers as member e-2", "", ""},
		{"a pod answers as a member the list lacks (removed, or started on its own): for the planner to judge",
			[]endpointStatus{said(testClusterID, 1, 1, 5), said(testClusterID, 2, 1, 5), said(testClusterID, 3, 1, 5), said(testClusterID, 9, 1, 5)}, true, 1, "", "", ""},
		{"a pod outside the list leads as well",
			[]endpointStatus{said(testClusterID, 1, 1, 5), said(testClusterID, 2, 1, 5), said(testClusterID, 3, 1, 5), said(testClusterID, 9, 9, 6)}, true, 1, "e-0 (term 5), e-3 (outside the member list) each report themselves leader", "", "e-0,e-3"},
		{"a pod outside the list follows a leader outside it too: a second membership the hook does not reach the leader of",
			[]endpointStatus{said(testClusterID, 1, 1, 5), said(testClusterID, 2, 1, 5), said(testClusterID, 3, 1, 5), said(testClusterID, 9, 8, 6)}, true, 1, "e-3 answers as member 9, which is not in the member list, and follows leader 8, not in it either", "", "e-3"},
		{"a pod outside the list follows a listed leader: a removed member not told yet",
			[]endpointStatus{said(testClusterID, 1, 1, 5), said(testClusterID, 2, 1, 5), said(testClusterID, 3, 1, 5), said(testClusterID, 9, 1, 5)}, true, 1, "", "", ""},
		{"a pod outside the list follows no leader: a removed member cut off",
			[]endpointStatus{said(testClusterID, 1, 1, 5), said(testClusterID, 2, 1, 5), said(testClusterID, 3, 1, 5), said(testClusterID, 9, 0, 6)}, true, 1, "", "", ""},
	} {
		names := []string{"e-0", "e-1", "e-2", "e-3"}[:len(tc.statuses)]
		snap := assemble(endpoints(names...), tc.statuses, threeMembers())
		l, hasLeader := snap.Leader()
		switch {
		case !snap.Asked || len(snap.Members) != 3 || snap.Members[0].ID != 1 || snap.Members[2].ID != 3:
			t.Errorf("%s: want the three members sorted by ID, got %+v", tc.story, snap.Members)
		case snap.Complete != tc.complete:
			t.Errorf("%s: complete %v", tc.story, snap.Complete)
		case hasLeader != (tc.leader != 0) || l.ID != tc.leader:
			t.Errorf("%s: leader %+v", tc.story, l)
		case (tc.inconsistent == "") != (snap.Inconsistent == "") || !strings.Contains(snap.Inconsistent, tc.inconsistent):
			t.Errorf("%s: inconsistent %q, want %q", tc.story, snap.Inconsistent, tc.inconsistent)
		case (tc.err == "") != (snap.Err == "") || !strings.Contains(snap.Err, tc.err):
			t.Errorf("%s: err %q, want %q", tc.story, snap.Err, tc.err)
		case strings.Join(snap.Forked, ",") != tc.forked:
			t.Errorf("%s: forked %q, want %q", tc.story, snap.Forked, tc.forked)
		}
	}
}

// An answer from outside the member list that does not lead is reported with the member ID it
// gave, and only then: the planner tells a removed member still stopping from a stranger.
func TestAssembleReportsUnlistedAnswers(t *testing.T) {
	snap := assemble(endpoints("e-0", "e-1", "e-2", "e-3"),
		[]endpointStatus{said(testClusterID, 1, 1, 5), said(testClusterID, 2, 1, 5), said(testClusterID, 3, 1, 5), said(testClusterID, 9, 1, 5)}, threeMembers())
	if want := []etcdstate.Unlisted{{Endpoint: "e-3", MemberID: 9}}; !slices.Equal(snap.Unlisted, want) {
		t.Errorf("unlisted %+v, want %+v", snap.Unlisted, want)
	}
	snap = assemble(endpoints("e-0", "e-1", "e-2", "e-3"),
		[]endpointStatus{said(testClusterID, 1, 1, 5), said(testClusterID, 2, 1, 5), said(testClusterID, 3, 1, 5), said(testClusterID, 9, 9, 6)}, threeMembers())
	if len(snap.Unlisted) != 0 || !slices.Contains(snap.Forked, "e-3") {
		t.Errorf("a leader outside the list: unlisted %+v, forked %v; want it forked only", snap.Unlisted, snap.Forked)
	}
}

func TestAssembleAlarms(t *testing.T) {
	// Every member's Status lists the cluster's alarms; each is the alarmed member's, and
	// only CORRUPT says that member is unhealthy: NOSPACE refuses writes but the members
	// read and vote. An alarm of a member no longer listed (9) is kept at the cluster's level.
	for _, tc := range []struct {
		alarm     string
		unhealthy uint64
	}{{"NOSPACE", 0}, {"CORRUPT", 2}} {
		statuses := []endpointStatus{said(testClusterID, 1, 1, 5), said(testClusterID, 2, 1, 5), said(testClusterID, 3, 1, 5)}
		for i := range statuses {
			statuses[i].status.Errors = []string{"memberID:2 alarm:" + tc.alarm, "memberID:9  alarm:CORRUPT"}
		}
		snap := assemble(endpoints("e-0", "e-1", "e-2"), statuses, threeMembers())
		for _, m := range snap.Members {
			hasAlarm := m.ID == 2
			if (len(m.Alarms) == 1) != hasAlarm || (hasAlarm && m.Alarms[0] != tc.alarm) {
				t.Errorf("%s: member %s: alarms %v", tc.alarm, m.Name, m.Alarms)
			}
			if m.Healthy == (m.ID == tc.unhealthy) {
				t.Errorf("%s: member %s healthy %v", tc.alarm, m.Name, m.Healthy)
			}
		}
		want := []etcdstate.Alarm{{MemberID: 2, Type: tc.alarm}, {MemberID: 9, Type: "CORRUPT"}}
		if !slices.Equal(snap.Alarms, want) {
			t.Errorf("%s: snapshot alarms %v, want %v", tc.alarm, snap.Alarms, want)
		}
	}
}

func TestParseAlarm(t *testing.T) {
	for _, tc := range []struct {
		in    string
		id    uint64
		alarm string
		ok    bool
	}{
		{"memberID:12345 alarm:NOSPACE", 12345, "NOSPACE", true},
		{"memberID:1  alarm:CORRUPT", 1, "CORRUPT", true},
		// Member ID 0, left out of the text form: etcd could not place the corruption.
		{"alarm:CORRUPT", 0, "CORRUPT", true},
		{"alarm:", 0, "", false},
		{"memberID:1 alarm:CORRUPT extra", 0, "", false},
		{"etcdserver: no leader", 0, "", false},
		{"memberID:x alarm:NOSPACE", 0, "", false},
	} {
		id, alarm, ok := parseAlarm(tc.in)
		if id != tc.id || alarm != tc.alarm || ok != tc.ok {
			t.Errorf("parseAlarm(%q) = %d %q %v", tc.in, id, alarm, ok)
		}
	}
}
