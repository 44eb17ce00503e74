package joinstate

import (
	"reflect"
	"testing"
)

// FuzzDecode: any bytes decode to a state or an error, never a panic; a decoded state encodes
// and decodes back to itself, so what the planner writes is what the launcher reads.
// The corpus in testdata/fuzz/FuzzDecode replays in every go test run.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(Encode(State{Token: "ns/e/uid", ClusterState: StateExisting, Members: []Member{
		{Name: "e-0", PeerURL: "https://e-0.e.ns.svc.cluster.local:2380", Incarnation: 2, Established: true},
		{Name: "e-1", PeerURL: "http://e-1.e.ns.svc.cluster.local:2380"},
	}})))
	f.Add([]byte(`{"clusterState":"new","members":[{"name":"e-0"}]}`))
	f.Add([]byte(`{"clusterState":"existing","members":null,"token":""}`))
	f.Add([]byte(`{"clusterState":"neither"}`))
	f.Add([]byte(`{"members":[{"incarnation":1e400}]}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Decode(data)
		if err != nil {
			return
		}
		again, err := Decode([]byte(Encode(s)))
		if err != nil {
			t.Fatalf("a decoded state does not decode after encoding: %v", err)
		}
		if !reflect.DeepEqual(normal(s), normal(again)) {
			t.Fatalf("round trip changed the state:\n%+v\n%+v", s, again)
		}
	})
}

// normal treats an empty member list and none alike: JSON null and [] mean the same here.
func normal(s State) State {
	if len(s.Members) == 0 {
		s.Members = nil
	}
	return s
}
