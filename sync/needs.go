package sync

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/netip"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
)

// Needs is what the hook observes for a sync beyond Metacontroller's request, as the planner
// reads it: where and how to ask etcd, where to read the continuous backup's progress, and
// what of the TLS Secrets the planner may see. It is the one door from the hook into the
// planner before Plan: the hook holds no rule of the planner's.
type Needs struct {
	// Endpoints are the members' client endpoints, each asked over the scheme its pod serves
	// (memberEndpoints).
	Endpoints []etcdstate.Endpoint
	// ClientSecret names the Secret holding the client certificate etcd is asked with: spec's,
	// or the one status keeps while a member still serves TLS after it left the spec; "" when
	// none.
	ClientSecret string
	// TLS: some endpoint is asked over TLS, so etcd cannot be asked without that certificate.
	TLS bool
	// ProgressURL is where the continuous backup's progress is read; "" when the cluster has
	// none or its Deployment is not observed yet (there is nothing to ask).
	ProgressURL string
	// CAs and CABundles are what Observed carries of the Secrets' CA bundles.
	CAs, CABundles map[string]string
	// Certificates checks the Secrets' certificates, for Observed.CertProblems.
	Certificates CertificateCheck
	// Credentials digests the operator's credential Secrets' passwords, for
	// Observed.Credentials.
	Credentials map[string]string
	// Login is the observer's etcd login while the operator manages auth; nil before its
	// Secret exists (auth is off then).
	Login *etcdstate.Login
}

// Need is what the hook must observe for cluster c, from the children, pods and Secrets
// Metacontroller sent.
func Need(cfg Config, c *v1alpha1.EtcdCluster, children Children, pods []corev1.Pod, secrets []corev1.Secret) Needs {
	eps := memberEndpoints(cfg, c, pods)
	_, _, client := secretsInUse(c)
	return Needs{
		Endpoints:    eps,
		ClientSecret: client,
		TLS:          slices.ContainsFunc(eps, func(e etcdstate.Endpoint) bool { return e.TLS }),
		ProgressURL:  progressURL(cfg, c, children),
		CAs:          caDigests(c, secrets),
		CABundles:    caBundles(c, secrets),
		Certificates: newCertificateCheck(cfg, c, secrets),
		Credentials:  credentialDigests(c, secrets),
		Login:        observerLogin(c, secrets),
	}
}

// credentialDigests digests the password of each of the operator's credential Secrets that
// was sent (auth.go); the planner sees only these digests, never a password.
func credentialDigests(c *v1alpha1.EtcdCluster, secrets []corev1.Secret) map[string]string {
	out := map[string]string{}
	for _, name := range credentialSecrets(c) {
		if pw := credential(c, secrets, name); pw != nil {
			sum := sha256.Sum256(pw)
			out[name] = hex.EncodeToString(sum[:])
		}
	}
	return out
}

// observerLogin is the hook's own etcd login, from its credential Secret.
func observerLogin(c *v1alpha1.EtcdCluster, secrets []corev1.Secret) *etcdstate.Login {
	if !authManaged(c) {
		return nil
	}
	pw := credential(c, secrets, ObserverSecretName(c.Name))
	if pw == nil {
		return nil
	}
	return &etcdstate.Login{User: authObserverUser, Password: string(pw)}
}

// credential is the password in the cluster's Secret name; nil when it was not sent or holds
// none.
func credential(c *v1alpha1.EtcdCluster, secrets []corev1.Secret, name string) []byte {
	for _, s := range secrets {
		if s.Name == name && (s.Namespace == c.Namespace || s.Namespace == "") && len(s.Data[SecretKeyPassword]) > 0 {
			return s.Data[SecretKeyPassword]
		}
	}
	return nil
}

// caDigests digests the CA bundle of each of the cluster's Secrets (those in its namespace);
// a Secret without one maps to "". The planner sees only these digests, never a key.
func caDigests(c *v1alpha1.EtcdCluster, secrets []corev1.Secret) map[string]string {
	out := map[string]string{}
	for _, s := range secrets {
		if s.Namespace != c.Namespace && s.Namespace != "" {
			continue
		}
		out[s.Name] = ""
		if ca := s.Data[secretCAKey]; len(ca) > 0 {
			sum := sha256.Sum256(ca)
			out[s.Name] = hex.EncodeToString(sum[:])
		}
	}
	return out
}

// memberEndpoints are the client endpoints of the cluster's own pods, sorted by ordinal: the pod IP
// when the pod has one (no DNS lookup on the hook's path), the member's stable DNS name
// otherwise; the DNS name is always the TLS server name. Each is asked over the scheme its
// pod serves, read from the pod's own etcd flags; a pod that serves both is asked over the one
// the spec asks for, so a member is seen answering over it before the other is dropped.
//
// Only the cluster's own pods are dialled: in the parent's namespace, labelled with its name,
// named <cluster>-<ordinal> below the largest size, with an IP a pod can have. A request that
// names other pods or addresses makes the hook dial nothing of them.
func memberEndpoints(cfg Config, c *v1alpha1.EtcdCluster, pods []corev1.Pod) []etcdstate.Endpoint {
	type ep struct {
		ordinal int
		etcdstate.Endpoint
	}
	eps := make([]ep, 0, len(pods))
	for _, p := range pods {
		ord, ok := ownPod(c, &p)
		if !ok || p.Labels[LabelCluster] != c.Name || p.Namespace != c.Namespace || ord >= maxOrdinal {
			continue
		}
		host := MemberHost(c, p.Name, cfg.ClusterDomain)
		addr := host
		if p.Status.PodIP != "" {
			ip, err := netip.ParseAddr(p.Status.PodIP)
			if err != nil || !podAddress(ip) {
				continue
			}
			addr = ip.String()
		}
		eps = append(eps, ep{ord, etcdstate.Endpoint{
			Member:     p.Name,
			Address:    net.JoinHostPort(addr, strconv.Itoa(ClientPort)),
			ServerName: host,
			TLS:        asksTLS(c, &p),
		}})
	}
	slices.SortFunc(eps, func(a, b ep) int { return cmp.Compare(a.ordinal, b.ordinal) })
	out := make([]etcdstate.Endpoint, len(eps))
	for i, e := range eps {
		out[i] = e.Endpoint
	}
	return out
}

// maxOrdinal bounds the ordinals dialled: twice the largest size leaves room for gaps, and a
// request listing thousands of pods makes the hook dial no more than this.
const maxOrdinal = 2 * int(v1alpha1.MaxSize)

// podAddress: an address a pod can be given. Unspecified, multicast and link-local addresses
// (169.254.169.254 is the cloud's metadata service) never are.
func podAddress(ip netip.Addr) bool {
	return ip.IsValid() && !ip.IsUnspecified() && !ip.IsMulticast() && !ip.IsLinkLocalUnicast() && !ip.IsLinkLocalMulticast() && !ip.IsInterfaceLocalMulticast() && ip.Zone() == ""
}

// SecretNames are the Secrets the sync hook needs to see (customize asks Metacontroller for
// them): those spec.tls names and those status.tls keeps while a change still uses them.
func SecretNames(c *v1alpha1.EtcdCluster) []string {
	var names []string
	add := func(n string) {
		if n != "" && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	if t := c.Spec.TLS; t != nil {
		add(t.ServerSecret)
		add(t.PeerSecret)
		add(t.ClientSecret)
	}
	if t := c.Status.TLS; t != nil {
		add(t.ServerSecret)
		add(t.PeerSecret)
		add(t.ClientSecret)
	}
	for _, n := range credentialSecrets(c) {
		add(n)
	}
	slices.Sort(names)
	return names
}
