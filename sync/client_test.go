package sync

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// simCABundle stands for the PEM CA bundle of a Secret whose CA the simulator calls ca.
func simCABundle(ca string) string {
	return "-----BEGIN CERTIFICATE-----\n" + ca + "\n-----END CERTIFICATE-----\n"
}

// clientDetails are the client ConfigMap's data as last applied, and status.client.
func (w *simWorld) clientDetails(t *testing.T) (map[string]string, *v1alpha1.ClientStatus) {
	t.Helper()
	raw, ok := w.applied["ConfigMap/"+ClientConfigMapName(w.cluster.Name)]
	if !ok {
		t.Fatalf("no client ConfigMap applied:\n%s", w.describe())
	}
	var cm corev1.ConfigMap
	w.decode(raw, &cm)
	return cm.Data, w.cluster.Status.Client
}

// TestClientDetailsFollowMembersAndTLS: the client ConfigMap and status.client name every
// voter's client URL in the scheme every voter serves, with the CA bundle and the client
// certificate's Secret under https; they follow a scale-out, TLS turned on, and a scale-in.
func TestClientDetailsFollowMembersAndTLS(t *testing.T) {
	w, _ := created(t, 3, true)
	check := func(when, scheme string, members int) {
		t.Helper()
		data, st := w.clientDetails(t)
		eps := strings.Split(data[ClientKeyEndpoints], ",")
		if len(eps) != members || data[ClientKeyScheme] != scheme || st == nil || st.Scheme != scheme || len(st.Endpoints) != members {
			t.Fatalf("%s: ConfigMap %v, status %+v; want %d %s endpoints", when, data, st, members, scheme)
		}
		for _, ep := range append(eps, data[ClientKeyService]) {
			if !strings.HasPrefix(ep, scheme+"://") || !strings.HasSuffix(ep, ":2379") {
				t.Fatalf("%s: endpoint %q is not a %s client URL", when, ep, scheme)
			}
		}
		ca, secret := data[ClientKeyCA], data[ClientKeyClientSecret]
		if scheme == "https" && (ca != simCABundle("ca-1") || secret != simClientSecret || st.ClientSecret != simClientSecret) ||
			scheme == "http" && (ca != "" || secret != "" || st.ClientSecret != "") {
			t.Fatalf("%s: ca.crt %q, client secret %q (status %q)", when, ca, secret, st.ClientSecret)
		}
	}
	check("created", "http", 3)
	w.resize(5)
	check("scaled out", "http", 5)
	w.edit(func(w *simWorld) { w.setTLS("client") })
	check("client TLS on", "https", 5)
	w.resize(3)
	check("scaled in", "https", 3)
}
