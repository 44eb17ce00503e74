package sync

import (
	"maps"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/joinstate"
)

// Pod annotations that make drift visible per pod: SpecHash covers the whole pod template,
// ConfigHash all of it but the etcd image, so a version change alone is an upgrade and not
// config drift.
const (
	AnnotationSpecHash   = "etcdops.dev/spec-hash"
	AnnotationConfigHash = "etcdops.dev/config-hash"
)

// Paths inside the etcd pod.
const (
	toolDir       = "/opt/etcdops"
	toolPath      = toolDir + "/etcdops-member"
	joinDir       = "/etc/etcdops/join"
	dataVolumeDir = "/var/lib/etcd"
	dataDir       = dataVolumeDir + "/data"
	etcdBinary    = "/usr/local/bin/etcd"
	tlsDir        = "/etc/etcdops/tls"
	// ClientTLSDir is where member Jobs find the client certificate.
	ClientTLSDir = tlsDir + "/client"
)

// Volume names in the pod template.
const (
	volumeData      = "data"
	volumeTools     = "tools"
	volumeJoin      = "join"
	volumeServerTLS = "server-tls"
	volumePeerTLS   = "peer-tls"
)

// podSpec is the rendered pod template and its two hashes.
type podSpec struct {
	template   *podTemplateSpec
	specHash   string
	configHash string
}

// renderPodSpec builds the pod template from the spec and the TLS stage s it is rolled to
// (see tls.go): nothing about membership goes in (that lives in the join ConfigMap), so
// membership changes never restart pods. The template is built once and completed between
// the hashes: configHash covers it without the etcd image, specHash with the image and
// configHash.
func renderPodSpec(cfg Config, c *v1alpha1.EtcdCluster, s serving) podSpec {
	t := podTemplate(cfg, c, s, "")
	configHash := shortHash(t)
	t.Spec.Containers[0].Image = etcdImage(c)
	t.annotate(AnnotationConfigHash, configHash)
	specHash := shortHash(t)
	t.annotate(AnnotationSpecHash, specHash)
	return podSpec{template: t, specHash: specHash, configHash: configHash}
}

// installContainer is the etcd pods' init container that copies the member tool in.
const installContainer = "install"

// keptTool renders the pod template with the member tool image the StatefulSet sts runs,
// when that is all that would change: a new operator image alone then rolls no etcd pod, and
// many clusters do not all roll at once after an operator upgrade. The tool is taken at the
// next roll for another reason, or when the cluster asks for it (AnnotationTakeMemberTool).
// The operator's tool must read what the tool pods run writes and the other way round: the
// join state and the launcher's flags stay compatible across one release (CONTRIBUTING.md).
func keptTool(cfg Config, c *v1alpha1.EtcdCluster, s serving, sts *appsv1.StatefulSet) podSpec {
	spec := renderPodSpec(cfg, c, s)
	running := toolImage(sts)
	if running == "" || running == cfg.ToolImage || c.Annotations[v1alpha1.AnnotationTakeMemberTool] == cfg.ToolImage {
		return spec
	}
	old := cfg
	old.ToolImage = running
	if kept := renderPodSpec(old, c, s); kept.specHash == sts.Spec.Template.Annotations[AnnotationSpecHash] {
		return kept
	}
	return spec
}

// toolImage is the member tool image sts's pod template installs; "" without one.
func toolImage(sts *appsv1.StatefulSet) string {
	if sts == nil {
		return ""
	}
	for _, c := range sts.Spec.Template.Spec.InitContainers {
		if c.Name == installContainer {
			return c.Image
		}
	}
	return ""
}

func etcdImage(c *v1alpha1.EtcdCluster) string {
	return c.Spec.ImageRegistry + ":" + c.Spec.Version
}

// annotate sets a pod annotation, giving the template its annotations when it had none.
func (t *podTemplateSpec) annotate(key, value string) {
	if t.Metadata.Annotations == nil {
		t.Metadata.Annotations = map[string]string{}
	}
	t.Metadata.Annotations[key] = value
}

// readinessProbe: etcd serves reads from its own data, no CORRUPT alarm stands, and the member
// is no learner, by the mounted join state and by etcd (etcdops-member ready; $POD_NAME).
// Quorum is not asked for (a seed becomes ready while the cluster forms), nor the absence of a
// NOSPACE alarm: reads still work then. A learner
// refuses what clients send through the client Service (writes, linearizable reads, watches,
// lease keep-alives: "rpc not supported for learner"), so it is not Ready, and the Service
// routes to voters only; the disruption budget counts Ready pods against the voters' quorum
// (podDisruptionBudget), so a learner costs it nothing, and the roll gates ask for a healthy
// voter anyway (notUp).
func readinessProbe() probe {
	metrics := "http://127.0.0.1:" + strconv.Itoa(MetricsPort)
	return probe{
		Exec: execAction{Command: []string{toolPath, "ready", "--readyz=" + metrics + readinessPath, "--metrics=" + metrics + "/metrics",
			"--join-state=" + joinDir + "/" + joinstate.ConfigMapKey}},
		PeriodSeconds: 5, TimeoutSeconds: 3, FailureThreshold: 3,
	}
}

// livenessProbe: etcd answers /livez (no alarm restarts it: a NOSPACE alarm must not become a
// crash loop) or reports a defragmentation in flight, and no quorum recovery waits for this
// member to restart (etcdops-member probe, docs/architecture-member.md). /livez is a read, which
// waits while a defragmentation holds the backend: minutes on a large database, far beyond
// the 80 s this probe's failures add up to. Restarting then would throw the work away, and the
// Job's retry would start it over into the next restart. etcd's metrics answer meanwhile and
// say so, which keeps the 80 s for an etcd that is hung rather than busy.
func livenessProbe() probe {
	metrics := "http://127.0.0.1:" + strconv.Itoa(MetricsPort)
	return probe{
		Exec: execAction{Command: []string{toolPath, "probe",
			"--join-state=" + joinDir + "/" + joinstate.ConfigMapKey,
			"--data-dir=" + dataDir,
			"--health=" + metrics + livenessPath,
			"--defrag-metrics=" + metrics + "/metrics"}},
		InitialDelaySeconds: 15, PeriodSeconds: 10, TimeoutSeconds: 5, FailureThreshold: 8,
	}
}

// podTemplate builds the etcd pods' template, etcd's container first.
func podTemplate(cfg Config, c *v1alpha1.EtcdCluster, s serving, image string) *podTemplateSpec {
	labels := map[string]string{}
	var annotations map[string]string
	var user *v1alpha1.PodSpec
	if pt := c.Spec.PodTemplate; pt != nil {
		if pt.Metadata != nil {
			maps.Copy(labels, pt.Metadata.Labels)
			if len(pt.Metadata.Annotations) > 0 {
				annotations = maps.Clone(pt.Metadata.Annotations)
			}
		}
		user = pt.Spec
	}
	// Operator-owned labels and annotations win over the user's.
	setCommonLabels(labels, c)
	t := &podTemplateSpec{Metadata: podMetadata{Labels: labels, Annotations: annotations}}
	if s.trust != "" {
		t.annotate(AnnotationTrust, s.trust)
	}

	install := container{
		Name:            installContainer,
		Image:           cfg.ToolImage,
		Command:         []string{"/etcdops-member", "install", "--to=" + toolPath},
		VolumeMounts:    []volumeMount{{Name: volumeTools, MountPath: toolDir}},
		SecurityContext: containerSecurityContext(),
	}
	etcd := container{
		Name:  "etcd",
		Image: image,
		Command: []string{toolPath, "launch",
			"--join-state=" + joinDir + "/" + joinstate.ConfigMapKey,
			"--name=$(POD_NAME)",
			"--data-dir=" + dataDir,
			"--etcd=" + etcdBinary,
			"--"},
		Args: etcdFlags(cfg, c, s),
		Env:  []envVar{{Name: "POD_NAME", ValueFrom: envVarSource{FieldRef: fieldRef{FieldPath: "metadata.name"}}}},
		Ports: []containerPort{
			{Name: "client", ContainerPort: ClientPort},
			{Name: "peer", ContainerPort: PeerPort},
			{Name: "metrics", ContainerPort: MetricsPort},
		},
		ReadinessProbe: readinessProbe(),
		LivenessProbe:  livenessProbe(),
		VolumeMounts:   podVolumeMounts(s),
		// The launcher writes only under /var/lib/etcd, and etcd only under its data dir
		// (its temporary files too: snapshots and defragmentation write beside the data), so
		// the image stays read-only and no /tmp is needed.
		SecurityContext: containerSecurityContext(),
	}
	if user != nil && user.Resources != nil {
		// The install container runs before etcd: its share is etcd's own (podTemplate's
		// doc comment says why).
		etcd.Resources = plain(user.Resources)
		install.Resources = etcd.Resources
	}

	// fsGroup makes a member volume writable by etcd's user; ownership is changed only when
	// the volume's root does not have it yet, not file by file on every start.
	security := podSecurityContext()
	security.FSGroup, security.FSGroupChangePolicy = runAsID, "OnRootMismatch"
	t.Spec = etcdPodSpec{
		InitContainers:  []container{install},
		Containers:      []container{etcd},
		Volumes:         podVolumes(c, s),
		SecurityContext: security,
		// etcd never talks to the Kubernetes API.
		AutomountServiceAccountToken: false,
		ImagePullSecrets:             pullSecrets(c, true),
	}
	withRestore(c, &t.Spec)
	if user != nil {
		if user.Affinity != nil {
			t.Spec.Affinity = plain(user.Affinity)
		}
		t.Spec.NodeSelector = user.NodeSelector
		if len(user.Tolerations) > 0 {
			t.Spec.Tolerations = plain(user.Tolerations)
		}
		t.Spec.PriorityClassName = user.PriorityClassName
	}
	return t
}

// etcd's probe endpoints, served on the metrics port from v3.5.11 (v1alpha1.MinVersion).
// Readiness leaves linearizable_read out (no quorum needed); its non_learner check, from
// v3.5.19 on, says what etcdops-member ready reads from the metrics on every release.
const (
	readinessPath = "/readyz?exclude=linearizable_read"
	livenessPath  = "/livez"
)

// etcdFlags are the static flags of every member for TLS stage s; the launcher adds name, data
// dir and the initial-cluster flags from the join state. $(POD_NAME) is expanded by the
// kubelet. While the client port serves both schemes, both client URLs are advertised.
func etcdFlags(cfg Config, c *v1alpha1.EtcdCluster, s serving) []string {
	self := "$(POD_NAME)"
	var listenClient, advertiseClient []string
	if s.client.servesPlain() {
		listenClient = append(listenClient, listenURL(false, ClientPort))
		advertiseClient = append(advertiseClient, clientURLOf(c, self, cfg.ClusterDomain, false))
	}
	if s.client.servesTLS() {
		listenClient = append(listenClient, listenURL(true, ClientPort))
		advertiseClient = append(advertiseClient, clientURLOf(c, self, cfg.ClusterDomain, true))
	}
	flags := []string{
		"--listen-peer-urls=" + listenURL(s.peer == peerTLS, PeerPort),
		"--listen-client-urls=" + strings.Join(listenClient, ","),
		"--initial-advertise-peer-urls=" + peerURLOf(c, self, cfg.ClusterDomain, s.peer == peerTLS),
		"--advertise-client-urls=" + strings.Join(advertiseClient, ","),
		"--listen-metrics-urls=" + listenURL(false, MetricsPort),
	}
	if s.client.servesTLS() {
		flags = append(flags, tlsFlags("", tlsDir+"/server")...)
	}
	if s.peer.canDialTLS() {
		flags = append(flags, tlsFlags("peer-", tlsDir+"/peer")...)
	}
	return append(flags, c.Spec.EtcdOptions...)
}

func listenURL(secure bool, port int) string {
	return scheme(secure) + "://0.0.0.0:" + strconv.Itoa(port)
}

func podVolumeMounts(s serving) []volumeMount {
	mounts := []volumeMount{
		{Name: volumeData, MountPath: dataVolumeDir},
		{Name: volumeTools, MountPath: toolDir},
		{Name: volumeJoin, MountPath: joinDir, ReadOnly: true},
	}
	if s.client.servesTLS() {
		mounts = append(mounts, volumeMount{Name: volumeServerTLS, MountPath: tlsDir + "/server", ReadOnly: true})
	}
	if s.peer.canDialTLS() {
		mounts = append(mounts, volumeMount{Name: volumePeerTLS, MountPath: tlsDir + "/peer", ReadOnly: true})
	}
	return mounts
}

func podVolumes(c *v1alpha1.EtcdCluster, s serving) []volume {
	vols := []volume{
		{Name: volumeTools, EmptyDir: &emptyDir{}},
		{Name: volumeJoin, ConfigMap: &configMapSource{Name: JoinConfigMapName(c.Name)}},
	}
	// Without a storageSpec the member's data lives as long as its pod.
	if c.Spec.StorageSpec == nil {
		vols = append(vols, volume{Name: volumeData, EmptyDir: &emptyDir{}})
	}
	if s.client.servesTLS() {
		vols = append(vols, volume{Name: volumeServerTLS, Secret: &secretSource{SecretName: s.serverSecret}})
	}
	if s.peer.canDialTLS() {
		vols = append(vols, volume{Name: volumePeerTLS, Secret: &secretSource{SecretName: s.peerSecret}})
	}
	return vols
}

// statefulSet renders the StatefulSet with the replicas and partition the planner chose, and
// its claims' retention (view.claimRetention).
// The claim template comes from storage (view.claimTemplate), not from the spec: it cannot
// change once the StatefulSet exists.
func statefulSet(c *v1alpha1.EtcdCluster, storage *v1alpha1.StorageSpec, lb childLabels, ps podSpec, replicas, partition int, retention claimRetention) Child {
	spec := statefulSetSpec{
		Replicas:    replicas,
		ServiceName: HeadlessServiceName(c.Name),
		Selector:    labelSelector{MatchLabels: lb.selector},
		// Members start together: the planner, not the StatefulSet, orders membership.
		PodManagementPolicy:                  "Parallel",
		UpdateStrategy:                       updateStrategy{Type: "RollingUpdate", RollingUpdate: rollingUpdate{Partition: partition}},
		PersistentVolumeClaimRetentionPolicy: retention,
		Template:                             ps.template,
	}
	if s := storage; s != nil {
		spec.VolumeClaimTemplates = []volumeClaimObject{volumeClaimTemplate(s)}
	}
	return child("apps/v1", "StatefulSet", metadata(c, StatefulSetName(c.Name), lb.common), spec)
}

// retainClaims keeps every claim, whatever happens to the StatefulSet or its replicas: a
// member's data is deleted only by a decision of the planner, never as a side effect of the
// StatefulSet being deleted (kubectl delete, to change an immutable field) or re-created.
var retainClaims = claimRetention{WhenDeleted: "Retain", WhenScaled: "Retain"}

// claimRetention is the StatefulSet's claim retention for replicas. The claims are retained,
// except while the StatefulSet shrinks past ordinals none of whose members etcd still lists
// (the planner's own scale-in, which removed them first): then a scaled-away claim goes with
// its pod, so it holds no stale data. A claim left behind all the same is safe: a member added
// again at its ordinal has a new incarnation, and the launcher wipes the old data first.
func (v *view) claimRetention(replicas int) claimRetention {
	beyond := max(v.replicas, replicas)
	for ord := range v.pods {
		beyond = max(beyond, ord+1)
	}
	if v.unknown != "" || v.sts == nil || beyond <= replicas {
		return retainClaims
	}
	for _, m := range v.members {
		if m.ordinal >= replicas {
			return retainClaims
		}
	}
	return claimRetention{WhenDeleted: "Retain", WhenScaled: "Delete"}
}

func volumeClaimTemplate(s *v1alpha1.StorageSpec) volumeClaimObject {
	mode := string(s.AccessModes)
	if mode == "" {
		mode = "ReadWriteOnce"
	}
	spec := claimSpec{AccessModes: []string{mode}, Resources: claimResources{Requests: storageQuantity{Storage: s.VolumeSizeRequest.String()}}, StorageClassName: s.StorageClassName,
		VolumeMode: "Filesystem"}
	if s.VolumeSizeLimit != nil {
		spec.Resources.Limits = &storageQuantity{Storage: s.VolumeSizeLimit.String()}
	}
	return volumeClaimObject{APIVersion: "v1", Kind: "PersistentVolumeClaim", Metadata: nameOnly{Name: volumeData}, Spec: spec,
		Status: claimStatus{Phase: "Pending"}}
}

// tlsFlags points etcd at a mounted kubernetes.io/tls Secret and requires client
// certificates; prefix is "" for the client port and "peer-" for the peer port.
func tlsFlags(prefix, dir string) []string {
	return []string{
		"--" + prefix + "cert-file=" + dir + "/tls.crt",
		"--" + prefix + "key-file=" + dir + "/tls.key",
		"--" + prefix + "trusted-ca-file=" + dir + "/ca.crt",
		"--" + prefix + "client-cert-auth=true",
	}
}
