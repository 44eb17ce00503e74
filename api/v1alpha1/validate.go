package v1alpha1

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/version"
)

// Size bounds. Nine voters is etcd's practical limit: every write waits for a majority,
// and more members only add latency.
const (
	MinSize int32 = 1
	MaxSize int32 = 9
)

// MaxNameLength bounds metadata.name: the StatefulSet adds a controller-revision-hash label
// "<name>-<10 chars>" to each pod, and label values stop at 63 characters.
const MaxNameLength = 52

// InvalidSpecError lists every problem Validate found, each saying what is wrong and what is
// allowed.
type InvalidSpecError struct {
	Problems []string
}

func (e *InvalidSpecError) Error() string {
	return "invalid EtcdCluster: " + strings.Join(e.Problems, "; ")
}

// Validate checks a defaulted cluster (see Defaulted) and returns nil or an *InvalidSpecError
// listing every problem. The version is checked against c.Status.CurrentVersion with
// CheckUpgrade, so a cluster's own history bounds what its spec may ask for.
//
// TLS combinations: peer TLS and client-port TLS are independent (TLS on one port and not the
// other is a common setup, no worse than plain HTTP on that port). serverSecret and
// clientSecret go together: with a serverSecret the operator turns on client certificate
// authentication, so without a clientSecret it could never observe the cluster and every
// sync would hold; a clientSecret alone would never be presented, while its author believes
// the client port authenticates clients when it serves plain HTTP to anyone.
func Validate(c EtcdCluster) error {
	var p []string
	add := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	s := c.Spec

	if c.Name != "" {
		if errs := validation.IsDNS1035Label(c.Name); len(errs) > 0 {
			add("metadata.name %q is not a DNS-1035 label (%s); it names Services and pods", c.Name, strings.Join(errs, ", "))
		} else if len(c.Name) > MaxNameLength {
			add("metadata.name %q is %d characters; at most %d are allowed so pod labels fit", c.Name, len(c.Name), MaxNameLength)
		}
	}

	switch {
	case s.Size == nil:
		add("spec.size is unset; validate a defaulted cluster")
	case *s.Size < MinSize || *s.Size > MaxSize:
		add("spec.size %d is out of range; allowed: %d to %d", *s.Size, MinSize, MaxSize)
	}

	if err := CheckUpgrade(c.Status.CurrentVersion, s.Version); err != nil {
		add("spec.%s", err)
	} else if v, err := version.ParseSemantic(s.Version); err == nil && v.LessThan(version.MustParseSemantic(MinVersion)) {
		add("spec.version %s is older than %s; allowed: %s or later (the pods' probes use etcd's /livez and /readyz, which it serves from %s)", s.Version, MinVersion, MinVersion, MinVersion)
	}

	if s.ImageRegistry == "" {
		add("spec.imageRegistry is empty; validate a defaulted cluster")
	} else if !isRepository(s.ImageRegistry) {
		add("spec.imageRegistry %q is not an image repository; allowed: a repository without tag or digest, e.g. %s", s.ImageRegistry, DefaultImageRegistry)
	}

	for _, msg := range checkEtcdOptions(s.EtcdOptions) {
		add("%s", msg)
	}
	if s.StorageSpec != nil {
		for _, msg := range checkStorage(*s.StorageSpec) {
			add("%s", msg)
		}
	}
	if s.TLS != nil {
		for _, msg := range checkTLS(*s.TLS) {
			add("%s", msg)
		}
	}
	if s.Auth != nil {
		for _, msg := range checkAuth(c.Name, *s.Auth) {
			add("%s", msg)
		}
	}
	if s.PodTemplate != nil {
		for _, msg := range checkPodTemplate(*s.PodTemplate) {
			add("%s", msg)
		}
	}
	if t := s.Tool; t != nil {
		for _, msg := range checkTool(*t) {
			add("%s", msg)
		}
	}
	if r := s.Recovery; r != nil && r.After != nil && r.After.Duration < MinRecoveryAfter {
		add("spec.recovery.after %s is too short; allowed: %s or more, so that a restart or a brief partition is not taken for a lost quorum", r.After.Duration, MinRecoveryAfter)
	}
	for _, msg := range checkBackup(s) {
		add("%s", msg)
	}
	if d := maintenanceDefragment(s); d != nil && d.MinFree != nil && d.MinFree.Sign() < 0 {
		add("spec.maintenance.defragment.minFree %s is negative; allowed: 0 or more bytes", d.MinFree.String())
	}

	if len(p) == 0 {
		return nil
	}
	return &InvalidSpecError{Problems: p}
}

// MinVersion is the oldest etcd release the operator runs.
const MinVersion = "v3.5.11"

// MinRecoveryAfter bounds spec.recovery.after from below.
const MinRecoveryAfter = time.Minute

func maintenanceDefragment(s EtcdClusterSpec) *DefragmentSpec {
	if s.Maintenance == nil {
		return nil
	}
	return s.Maintenance.Defragment
}

// isRepository rejects a tag or digest: the image is ImageRegistry:Version, so a tag here
// would make an invalid reference. A colon is fine before the last "/" (a registry port).
func isRepository(r string) bool {
	last := r[strings.LastIndex(r, "/")+1:]
	return !strings.ContainsAny(r, " \t\n@") && !strings.Contains(last, ":")
}

// ownedFlags are etcd flags the operator sets itself; a user value would break membership,
// addressing, TLS or data safety. Exact names.
var ownedFlags = []string{
	"name", "data-dir", "wal-dir",
	"initial-cluster", "initial-cluster-state", "initial-cluster-token", "initial-advertise-peer-urls",
	"cert-file", "key-file", "trusted-ca-file", "client-cert-auth", "auto-tls",
	"force-new-cluster", "config-file", "listen-metrics-urls",
}

// ownedFlagPrefixes cover flag families the operator owns: all listen and advertise URLs,
// all peer TLS settings, and discovery (which would replace the join state).
var ownedFlagPrefixes = []string{"listen-", "advertise-", "peer-", "discovery"}

// isOwnedFlag reports whether the operator sets flag itself.
func isOwnedFlag(flag string) bool {
	if slices.Contains(ownedFlags, flag) {
		return true
	}
	for _, prefix := range ownedFlagPrefixes {
		if strings.HasPrefix(flag, prefix) {
			return true
		}
	}
	return false
}

// checkEtcdOptions requires each option to be one "--flag" or "--flag=value", names a flag the
// operator owns, and rejects a flag given twice (etcd would take the last silently).
func checkEtcdOptions(opts []string) []string {
	var p []string
	seen := map[string]bool{}
	for i, opt := range opts {
		name, _, _ := strings.Cut(strings.TrimPrefix(opt, "--"), "=")
		switch {
		case !strings.HasPrefix(opt, "--") || !isFlagName(name):
			p = append(p, fmt.Sprintf("spec.etcdOptions[%d] %q is not a flag; allowed: \"--flag\" or \"--flag=value\", one per entry", i, opt))
		case isOwnedFlag(name):
			p = append(p, fmt.Sprintf("spec.etcdOptions[%d] sets --%s, which the operator owns; remove it (the operator sets names, URLs, data dir, initial cluster and TLS files)", i, name))
		case seen[name]:
			p = append(p, fmt.Sprintf("spec.etcdOptions[%d] sets --%s a second time; allowed: each flag once", i, name))
		}
		seen[name] = true
	}
	return p
}

// isFlagName accepts etcd's flag names: lower-case words joined by dashes or dots.
func isFlagName(s string) bool {
	if s == "" || s[0] == '-' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_') {
			return false
		}
	}
	return true
}

var allowedAccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadWriteOncePod, corev1.ReadWriteMany}

func checkStorage(st StorageSpec) []string {
	var p []string
	if !slices.Contains(allowedAccessModes, st.AccessModes) {
		p = append(p, fmt.Sprintf("spec.storageSpec.accessModes %q is not allowed; allowed: ReadWriteOnce, ReadWriteOncePod, ReadWriteMany (etcd writes to its volume)", st.AccessModes))
	}
	if st.VolumeSizeRequest.Sign() <= 0 {
		p = append(p, fmt.Sprintf("spec.storageSpec.volumeSizeRequest %q must be greater than zero, e.g. 8Gi", st.VolumeSizeRequest.String()))
	}
	if st.VolumeSizeLimit != nil && st.VolumeSizeLimit.Cmp(st.VolumeSizeRequest) < 0 {
		p = append(p, fmt.Sprintf("spec.storageSpec.volumeSizeLimit %s is below volumeSizeRequest %s; allowed: a limit at least the request", st.VolumeSizeLimit.String(), st.VolumeSizeRequest.String()))
	}
	if st.StorageClassName != "" {
		if errs := validation.IsDNS1123Subdomain(st.StorageClassName); len(errs) > 0 {
			p = append(p, fmt.Sprintf("spec.storageSpec.storageClassName %q is not a valid name (%s)", st.StorageClassName, strings.Join(errs, ", ")))
		}
	}
	if st.WhenDeleted != PVCRetain && st.WhenDeleted != PVCDelete {
		p = append(p, fmt.Sprintf("spec.storageSpec.whenDeleted %q is not allowed; allowed: Retain, Delete", st.WhenDeleted))
	}
	return p
}

func checkTLS(t TLSSpec) []string {
	var p []string
	for _, f := range []struct{ field, name string }{
		{"serverSecret", t.ServerSecret}, {"peerSecret", t.PeerSecret}, {"clientSecret", t.ClientSecret},
	} {
		if f.name != "" {
			p = append(p, checkSecretName("spec.tls."+f.field, f.name)...)
		}
	}
	if t.ClientSecret != "" && t.ServerSecret == "" {
		p = append(p, "spec.tls.clientSecret is set without spec.tls.serverSecret: etcd would serve clients plain HTTP without authenticating them; set serverSecret too, or remove clientSecret")
	}
	if t.ServerSecret != "" && t.ClientSecret == "" {
		p = append(p, "spec.tls.serverSecret is set without spec.tls.clientSecret: etcd requires client certificates on its client port, and the operator needs one to observe the cluster; set clientSecret too, or remove serverSecret")
	}
	return p
}

// checkSecretName is the problem with the Secret name set in field, if any.
func checkSecretName(field, name string) []string {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return []string{fmt.Sprintf("%s %q is not a valid Secret name (%s)", field, name, strings.Join(errs, ", "))}
	}
	return nil
}

func checkPodTemplate(t PodTemplate) []string {
	var p []string
	if t.Metadata != nil {
		for _, k := range sortedKeys(t.Metadata.Labels) {
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				p = append(p, fmt.Sprintf("spec.podTemplate.metadata.labels key %q is not a valid label key (%s)", k, strings.Join(errs, ", ")))
			}
			if errs := validation.IsValidLabelValue(t.Metadata.Labels[k]); len(errs) > 0 {
				p = append(p, fmt.Sprintf("spec.podTemplate.metadata.labels[%q] value %q is not a valid label value (%s)", k, t.Metadata.Labels[k], strings.Join(errs, ", ")))
			}
		}
		for _, k := range sortedKeys(t.Metadata.Annotations) {
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				p = append(p, fmt.Sprintf("spec.podTemplate.metadata.annotations key %q is not a valid annotation key (%s)", k, strings.Join(errs, ", ")))
			}
		}
	}
	if t.Spec != nil && t.Spec.PriorityClassName != "" {
		if errs := validation.IsDNS1123Subdomain(t.Spec.PriorityClassName); len(errs) > 0 {
			p = append(p, fmt.Sprintf("spec.podTemplate.spec.priorityClassName %q is not a valid name (%s)", t.Spec.PriorityClassName, strings.Join(errs, ", ")))
		}
	}
	if t.Spec != nil {
		if r := t.Spec.Resources; r != nil {
			p = append(p, checkResources("spec.podTemplate.spec.resources", *r, false)...)
		}
		p = append(p, checkPullSecrets("spec.podTemplate.spec.imagePullSecrets", t.Spec.ImagePullSecrets)...)
	}
	return p
}

func checkTool(t ToolSpec) []string {
	var p []string
	if r := t.Resources; r != nil {
		p = append(p, checkResources("spec.tool.resources", *r, true)...)
	}
	return append(p, checkPullSecrets("spec.tool.imagePullSecrets", t.ImagePullSecrets)...)
}

func checkPullSecrets(field string, refs []SecretReference) []string {
	var p []string
	seen := map[string]bool{}
	for i, r := range refs {
		f := fmt.Sprintf("%s[%d].name", field, i)
		switch {
		case r.Name == "":
			p = append(p, f+" is empty; allowed: the name of a Secret in the cluster's namespace")
		case seen[r.Name]:
			p = append(p, fmt.Sprintf("%s names %q a second time; allowed: each Secret once", f, r.Name))
		default:
			p = append(p, checkSecretName(f, r.Name)...)
		}
		seen[r.Name] = true
	}
	return p
}

// toolResourceNames are what the operator's own containers may ask for: they use no device.
var toolResourceNames = []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage}

// checkResources refuses what the API server would refuse in a container's resources, so
// that the spec says why rather than a pod, a Job or a StatefulSet the API server does not
// take: a negative quantity, a request above its limit, an invalid resource name, a claim
// (dynamic resources are not the operator's to allocate). tool limits the names to cpu,
// memory and ephemeral-storage, and a memory limit of at least MinToolMemory.
func checkResources(field string, r corev1.ResourceRequirements, tool bool) []string {
	var p []string
	if len(r.Claims) > 0 {
		p = append(p, field+".claims is not allowed: the operator's pods use no dynamic resources")
	}
	for _, part := range []struct {
		name string
		list corev1.ResourceList
	}{{"requests", r.Requests}, {"limits", r.Limits}} {
		for _, name := range slices.Sorted(maps.Keys(part.list)) {
			q := part.list[name]
			f := fmt.Sprintf("%s.%s[%s]", field, part.name, name)
			switch {
			case tool && !slices.Contains(toolResourceNames, name):
				p = append(p, fmt.Sprintf("%s: the operator's containers use no %s; allowed: cpu, memory, ephemeral-storage", f, name))
			case !tool && !isResourceName(name):
				p = append(p, fmt.Sprintf("%s is not a resource name; allowed: cpu, memory, ephemeral-storage, hugepages-<size> or a domain-qualified extended resource", f))
			case q.Sign() < 0:
				p = append(p, fmt.Sprintf("%s %s is negative", f, q.String()))
			case tool && part.name == "limits" && name == corev1.ResourceMemory && q.Cmp(resource.MustParse(MinToolMemory)) < 0:
				p = append(p, fmt.Sprintf("%s %s is below %s: etcdops-member needs more to start (docs/create.md, \"Resources and pull secrets\")", f, q.String(), MinToolMemory))
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(r.Requests)) {
		req := r.Requests[name]
		if limit, ok := r.Limits[name]; ok && req.Cmp(limit) > 0 {
			p = append(p, fmt.Sprintf("%s.requests[%s] %s is above its limit %s; allowed: a request at most the limit", field, name, req.String(), limit.String()))
		}
	}
	return p
}

// isResourceName accepts a container's resource names as the API server does: the native
// ones, hugepages of a size, and extended resources named with a domain.
func isResourceName(name corev1.ResourceName) bool {
	n := string(name)
	switch {
	case name == corev1.ResourceCPU || name == corev1.ResourceMemory || name == corev1.ResourceEphemeralStorage:
		return true
	case strings.HasPrefix(n, corev1.ResourceHugePagesPrefix):
		_, err := resource.ParseQuantity(strings.TrimPrefix(n, corev1.ResourceHugePagesPrefix))
		return err == nil
	}
	domain, _, ok := strings.Cut(n, "/")
	return ok && len(validation.IsQualifiedName(n)) == 0 && len(validation.IsDNS1123Subdomain(domain)) == 0 && !strings.HasSuffix(domain, "kubernetes.io")
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// CheckUpgrade says whether a cluster running from may be moved to to. Allowed: the same
// version, a patch release forward, or one minor release forward (any patch) from a patch at
// least the one etcd's upgrade guide requires for that move (MinorUpgradeMinimums). Rejected:
// a downgrade of any size, skipping a minor release, a major change, and anything that is not
// a semantic version. An empty from (nothing running yet) accepts any valid to.
//
// etcd supports only these moves: its storage and raft formats are checked one minor release
// apart, and a downgrade needs etcd's own downgrade procedure, which the operator does not run.
// from should be the lowest version anything says the cluster runs: the planner takes it over
// status.currentVersion, the members that answer and the etcd image of every pod, so that a
// member that does not answer still counts.
func CheckUpgrade(from, to string) error {
	t, err := version.ParseSemantic(to)
	if err != nil {
		return fmt.Errorf("version %q is not a semantic version; allowed: an etcd release such as %s", to, DefaultVersion)
	}
	if from == "" {
		return nil
	}
	f, err := version.ParseSemantic(from)
	if err != nil {
		return fmt.Errorf("version: the running version %q is not a semantic version, so no upgrade path from it can be checked", from)
	}
	fs, ts := "v"+f.String(), "v"+t.String()
	switch {
	case t.EqualTo(f):
		return nil
	case t.LessThan(f):
		return fmt.Errorf("version %s is a downgrade from %s; downgrades are not supported", ts, fs)
	case t.Major() != f.Major():
		return fmt.Errorf("version %s changes the major version from %s; allowed: %s's patch releases or v%d.%d.x", ts, fs, fs, f.Major(), f.Minor()+1)
	case t.Minor() > f.Minor()+1:
		return fmt.Errorf("version %s skips minor releases from %s; allowed: one minor release at a time, next v%d.%d.x", ts, fs, f.Major(), f.Minor()+1)
	case t.Minor() == f.Minor()+1:
		if least, ok := MinorUpgradeMinimums[fmt.Sprintf("%d.%d", t.Major(), t.Minor())]; ok && f.LessThan(version.MustParseSemantic(least)) {
			return fmt.Errorf("version %s needs every member on v%s or later first (etcd's v%d.%d to v%d.%d upgrade guide), and a member runs %s; allowed: upgrade to v%s first",
				ts, least, f.Major(), f.Minor(), t.Major(), t.Minor(), fs, least)
		}
	}
	return nil
}

// MinorUpgradeMinimums is, per target minor release, the lowest release of the minor before
// it from which etcd's upgrade guide allows the move: for v3.6, "make sure that all of your 3.5
// members are updated to 3.5.26 or later" (https://etcd.io/docs/latest/upgrades/upgrade_3_6/;
// the v3.5 patches up to 3.5.26 fix membership data that a v3.6 member refuses); for v3.7, "make
// sure that all of your 3.6 members are updated to 3.6.11 or later. Earlier 3.6 patch releases
// may not be compatible with a rolling upgrade to 3.7"
// (https://etcd.io/docs/v3.7/upgrades/upgrade_3_7/).
var MinorUpgradeMinimums = map[string]string{
	"3.6": "3.5.26",
	"3.7": "3.6.11",
}
