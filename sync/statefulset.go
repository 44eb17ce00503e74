package sync

import (
	"fmt"
	"strings"

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
	template   object
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
	configHash := shortHash(t.object)
	t.etcd["image"] = etcdImage(c)
	t.annotate(AnnotationConfigHash, configHash)
	specHash := shortHash(t.object)
	t.annotate(AnnotationSpecHash, specHash)
	return podSpec{template: t.object, specHash: specHash, configHash: configHash}
}

func etcdImage(c *v1alpha1.EtcdCluster) string {
	return c.Spec.ImageRegistry + ":" + c.Spec.Version
}

// template is a pod template with the parts renderPodSpec completes after hashing.
type template struct {
	object
	meta, etcd  object
	annotations map[string]string
}

// annotate sets a pod annotation, giving the template its annotations when it had none.
func (t template) annotate(key, value string) {
	t.annotations[key] = value
	t.meta["annotations"] = t.annotations
}

func podTemplate(cfg Config, c *v1alpha1.EtcdCluster, s serving, image string) template {
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
	if s.trust != "" {
		annotations[AnnotationTrust] = s.trust
	}
	meta := object{"labels": labels}
	if len(annotations) > 0 {
		meta["annotations"] = annotations
	}

	install := object{
		"name":            "install",
		"image":           cfg.ToolImage,
		"command":         []string{"/etcdops-member", "install", "--to=" + toolPath},
		"volumeMounts":    []any{object{"name": volumeTools, "mountPath": toolDir}},
		"securityContext": containerSecurityContext(),
	}
	etcd := object{
		"name":  "etcd",
		"image": image,
		"command": []string{toolPath, "launch",
			"--join-state=" + joinDir + "/" + joinstate.ConfigMapKey,
			"--name=$(POD_NAME)",
			"--data-dir=" + dataDir,
			"--etcd=" + etcdBinary,
			"--"},
		"args": etcdFlags(cfg, c, s),
		"env": []any{object{"name": "POD_NAME", "valueFrom": object{
			"fieldRef": object{"fieldPath": "metadata.name"}}}},
		"ports": []any{
			object{"name": "client", "containerPort": ClientPort},
			object{"name": "peer", "containerPort": PeerPort},
			object{"name": "metrics", "containerPort": MetricsPort},
		},
		// Ready: etcd serves reads from its own data and no CORRUPT alarm stands. Neither
		// quorum nor voting is asked for (a seed or a joining learner becomes ready while the
		// cluster forms), nor the absence of a NOSPACE alarm: reads still work then.
		"readinessProbe": object{
			"httpGet":       object{"path": readinessPath, "port": MetricsPort, "scheme": "HTTP"},
			"periodSeconds": 5, "failureThreshold": 3,
		},
		// Alive: etcd answers /livez (no alarm restarts it: a NOSPACE alarm must not become a
		// crash loop), and no quorum recovery waits for this member to restart
		// (etcdops-member probe, docs/architecture.md).
		"livenessProbe": object{
			"exec": object{"command": []string{toolPath, "probe",
				"--join-state=" + joinDir + "/" + joinstate.ConfigMapKey,
				"--data-dir=" + dataDir,
				fmt.Sprintf("--health=http://127.0.0.1:%d%s", MetricsPort, livenessPath)}},
			"initialDelaySeconds": 15, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 8,
		},
		"volumeMounts": podVolumeMounts(s),
		// The launcher writes only under /var/lib/etcd, and etcd only under its data dir
		// (its temporary files too: snapshots and defragmentation write beside the data), so
		// the image stays read-only and no /tmp is needed.
		"securityContext": containerSecurityContext(),
	}
	if user != nil && user.Resources != nil {
		etcd["resources"] = plain(user.Resources)
	}

	// fsGroup makes a member volume writable by etcd's user; ownership is changed only when
	// the volume's root does not have it yet, not file by file on every start.
	security := podSecurityContext()
	security["fsGroup"] = runAsID
	security["fsGroupChangePolicy"] = "OnRootMismatch"
	spec := object{
		"initContainers":  []any{install},
		"containers":      []any{etcd},
		"volumes":         podVolumes(c, s),
		"securityContext": security,
		// etcd never talks to the Kubernetes API.
		"automountServiceAccountToken": false,
	}
	withRestore(c, etcd, spec)
	if user != nil {
		if user.Affinity != nil {
			spec["affinity"] = plain(user.Affinity)
		}
		if len(user.NodeSelector) > 0 {
			spec["nodeSelector"] = user.NodeSelector
		}
		if len(user.Tolerations) > 0 {
			spec["tolerations"] = plain(user.Tolerations)
		}
		if user.PriorityClassName != "" {
			spec["priorityClassName"] = user.PriorityClassName
		}
	}
	return template{object: object{"metadata": meta, "spec": spec}, meta: meta, etcd: etcd, annotations: annotations}
}

// etcd's probe endpoints, served on the metrics port from v3.5.11 (v1alpha1.MinVersion).
const (
	readinessPath = "/readyz?exclude=linearizable_read&exclude=non_learner"
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
		fmt.Sprintf("--listen-metrics-urls=http://0.0.0.0:%d", MetricsPort),
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
	return fmt.Sprintf("%s://0.0.0.0:%d", scheme(secure), port)
}

func podVolumeMounts(s serving) []any {
	mounts := []any{
		object{"name": volumeData, "mountPath": dataVolumeDir},
		object{"name": volumeTools, "mountPath": toolDir},
		object{"name": volumeJoin, "mountPath": joinDir, "readOnly": true},
	}
	if s.client.servesTLS() {
		mounts = append(mounts, object{"name": volumeServerTLS, "mountPath": tlsDir + "/server", "readOnly": true})
	}
	if s.peer.canDialTLS() {
		mounts = append(mounts, object{"name": volumePeerTLS, "mountPath": tlsDir + "/peer", "readOnly": true})
	}
	return mounts
}

func podVolumes(c *v1alpha1.EtcdCluster, s serving) []any {
	vols := []any{
		object{"name": volumeTools, "emptyDir": object{}},
		object{"name": volumeJoin, "configMap": object{"name": JoinConfigMapName(c.Name)}},
	}
	// Without a storageSpec the member's data lives as long as its pod.
	if c.Spec.StorageSpec == nil {
		vols = append(vols, object{"name": volumeData, "emptyDir": object{}})
	}
	if s.client.servesTLS() {
		vols = append(vols, object{"name": volumeServerTLS, "secret": object{"secretName": s.serverSecret}})
	}
	if s.peer.canDialTLS() {
		vols = append(vols, object{"name": volumePeerTLS, "secret": object{"secretName": s.peerSecret}})
	}
	return vols
}

// statefulSet renders the StatefulSet with the replicas and partition the planner chose.
func statefulSet(c *v1alpha1.EtcdCluster, ps podSpec, replicas, partition int) Child {
	name := StatefulSetName(c.Name)
	whenDeleted := "Retain"
	if c.Spec.StorageSpec != nil && c.Spec.StorageSpec.WhenDeleted == v1alpha1.PVCDelete {
		whenDeleted = "Delete"
	}
	spec := object{
		"replicas":    replicas,
		"serviceName": HeadlessServiceName(c.Name),
		"selector":    object{"matchLabels": selectorLabels(c)},
		// Members start together: the planner, not the StatefulSet, orders membership.
		"podManagementPolicy": "Parallel",
		"updateStrategy": object{
			"type":          "RollingUpdate",
			"rollingUpdate": object{"partition": partition},
		},
		// A scaled-away ordinal loses its claim, so it can never come back with stale data.
		"persistentVolumeClaimRetentionPolicy": object{"whenScaled": "Delete", "whenDeleted": whenDeleted},
		"template":                             ps.template,
	}
	if s := c.Spec.StorageSpec; s != nil {
		spec["volumeClaimTemplates"] = []any{volumeClaimTemplate(s)}
	}
	return Child{APIVersion: "apps/v1", Kind: "StatefulSet", Name: name, Object: object{
		"apiVersion": "apps/v1",
		"kind":       "StatefulSet",
		"metadata":   metadata(c, name, commonLabels(c)),
		"spec":       spec,
	}}
}

func volumeClaimTemplate(s *v1alpha1.StorageSpec) object {
	mode := string(s.AccessModes)
	if mode == "" {
		mode = "ReadWriteOnce"
	}
	res := object{"requests": object{"storage": s.VolumeSizeRequest.String()}}
	if s.VolumeSizeLimit != nil {
		res["limits"] = object{"storage": s.VolumeSizeLimit.String()}
	}
	spec := object{"accessModes": []string{mode}, "resources": res}
	if s.StorageClassName != "" {
		spec["storageClassName"] = s.StorageClassName
	}
	return object{"metadata": object{"name": volumeData}, "spec": spec}
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
