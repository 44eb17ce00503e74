package hooks_test

import (
	"net/http"
	"strings"
	"testing"

	"etcdops.dev/etcdops/hooks"
)

// TestDuplicateNamesRefused: a request naming a member twice in one object says two things at
// once (which parent, which size, which key) and decoders differ on which wins: 400, for every
// hook, and the same names in sibling objects are fine.
func TestDuplicateNamesRefused(t *testing.T) {
	srv := newServer(t, hooks.Deps{Etcd: offline(t)})
	parent := `{"apiVersion":"etcdops.dev/v1alpha1","kind":"EtcdCluster","metadata":{"name":"etcd","namespace":"default"}}`
	for _, tc := range []struct {
		path, body string
		want       int
	}{
		{"/sync", `{"parent":` + parent + `,"parent":` + strings.Replace(parent, `"etcd"`, `"other"`, 1) + `}`, http.StatusBadRequest},
		{"/sync", `{"parent":` + strings.Replace(parent, `}}`, `},"spec":{"size":3,"size":1}}`, 1) + `}`, http.StatusBadRequest},
		{"/sync", `{"parent":` + parent + `,"related":{"Secret.v1":{"s":{"metadata":{"name":"s"},"data":{"tls.key":"eA==","tls.key":"eQ=="}}}}}`, http.StatusBadRequest},
		{"/customize", `{"parent":` + parent + `,"parent":` + parent + `}`, http.StatusBadRequest},
		{"/sync", `{"parent":` + parent + `,"children":{"Service.v1":{"a":{"metadata":{"name":"a"}},"b":{"metadata":{"name":"b"}}}}}`, http.StatusOK},
	} {
		if status, body := post(t, srv, tc.path, tc.body); status != tc.want {
			t.Errorf("%s %s: %d %s, want %d", tc.path, tc.body, status, body, tc.want)
		}
	}
}
