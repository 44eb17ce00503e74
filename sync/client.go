package sync

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// Connection details for applications: status.client, and the same in a ConfigMap next to
// the cluster that a Deployment can mount or read as environment, with the CA bundle.

// ClientConfigMapName is the ConfigMap with the cluster's connection details.
func ClientConfigMapName(cluster string) string { return cluster + "-client" }

// Keys of the client ConfigMap.
const (
	// ClientKeyEndpoints holds the voters' client URLs, comma-separated (ETCDCTL_ENDPOINTS).
	ClientKeyEndpoints = "endpoints"
	// ClientKeyService holds the client Service's URL.
	ClientKeyService = "service"
	// ClientKeyScheme holds http or https.
	ClientKeyScheme = "scheme"
	// ClientKeyCA holds the CA bundle that signed the members' serving certificates (https).
	ClientKeyCA = "ca.crt"
	// ClientKeyClientSecret names the Secret with the client certificate members require.
	ClientKeyClientSecret = "client-secret"
	// ClientKeyUsers names each application's etcd user and its credential Secret
	// (spec.auth), as user=secret, comma-separated.
	ClientKeyUsers = "users"
)

// clientStatus is how applications reach the cluster now: every voter's client URL (the
// seed's before there is one) and the client Service's, in the scheme the member Jobs use (every voter serves it: jobTLS), and
// with https the client certificate's Secret, which members require.
func (v *view) clientStatus() *v1alpha1.ClientStatus {
	secure := v.jobTLS()
	cs := &v1alpha1.ClientStatus{Scheme: "http", ConfigMap: ClientConfigMapName(v.c.Name)}
	if secure {
		cs.Scheme, cs.ClientSecret = "https", v.tls.clientSecret
	}
	cs.Service = fmt.Sprintf("%s://%s.%s.svc.%s:%d", cs.Scheme, ClientServiceName(v.c.Name), v.c.Namespace, v.cfg.ClusterDomain, ClientPort)
	for _, m := range v.voters() {
		cs.Endpoints = append(cs.Endpoints, clientURLOf(v.c, m.name, v.cfg.ClusterDomain, secure))
	}
	if len(cs.Endpoints) == 0 {
		// No member yet (the bootstrap): the seed's, which is the first.
		cs.Endpoints = []string{clientURLOf(v.c, PodName(v.c.Name, 0), v.cfg.ClusterDomain, secure)}
	}
	cs.Users = clientUsers(v.c)
	return cs
}

// clientConfigMap renders cs, with the CA bundle of the Secret the members serve with when
// they serve https and it is known, and the etcd cluster ID once there is one.
func (v *view) clientConfigMap(cs *v1alpha1.ClientStatus) Child {
	data := map[string]string{
		ClientKeyEndpoints: strings.Join(cs.Endpoints, ","),
		ClientKeyService:   cs.Service,
		ClientKeyScheme:    cs.Scheme,
	}
	if cs.Scheme == "https" {
		if ca := v.obs.CABundles[v.tls.desired.serverSecret]; ca != "" {
			data[ClientKeyCA] = ca
		}
		if cs.ClientSecret != "" {
			data[ClientKeyClientSecret] = cs.ClientSecret
		}
	}
	if len(cs.Users) > 0 {
		var users []string
		for _, u := range cs.Users {
			users = append(users, u.Name+"="+u.Secret)
		}
		data[ClientKeyUsers] = strings.Join(users, ",")
	}
	meta := metadata(v.c, ClientConfigMapName(v.c.Name), v.labels.common)
	if id := v.knownClusterID(); id != "" {
		// An application that remembers it can tell a restore, a new cluster under the same
		// name, from the cluster it wrote to.
		meta.Annotations = map[string]string{AnnotationClusterID: id}
	}
	return Child{APIVersion: "v1", Kind: "ConfigMap", Name: meta.Name, Object: apiObject{APIVersion: "v1", Kind: "ConfigMap", Metadata: meta, Data: data}}
}

// caBundles are the CA bundles (ca.crt: certificates, public) of the Secrets Metacontroller
// sent, by name, for the client ConfigMap.
func caBundles(c *v1alpha1.EtcdCluster, secrets []corev1.Secret) map[string]string {
	out := map[string]string{}
	for _, s := range secrets {
		if s.Namespace != c.Namespace && s.Namespace != "" {
			continue
		}
		if ca := s.Data[secretCAKey]; len(ca) > 0 {
			out[s.Name] = string(ca)
		}
	}
	return out
}

// knownClusterID is etcd's cluster ID in hex: as it answers, else as on record; "" before it
// first answered.
func (v *view) knownClusterID() string {
	if v.obs.Etcd.Asked && v.obs.Etcd.ClusterID != 0 {
		return fmt.Sprintf("%x", v.obs.Etcd.ClusterID)
	}
	return v.clusterID
}
