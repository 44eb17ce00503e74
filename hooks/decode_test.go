package hooks

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	jsonv2 "github.com/go-json-experiment/json"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// decodeTime must read every timestamp as metav1.Time's own decoder does, errors included.
func TestDecodeTimeAsMetav1(t *testing.T) {
	for _, in := range []string{
		`null`, `"2026-12-01T12:00:00Z"`, `"2026-12-01T12:00:00+02:00"`, `"2026-12-01T12:00:00.123456789Z"`,
		`""`, `"yesterday"`, `"2026-12-01 12:00:00"`, `12`, `true`, `{}`, `[]`,
	} {
		var want, got metav1.Time
		wantErr := want.UnmarshalJSON([]byte(in))
		gotErr := jsonv2.Unmarshal([]byte(in), &got, decodeOptions...)
		if (wantErr != nil) != (gotErr != nil) {
			t.Errorf("%s: error %v, metav1 says %v", in, gotErr, wantErr)
			continue
		}
		if !got.Equal(&want) || got.Location() != want.Location() {
			t.Errorf("%s: %v, metav1 says %v", in, got, want)
		}
	}
}

// A pod's managed fields are not kept; everything else of its metadata is, and a malformed
// timestamp still refuses the request.
func TestDecodeSkipsManagedFields(t *testing.T) {
	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"etcd-0","namespace":"default",` +
		`"creationTimestamp":%s,"labels":{"a":"b"},` +
		`"managedFields":[{"manager":"kubelet","operation":"Update","fieldsType":"FieldsV1","fieldsV1":{"f:status":{}}}]}}`
	read := func(created string) (syncRequest, error) {
		body := `{"parent":null,"related":{"Pod.v1":{"default/etcd-0":` + strings.Replace(pod, "%s", created, 1) + `}}}`
		return readSyncRequest(httptest.NewRequest("POST", "/sync", strings.NewReader(body)), new(bytes.Buffer))
	}
	req, err := read(`"2026-12-01T12:00:00Z"`)
	if err != nil {
		t.Fatal(err)
	}
	p := req.related.pods["default/etcd-0"]
	if p == nil || p.ManagedFields != nil || p.Labels["a"] != "b" || p.CreationTimestamp.UTC().Hour() != 12 {
		t.Fatalf("decoded pod %+v", p)
	}
	if _, err := read(`"noon"`); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Fatalf("a malformed timestamp: %v, want the request refused as malformed", err)
	}
}

// Decoders are reused from one request to the next: one left mid-object by a malformed body
// must read the next body from its start, remembering none of the names it saw, so a request
// with the same names is not refused as naming them twice.
func TestADecoderReadsEachBodyAfresh(t *testing.T) {
	read := func(body string) (syncRequest, error) {
		return readSyncRequest(httptest.NewRequest("POST", "/sync", strings.NewReader(body)), new(bytes.Buffer))
	}
	good := `{"parent":{"metadata":{"name":"etcd"}},"finalizing":true}`
	for range 3 {
		if _, err := read(`{"parent":{"metadata":{"name":"etcd"}},"finalizing":tru`); err == nil {
			t.Fatal("a truncated body was read")
		}
		req, err := read(good)
		if err != nil {
			t.Fatalf("the body after a truncated one: %v", err)
		}
		if !req.finalizing || !strings.Contains(string(req.parent), `"etcd"`) {
			t.Fatalf("the body after a truncated one read as %+v", req)
		}
	}
}

// The parent is kept as part of the body's buffer, not copied: it must come out whole after the
// decoder has read a large rest of the body past it.
func TestTheParentSurvivesTheRestOfTheBody(t *testing.T) {
	parent := `{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"default","annotations":{"note":"` + strings.Repeat("p", 4096) + `"}}}`
	var pods strings.Builder
	for i := range 200 {
		if i > 0 {
			pods.WriteByte(',')
		}
		fmt.Fprintf(&pods, `"default/etcd-%d":{"metadata":{"name":"etcd-%d","namespace":"default","labels":{"x":"%s"}}}`, i, i, strings.Repeat("q", 1024))
	}
	body := `{"parent":` + parent + `,"related":{"Pod.v1":{` + pods.String() + `}}}`
	req, err := readSyncRequest(httptest.NewRequest("POST", "/sync", strings.NewReader(body)), new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	if string(req.parent) != parent || len(req.related.pods) != 200 {
		t.Fatalf("the parent read as %.80q..., %d pods", req.parent, len(req.related.pods))
	}
}

// The parent is read as encoding/json reads it, less its managed fields: every fixture's
// parent, names in another case, unknown names, nulls, and the errors of values of the wrong
// type.
func TestTheParentIsReadAsEncodingJSONWouldReadIt(t *testing.T) {
	parents := []string{
		`{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","METADATA":{"Name":"etcd","namespace":"default"},"Spec":{"SIZE":3,"unknown":1}}`,
		`{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"default","labels":null,"creationTimestamp":null},"spec":null,"status":{"conditions":[{"type":"Ready","status":"True","lastTransitionTime":"2026-12-01T12:00:00+02:00"}]}}`,
		`{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"default"},"spec":{"size":"three"}}`,
		`{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"default"},"spec":{"storage":{"size":"1Gi"},"size":3.5}}`,
		`{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"default"},"spec":{"storage":{"size":"lots"}}}`,
		`{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"default","creationTimestamp":"noon"}}`,
	}
	files, err := filepath.Glob("../test/fixtures/*.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		var req struct{ Parent json.RawMessage }
		if b, err := os.ReadFile(f); err == nil && json.Unmarshal(b, &req) == nil && len(req.Parent) > 0 && string(req.Parent) != "null" {
			parents = append(parents, string(req.Parent))
		}
	}
	if len(parents) < 10 {
		t.Fatalf("only %d parents to compare", len(parents))
	}
	for _, raw := range parents {
		var want v1alpha1.EtcdCluster
		wantErr := json.Unmarshal([]byte(raw), &want)
		want.ManagedFields = nil
		got, gotErr := decodeParent(json.RawMessage(raw))
		if (wantErr != nil) != (gotErr != nil) {
			t.Errorf("%.100s: error %v, encoding/json says %v", raw, gotErr, wantErr)
			continue
		}
		if wantErr == nil && !reflect.DeepEqual(got, want) {
			t.Errorf("%.100s:\nread    %+v\nwant    %+v", raw, got, want)
		}
	}
}
