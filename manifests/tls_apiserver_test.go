package manifests

import (
	"strings"
	"testing"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// TLS may be turned on and off by editing spec.tls, but a Secret may not be swapped for
// another while its field is set: the API server refuses it with the safe path, as the hook
// does (sync's checkTLSChange) when the CRD is bypassed.
func testTLSTransitions(t *testing.T, s *apiServer) {
	ctx := t.Context()
	c := sampleCluster("tls")
	c.Spec.TLS = &v1alpha1.TLSSpec{ServerSecret: "server", ClientSecret: "client"}
	created, err := s.clusters().Create(ctx, toUnstructured(t, c), strictCreate)
	if err != nil {
		t.Fatal(err)
	}
	current := fromUnstructured(t, created)
	update := func(tls *v1alpha1.TLSSpec) error {
		c := current
		c.Spec.TLS = tls
		u, err := s.clusters().Update(ctx, toUnstructured(t, c), strictUpdate)
		if err == nil {
			current = fromUnstructured(t, u)
		}
		return err
	}
	for _, c := range []struct {
		story string
		tls   *v1alpha1.TLSSpec
		want  string
	}{
		{"another server Secret", &v1alpha1.TLSSpec{ServerSecret: "server-2", ClientSecret: "client"}, "renew the certificate inside the named Secret"},
		{"another client Secret", &v1alpha1.TLSSpec{ServerSecret: "server", ClientSecret: "client-2"}, "spec.tls.clientSecret cannot name another Secret"},
	} {
		if err := update(c.tls); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error mentioning %q", c.story, err, c.want)
		}
	}
	for _, c := range []struct {
		story string
		tls   *v1alpha1.TLSSpec
	}{
		{"peer TLS turned on", &v1alpha1.TLSSpec{ServerSecret: "server", ClientSecret: "client", PeerSecret: "peer"}},
		{"client TLS turned off", &v1alpha1.TLSSpec{PeerSecret: "peer"}},
		{"client TLS on again, with other Secrets", &v1alpha1.TLSSpec{ServerSecret: "server-2", ClientSecret: "client-2", PeerSecret: "peer"}},
		{"TLS off altogether", nil},
	} {
		if err := update(c.tls); err != nil {
			t.Errorf("%s: %v", c.story, err)
		}
	}
}
