package launcher

import (
	"slices"
	"strings"
	"testing"

	"etcdops.dev/etcdops/joinstate"
)

// FuzzDecide runs the start decision over arbitrary join states and volumes. It never panics,
// always says why, and keeps the rules that protect the data: an established member never
// starts without its own data, data is wiped only when an older incarnation wrote it, and a
// start carries the pod's own name and the join state's token and cluster state, and never
// happens on data another cluster's member wrote.
func FuzzDecide(f *testing.F) {
	f.Add("e-1", []byte(joinstate.Encode(join("existing", member("e-0", 1, true), member("e-1", 2, false)))), true, true, int64(1), "")
	f.Add("e-0", []byte(joinstate.Encode(join("new", member("e-0", 0, false)))), false, false, int64(0), "")
	f.Add("e-0", []byte(joinstate.Encode(join("existing", member("e-0", 3, true)))), true, false, int64(0), "")
	f.Add("e-0", []byte(joinstate.Encode(join("new", member("e-0", 0, false)))), true, true, int64(0), "ns/e/uid-0")
	f.Add("e-0", []byte(joinstate.Encode(join("new", member("e-0", 0, false)))), false, true, int64(4), "ns/e/uid-0")
	f.Add("e-2", []byte(`{"token":"","clusterState":"existing","members":[{"name":"e-2","incarnation":-1}]}`), false, true, int64(-5), "ns/e/uid-1")
	f.Fuzz(func(t *testing.T, name string, state []byte, hasData, hasMarker bool, incarnation int64, token string) {
		js, err := joinstate.Decode(state)
		if err != nil {
			return
		}
		in := Input{Join: js, Name: name, DataDir: dataDir, Volume: Volume{HasData: hasData, HasMarker: hasMarker, Incarnation: incarnation, Token: token}}
		d := Decide(in)
		if d.Reason == "" {
			t.Fatalf("decision %v without a reason", d.Kind)
		}
		me, listed := js.Find(name)
		if !listed && d.Kind != Wait {
			t.Fatalf("%s is not in the join state, decision %v", name, d.Kind)
		}
		if d.Kind != Start {
			if d.Wipe || d.Args != nil {
				t.Fatalf("a %v decision wipes (%v) or has flags %q", d.Kind, d.Wipe, d.Args)
			}
			return
		}
		if hasData && token != "" && token != js.Token {
			t.Fatalf("started on data of cluster %q under join state token %q", token, js.Token)
		}
		if d.Token != js.Token {
			t.Fatalf("a start records token %q, the join state's is %q", d.Token, js.Token)
		}
		stale := hasData && incarnation < me.Incarnation
		if me.Established && (!hasData || stale) {
			t.Fatalf("established %s starts on %s", name, map[bool]string{true: "stale data", false: "no data"}[stale])
		}
		if d.Wipe != stale {
			t.Fatalf("wipe %v, stale data %v", d.Wipe, stale)
		}
		if hasData && !hasMarker {
			t.Fatal("started on data no incarnation marker vouches for")
		}
		for _, want := range []string{"--name=" + name, "--initial-cluster-token=" + js.Token, "--initial-cluster-state=" + js.ClusterState} {
			if !slices.Contains(d.Args, want) {
				t.Fatalf("start flags %q lack %q", d.Args, want)
			}
		}
		if !slices.ContainsFunc(d.Args, func(a string) bool {
			return strings.HasPrefix(a, "--initial-cluster=") && strings.Contains(a, name+"=")
		}) {
			t.Fatalf("initial cluster in %q does not list %s", d.Args, name)
		}
	})
}
