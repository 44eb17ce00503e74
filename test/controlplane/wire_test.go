package controlplane

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// FixturesDir holds the hook requests curl users post (test/fixtures).
const FixturesDir = "../fixtures"

// requestShape is the structure of a hook request as Metacontroller builds it for the hook's
// version: its top-level keys, the object types of its children and related maps (a declared
// type is there even without objects), and how each type's objects are keyed.
func requestShape(t *testing.T, body []byte) map[string]bool {
	t.Helper()
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for k, raw := range req {
		out["key "+k] = true
		if k != "children" && k != "related" {
			continue
		}
		var groups map[string]map[string]struct {
			Metadata struct{ Name, Namespace string }
		}
		if err := json.Unmarshal(raw, &groups); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		for typ, objs := range groups {
			out[k+" "+typ] = true
			for key, o := range objs {
				switch key {
				case o.Metadata.Namespace + "/" + o.Metadata.Name:
					out[k+" "+typ+" keyed namespace/name"] = true
				case o.Metadata.Name:
					out[k+" "+typ+" keyed by name"] = true
				default:
					out[k+" "+typ+" keyed otherwise"] = true
				}
			}
		}
	}
	return out
}

// wireFormatMatchesFixtures holds the fixtures to the requests the real Metacontroller sent in
// this test, for the hooks' version in the installed CompositeController: the last sync of a
// steady cluster with claims has the shape of steady-3.json, the last customize that of
// customize.json. Objects' contents are the fixtures' own tests' business (TestShapedLikeRecorded).
func wireFormatMatchesFixtures(t *testing.T, p *Plane) {
	for path, fixture := range map[string]string{"/sync": "steady-3.json", "/customize": "customize.json"} {
		real := p.requests.lastRequest(path)
		if real == nil {
			t.Errorf("Metacontroller posted nothing to %s", path)
			continue
		}
		want, err := os.ReadFile(filepath.Join(FixturesDir, fixture))
		if err != nil {
			t.Fatal(err)
		}
		got, fix := requestShape(t, real), requestShape(t, want)
		var missing, extra []string
		for f := range got {
			if !fix[f] {
				missing = append(missing, f)
			}
		}
		for f := range fix {
			if !got[f] {
				extra = append(extra, f)
			}
		}
		slices.Sort(missing)
		slices.Sort(extra)
		if len(missing) > 0 || len(extra) > 0 {
			t.Errorf("%s lacks what Metacontroller sent to %s: %s; and has what it did not send: %s (the request: %s)",
				fixture, path, strings.Join(missing, ", "), strings.Join(extra, ", "), filepath.Join(p.requests.dir, strings.TrimPrefix(path, "/")+".json"))
		}
		t.Logf("%s: %s", path, strings.Join(slices.Sorted(maps.Keys(got)), ", "))
	}
}
