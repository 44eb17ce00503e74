package harness

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	gosync "sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// Object is any namespaced Kubernetes object the store holds.
type Object interface {
	metav1.Object
	runtime.Object
}

// kindInfo is what the store knows of one kind: the API server's part of the fake.
type kindInfo struct {
	APIVersion string
	Resource   string
	New        func() Object
}

// kinds the harness serves, by Kind.
var kinds = map[string]kindInfo{
	"StatefulSet":           {"apps/v1", "statefulsets", func() Object { return &appsv1.StatefulSet{} }},
	"Service":               {"v1", "services", func() Object { return &corev1.Service{} }},
	"ConfigMap":             {"v1", "configmaps", func() Object { return &corev1.ConfigMap{} }},
	"Secret":                {"v1", "secrets", func() Object { return &corev1.Secret{} }},
	"Pod":                   {"v1", "pods", func() Object { return &corev1.Pod{} }},
	"PersistentVolumeClaim": {"v1", "persistentvolumeclaims", func() Object { return &corev1.PersistentVolumeClaim{} }},
	"PodDisruptionBudget":   {"policy/v1", "poddisruptionbudgets", func() Object { return &policyv1.PodDisruptionBudget{} }},
	"Job":                   {"batch/v1", "jobs", func() Object { return &batchv1.Job{} }},
	"ServiceAccount":        {"v1", "serviceaccounts", func() Object { return &corev1.ServiceAccount{} }},
	"Role":                  {"rbac.authorization.k8s.io/v1", "roles", func() Object { return &rbacv1.Role{} }},
	"RoleBinding":           {"rbac.authorization.k8s.io/v1", "rolebindings", func() Object { return &rbacv1.RoleBinding{} }},
	// Cluster-scoped in Kubernetes; the store keeps it in its one namespace.
	"StorageClass": {"storage.k8s.io/v1", "storageclasses", func() Object { return &storagev1.StorageClass{} }},
	// The continuous backup's Deployment; Streams runs its pod.
	"Deployment": {"apps/v1", "deployments", func() Object { return &appsv1.Deployment{} }},
}

// kindOfResource maps a resource name (as CompositeController and customize use) to a Kind.
func kindOfResource(apiVersion, resource string) (string, bool) {
	for k, ki := range kinds {
		if ki.Resource == resource && ki.APIVersion == apiVersion {
			return k, true
		}
	}
	return "", false
}

// clusterScoped are the kinds the API server keeps outside namespaces; the store keeps them
// in its one namespace with the others.
var clusterScoped = map[string]bool{"StorageClass": true}

type objKey struct{ Kind, Name string }

// Store is the API server's part of the fake: one namespace holding one EtcdCluster parent
// and the objects around it. It hands out deep copies, stamps uid, resourceVersion,
// generation and timestamps, and wakes watchers on every write, as informers would.
type Store struct {
	Namespace string

	mu      gosync.Mutex
	rv      int64
	parent  *v1alpha1.EtcdCluster
	objs    map[objKey]Object
	changed chan struct{}
}

// NewStore returns an empty store for namespace.
func NewStore(namespace string) *Store {
	return &Store{Namespace: namespace, objs: map[objKey]Object{}, changed: make(chan struct{})}
}

// Changed returns a channel closed at the next write.
func (s *Store) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func (s *Store) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Store) stampLocked(o metav1.Object) {
	s.rv++
	o.SetResourceVersion(strconv.FormatInt(s.rv, 10))
}

// uids counts the UIDs handed out by every Store: unique across them, as an API server's are,
// so that an EtcdCluster created again under its name in another loop gets a new UID, and
// with it a new cluster token and etcd cluster ID.
var uids atomic.Int64

func (s *Store) newUIDLocked() types.UID {
	return types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", uids.Add(1)))
}

// KindOf returns the Kind of a stored object type.
func KindOf(o Object) string {
	return reflect.TypeOf(o).Elem().Name()
}

func setTypeMeta(o Object) {
	kind := KindOf(o)
	o.GetObjectKind().SetGroupVersionKind(gvk(kinds[kind].APIVersion, kind))
}

// CreateParent stores the EtcdCluster, as kubectl apply would.
func (s *Store) CreateParent(c *v1alpha1.EtcdCluster) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c = copyParent(c)
	c.APIVersion, c.Kind = v1alpha1.APIVersion, v1alpha1.Kind
	c.Namespace = s.Namespace
	c.UID = s.newUIDLocked()
	c.Generation = 1
	c.CreationTimestamp = metav1.NewTime(time.Now().Truncate(time.Second))
	s.stampLocked(c)
	s.parent = c
	s.notifyLocked()
}

// Parent returns a copy of the EtcdCluster, nil before it is created.
func (s *Store) Parent() *v1alpha1.EtcdCluster {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.parent == nil {
		return nil
	}
	return copyParent(s.parent)
}

// EditParentSpec changes the spec, as kubectl edit would; generation moves on when it changed.
func (s *Store) EditParentSpec(edit func(*v1alpha1.EtcdClusterSpec)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	before, _ := json.Marshal(s.parent.Spec)
	edit(&s.parent.Spec)
	if after, _ := json.Marshal(s.parent.Spec); string(before) != string(after) {
		s.parent.Generation++
	}
	s.stampLocked(s.parent)
	s.notifyLocked()
}

// AnnotateParent sets an annotation on the EtcdCluster, as kubectl annotate would; the
// generation stays, as for any change of metadata.
func (s *Store) AnnotateParent(key, value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.parent.Annotations == nil {
		s.parent.Annotations = map[string]string{}
	}
	s.parent.Annotations[key] = value
	s.stampLocked(s.parent)
	s.notifyLocked()
}

// SetParentStatus writes the status subresource; an unchanged status is not written.
func (s *Store) SetParentStatus(st v1alpha1.EtcdClusterStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reflect.DeepEqual(s.parent.Status, st) {
		return
	}
	s.parent.Status = st
	s.stampLocked(s.parent)
	s.notifyLocked()
}

// Get returns a copy of the object of kind named name.
func (s *Store) Get(kind, name string) (Object, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objs[objKey{kind, name}]
	if !ok {
		return nil, false
	}
	return o.DeepCopyObject().(Object), true
}

// List returns copies of every object of kind, sorted by name.
func (s *Store) List(kind string) []Object {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Object
	for k, o := range s.objs {
		if k.Kind == kind {
			out = append(out, o.DeepCopyObject().(Object))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out
}

// Create stores a new object; it fails when one of that kind and name exists.
func (s *Store) Create(o Object) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := objKey{KindOf(o), o.GetName()}
	if _, ok := s.objs[k]; ok {
		return fmt.Errorf("%s %q already exists", k.Kind, k.Name)
	}
	o = o.DeepCopyObject().(Object)
	setTypeMeta(o)
	o.SetNamespace(s.Namespace)
	o.SetUID(s.newUIDLocked())
	o.SetGeneration(1)
	o.SetCreationTimestamp(metav1.NewTime(time.Now().Truncate(time.Second)))
	s.stampLocked(o)
	s.objs[k] = o
	s.notifyLocked()
	return nil
}

// Update replaces an object's spec and metadata; status is kept, as the main resource
// endpoint does. Generation moves on when the spec changed.
func (s *Store) Update(o Object) error {
	return s.write(o, false)
}

// UpdateStatus replaces an object's status only, as the status subresource does.
func (s *Store) UpdateStatus(o Object) error {
	return s.write(o, true)
}

func (s *Store) write(o Object, status bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := objKey{KindOf(o), o.GetName()}
	old, ok := s.objs[k]
	if !ok {
		return fmt.Errorf("%s %q not found", k.Kind, k.Name)
	}
	o = o.DeepCopyObject().(Object)
	setTypeMeta(o)
	var next Object
	if status {
		next = old.DeepCopyObject().(Object)
		copyField(next, o, "Status")
	} else {
		if sts, ok := o.(*appsv1.StatefulSet); ok && !jsonEqual(sts.Spec.VolumeClaimTemplates, old.(*appsv1.StatefulSet).Spec.VolumeClaimTemplates) {
			return fmt.Errorf("StatefulSet.apps %q is invalid: spec: Forbidden: updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden", o.GetName())
		}
		next = o
		copyField(next, old, "Status")
		next.SetUID(old.GetUID())
		next.SetNamespace(s.Namespace)
		next.SetCreationTimestamp(old.GetCreationTimestamp())
		next.SetDeletionTimestamp(old.GetDeletionTimestamp())
		next.SetGeneration(old.GetGeneration())
		if !jsonEqual(field(old, "Spec"), field(next, "Spec")) {
			next.SetGeneration(old.GetGeneration() + 1)
		}
	}
	next.SetResourceVersion(old.GetResourceVersion())
	if jsonEqual(old, next) {
		return nil
	}
	s.stampLocked(next)
	s.objs[k] = next
	s.notifyLocked()
	return nil
}

// Delete removes an object. A pod is only marked for deletion (the kubelet stops it and
// then calls Remove); deleting a Job also deletes its pods (background propagation).
func (s *Store) Delete(kind, name string) { s.DeleteUID(kind, name, "") }

// DeleteUID is Delete with the API server's UID precondition: when no object of that name
// has uid ("" matches any), nothing is deleted and it returns false.
func (s *Store) DeleteUID(kind, name string, uid types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := objKey{kind, name}
	o, ok := s.objs[k]
	if !ok || uid != "" && o.GetUID() != uid {
		return false
	}
	if kind == "Pod" {
		if o.GetDeletionTimestamp() == nil {
			now := metav1.Now()
			o.SetDeletionTimestamp(&now)
			s.stampLocked(o)
			s.notifyLocked()
		}
		return true
	}
	delete(s.objs, k)
	if kind == "Job" {
		for pk, p := range s.objs {
			if pk.Kind == "Pod" && p.GetLabels()[batchv1.JobNameLabel] == name {
				delete(s.objs, pk)
			}
		}
	}
	s.notifyLocked()
	return true
}

// Put stores an object as a real API server holds it, its uid, resourceVersion and
// timestamps kept: the store is then the kubelet's view of that server (APINode).
func (s *Store) Put(o Object) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o = o.DeepCopyObject().(Object)
	setTypeMeta(o)
	k := objKey{KindOf(o), o.GetName()}
	if old, ok := s.objs[k]; ok && jsonEqual(old, o) {
		return
	}
	s.objs[k] = o
	s.notifyLocked()
}

// Remove deletes a pod for good: the kubelet has stopped it.
func (s *Store) Remove(kind, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.objs[objKey{kind, name}]; ok {
		delete(s.objs, objKey{kind, name})
		s.notifyLocked()
	}
}

func field(o Object, name string) any {
	f := reflect.ValueOf(o).Elem().FieldByName(name)
	if !f.IsValid() {
		return nil
	}
	return f.Interface()
}

func copyField(dst, src Object, name string) {
	d := reflect.ValueOf(dst).Elem().FieldByName(name)
	if d.IsValid() {
		d.Set(reflect.ValueOf(src).Elem().FieldByName(name))
	}
}

// decodeObject turns a child as the hook sent it into a typed object.
func decodeObject(raw json.RawMessage) (Object, error) {
	var tm metav1.TypeMeta
	if err := json.Unmarshal(raw, &tm); err != nil {
		return nil, err
	}
	ki, ok := kinds[tm.Kind]
	if !ok || ki.APIVersion != tm.APIVersion {
		return nil, fmt.Errorf("unknown child type %s %s", tm.APIVersion, tm.Kind)
	}
	o := ki.New()
	if err := json.Unmarshal(raw, o); err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return o, nil
}

// copyParent deep-copies an EtcdCluster through JSON: the API types carry no generated
// DeepCopy, and JSON is what the API server stores anyway.
func copyParent(c *v1alpha1.EtcdCluster) *v1alpha1.EtcdCluster {
	b, err := json.Marshal(c)
	if err != nil {
		panic(fmt.Sprintf("harness: EtcdCluster does not encode: %v", err))
	}
	out := &v1alpha1.EtcdCluster{}
	if err := json.Unmarshal(b, out); err != nil {
		panic(fmt.Sprintf("harness: EtcdCluster does not decode: %v", err))
	}
	return out
}

// jsonEqual compares as the API server would: by serialized form, so that equal quantities
// with different internal caches compare equal.
func jsonEqual(a, b any) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && string(ja) == string(jb)
}

// touch wakes watchers without a write: for state outside the API (a healed node).
func (s *Store) touch() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notifyLocked()
}
