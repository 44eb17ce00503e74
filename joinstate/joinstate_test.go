package joinstate

import "testing"

// The ConfigMap's value is what running clusters' pods read and what Metacontroller compares:
// a changed byte (indentation, HTML escaping, the final newline) changes the ConfigMap of
// every cluster.
func TestEncodeWritesIndentedJSON(t *testing.T) {
	s := State{Token: "ns/e<&>/uid", ClusterState: StateExisting, Members: []Member{
		{Name: "e-0", PeerURL: "https://e-0.e.ns.svc.cluster.local:2380", Incarnation: 2, Established: true},
		{Name: "e-1", PeerURL: "http://e-1.e.ns.svc.cluster.local:2380", Fenced: true},
	}, Recovery: &Recovery{Survivor: "e-0", Token: "r1"}}
	want := `{
  "token": "ns/e\u003c\u0026\u003e/uid",
  "clusterState": "existing",
  "members": [
    {
      "name": "e-0",
      "peerURL": "https://e-0.e.ns.svc.cluster.local:2380",
      "incarnation": 2,
      "established": true
    },
    {
      "name": "e-1",
      "peerURL": "http://e-1.e.ns.svc.cluster.local:2380",
      "incarnation": 0,
      "fenced": true
    }
  ],
  "recovery": {
    "survivor": "e-0",
    "token": "r1"
  }
}
`
	// Twice: the second Encode reuses the first one's buffers.
	for range 2 {
		if got := Encode(s); got != want {
			t.Fatalf("Encode:\n%s\nwant:\n%s", got, want)
		}
	}
	if got, want := Encode(State{ClusterState: StateNew}), "{\n  \"token\": \"\",\n  \"clusterState\": \"new\",\n  \"members\": null\n}\n"; got != want {
		t.Fatalf("Encode of an empty state: %q, want %q", got, want)
	}
}
