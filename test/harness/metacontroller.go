package harness

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	gosync "sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// ChildResource is one childResources entry of the CompositeController.
type ChildResource struct {
	APIVersion     string `json:"apiVersion"`
	Resource       string `json:"resource"`
	UpdateStrategy struct {
		Method string `json:"method"`
	} `json:"updateStrategy"`
}

// Controller is what the harness reads from the CompositeController manifest.
type Controller struct {
	Raw      json.RawMessage // the CompositeController object, sent as "controller"
	Children []ChildResource
	Resync   time.Duration // resyncPeriodSeconds
	Paths    map[string]string
	Version  string // hook version: v1 keys inner maps by name, v2 by namespace/name
	// GenerateSelector: children are selected by a controller-uid label, which
	// Metacontroller adds to every desired child before applying it.
	GenerateSelector bool
}

// compositeController is the part of the manifest the harness obeys.
type compositeController struct {
	Kind string `json:"kind"`
	Spec struct {
		ResyncPeriodSeconds float64         `json:"resyncPeriodSeconds"`
		GenerateSelector    bool            `json:"generateSelector"`
		ChildResources      []ChildResource `json:"childResources"`
		Hooks               map[string]struct {
			Version string `json:"version"`
			Webhook struct {
				URL  string `json:"url"`
				Path string `json:"path"`
			} `json:"webhook"`
		} `json:"hooks"`
	} `json:"spec"`
}

// LoadController finds the CompositeController among the YAML manifests under dir of fsys
// (manifests.FS as it ships), so that the harness drives the hook with exactly the child
// types, update strategies, hooks and resync period that will be deployed.
func LoadController(fsys fs.FS, dir string) (Controller, error) {
	var found []Controller
	err := fs.WalkDir(fsys, dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			return err
		}
		b, err := fs.ReadFile(fsys, path)
		if err != nil {
			return err
		}
		for _, doc := range strings.Split(string(b), "\n---") {
			var cc compositeController
			if yaml.Unmarshal([]byte(doc), &cc) != nil || cc.Kind != "CompositeController" {
				continue
			}
			raw, err := yaml.YAMLToJSON([]byte(doc))
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			c := Controller{Raw: raw, Children: cc.Spec.ChildResources, Paths: map[string]string{}, Version: "v1",
				Resync: time.Duration(cc.Spec.ResyncPeriodSeconds * float64(time.Second)), GenerateSelector: cc.Spec.GenerateSelector}
			for name, h := range cc.Spec.Hooks {
				p := h.Webhook.Path
				if h.Webhook.URL != "" {
					p = h.Webhook.URL[strings.Index(h.Webhook.URL[len("http://"):], "/")+len("http://"):]
				}
				c.Paths[name] = p
				if h.Version != "" {
					c.Version = h.Version
				}
			}
			found = append(found, c)
		}
		return nil
	})
	if err != nil {
		return Controller{}, err
	}
	if len(found) != 1 {
		return Controller{}, fmt.Errorf("want one CompositeController under %s, found %d", dir, len(found))
	}
	if found[0].Paths["sync"] == "" {
		return Controller{}, errors.New("the CompositeController has no sync hook")
	}
	return found[0], nil
}

// SyncRecord is one sync as Metacontroller performed it.
type SyncRecord struct {
	N        int
	At       time.Time
	Took     time.Duration
	Request  []byte
	Response []byte // nil when the hook failed
	Err      error
	Answer   Answer
	Applied  bool
	Replayed bool // an old request sent again
}

// Answer is a decoded sync response.
type Answer struct {
	Status             v1alpha1.EtcdClusterStatus `json:"status"`
	Children           []json.RawMessage          `json:"children"`
	ResyncAfterSeconds float64                    `json:"resyncAfterSeconds"`
	Finalized          bool                       `json:"finalized"`
}

// Metacontroller plays Metacontroller's part for one parent: it builds sync requests from
// the store, posts them to the hook over HTTP, and applies the answers.
type Metacontroller struct {
	Store *Store
	Ctrl  Controller
	// HookURL returns the hook's base URL; it changes when the hook restarts.
	HookURL func() string
	// TimeScale shrinks resync periods; see Options.TimeScale.
	TimeScale float64
	// OnSync sees every sync after it was applied (or not).
	OnSync func(SyncRecord)
	// EtcdState fingerprints what the hook observes besides the request (etcd's membership,
	// leader and member health). The same request must get the same answer only while it
	// is unchanged and the hook saw etcd the same way both times: SendTwice compares answers
	// only then.
	EtcdState func() string
	// Clock is the hook's clock, held still while a request is posted twice; nil when the
	// hook runs on the wall clock.
	Clock *HookClock
	// Drop, when set, sees every decoded answer and may have it thrown away unapplied, as
	// when the answer is lost to a timeout.
	Drop func(Answer) bool

	client *http.Client
	// one holds one sync at a time: Metacontroller never syncs a parent concurrently.
	one gosync.Mutex

	mu        gosync.Mutex
	n         int
	history   []SyncRecord
	dropNext  int
	twice     bool
	nonIdem   []string
	jobChange []string
}

// NewMetacontroller returns a Metacontroller for the store's parent.
func NewMetacontroller(s *Store, ctrl Controller, hookURL func() string, timeScale float64) *Metacontroller {
	return &Metacontroller{Store: s, Ctrl: ctrl, HookURL: hookURL, TimeScale: timeScale,
		EtcdState: func() string { return "" },
		// Metacontroller's default webhook timeout.
		client: &http.Client{Timeout: 10 * time.Second}}
}

// DropNext makes the next n answers be thrown away unapplied, as when the hook's answer is
// lost to a timeout.
func (m *Metacontroller) DropNext(n int) {
	m.mu.Lock()
	m.dropNext += n
	m.mu.Unlock()
}

// SendTwice makes every sync post its request twice and compare the answers byte for byte.
func (m *Metacontroller) SendTwice(on bool) {
	m.mu.Lock()
	m.twice = on
	m.mu.Unlock()
}

// NonIdempotent lists the syncs whose two answers to the same request differed.
func (m *Metacontroller) NonIdempotent() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.nonIdem...)
}

// JobChanges lists every time the hook returned a Job that differs from the one it created
// under the same name (Jobs are immutable: OnDelete never applies the change).
func (m *Metacontroller) JobChanges() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.jobChange...)
}

// History returns every sync so far.
func (m *Metacontroller) History() []SyncRecord {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]SyncRecord(nil), m.history...)
}

// Syncs counts the syncs so far.
func (m *Metacontroller) Syncs() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}

// Run syncs whenever the parent, a child or a related object changes, when the answer's
// resyncAfterSeconds or the controller's resync period elapses, and after failures with
// Metacontroller's exponential backoff (5ms doubling, capped here at one second of scaled
// time), until ctx ends.
func (m *Metacontroller) Run(ctx context.Context) {
	backoff := 5 * time.Millisecond
	resync := m.scaled(m.Ctrl.Resync)
	for ctx.Err() == nil {
		changed := m.Store.Changed()
		rec := m.Sync(ctx)
		wait := resync
		if rec.Err != nil {
			wait = backoff
			backoff = min(2*backoff, time.Second)
		} else {
			backoff = 5 * time.Millisecond
			if r := rec.Answer.ResyncAfterSeconds; r > 0 {
				wait = min(wait, m.scaled(time.Duration(r*float64(time.Second))))
			}
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-changed:
			if rec.Err != nil {
				<-timer.C
			}
		case <-timer.C:
		}
		timer.Stop()
	}
}

func (m *Metacontroller) scaled(d time.Duration) time.Duration {
	if d <= 0 {
		d = time.Minute
	}
	return max(time.Duration(float64(d)*m.TimeScale), 20*time.Millisecond)
}

// Sync performs one sync: request, hook, apply.
func (m *Metacontroller) Sync(ctx context.Context) SyncRecord {
	m.one.Lock()
	defer m.one.Unlock()
	req, err := m.request(ctx)
	if err != nil {
		return m.finish(SyncRecord{At: time.Now(), Err: err}, false)
	}
	return m.send(ctx, req, false)
}

// Replay sends the request of an earlier sync again, as Metacontroller does when its
// informer caches lag, and applies the answer.
func (m *Metacontroller) Replay(ctx context.Context, rec SyncRecord) SyncRecord {
	m.one.Lock()
	defer m.one.Unlock()
	return m.send(ctx, rec.Request, true)
}

func (m *Metacontroller) send(ctx context.Context, req []byte, replayed bool) SyncRecord {
	rec := SyncRecord{At: time.Now(), Request: req, Replayed: replayed}
	m.mu.Lock()
	twice := m.twice
	m.mu.Unlock()
	if twice && m.Clock != nil {
		defer m.Clock.Hold()()
	}
	before := m.EtcdState()
	rec.Response, rec.Err = m.post(ctx, m.Ctrl.Paths["sync"], req)
	rec.Took = time.Since(rec.At)
	if rec.Err == nil && twice {
		again, err := m.post(ctx, m.Ctrl.Paths["sync"], req)
		if err == nil && m.EtcdState() == before && sameObservation(again, rec.Response) && !bytes.Equal(again, rec.Response) {
			m.mu.Lock()
			m.nonIdem = append(m.nonIdem, fmt.Sprintf("sync %d: same request, different answers:\n%s\n%s", m.n+1, rec.Response, again))
			m.mu.Unlock()
		}
	}
	if rec.Err == nil {
		dec := json.NewDecoder(bytes.NewReader(rec.Response))
		if m.Ctrl.Version == "v2" {
			dec.DisallowUnknownFields()
		}
		if err := dec.Decode(&rec.Answer); err != nil {
			rec.Err = fmt.Errorf("decoding the answer: %w", err)
		}
	}
	if rec.Err != nil {
		return m.finish(rec, false)
	}
	m.mu.Lock()
	drop := m.dropNext > 0
	if drop {
		m.dropNext--
	}
	m.mu.Unlock()
	if m.Drop != nil && m.Drop(rec.Answer) {
		drop = true
	}
	if drop {
		return m.finish(rec, false)
	}
	generation, err := generationOf(req)
	if err == nil {
		err = m.apply(rec.Answer, generation)
	}
	if err != nil {
		rec.Err = err
		return m.finish(rec, false)
	}
	return m.finish(rec, true)
}

func (m *Metacontroller) finish(rec SyncRecord, applied bool) SyncRecord {
	m.mu.Lock()
	m.n++
	rec.N = m.n
	rec.Applied = applied
	m.history = append(m.history, rec)
	m.mu.Unlock()
	if m.OnSync != nil {
		m.OnSync(rec)
	}
	return rec
}

func (m *Metacontroller) post(ctx context.Context, path string, body []byte) ([]byte, error) {
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, m.HookURL()+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	r.Header.Set("Content-Type", "application/json")
	resp, err := m.client.Do(r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("hook answered %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return b, nil
}

// sameObservation reports whether two answers show the same observation of etcd: the members
// as the hook saw them (health, roles, who did not answer) and the leader. On a loaded machine
// a member may miss the hook's observation deadline once and answer the next time, and then
// the hook rightly decides differently on the same request.
func sameObservation(a, b []byte) bool {
	var x, y Answer
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x.Status.Members, y.Status.Members) && x.Status.Leader == y.Status.Leader
}

// mapKey is the children/related map key: Kind.version for the core group,
// Kind.group/version otherwise.
func mapKey(kind string) string {
	return kind + "." + kinds[kind].APIVersion
}

func (m *Metacontroller) innerKey(o Object) string {
	if m.Ctrl.Version == "v2" && o.GetNamespace() != "" {
		return o.GetNamespace() + "/" + o.GetName()
	}
	return o.GetName()
}

func (m *Metacontroller) request(ctx context.Context) ([]byte, error) {
	parent := m.Store.Parent()
	if parent == nil {
		return nil, errors.New("no parent")
	}
	children := map[string]map[string]Object{}
	for _, cr := range m.Ctrl.Children {
		kind, ok := kindOfResource(cr.APIVersion, cr.Resource)
		if !ok {
			return nil, fmt.Errorf("child resource %s %s is not served by the harness", cr.APIVersion, cr.Resource)
		}
		inner := map[string]Object{}
		for _, o := range m.Store.List(kind) {
			inner[m.innerKey(o)] = o
		}
		children[mapKey(kind)] = inner
	}
	related, err := m.related(ctx, parent)
	if err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{
		"controller": m.Ctrl.Raw,
		"parent":     parent,
		"children":   children,
		"related":    related,
		"finalizing": parent.DeletionTimestamp != nil,
	})
}

// relatedRule is one entry of a customize answer.
type relatedRule struct {
	APIVersion    string                `json:"apiVersion"`
	Resource      string                `json:"resource"`
	LabelSelector *metav1.LabelSelector `json:"labelSelector"`
	Namespace     string                `json:"namespace"`
	Names         []string              `json:"names"`
}

// related asks the customize hook which related objects to send and selects them.
func (m *Metacontroller) related(ctx context.Context, parent *v1alpha1.EtcdCluster) (map[string]map[string]Object, error) {
	out := map[string]map[string]Object{}
	path, ok := m.Ctrl.Paths["customize"]
	if !ok {
		return out, nil
	}
	body, err := json.Marshal(map[string]any{"controller": m.Ctrl.Raw, "parent": parent})
	if err != nil {
		return nil, err
	}
	b, err := m.post(ctx, path, body)
	if err != nil {
		return nil, fmt.Errorf("customize: %w", err)
	}
	var ans struct {
		RelatedResources []relatedRule `json:"relatedResources"`
	}
	if err := json.Unmarshal(b, &ans); err != nil {
		return nil, fmt.Errorf("customize: %w", err)
	}
	for _, rule := range ans.RelatedResources {
		kind, ok := kindOfResource(rule.APIVersion, rule.Resource)
		if !ok {
			return nil, fmt.Errorf("customize: related %s %s is not served by the harness", rule.APIVersion, rule.Resource)
		}
		sel := labels.Everything()
		if rule.LabelSelector != nil {
			if sel, err = metav1.LabelSelectorAsSelector(rule.LabelSelector); err != nil {
				return nil, fmt.Errorf("customize: %w", err)
			}
		}
		inner := out[mapKey(kind)]
		if inner == nil {
			inner = map[string]Object{}
			out[mapKey(kind)] = inner
		}
		for _, o := range m.Store.List(kind) {
			if clusterScoped[kind] {
				// Metacontroller hands a namespaced parent's v1 hooks only the related objects
				// of the parent's namespace (UniformObjectMap.Convert): a StorageClass never
				// reaches them. v2 hooks get every one, keyed by name alone.
				if m.Ctrl.Version != "v2" {
					continue
				}
				o.SetNamespace("")
			}
			if rule.Namespace != "" && rule.Namespace != o.GetNamespace() {
				continue
			}
			if len(rule.Names) > 0 && !slices.Contains(rule.Names, o.GetName()) {
				continue
			}
			if sel.Matches(labels.Set(o.GetLabels())) {
				inner[m.innerKey(o)] = o
			}
		}
	}
	return out, nil
}

// lastApplied is the annotation Metacontroller's client-side apply keeps.
const lastApplied = "metacontroller.k8s.io/last-applied-configuration"

// generationOf is the generation of the parent a sync request carries. Metacontroller
// stamps the status with the generation it synced, not the parent's generation when the
// answer comes back: a spec edited meanwhile stays unobserved until a sync sees it.
func generationOf(req []byte) (int64, error) {
	var r struct {
		Parent struct {
			Metadata struct {
				Generation int64 `json:"generation"`
			} `json:"metadata"`
		} `json:"parent"`
	}
	if err := json.Unmarshal(req, &r); err != nil {
		return 0, fmt.Errorf("reading the parent's generation from the sync request: %w", err)
	}
	return r.Parent.Metadata.Generation, nil
}

// apply makes the store match an answer: children created, updated per strategy, or
// deleted when left out; status replaced with observedGeneration, the generation of the
// parent that was synced, added.
func (m *Metacontroller) apply(a Answer, generation int64) error {
	parent := m.Store.Parent()
	desired := map[objKey]Object{}
	raws := map[objKey]string{}
	for _, raw := range a.Children {
		if m.Ctrl.GenerateSelector {
			var err error
			if raw, err = withControllerUID(raw, string(parent.UID)); err != nil {
				return err
			}
		}
		o, err := decodeObject(raw)
		if err != nil {
			return err
		}
		k := objKey{KindOf(o), o.GetName()}
		if _, dup := desired[k]; dup {
			return fmt.Errorf("the answer has %s %q twice", k.Kind, k.Name)
		}
		if ns := o.GetNamespace(); ns != "" && ns != m.Store.Namespace {
			return fmt.Errorf("%s %q is in namespace %q, not the parent's", k.Kind, k.Name, ns)
		}
		desired[k] = o
		raws[k] = string(raw)
	}
	methods := map[string]string{}
	var kinds []schema.GroupVersionKind
	for _, cr := range m.Ctrl.Children {
		kind, _ := kindOfResource(cr.APIVersion, cr.Resource)
		methods[kind] = cr.UpdateStrategy.Method
		kinds = append(kinds, schema.FromAPIVersionAndKind(cr.APIVersion, kind))
	}
	for k := range desired {
		if _, ok := methods[k.Kind]; !ok {
			return fmt.Errorf("the answer returns %s, which is not a declared child type", k.Kind)
		}
	}
	// Metacontroller's ManageChildren: every delete first, then creates and updates, each
	// pass kind by kind sorted by group, version and kind (its GetAllGVKs), so a policy
	// object lands after the apps and batch ones of the same answer.
	slices.SortFunc(kinds, func(a, b schema.GroupVersionKind) int {
		return cmp.Or(strings.Compare(a.Group, b.Group), strings.Compare(a.Version, b.Version), strings.Compare(a.Kind, b.Kind))
	})
	rank := map[string]int{}
	for i, gvk := range kinds {
		rank[gvk.Kind] = i
		for _, o := range m.Store.List(gvk.Kind) {
			if _, keep := desired[objKey{gvk.Kind, o.GetName()}]; !keep {
				m.Store.Delete(gvk.Kind, o.GetName())
			}
		}
	}
	keys := slices.SortedFunc(maps.Keys(desired), func(a, b objKey) int {
		return cmp.Or(cmp.Compare(rank[a.Kind], rank[b.Kind]), strings.Compare(a.Name, b.Name))
	})
	for _, k := range keys {
		if err := m.applyChild(desired[k], raws[k], methods[k.Kind], parent); err != nil {
			return err
		}
	}
	st := a.Status
	st.ObservedGeneration = generation
	m.Store.SetParentStatus(st)
	return nil
}

// withControllerUID is a desired child with the controller-uid label of generateSelector
// unless it has one, as Metacontroller labels it before applying: the last-applied
// configuration records the label too.
func withControllerUID(raw json.RawMessage, uid string) (json.RawMessage, error) {
	var o map[string]any
	if err := json.Unmarshal(raw, &o); err != nil {
		return nil, fmt.Errorf("a child of the answer: %w", err)
	}
	md, _ := o["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
		o["metadata"] = md
	}
	labels, _ := md["labels"].(map[string]any)
	if labels == nil {
		labels = map[string]any{}
		md["labels"] = labels
	}
	if _, ok := labels["controller-uid"]; ok {
		return raw, nil
	}
	labels["controller-uid"] = uid
	return json.Marshal(o)
}

// applyChild creates a desired child, or updates it as its kind's strategy says when the
// answer changed it since it was last applied.
func (m *Metacontroller) applyChild(o Object, raw, method string, parent *v1alpha1.EtcdCluster) error {
	k := objKey{KindOf(o), o.GetName()}
	ann := o.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[lastApplied] = raw
	o.SetAnnotations(ann)
	o.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind,
		Name: parent.Name, UID: parent.UID, Controller: ptr(true), BlockOwnerDeletion: ptr(true)}})
	old, exists := m.Store.Get(k.Kind, k.Name)
	if !exists {
		return m.Store.Create(o)
	}
	if sameJSON(old.GetAnnotations()[lastApplied], raw) {
		return nil
	}
	switch method {
	case "InPlace":
		return m.Store.Update(o)
	case "Recreate":
		m.Store.Delete(k.Kind, k.Name)
	default: // OnDelete: an existing child is never updated.
		if k.Kind == "Job" {
			m.mu.Lock()
			m.jobChange = append(m.jobChange, fmt.Sprintf("Job %s changed:\nwas  %s\nnow  %s", k.Name, old.GetAnnotations()[lastApplied], raw))
			m.mu.Unlock()
		}
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// SyncLine is a one-line account of a sync: the action, why, the members and the leader as
// the hook reported them.
func SyncLine(rec SyncRecord) string {
	if rec.Err != nil {
		return fmt.Sprintf("sync %3d  error: %v", rec.N, rec.Err)
	}
	st := rec.Answer.Status
	action, member, reason := "-", "", ""
	if a := st.Action; a != nil {
		action, member, reason = a.Type, a.Member, a.Reason
	}
	var ms []string
	for _, m := range st.Members {
		s := m.Name
		if m.IsLearner {
			s += "(learner)"
		}
		if !m.Healthy {
			s += "(unhealthy)"
		}
		ms = append(ms, s)
	}
	note := ""
	if !rec.Applied {
		note = "  [not applied]"
	}
	if rec.Replayed {
		note += "  [replayed request]"
	}
	return fmt.Sprintf("sync %3d  %-16s %-8s %-10s %-40s members=[%s] leader=%s  %s%s",
		rec.N, action, member, st.Phase, Conditions(st), strings.Join(ms, " "), st.Leader, reason, note)
}

// Conditions is a status's Progressing and Degraded in brief: each condition's reason when
// True, "-" when False, and Degraded's reason in parentheses when it is False for a reason
// worth telling (PlannedDisruption).
func Conditions(st v1alpha1.EtcdClusterStatus) string {
	brief := map[string]string{v1alpha1.ConditionProgressing: "-", v1alpha1.ConditionDegraded: "-"}
	for _, c := range st.Conditions {
		switch {
		case c.Status == metav1.ConditionTrue:
			brief[c.Type] = c.Reason
		case c.Type == v1alpha1.ConditionDegraded && c.Reason != "Healthy":
			brief[c.Type] = "(" + c.Reason + ")"
		}
	}
	return "P=" + brief[v1alpha1.ConditionProgressing] + " D=" + brief[v1alpha1.ConditionDegraded]
}

// sameJSON compares two JSON documents by value: key order and spacing do not matter, as
// they do not to the API server.
func sameJSON(a, b string) bool {
	var va, vb any
	if json.Unmarshal([]byte(a), &va) != nil || json.Unmarshal([]byte(b), &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}
