package launcher

import (
	"slices"
	"strings"
	"testing"

	"etcdops.dev/etcdops/joinstate"
)

const dataDir = "/var/lib/etcd/data"

func peer(name string) string { return "http://" + name + ".e.ns.svc.cluster.local:2380" }

// join is a join state of the given members, all at incarnation 1 unless said otherwise.
func join(state string, members ...joinstate.Member) joinstate.State {
	return joinstate.State{Token: "ns/e/uid-1", ClusterState: state, Members: members}
}

func member(name string, incarnation int64, established bool) joinstate.Member {
	return joinstate.Member{Name: name, PeerURL: peer(name), Incarnation: incarnation, Established: established}
}

func TestDecide(t *testing.T) {
	withData := func(incarnation int64) Volume {
		return Volume{HasData: true, HasMarker: true, Incarnation: incarnation}
	}
	for _, tc := range []struct {
		story   string
		in      Input
		kind    Kind
		wipe    bool
		initial string // --initial-cluster-state when starting
	}{
		{"the first seed of a new cluster starts it",
			Input{Join: join("new", member("e-0", 1, false)), Name: "e-0"}, Start, false, "new"},
		{"a learner added for e-1 joins the existing cluster",
			Input{Join: join("existing", member("e-0", 1, true), member("e-1", 1, false)), Name: "e-1"}, Start, false, "existing"},
		{"a voter restarts with its data; the initial flags are ignored by etcd",
			Input{Join: join("existing", member("e-0", 1, true)), Name: "e-0", Volume: withData(1)}, Start, false, "existing"},
		{"the seed restarts with its data before the planner recorded it established",
			Input{Join: join("new", member("e-0", 1, false)), Name: "e-0", Volume: withData(1)}, Start, false, "new"},
		{"a replaced member wipes its old incarnation's data and joins anew",
			Input{Join: join("existing", member("e-0", 1, true), member("e-1", 2, false)), Name: "e-1", Volume: withData(1)}, Start, true, "existing"},
		{"a stale empty dir with an old marker joins without a wipe",
			Input{Join: join("existing", member("e-0", 1, true), member("e-1", 2, false)), Name: "e-1", Volume: Volume{HasMarker: true, Incarnation: 1}}, Start, false, "existing"},
		{"an established voter whose data dir is empty must not start",
			Input{Join: join("existing", member("e-0", 1, true), member("e-1", 1, true)), Name: "e-1", Volume: Volume{HasMarker: true, Incarnation: 1}}, Refuse, false, ""},
		{"a voter whose data dir was lost before its pod read its established flag must not start: the volume knows",
			Input{Join: join("existing", member("e-0", 1, true), member("e-1", 1, false)), Name: "e-1", Volume: Volume{HasMarker: true, Incarnation: 1, Established: true}}, Refuse, false, ""},
		{"a voter of an earlier incarnation vouches for nothing: the re-added learner starts on the empty dir",
			Input{Join: join("existing", member("e-0", 1, true), member("e-1", 2, false)), Name: "e-1", Volume: Volume{HasMarker: true, Incarnation: 1, Established: true}}, Start, false, "existing"},
		{"an established seed on an empty dir would form a new cluster",
			Input{Join: join("existing", member("e-0", 1, true)), Name: "e-0"}, Refuse, false, ""},
		{"an established member with stale data contradicts the join state: nothing is wiped",
			Input{Join: join("existing", member("e-0", 2, true)), Name: "e-0", Volume: withData(1)}, Refuse, false, ""},
		{"data nobody vouches for is not started on, nor wiped",
			Input{Join: join("existing", member("e-0", 1, true)), Name: "e-0", Volume: Volume{HasData: true}}, Refuse, false, ""},
		{"a pod whose member is not in the mounted join state yet waits",
			Input{Join: join("existing", member("e-0", 1, true)), Name: "e-1"}, Wait, false, ""},
		{"a volume newer than the mounted join state waits for the file to catch up",
			Input{Join: join("existing", member("e-0", 1, true), member("e-1", 1, false)), Name: "e-1", Volume: withData(2)}, Wait, false, ""},
		{"the seed of a cluster started from a snapshot restores it into its empty volume",
			Input{Join: restoring(join("new", member("e-0", 1, false))), Name: "e-0"}, Start, false, "new"},
		{"the restored seed restarts with the data it restored",
			Input{Join: restoring(join("new", member("e-0", 1, false))), Name: "e-0", Volume: Volume{HasData: true, HasMarker: true, Incarnation: 1, Restored: "ns/e/uid-1"}}, Start, false, "new"},
		{"a restore never lands on a volume that holds another cluster's data",
			Input{Join: restoring(join("new", member("e-0", 1, false))), Name: "e-0", Volume: withData(1)}, Refuse, false, ""},
		{"data restored for an earlier cluster of the same name is not this restore",
			Input{Join: restoring(join("new", member("e-0", 1, false))), Name: "e-0", Volume: Volume{HasData: true, HasMarker: true, Incarnation: 1, Restored: "ns/e/uid-0"}}, Refuse, false, ""},
		{"once the cluster exists, a member added back on an empty volume joins it; it restores nothing",
			Input{Join: restoring(join("existing", member("e-0", 2, false), member("e-1", 1, true))), Name: "e-0"}, Start, false, "existing"},
		{"an established restored seed on an empty volume refuses, as any established member",
			Input{Join: restoring(join("existing", member("e-0", 1, true))), Name: "e-0"}, Refuse, false, ""},
		{"a cluster of one re-created under the same name refuses the data its predecessor left on the claim",
			Input{Join: join("new", member("e-0", 0, false)), Name: "e-0", Volume: earlier(withData(0))}, Refuse, false, ""},
		{"a member of a larger re-created cluster refuses its predecessor's data, stale or not, and wipes nothing",
			Input{Join: join("existing", member("e-0", 0, true), member("e-1", 2, false)), Name: "e-1", Volume: earlier(withData(1))}, Refuse, false, ""},
		{"an earlier cluster's markers beside an empty data dir are ignored: the seed starts a new cluster",
			Input{Join: join("new", member("e-0", 0, false)), Name: "e-0", Volume: earlier(Volume{HasMarker: true, Incarnation: 3})}, Start, false, "new"},
		{"a volume written before the token was recorded keeps starting",
			Input{Join: join("existing", member("e-0", 1, true)), Name: "e-0", Volume: withData(1)}, Start, false, "existing"},
		{"a volume of before the token whose etcd cluster ID is the one on record starts",
			Input{Join: onRecord(join("existing", member("e-0", 1, true)), "c1"), Name: "e-0", Volume: pretoken(withData(1), "c1")}, Start, false, "existing"},
		{"a volume of before the token of another etcd cluster ID is refused and wiped by nothing, stale or not",
			Input{Join: onRecord(join("existing", member("e-0", 1, true), member("e-1", 2, false)), "c1"), Name: "e-1", Volume: pretoken(withData(1), "c0")}, Refuse, false, ""},
		{"a volume of before the token whose cluster ID cannot be read, or no ID on record: taken as this cluster's",
			Input{Join: join("existing", member("e-0", 1, true)), Name: "e-0", Volume: pretoken(withData(1), "c0")}, Start, false, "existing"},
		{"a volume this cluster's member wrote restarts",
			Input{Join: join("existing", member("e-0", 1, true)), Name: "e-0", Volume: Volume{HasData: true, HasMarker: true, Incarnation: 1, Token: "ns/e/uid-1"}}, Start, false, "existing"},
		{"a join state without a token waits",
			Input{Join: joinstate.State{ClusterState: "new", Members: []joinstate.Member{member("e-0", 1, false)}}, Name: "e-0"}, Wait, false, ""},
	} {
		tc.in.DataDir = dataDir
		d := Decide(tc.in)
		if wantRestore := tc.in.Join.Restore != nil && tc.kind == Start && !tc.in.Volume.HasData && tc.initial == "new"; d.Restore != wantRestore {
			t.Errorf("%s: restore=%v, want %v", tc.story, d.Restore, wantRestore)
		}
		if d.Kind != tc.kind || d.Wipe != tc.wipe || d.Reason == "" {
			t.Errorf("%s: got %v wipe=%v (%s), want %v wipe=%v", tc.story, d.Kind, d.Wipe, d.Reason, tc.kind, tc.wipe)
			continue
		}
		foreign := tc.in.Volume.Token == "ns/e/uid-0" && tc.in.Volume.HasData || tc.kind == Refuse && tc.in.Volume.ClusterID == "c0"
		if foreign != strings.HasPrefix(d.Reason, joinstate.ForeignCluster) {
			t.Errorf("%s: reason %q; another cluster's data: %v", tc.story, d.Reason, foreign)
		}
		if d.Kind != Start {
			if d.Args != nil {
				t.Errorf("%s: %v carries etcd flags %v", tc.story, d.Kind, d.Args)
			}
			continue
		}
		me, _ := tc.in.Join.Find(tc.in.Name)
		var initial []string
		for _, m := range tc.in.Join.Members {
			initial = append(initial, m.Name+"="+m.PeerURL)
		}
		want := []string{
			"--name=" + tc.in.Name,
			"--data-dir=" + dataDir,
			"--initial-cluster=" + strings.Join(initial, ","),
			"--initial-cluster-state=" + tc.initial,
			"--initial-cluster-token=ns/e/uid-1",
		}
		if !slices.Equal(d.Args, want) || d.Incarnation != me.Incarnation || d.Token != "ns/e/uid-1" {
			t.Errorf("%s: got args %q incarnation %d token %q, want %q incarnation %d token ns/e/uid-1", tc.story, d.Args, d.Incarnation, d.Token, want, me.Incarnation)
		}
	}
}

// earlier marks v as written by a member of an earlier cluster of the same name (uid-0).
func earlier(v Volume) Volume {
	v.Token = "ns/e/uid-0"
	return v
}

// onRecord is s naming etcd cluster ID id as the one on record.
func onRecord(s joinstate.State, id string) joinstate.State {
	s.ClusterID = id
	return s
}

// pretoken is v as a launcher of before the cluster token left it, written by a member of etcd
// cluster id.
func pretoken(v Volume, id string) Volume {
	v.Token, v.ClusterID = "", id
	return v
}

// restoring marks s as the join state of a cluster bootstrapped from a snapshot by e-0.
func restoring(s joinstate.State) joinstate.State {
	s.Restore = &joinstate.Restore{Member: "e-0", Backup: "latest", Revision: 42}
	return s
}

func TestMarkerPath(t *testing.T) {
	for dir, want := range map[string]string{
		"/var/lib/etcd/data":  "/var/lib/etcd/incarnation",
		"/var/lib/etcd/data/": "/var/lib/etcd/incarnation",
		"/tmp/x/member-0/d":   "/tmp/x/member-0/incarnation",
	} {
		if got := MarkerPath(dir); got != want {
			t.Errorf("MarkerPath(%s) = %s, want %s", dir, got, want)
		}
	}
}
