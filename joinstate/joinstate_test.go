package joinstate

import (
	"testing"
	"time"
)

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

// The seed's report of a restore reads back as written, with or without a time and a
// lineage, and as an older launcher wrote it (the revision and the object only).
func TestRestoredMessageReadsBack(t *testing.T) {
	at := time.Date(2026, 12, 1, 9, 12, 31, 412_000_000, time.UTC)
	for _, p := range []RestoredPoint{
		{Revision: 48377, Time: at, Lineage: "8e9e05c52164694d", Object: "s3://b/p/lineages/8e9e05c52164694d/etcd-20261201T090000Z-r48213.db"},
		{Revision: 48377, Time: at, Lineage: "8e9e05c52164694d", Took: 12*time.Second + 345*time.Millisecond, Object: "s3://b/p/lineages/8e9e05c52164694d/x.db"},
		{Revision: 7, Lineage: "legacy", Object: "/var/lib/etcdops/backup/ns/etcd/etcd-20261201T090000Z-r7.db"},
		{Revision: 9, Object: "s3://b/with space/x.db"},
	} {
		got, ok := ParseRestored(RestoredMessage(p))
		if !ok || got.Revision != p.Revision || !got.Time.Equal(p.Time) || got.Lineage != p.Lineage || got.Object != p.Object || got.Took != p.Took {
			t.Errorf("%q read back as %+v, %t", RestoredMessage(p), got, ok)
		}
	}
	if got, ok := ParseRestored("launch restored: revision 48377 from s3://b/p/etcd-20261201T090000Z-r48213.db"); !ok || got.Revision != 48377 || got.Object != "s3://b/p/etcd-20261201T090000Z-r48213.db" {
		t.Errorf("an older launcher's report: %+v, %t", got, ok)
	}
	for _, bad := range []string{"launch refused: x", "launch restored: revision 0 from x", "launch restored: revision 5 at yesterday from x", "launch restored: revision 5 in a while from x"} {
		if _, ok := ParseRestored(bad); ok {
			t.Errorf("%q read as a restore", bad)
		}
	}
}
