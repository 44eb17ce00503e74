package hooks

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// TestStatusReadsBackAsAnswered: a status answered and handed back by the API server has the
// digest it was remembered under, or the memo could not tell an older status from a newer
// one. Every golden answer's status, decoded as a parent's status is, marshals to the same
// JSON as it was answered (observedGeneration left out, as the memo leaves it).
func TestStatusReadsBackAsAnswered(t *testing.T) {
	goldens, err := filepath.Glob("../test/fixtures/*.golden.json")
	if err != nil || len(goldens) == 0 {
		t.Fatalf("no golden answers (%v)", err)
	}
	statuses := 0
	for _, g := range goldens {
		raw, err := os.ReadFile(g)
		if err != nil {
			t.Fatal(err)
		}
		var answer struct {
			Status json.RawMessage `json:"status"`
		}
		if err := json.Unmarshal(raw, &answer); err != nil {
			t.Fatalf("%s: %v", g, err)
		}
		if len(answer.Status) == 0 {
			continue
		}
		statuses++
		c, err := decodeParent(json.RawMessage(`{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"default","uid":"u-1"},"status":` + string(answer.Status) + `}`))
		if err != nil {
			t.Fatalf("%s: %v", g, err)
		}
		got, _ := statusJSON(c.Status)
		var back, answered map[string]any
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(answer.Status, &answered); err != nil {
			t.Fatal(err)
		}
		delete(answered, "observedGeneration")
		if !reflect.DeepEqual(back, answered) {
			t.Errorf("%s: the status reads back as\n%s\nanswered as\n%s", filepath.Base(g), got, answer.Status)
		}
	}
	if statuses < 10 {
		t.Errorf("only %d golden answers carry a status", statuses)
	}
}
