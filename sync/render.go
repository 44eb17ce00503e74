package sync

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"slices"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/joinstate"
)

// Rendering: every child holds only the fields the operator owns, so its JSON carries no
// creationTimestamp: null, no status: {} and no empty structs, and identical input encodes to
// identical bytes. Typed API structs would emit server-owned zero values; client-go's apply
// configurations would do, but they pull an HTTP client into this package. So the children
// are the package's own structs (objects.go), and the parts of member Jobs not shared with the
// etcd pods are maps (encoding/json sorts their keys).

// object is a part of a rendered member Job.
type object map[string]any

// AnnotationLedger on the join ConfigMap keeps, per ordinal ever used, the member ID,
// incarnation and whether it was established, so a member re-added under the same name gets a
// new incarnation even after its old record left the membership.
const AnnotationLedger = "etcdops.dev/ledger"

// childLabels are the label maps of one Plan's top-level children, built once and shared by them.
// Sharing is safe because a rendered child is only encoded, never changed: the maps sit in
// unexported fields that only encoding/json reads, and whatever adds labels (the pod
// template, a member Job) writes into a map of its own.
type childLabels struct {
	common   map[string]string // on every child
	selector map[string]string // picks the cluster's pods
}

func labelsOf(c *v1alpha1.EtcdCluster) childLabels {
	return childLabels{common: commonLabels(c), selector: map[string]string{LabelCluster: c.Name}}
}

// commonLabels are a fresh map of the labels on every child, for a child that adds its own.
func commonLabels(c *v1alpha1.EtcdCluster) map[string]string {
	m := make(map[string]string, 8)
	setCommonLabels(m, c)
	return m
}

func setCommonLabels(m map[string]string, c *v1alpha1.EtcdCluster) {
	m[LabelCluster] = c.Name
	m[LabelManagedBy] = ManagedBy
	m[LabelName] = "etcd"
	m[LabelInstance] = c.Name
}

// metadata of a top-level child.
func metadata(c *v1alpha1.EtcdCluster, name string, labels map[string]string) objectMeta {
	return objectMeta{Name: name, Namespace: c.Namespace, Labels: labels}
}

// child is a top-level child named by its metadata, with the spec given.
func child(apiVersion, kind string, meta objectMeta, spec any) Child {
	return Child{APIVersion: apiVersion, Kind: kind, Name: meta.Name, Object: apiObject{APIVersion: apiVersion, Kind: kind, Metadata: meta, Spec: spec}}
}

func headlessService(c *v1alpha1.EtcdCluster, lb childLabels) Child {
	return child("v1", "Service", metadata(c, HeadlessServiceName(c.Name), lb.common), serviceSpec{
		ClusterIP: "None",
		// Peers must find each other before they are ready: readiness waits for them.
		PublishNotReadyAddresses: true,
		Selector:                 lb.selector,
		Ports:                    []servicePort{{Name: "client", Port: ClientPort, TargetPort: ClientPort, Protocol: "TCP"}, {Name: "peer", Port: PeerPort, TargetPort: PeerPort, Protocol: "TCP"}},
	})
}

func clientService(c *v1alpha1.EtcdCluster, lb childLabels) Child {
	return child("v1", "Service", metadata(c, ClientServiceName(c.Name), lb.common), serviceSpec{
		Selector: lb.selector,
		Ports:    []servicePort{{Name: "client", Port: ClientPort, TargetPort: ClientPort, Protocol: "TCP"}},
	})
}

// joinConfigMap renders the join state; clusterID is "" until etcd first answered, restored
// until the seed of a restore reported what it restored (restoredAnnotation); d are the copies
// of status's safety state (durable.go).
func joinConfigMap(c *v1alpha1.EtcdCluster, lb childLabels, state joinstate.State, l ledger, clusterID, restored string, d durable) Child {
	meta := metadata(c, JoinConfigMapName(c.Name), lb.common)
	meta.Annotations = map[string]string{AnnotationLedger: l.encode()}
	if clusterID != "" {
		meta.Annotations[AnnotationClusterID] = clusterID
	}
	if f := fromBackup(c); f != nil {
		meta.Annotations[AnnotationRestoredFrom] = f.Name
	}
	if restored != "" {
		meta.Annotations[AnnotationRestored] = restored
	}
	d.annotate(meta.Annotations)
	return Child{APIVersion: "v1", Kind: "ConfigMap", Name: meta.Name, Object: apiObject{
		APIVersion: "v1", Kind: "ConfigMap", Metadata: meta,
		Data: map[string]string{joinstate.ConfigMapKey: joinstate.Encode(state)},
	}}
}

// podDisruptionBudget lets voluntary disruptions take down only as many pods as the voters
// can lose without losing quorum, and none while the operator's own step takes a member down
// (disruption.go). It asks for a quorum of the voters' pods to stay Ready (minAvailable): a
// pod is Ready only while its member is a voter (readinessProbe), so a learner, or a pod
// without a member, counts neither for nor against it. Closed, it asks for every pod the
// StatefulSet should have (100%), which leaves no disruption to allow.
func podDisruptionBudget(c *v1alpha1.EtcdCluster, lb childLabels, voters int, disrupting bool) Child {
	var minAvailable any = etcdstate.Quorum(voters)
	if disrupting {
		minAvailable = "100%"
	}
	return child("policy/v1", "PodDisruptionBudget", metadata(c, PDBName(c.Name), lb.common), pdbSpec{
		MinAvailable: minAvailable,
		Selector:     labelSelector{MatchLabels: lb.selector},
	})
}

// Pods the operator runs (etcd pods and member Jobs) meet the "restricted" Pod Security
// Standard: neither needs root, a capability, a writable image or the Kubernetes API.
// runAsID is the nonroot user of the distroless image the operator ships in; etcd runs as the
// same user, so the binary the init container copies in and the data it writes are its own.
const runAsID = 65532

func podSecurityContext() podSecurity {
	return podSecurity{RunAsNonRoot: true, RunAsUser: runAsID, RunAsGroup: runAsID, SeccompProfile: seccompProfile{Type: "RuntimeDefault"}}
}

// containerSecurityContext makes the image's filesystem read-only: every container writes
// only to its volumes.
func containerSecurityContext() containerSecurity {
	return containerSecurity{AllowPrivilegeEscalation: false, Capabilities: capabilities{Drop: []string{"ALL"}}, ReadOnlyRootFilesystem: true}
}

// toolResources are the resources of a container of role running the operator's image, in
// their JSON form.
func toolResources(c *v1alpha1.EtcdCluster, role v1alpha1.ToolRole) any {
	return plain(v1alpha1.ToolResources(c.Spec, role))
}

// pullSecrets are the imagePullSecrets of a pod running the operator's image
// (spec.tool.imagePullSecrets) and, for an etcd pod, etcd's too
// (spec.podTemplate.spec.imagePullSecrets, first): each Secret once.
func pullSecrets(c *v1alpha1.EtcdCluster, etcdPod bool) []secretRef {
	var names []v1alpha1.SecretReference
	if pt := c.Spec.PodTemplate; etcdPod && pt != nil && pt.Spec != nil {
		names = append(names, pt.Spec.ImagePullSecrets...)
	}
	if t := c.Spec.Tool; t != nil {
		names = append(names, t.ImagePullSecrets...)
	}
	var refs []secretRef
	for _, n := range names {
		if !slices.Contains(refs, secretRef{Name: n.Name}) {
			refs = append(refs, secretRef{Name: n.Name})
		}
	}
	return refs
}

// shortHash is a stable 10-hex-digit digest of v's JSON, as json.Marshal writes it. The JSON
// is streamed into the digest rather than copied out first.
func shortHash(v any) string {
	h := &jsonDigest{Hash: sha256.New()}
	if err := json.NewEncoder(h).Encode(v); err != nil {
		panic(fmt.Sprintf("sync: encoding plain values cannot fail: %v", err))
	}
	return hex.EncodeToString(h.Sum(nil))[:10]
}

// jsonDigest hashes what is written to it but the last byte: the newline json.Encoder ends a
// value with, which json.Marshal does not write.
type jsonDigest struct {
	hash.Hash
	held    byte
	holding bool
}

func (d *jsonDigest) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if d.holding {
		d.Hash.Write([]byte{d.held})
	}
	d.Hash.Write(p[:len(p)-1])
	d.held, d.holding = p[len(p)-1], true
	return len(p), nil
}

// plain turns a user-supplied API value into its JSON form: the user's value carries only
// what the user wrote.
func plain(v any) any {
	var out any
	if err := json.Unmarshal(mustJSON(v), &out); err != nil {
		panic(fmt.Sprintf("sync: decoding %T: %v", v, err))
	}
	return out
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("sync: encoding plain values cannot fail: %v", err))
	}
	return b
}
