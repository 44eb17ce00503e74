package sync

import (
	"encoding/json"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

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
	template   *corev1ac.PodTemplateSpecApplyConfiguration
	specHash   string
	configHash string
}

// renderPodSpec builds the pod template from the spec alone: nothing about membership goes in
// (that lives in the join ConfigMap), so membership changes never restart pods.
func renderPodSpec(cfg Config, c *v1alpha1.EtcdCluster) podSpec {
	image := etcdImage(c)
	configHash := shortHash(podTemplate(cfg, c, "", nil))
	annotations := map[string]string{AnnotationConfigHash: configHash}
	specHash := shortHash(podTemplate(cfg, c, image, annotations))
	annotations[AnnotationSpecHash] = specHash
	return podSpec{template: podTemplate(cfg, c, image, annotations), specHash: specHash, configHash: configHash}
}

func etcdImage(c *v1alpha1.EtcdCluster) string {
	return c.Spec.ImageRegistry + ":" + c.Spec.Version
}

func podTemplate(cfg Config, c *v1alpha1.EtcdCluster, image string, hashes map[string]string) *corev1ac.PodTemplateSpecApplyConfiguration {
	labels := map[string]string{}
	annotations := map[string]string{}
	var user *v1alpha1.PodSpec
	if pt := c.Spec.PodTemplate; pt != nil {
		if pt.Metadata != nil {
			for k, v := range pt.Metadata.Labels {
				labels[k] = v
			}
			for k, v := range pt.Metadata.Annotations {
				annotations[k] = v
			}
		}
		user = pt.Spec
	}
	// Operator-owned labels and annotations win over the user's.
	for k, v := range commonLabels(c) {
		labels[k] = v
	}
	for k, v := range hashes {
		annotations[k] = v
	}
	meta := corev1ac.PodTemplateSpec().WithLabels(labels)
	if len(annotations) > 0 {
		meta = meta.WithAnnotations(annotations)
	}

	install := corev1ac.Container().
		WithName("install").
		WithImage(cfg.ToolImage).
		WithCommand("/etcdops-member", "install", "--to="+toolPath).
		WithVolumeMounts(corev1ac.VolumeMount().WithName(volumeTools).WithMountPath(toolDir))

	etcd := corev1ac.Container().
		WithName("etcd").
		WithImage(image).
		WithCommand(toolPath, "launch",
			"--join-state="+joinDir+"/"+joinstate.ConfigMapKey,
			"--name=$(POD_NAME)",
			"--data-dir="+dataDir,
			"--etcd="+etcdBinary,
			"--").
		WithArgs(etcdFlags(cfg, c)...).
		WithEnv(corev1ac.EnvVar().WithName("POD_NAME").WithValueFrom(
			corev1ac.EnvVarSource().WithFieldRef(corev1ac.ObjectFieldSelector().WithFieldPath("metadata.name")))).
		WithPorts(
			corev1ac.ContainerPort().WithName("client").WithContainerPort(ClientPort),
			corev1ac.ContainerPort().WithName("peer").WithContainerPort(PeerPort),
			corev1ac.ContainerPort().WithName("metrics").WithContainerPort(MetricsPort)).
		// Serializable health answers from the member's own data: it needs no quorum, so a
		// seed or a joining learner becomes ready while the cluster is still forming.
		WithReadinessProbe(healthProbe().WithPeriodSeconds(5).WithFailureThreshold(3)).
		WithLivenessProbe(healthProbe().WithInitialDelaySeconds(15).WithPeriodSeconds(10).WithFailureThreshold(8)).
		WithVolumeMounts(podVolumeMounts(c)...)
	if user != nil && user.Resources != nil {
		etcd = etcd.WithResources(resources(*user.Resources))
	}

	spec := corev1ac.PodSpec().
		WithInitContainers(install).
		WithContainers(etcd).
		WithVolumes(podVolumes(c)...)
	if user != nil {
		if user.Affinity != nil {
			var a corev1ac.AffinityApplyConfiguration
			convert(user.Affinity, &a)
			spec = spec.WithAffinity(&a)
		}
		if len(user.NodeSelector) > 0 {
			spec = spec.WithNodeSelector(user.NodeSelector)
		}
		for i := range user.Tolerations {
			var t corev1ac.TolerationApplyConfiguration
			convert(&user.Tolerations[i], &t)
			spec = spec.WithTolerations(&t)
		}
		if user.PriorityClassName != "" {
			spec = spec.WithPriorityClassName(user.PriorityClassName)
		}
	}
	return meta.WithSpec(spec)
}

func healthProbe() *corev1ac.ProbeApplyConfiguration {
	return corev1ac.Probe().WithHTTPGet(corev1ac.HTTPGetAction().
		WithPath("/health?serializable=true").
		WithPort(intstr.FromInt32(MetricsPort)).
		WithScheme(corev1.URISchemeHTTP))
}

// etcdFlags are the static flags of every member; the launcher adds name, data dir and the
// initial-cluster flags from the join state. $(POD_NAME) is expanded by the kubelet.
func etcdFlags(cfg Config, c *v1alpha1.EtcdCluster) []string {
	self := "$(POD_NAME)"
	flags := []string{
		"--listen-peer-urls=" + listenURL(peerTLS(c), PeerPort),
		"--listen-client-urls=" + listenURL(serverTLS(c), ClientPort),
		"--initial-advertise-peer-urls=" + PeerURL(c, self, cfg.ClusterDomain),
		"--advertise-client-urls=" + ClientURL(c, self, cfg.ClusterDomain),
		fmt.Sprintf("--listen-metrics-urls=http://0.0.0.0:%d", MetricsPort),
	}
	if serverTLS(c) {
		dir := tlsDir + "/server"
		flags = append(flags,
			"--cert-file="+dir+"/tls.crt",
			"--key-file="+dir+"/tls.key",
			"--trusted-ca-file="+dir+"/ca.crt",
			"--client-cert-auth=true")
	}
	if peerTLS(c) {
		dir := tlsDir + "/peer"
		flags = append(flags,
			"--peer-cert-file="+dir+"/tls.crt",
			"--peer-key-file="+dir+"/tls.key",
			"--peer-trusted-ca-file="+dir+"/ca.crt",
			"--peer-client-cert-auth=true")
	}
	return append(flags, c.Spec.EtcdOptions...)
}

func serverTLS(c *v1alpha1.EtcdCluster) bool {
	return c.Spec.TLS != nil && c.Spec.TLS.ServerSecret != ""
}
func peerTLS(c *v1alpha1.EtcdCluster) bool { return c.Spec.TLS != nil && c.Spec.TLS.PeerSecret != "" }
func clientTLS(c *v1alpha1.EtcdCluster) bool {
	return c.Spec.TLS != nil && c.Spec.TLS.ClientSecret != ""
}

func listenURL(secure bool, port int) string {
	return fmt.Sprintf("%s://0.0.0.0:%d", scheme(secure), port)
}

func podVolumeMounts(c *v1alpha1.EtcdCluster) []*corev1ac.VolumeMountApplyConfiguration {
	mounts := []*corev1ac.VolumeMountApplyConfiguration{
		corev1ac.VolumeMount().WithName(volumeData).WithMountPath(dataVolumeDir),
		corev1ac.VolumeMount().WithName(volumeTools).WithMountPath(toolDir),
		corev1ac.VolumeMount().WithName(volumeJoin).WithMountPath(joinDir).WithReadOnly(true),
	}
	if serverTLS(c) {
		mounts = append(mounts, corev1ac.VolumeMount().WithName(volumeServerTLS).WithMountPath(tlsDir+"/server").WithReadOnly(true))
	}
	if peerTLS(c) {
		mounts = append(mounts, corev1ac.VolumeMount().WithName(volumePeerTLS).WithMountPath(tlsDir+"/peer").WithReadOnly(true))
	}
	return mounts
}

func podVolumes(c *v1alpha1.EtcdCluster) []*corev1ac.VolumeApplyConfiguration {
	vols := []*corev1ac.VolumeApplyConfiguration{
		corev1ac.Volume().WithName(volumeTools).WithEmptyDir(corev1ac.EmptyDirVolumeSource()),
		corev1ac.Volume().WithName(volumeJoin).WithConfigMap(corev1ac.ConfigMapVolumeSource().WithName(JoinConfigMapName(c.Name))),
	}
	// Without a storageSpec the member's data lives as long as its pod.
	if c.Spec.StorageSpec == nil {
		vols = append(vols, corev1ac.Volume().WithName(volumeData).WithEmptyDir(corev1ac.EmptyDirVolumeSource()))
	}
	if serverTLS(c) {
		vols = append(vols, corev1ac.Volume().WithName(volumeServerTLS).WithSecret(corev1ac.SecretVolumeSource().WithSecretName(c.Spec.TLS.ServerSecret)))
	}
	if peerTLS(c) {
		vols = append(vols, corev1ac.Volume().WithName(volumePeerTLS).WithSecret(corev1ac.SecretVolumeSource().WithSecretName(c.Spec.TLS.PeerSecret)))
	}
	return vols
}

func resources(r corev1.ResourceRequirements) *corev1ac.ResourceRequirementsApplyConfiguration {
	out := corev1ac.ResourceRequirements()
	if len(r.Requests) > 0 {
		out = out.WithRequests(r.Requests)
	}
	if len(r.Limits) > 0 {
		out = out.WithLimits(r.Limits)
	}
	return out
}

// convert copies a user-supplied API value into its apply configuration through JSON: both
// have the same wire shape, and the user's value carries only what the user wrote.
func convert(in, out any) {
	b, err := json.Marshal(in)
	if err == nil {
		err = json.Unmarshal(b, out)
	}
	if err != nil {
		panic(fmt.Sprintf("sync: converting %T: %v", in, err))
	}
}

// statefulSet renders the StatefulSet with the replicas and partition the planner chose.
func statefulSet(c *v1alpha1.EtcdCluster, ps podSpec, replicas, partition int32) Child {
	name := StatefulSetName(c.Name)
	whenDeleted := appsv1.RetainPersistentVolumeClaimRetentionPolicyType
	if c.Spec.StorageSpec != nil && c.Spec.StorageSpec.WhenDeleted == v1alpha1.PVCDelete {
		whenDeleted = appsv1.DeletePersistentVolumeClaimRetentionPolicyType
	}
	spec := appsv1ac.StatefulSetSpec().
		WithReplicas(replicas).
		WithServiceName(HeadlessServiceName(c.Name)).
		WithSelector(metav1ac.LabelSelector().WithMatchLabels(selectorLabels(c))).
		// Members start together: the planner, not the StatefulSet, orders membership.
		WithPodManagementPolicy(appsv1.ParallelPodManagement).
		WithUpdateStrategy(appsv1ac.StatefulSetUpdateStrategy().
			WithType(appsv1.RollingUpdateStatefulSetStrategyType).
			WithRollingUpdate(appsv1ac.RollingUpdateStatefulSetStrategy().WithPartition(partition))).
		// A scaled-away ordinal loses its claim, so it can never come back with stale data.
		WithPersistentVolumeClaimRetentionPolicy(appsv1ac.StatefulSetPersistentVolumeClaimRetentionPolicy().
			WithWhenScaled(appsv1.DeletePersistentVolumeClaimRetentionPolicyType).
			WithWhenDeleted(whenDeleted)).
		WithTemplate(ps.template)
	if s := c.Spec.StorageSpec; s != nil {
		spec = spec.WithVolumeClaimTemplates(volumeClaimTemplate(s))
	}
	sts := appsv1ac.StatefulSet(name, c.Namespace).WithLabels(commonLabels(c)).WithSpec(spec)
	return Child{APIVersion: "apps/v1", Kind: "StatefulSet", Name: name, Object: sts}
}

func volumeClaimTemplate(s *v1alpha1.StorageSpec) *corev1ac.PersistentVolumeClaimApplyConfiguration {
	mode := s.AccessModes
	if mode == "" {
		mode = corev1.ReadWriteOnce
	}
	res := corev1ac.VolumeResourceRequirements().
		WithRequests(corev1.ResourceList{corev1.ResourceStorage: s.VolumeSizeRequest})
	if s.VolumeSizeLimit != nil {
		res = res.WithLimits(corev1.ResourceList{corev1.ResourceStorage: *s.VolumeSizeLimit})
	}
	spec := corev1ac.PersistentVolumeClaimSpec().WithAccessModes(mode).WithResources(res)
	if s.StorageClassName != "" {
		spec = spec.WithStorageClassName(s.StorageClassName)
	}
	// Built bare: a claim template carries neither kind nor namespace.
	return (&corev1ac.PersistentVolumeClaimApplyConfiguration{}).WithName(volumeData).WithSpec(spec)
}
