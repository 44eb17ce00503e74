package v1alpha1

import (
	"errors"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestCheckUpgrade(t *testing.T) {
	tests := []struct {
		story    string
		from, to string
		want     string // "" means allowed
	}{
		{"a new cluster may start on any release", "", "v3.4.0", ""},
		{"a new cluster still needs a real version", "", "latest", `version "latest" is not a semantic version; allowed: an etcd release such as v3.6.16`},
		{"nothing changes", "v3.6.5", "v3.6.5", ""},
		{"etcd reports versions without the v; that is the same release", "3.6.5", "v3.6.5", ""},
		{"a patch forward is routine", "v3.6.5", "v3.6.16", ""},
		{"one minor forward is etcd's supported upgrade", "v3.5.26", "v3.6.0", ""},
		{"one minor forward to any patch of it", "v3.5.30", "v3.6.16", ""},
		{"etcd's guide wants 3.5 at 3.5.26 before 3.6", "v3.5.21", "v3.6.16", "version v3.6.16 needs every member on v3.5.26 or later first (etcd's v3.5 to v3.6 upgrade guide), and a member runs v3.5.21; allowed: upgrade to v3.5.26 first"},
		{"etcd's guide wants 3.6 at 3.6.11 before 3.7", "v3.6.8", "v3.7.3", "version v3.7.3 needs every member on v3.6.11 or later first (etcd's v3.6 to v3.7 upgrade guide), and a member runs v3.6.8; allowed: upgrade to v3.6.11 first"},
		{"from 3.6.11 to 3.7", "v3.6.11", "v3.7.0", ""},
		{"the minimum is per target minor: 3.4 to 3.5 has none", "v3.4.0", "v3.5.0", ""},
		{"a release candidate to its release is forward", "v3.6.0-rc.1", "v3.6.0", ""},
		{"a patch backward is still a downgrade", "v3.6.5", "v3.6.4", "version v3.6.4 is a downgrade from v3.6.5; downgrades are not supported"},
		{"a minor backward is a downgrade", "v3.6.5", "v3.4.0", "version v3.4.0 is a downgrade from v3.6.5; downgrades are not supported"},
		{"a release back to its candidate is a downgrade", "v3.6.0", "v3.6.0-rc.2", "version v3.6.0-rc.2 is a downgrade from v3.6.0; downgrades are not supported"},
		{"skipping a minor release is not supported by etcd", "v3.4.30", "v3.6.0", "version v3.6.0 skips minor releases from v3.4.30; allowed: one minor release at a time, next v3.5.x"},
		{"a major change is refused", "v3.6.5", "v4.0.0", "version v4.0.0 changes the major version from v3.6.5; allowed: v3.6.5's patch releases or v3.7.x"},
		{"a version with two parts is not semver", "v3.6.5", "v3.7", `version "v3.7" is not a semantic version; allowed: an etcd release such as v3.6.16`},
		{"leading zeros are not semver", "v3.6.5", "v3.06.5", `version "v3.06.5" is not a semantic version; allowed: an etcd release such as v3.6.16`},
		{"a garbled running version blocks every change", "banana", "v3.6.5", `version: the running version "banana" is not a semantic version, so no upgrade path from it can be checked`},
	}
	for _, tt := range tests {
		err := CheckUpgrade(tt.from, tt.to)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("%s: CheckUpgrade(%q, %q)\n got %q\nwant %q", tt.story, tt.from, tt.to, got, tt.want)
		}
	}
}

// valid is a defaulted cluster that passes validation; each case breaks one thing.
func valid() EtcdCluster {
	return Defaulted(EtcdCluster{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: "default"}})
}

func TestValidate(t *testing.T) {
	gi := resource.MustParse("8Gi")
	tests := []struct {
		story  string
		change func(c *EtcdCluster)
		want   []string // nil means valid
	}{
		{"the defaults are valid", func(*EtcdCluster) {}, nil},
		{"a full, sensible spec is valid", func(c *EtcdCluster) {
			c.Spec.Size = ptr(int32(5))
			c.Spec.EtcdOptions = []string{"--quota-backend-bytes=8589934592", "--auto-compaction-retention=1h", "--enable-pprof"}
			c.Spec.StorageSpec = &StorageSpec{VolumeSizeRequest: gi, StorageClassName: "fast-ssd", AccessModes: corev1.ReadWriteOnce, WhenDeleted: PVCDelete}
			c.Spec.TLS = &TLSSpec{ServerSecret: "demo-server", PeerSecret: "demo-peer", ClientSecret: "demo-client"}
			c.Spec.PodTemplate = &PodTemplate{Metadata: &PodMetadata{Labels: map[string]string{"team": "storage"}}, Spec: &PodSpec{PriorityClassName: "system-cluster-critical"}}
			c.Status.CurrentVersion = "3.5.26"
		}, nil},
		{"users each on their own prefix, one reading a shared key, are valid", func(c *EtcdCluster) {
			c.Spec.Auth = &AuthSpec{Enabled: true,
				Roles: []AuthRole{{Name: "orders", Permissions: []AuthPermission{{Type: PermissionReadWrite, Key: "/orders/", Prefix: true}, {Type: PermissionRead, Key: "/config"}}},
					{Name: "audit", Permissions: []AuthPermission{{Type: PermissionRead, Prefix: true}}}},
				Users: []AuthUser{{Name: "orders-api", Roles: []string{"orders"}}, {Name: "auditor", Roles: []string{"audit"}}}}
		}, nil},
		{"auth names are checked, the operator's are reserved, roles must be declared", func(c *EtcdCluster) {
			c.Spec.Auth = &AuthSpec{Enabled: true,
				Roles: []AuthRole{{Name: "root"}, {Name: "Orders"}, {Name: "a", Permissions: []AuthPermission{{Type: "All", Key: "/a/"}, {Type: PermissionRead}}}, {Name: "a"}},
				Users: []AuthUser{{Name: "etcdops-backup"}, {Name: "app", Roles: []string{"missing"}}, {Name: "app"}}}
		}, []string{
			`spec.auth.roles[0].name "root" is the operator's: root and names starting with etcdops are reserved`,
			`spec.auth.roles[1].name "Orders" is not a DNS-1123 label`,
			`spec.auth.roles[2].permissions[0].type "All" is not a permission; allowed: Read, Write, ReadWrite`,
			"spec.auth.roles[2].permissions[1] has no key: a permission on one key needs the key; for the whole key space set prefix: true with an empty key",
			`spec.auth.roles[3].name "a" is declared twice`,
			`spec.auth.users[0].name "etcdops-backup" is the operator's: root and names starting with etcdops are reserved`,
			`spec.auth.users[1] has role "missing", which spec.auth.roles does not declare`,
			`spec.auth.users[2].name "app" is declared twice`,
		}},
		{"an even size is allowed; status flags it instead", func(c *EtcdCluster) { c.Spec.Size = ptr(int32(4)) }, nil},
		{"peer TLS without server TLS is allowed: it is no worse than plain HTTP", func(c *EtcdCluster) { c.Spec.TLS = &TLSSpec{PeerSecret: "p"} }, nil},
		{"client-port TLS without peer TLS is allowed", func(c *EtcdCluster) { c.Spec.TLS = &TLSSpec{ServerSecret: "s", ClientSecret: "c"} }, nil},
		{"a registry with a port is a repository", func(c *EtcdCluster) { c.Spec.ImageRegistry = "registry.local:5000/etcd" }, nil},
		{"zero members is no cluster", func(c *EtcdCluster) { c.Spec.Size = ptr(int32(0)) },
			[]string{"spec.size 0 is out of range; allowed: 1 to 9"}},
		{"ten members is past etcd's practical limit", func(c *EtcdCluster) { c.Spec.Size = ptr(int32(10)) },
			[]string{"spec.size 10 is out of range; allowed: 1 to 9"}},
		{"an undefaulted spec is a caller bug, said plainly", func(c *EtcdCluster) { c.Spec.Size = nil },
			[]string{"spec.size is unset; validate a defaulted cluster"}},
		{"a downgrade against the running version is refused", func(c *EtcdCluster) {
			c.Spec.Version = "v3.4.0"
			c.Status.CurrentVersion = "3.6.5"
		}, []string{"spec.version v3.4.0 is a downgrade from v3.6.5; downgrades are not supported"}},
		{"a tag in the registry would make a broken image reference", func(c *EtcdCluster) { c.Spec.ImageRegistry = "quay.io/coreos/etcd:v3.5.0" },
			[]string{`spec.imageRegistry "quay.io/coreos/etcd:v3.5.0" is not an image repository; allowed: a repository without tag or digest, e.g. gcr.io/etcd-development/etcd`}},
		{"each operator-owned flag is named, and malformed entries are explained", func(c *EtcdCluster) {
			c.Spec.EtcdOptions = []string{"--data-dir=/tmp", "--listen-client-urls=http://0.0.0.0:2379", "--peer-cert-file=/x", "--initial-cluster-state=new", "--snapshot-count 10000", "-name=x", "--discovery-srv=example.com"}
		}, []string{
			`spec.etcdOptions[0] sets --data-dir, which the operator owns; remove it (the operator sets names, URLs, data dir, initial cluster and TLS files)`,
			`spec.etcdOptions[1] sets --listen-client-urls, which the operator owns; remove it (the operator sets names, URLs, data dir, initial cluster and TLS files)`,
			`spec.etcdOptions[2] sets --peer-cert-file, which the operator owns; remove it (the operator sets names, URLs, data dir, initial cluster and TLS files)`,
			`spec.etcdOptions[3] sets --initial-cluster-state, which the operator owns; remove it (the operator sets names, URLs, data dir, initial cluster and TLS files)`,
			`spec.etcdOptions[4] "--snapshot-count 10000" is not a flag; allowed: "--flag" or "--flag=value", one per entry`,
			`spec.etcdOptions[5] "-name=x" is not a flag; allowed: "--flag" or "--flag=value", one per entry`,
			`spec.etcdOptions[6] sets --discovery-srv, which the operator owns; remove it (the operator sets names, URLs, data dir, initial cluster and TLS files)`,
		}},
		{"force-new-cluster would fork the cluster and is never the user's to set", func(c *EtcdCluster) { c.Spec.EtcdOptions = []string{"--force-new-cluster"} },
			[]string{`spec.etcdOptions[0] sets --force-new-cluster, which the operator owns; remove it (the operator sets names, URLs, data dir, initial cluster and TLS files)`}},
		{"a flag given twice is ambiguous", func(c *EtcdCluster) {
			c.Spec.EtcdOptions = []string{"--quota-backend-bytes=1", "--quota-backend-bytes=2"}
		},
			[]string{`spec.etcdOptions[1] sets --quota-backend-bytes a second time; allowed: each flag once`}},
		{"storage must be writable, sized, and deleted only on request", func(c *EtcdCluster) {
			lim := resource.MustParse("1Gi")
			c.Spec.StorageSpec = &StorageSpec{AccessModes: corev1.ReadOnlyMany, VolumeSizeRequest: gi, VolumeSizeLimit: &lim, WhenDeleted: "Recycle", StorageClassName: "Fast_SSD"}
		}, []string{
			`spec.storageSpec.accessModes "ReadOnlyMany" is not allowed; allowed: ReadWriteOnce, ReadWriteOncePod, ReadWriteMany (etcd writes to its volume)`,
			`spec.storageSpec.volumeSizeLimit 1Gi is below volumeSizeRequest 8Gi; allowed: a limit at least the request`,
			`spec.storageSpec.storageClassName "Fast_SSD" is not a valid name (a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*'))`,
			`spec.storageSpec.whenDeleted "Recycle" is not allowed; allowed: Retain, Delete`,
		}},
		{"a zero-sized volume cannot hold etcd", func(c *EtcdCluster) {
			c.Spec.StorageSpec = &StorageSpec{AccessModes: corev1.ReadWriteOnce, WhenDeleted: PVCRetain}
		},
			[]string{`spec.storageSpec.volumeSizeRequest "0" must be greater than zero, e.g. 8Gi`}},
		{"a client certificate for a plain-HTTP port gives a false sense of security", func(c *EtcdCluster) { c.Spec.TLS = &TLSSpec{ClientSecret: "c"} },
			[]string{"spec.tls.clientSecret is set without spec.tls.serverSecret: etcd would serve clients plain HTTP without authenticating them; set serverSecret too, or remove clientSecret"}},
		{"server TLS without a client certificate would leave the operator unable to observe etcd", func(c *EtcdCluster) { c.Spec.TLS = &TLSSpec{ServerSecret: "s", PeerSecret: "p"} },
			[]string{"spec.tls.serverSecret is set without spec.tls.clientSecret: etcd requires client certificates on its client port, and the operator needs one to observe the cluster; set clientSecret too, or remove serverSecret"}},
		{"a Secret name must be a Kubernetes name", func(c *EtcdCluster) { c.Spec.TLS = &TLSSpec{PeerSecret: "Peer_Certs"} },
			[]string{`spec.tls.peerSecret "Peer_Certs" is not a valid Secret name (a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*'))`}},
		{"a name that cannot be a Service name is refused up front", func(c *EtcdCluster) { c.Name = "1etcd" },
			[]string{`metadata.name "1etcd" is not a DNS-1035 label (a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')); it names Services and pods`}},
		{"a long name would overflow the pods' revision label", func(c *EtcdCluster) { c.Name = "a23456789012345678901234567890123456789012345678901234" },
			[]string{`metadata.name "a23456789012345678901234567890123456789012345678901234" is 54 characters; at most 52 are allowed so pod labels fit`}},
		{"resources and pull secrets for every pod", func(c *EtcdCluster) {
			c.Spec.PodTemplate = &PodTemplate{Spec: &PodSpec{
				Resources:        &corev1.ResourceRequirements{Requests: quantities("cpu", "1", "memory", "2Gi", "hugepages-2Mi", "64Mi", "example.com/accelerator", "1"), Limits: quantities("memory", "4Gi", "hugepages-2Mi", "64Mi")},
				ImagePullSecrets: []SecretReference{{Name: "etcd-registry"}},
			}}
			c.Spec.Tool = &ToolSpec{
				Resources:        &corev1.ResourceRequirements{Requests: quantities("cpu", "10m", "memory", "32Mi", "ephemeral-storage", "1Gi"), Limits: quantities("cpu", "1", "memory", "256Mi")},
				ImagePullSecrets: []SecretReference{{Name: "tool-registry"}, {Name: "etcd-registry"}},
			}
		}, nil},
		{"quantities the API server would refuse in a pod are refused in the spec", func(c *EtcdCluster) {
			c.Spec.PodTemplate = &PodTemplate{Spec: &PodSpec{Resources: &corev1.ResourceRequirements{
				Requests: quantities("cpu", "2", "memory", "-1Gi", "gpu", "1"),
				Limits:   quantities("cpu", "1"),
				Claims:   []corev1.ResourceClaim{{Name: "gpu"}},
			}}}
			c.Spec.Tool = &ToolSpec{Resources: &corev1.ResourceRequirements{
				Requests: quantities("memory", "128Mi", "nvidia.com/gpu", "1", "cpu", "1m"),
				Limits:   quantities("memory", "16Mi"),
			}}
		}, []string{
			"spec.podTemplate.spec.resources.claims is not allowed: the operator's pods use no dynamic resources",
			"spec.podTemplate.spec.resources.requests[gpu] is not a resource name; allowed: cpu, memory, ephemeral-storage, hugepages-<size> or a domain-qualified extended resource",
			"spec.podTemplate.spec.resources.requests[memory] -1Gi is negative",
			"spec.podTemplate.spec.resources.requests[cpu] 2 is above its limit 1; allowed: a request at most the limit",
			"spec.tool.resources.requests[nvidia.com/gpu]: the operator's containers use no nvidia.com/gpu; allowed: cpu, memory, ephemeral-storage",
			`spec.tool.resources.limits[memory] 16Mi is below 64Mi: etcdops-member needs more to start (docs/create.md, "Resources and pull secrets")`,
			"spec.tool.resources.requests[memory] 128Mi is above its limit 16Mi; allowed: a request at most the limit",
		}},
		{"pull secrets are Secret names, each once", func(c *EtcdCluster) {
			c.Spec.PodTemplate = &PodTemplate{Spec: &PodSpec{ImagePullSecrets: []SecretReference{{Name: "Registry_Creds"}, {}}}}
			c.Spec.Tool = &ToolSpec{ImagePullSecrets: []SecretReference{{Name: "registry"}, {Name: "registry"}}}
		}, []string{
			`spec.podTemplate.spec.imagePullSecrets[0].name "Registry_Creds" is not a valid Secret name (a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*'))`,
			"spec.podTemplate.spec.imagePullSecrets[1].name is empty; allowed: the name of a Secret in the cluster's namespace",
			`spec.tool.imagePullSecrets[1].name names "registry" a second time; allowed: each Secret once`,
		}},
		{"every problem is listed, not just the first", func(c *EtcdCluster) {
			c.Spec.Size = ptr(int32(11))
			c.Spec.Version = "v3.x"
			c.Spec.EtcdOptions = []string{"--name=foo"}
		}, []string{
			"spec.size 11 is out of range; allowed: 1 to 9",
			`spec.version "v3.x" is not a semantic version; allowed: an etcd release such as v3.6.16`,
			"spec.etcdOptions[0] sets --name, which the operator owns; remove it (the operator sets names, URLs, data dir, initial cluster and TLS files)",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.story, func(t *testing.T) {
			c := valid()
			tt.change(&c)
			err := Validate(c)
			var got []string
			if err != nil {
				var ise *InvalidSpecError
				if !errors.As(err, &ise) {
					t.Fatalf("Validate returned %T, want *InvalidSpecError", err)
				}
				got = ise.Problems
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Validate problems:\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestInvalidSpecErrorMessage(t *testing.T) {
	// The status message carries every problem on one line.
	err := &InvalidSpecError{Problems: []string{"a is wrong", "b is wrong"}}
	if got, want := err.Error(), "invalid EtcdCluster: a is wrong; b is wrong"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

// quantities is a resource list from name, quantity pairs.
func quantities(kv ...string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return l
}
