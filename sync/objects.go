package sync

// The rendered children as typed values: they encode without the per-key work of a map (the
// pod template is encoded three times per sync: its two hashes and the answer). Like the maps
// the rest of a member Job is built of, they hold only the fields the operator owns, and they must
// encode to the same bytes a map of those keys would: the pods of running clusters carry
// hashes of those bytes, a Job is named after its own, and a changed byte restarts every pod
// or renames a Job. So each struct declares its fields in the sorted order of their JSON names
// (the order encoding/json writes a map's keys in), a field is omitempty or omitzero exactly
// when the operator leaves it out, and TestRenderedBytesDoNotChange and the golden fixtures
// pin the result.

// apiObject is a top-level child: data for the ConfigMap, spec for the others.
type apiObject struct {
	APIVersion string            `json:"apiVersion"`
	Data       map[string]string `json:"data,omitempty"`
	Kind       string            `json:"kind"`
	Metadata   objectMeta        `json:"metadata"`
	Spec       any               `json:"spec,omitempty"`
}

// objectMeta is a top-level child's metadata; the namespace is always written.
type objectMeta struct {
	Annotations map[string]string `json:"annotations,omitempty"`
	Labels      map[string]string `json:"labels"`
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
}

type labelSelector struct {
	MatchLabels map[string]string `json:"matchLabels"`
}

type serviceSpec struct {
	ClusterIP                string            `json:"clusterIP,omitempty"`
	Ports                    []servicePort     `json:"ports"`
	PublishNotReadyAddresses bool              `json:"publishNotReadyAddresses,omitempty"`
	Selector                 map[string]string `json:"selector"`
}

type servicePort struct {
	Name       string `json:"name"`
	Port       int    `json:"port"`
	Protocol   string `json:"protocol"`
	TargetPort int    `json:"targetPort"`
}

type pdbSpec struct {
	// MinAvailable is an int or a percentage.
	MinAvailable any           `json:"minAvailable"`
	Selector     labelSelector `json:"selector"`
}

type statefulSetSpec struct {
	PersistentVolumeClaimRetentionPolicy claimRetention      `json:"persistentVolumeClaimRetentionPolicy"`
	PodManagementPolicy                  string              `json:"podManagementPolicy"`
	Replicas                             int                 `json:"replicas"`
	Selector                             labelSelector       `json:"selector"`
	ServiceName                          string              `json:"serviceName"`
	Template                             *podTemplateSpec    `json:"template"`
	UpdateStrategy                       updateStrategy      `json:"updateStrategy"`
	VolumeClaimTemplates                 []volumeClaimObject `json:"volumeClaimTemplates,omitempty"`
}

type claimRetention struct {
	WhenDeleted string `json:"whenDeleted"`
	WhenScaled  string `json:"whenScaled"`
}

type updateStrategy struct {
	RollingUpdate rollingUpdate `json:"rollingUpdate"`
	Type          string        `json:"type"`
}

type rollingUpdate struct {
	Partition int `json:"partition"`
}

// volumeClaimObject is a claim template as the API server stores it, its defaults included
// (apiVersion and kind, spec.volumeMode, status.phase): Metacontroller replaces the list
// whole, it having no merge key, and a template that differs from the stored one by a
// default would be written again on every sync.
type volumeClaimObject struct {
	APIVersion string      `json:"apiVersion"`
	Kind       string      `json:"kind"`
	Metadata   nameOnly    `json:"metadata"`
	Spec       claimSpec   `json:"spec"`
	Status     claimStatus `json:"status"`
}

type claimStatus struct {
	Phase string `json:"phase"`
}

type nameOnly struct {
	Name string `json:"name"`
}

type claimSpec struct {
	AccessModes      []string       `json:"accessModes"`
	Resources        claimResources `json:"resources"`
	StorageClassName string         `json:"storageClassName,omitempty"`
	VolumeMode       string         `json:"volumeMode"`
}

type claimResources struct {
	Limits   *storageQuantity `json:"limits,omitempty"`
	Requests storageQuantity  `json:"requests"`
}

type storageQuantity struct {
	Storage string `json:"storage"`
}

// podTemplateSpec is a StatefulSet's spec.template.
type podTemplateSpec struct {
	Metadata podMetadata `json:"metadata"`
	Spec     etcdPodSpec `json:"spec"`
}

type podMetadata struct {
	Annotations map[string]string `json:"annotations,omitempty"`
	Labels      map[string]string `json:"labels"`
}

// etcdPodSpec is the etcd pods' spec; the user's affinity and tolerations are kept in their
// JSON form (plain).
type etcdPodSpec struct {
	Affinity                     any               `json:"affinity,omitempty"`
	AutomountServiceAccountToken bool              `json:"automountServiceAccountToken"`
	Containers                   []container       `json:"containers"`
	ImagePullSecrets             []secretRef       `json:"imagePullSecrets,omitempty"`
	InitContainers               []container       `json:"initContainers"`
	NodeSelector                 map[string]string `json:"nodeSelector,omitempty"`
	PriorityClassName            string            `json:"priorityClassName,omitempty"`
	SecurityContext              podSecurity       `json:"securityContext"`
	Tolerations                  any               `json:"tolerations,omitempty"`
	Volumes                      []volume          `json:"volumes"`
}

// container is the etcd container or the init container that installs the launcher; the
// image is always written, empty too (the config hash is taken without it).
type container struct {
	Args            []string          `json:"args,omitempty"`
	Command         []string          `json:"command"`
	Env             []envVar          `json:"env,omitempty"`
	Image           string            `json:"image"`
	LivenessProbe   probe             `json:"livenessProbe,omitzero"`
	Name            string            `json:"name"`
	Ports           []containerPort   `json:"ports,omitempty"`
	ReadinessProbe  probe             `json:"readinessProbe,omitzero"`
	Resources       any               `json:"resources,omitempty"`
	SecurityContext containerSecurity `json:"securityContext"`
	VolumeMounts    []volumeMount     `json:"volumeMounts"`
}

type envVar struct {
	Name      string       `json:"name"`
	ValueFrom envVarSource `json:"valueFrom"`
}

type envVarSource struct {
	FieldRef fieldRef `json:"fieldRef"`
}

type fieldRef struct {
	FieldPath string `json:"fieldPath"`
}

type containerPort struct {
	ContainerPort int    `json:"containerPort"`
	Name          string `json:"name"`
}

type probe struct {
	Exec                execAction `json:"exec,omitzero"`
	FailureThreshold    int        `json:"failureThreshold"`
	HTTPGet             httpGet    `json:"httpGet,omitzero"`
	InitialDelaySeconds int        `json:"initialDelaySeconds,omitempty"`
	PeriodSeconds       int        `json:"periodSeconds"`
	TimeoutSeconds      int        `json:"timeoutSeconds,omitempty"`
}

type execAction struct {
	Command []string `json:"command"`
}

type httpGet struct {
	Path   string `json:"path"`
	Port   int    `json:"port"`
	Scheme string `json:"scheme"`
}

// podSecurity is a pod's securityContext; only the etcd pods set an fsGroup.
type podSecurity struct {
	FSGroup             int            `json:"fsGroup,omitempty"`
	FSGroupChangePolicy string         `json:"fsGroupChangePolicy,omitempty"`
	RunAsGroup          int            `json:"runAsGroup"`
	RunAsNonRoot        bool           `json:"runAsNonRoot"`
	RunAsUser           int            `json:"runAsUser"`
	SeccompProfile      seccompProfile `json:"seccompProfile"`
}

type seccompProfile struct {
	Type string `json:"type"`
}

type containerSecurity struct {
	AllowPrivilegeEscalation bool         `json:"allowPrivilegeEscalation"`
	Capabilities             capabilities `json:"capabilities"`
	ReadOnlyRootFilesystem   bool         `json:"readOnlyRootFilesystem"`
}

type capabilities struct {
	Drop []string `json:"drop"`
}

type volumeMount struct {
	MountPath string `json:"mountPath"`
	Name      string `json:"name"`
	ReadOnly  bool   `json:"readOnly,omitempty"`
}

// volume has exactly one source.
type volume struct {
	ConfigMap             *configMapSource `json:"configMap,omitempty"`
	EmptyDir              *emptyDir        `json:"emptyDir,omitempty"`
	Name                  string           `json:"name"`
	PersistentVolumeClaim *claimSource     `json:"persistentVolumeClaim,omitempty"`
	Secret                *secretSource    `json:"secret,omitempty"`
}

type configMapSource struct {
	Name string `json:"name"`
}

// emptyDir encodes as {} unless bounded.
type emptyDir struct {
	SizeLimit string `json:"sizeLimit,omitempty"`
}

// secretRef is an imagePullSecrets entry.
type secretRef struct {
	Name string `json:"name"`
}

type claimSource struct {
	ClaimName string `json:"claimName"`
	ReadOnly  bool   `json:"readOnly,omitempty"`
}

type secretSource struct {
	Optional   bool   `json:"optional,omitempty"`
	SecretName string `json:"secretName"`
}
