package hooks

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/go-chi/chi/v5/middleware"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/sync"
)

func (h *handler) sync(w http.ResponseWriter, r *http.Request) { h.plan(w, r, false) }

// finalize is sync for a parent being deleted: Metacontroller calls it until it answers
// finalized.
func (h *handler) finalize(w http.ResponseWriter, r *http.Request) { h.plan(w, r, true) }

// plan answers a sync or finalize call: decode, observe, plan, encode.
func (h *handler) plan(w http.ResponseWriter, r *http.Request, finalize bool) {
	start := time.Now()
	body := bodies.get()
	defer bodies.put(body)
	req, err := readSyncRequest(r, body)
	if err != nil {
		writeError(w, r, h.Log, err)
		return
	}
	obs, base, err := h.observe(r.Context(), &req, finalize)
	if err != nil {
		writeError(w, r, h.Log, err)
		return
	}
	d := h.decide(obs)
	h.statuses.answered(&obs.Cluster, base, d.Status, d.Finalized, obs.Now)
	if base.put {
		h.metrics.staleParents.Inc()
	}
	h.metrics.decisions.WithLabelValues(d.Action.Type.String()).Inc()
	h.metrics.clusters.observe(sync.Metrics(obs, d), obs.Now)
	h.Log.LogAttrs(r.Context(), slog.LevelInfo, "decided",
		slog.String("requestID", middleware.GetReqID(r.Context())),
		slog.String("cluster", obs.Cluster.Namespace+"/"+obs.Cluster.Name),
		slog.Bool("finalizing", obs.Finalizing),
		slog.String("action", d.Action.Type.String()),
		slog.String("member", d.Action.Member),
		slog.String("reason", d.Action.Reason),
		slog.Int("children", len(d.Children)),
		slog.Duration("took", time.Since(start)))
	writeJSON(w, http.StatusOK, encodeDecision(d))
	if h.Events != nil && len(d.Events) > 0 {
		c := &obs.Cluster
		h.Events.Emit(&corev1.ObjectReference{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind,
			Namespace: c.Namespace, Name: c.Name, UID: c.UID, ResourceVersion: c.ResourceVersion}, d.Events)
	}
}

// decide plans obs; a cluster with pods to roll and no roll slot free is planned again with
// its roll held back (rollSlots).
func (h *handler) decide(obs sync.Observed) sync.Decision {
	d := sync.Plan(h.Config, obs)
	cluster := obs.Cluster.Namespace + "/" + obs.Cluster.Name
	if !d.Rolls || obs.Finalizing {
		h.rolls.release(cluster)
		return d
	}
	if ok, why := h.rolls.admit(cluster, obs.Now); !ok {
		obs.RollWait = why
		h.metrics.rollWaits.Inc()
		return sync.Plan(h.Config, obs)
	}
	return d
}

// encodeDecision renders a decision as Metacontroller's response, children in the planner's
// order and never null (a null list would delete every child).
func encodeDecision(d sync.Decision) syncResponse {
	children := make([]any, 0, len(d.Children))
	for _, c := range d.Children {
		children = append(children, c.Object)
	}
	return syncResponse{Status: d.Status, Children: children, ResyncAfterSeconds: d.ResyncAfterSeconds, Finalized: d.Finalized}
}

// observe turns a request into the planner's input, asking etcd only when pods give it
// somewhere to ask.
func (h *handler) observe(ctx context.Context, req *syncRequest, finalize bool) (sync.Observed, statusBase, error) {
	c, err := decodeParent(req.parent)
	if err != nil {
		return sync.Observed{}, statusBase{}, err
	}
	base := h.statuses.newest(&c, h.Now())
	children, err := req.observedChildren()
	if err != nil {
		return sync.Observed{}, statusBase{}, err
	}
	pods, secrets := sortedIn(c.Namespace, req.related.pods), sortedIn(c.Namespace, req.related.secrets)
	need := sync.Need(h.Config, &c, children, pods, secrets)
	// The stream's progress is read while etcd is asked, so that it adds no wait of its own;
	// a cluster without a stream to ask pays no goroutine for it.
	var stream sync.StreamProgress
	var progress chan sync.StreamProgress
	if url := need.ProgressURL; url != "" {
		progress = make(chan sync.StreamProgress, 1)
		go func() { progress <- h.streamProgress(ctx, url) }()
	} else {
		stream = h.streamProgress(ctx, url)
	}
	snap := h.snapshot(ctx, &c, need, secrets)
	if progress != nil {
		stream = <-progress
	}
	// One reading of the clock, after etcd answered, for everything the planner is given.
	now := h.Now()
	return sync.Observed{
		Cluster:   c,
		Children:  children,
		Pods:      pods,
		Claims:    sortedIn(c.Namespace, req.related.claims),
		Classes:   sorted(req.related.classes),
		Etcd:      snap,
		CAs:       need.CAs,
		CABundles: need.CABundles,
		// Certificates members would reject are caught before a TLS change relies on them.
		CertProblems: h.certs.problems(c.Namespace+"/"+c.Name, need.Certificates, now),
		Credentials:  need.Credentials,
		BackupStream: stream,
		Finalizing:   req.finalizing || finalize,
		Now:          now,
	}, base, nil
}

// snapshot observes etcd through the member pods' endpoints under ObserveTimeout. With no
// endpoints there is nothing to dial, so no etcd call is made at all.
func (h *handler) snapshot(ctx context.Context, c *v1alpha1.EtcdCluster, need sync.Needs, secrets []corev1.Secret) etcdstate.Snapshot {
	endpoints := need.Endpoints
	if len(endpoints) == 0 {
		return etcdstate.Snapshot{Err: "no member pod to ask"}
	}
	key := c.Namespace + "/" + c.Name + "/" + string(c.UID)
	// The client certificate is needed only for members whose pods serve TLS.
	tls, err := clientTLS(c.Namespace, need.ClientSecret, secrets)
	if err != nil && need.TLS {
		h.metrics.observeFailures.Inc()
		h.Log.Warn("etcd not observed", "cluster", key, "error", err.Error())
		return etcdstate.Snapshot{Err: err.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, h.ObserveTimeout)
	defer cancel()
	start := time.Now()
	snap := h.Etcd.Observe(ctx, etcdstate.Request{Key: key, Endpoints: endpoints, TLS: tls, Login: need.Login})
	h.metrics.observeDuration.Observe(time.Since(start).Seconds())
	if !snap.Asked {
		h.metrics.observeFailures.Inc()
		h.Log.Warn("etcd not observed", "cluster", key, "error", snap.Err)
	}
	return snap
}

// secretCAKey is where a kubernetes.io/tls Secret made by cert-manager keeps the CA.
const secretCAKey = "ca.crt"

// clientTLS returns the client certificate from the related Secret name in namespace ns
// (Needs.ClientSecret), or nil when there is none. Errors name the Secret and the missing
// key, never a value.
func clientTLS(ns, name string, secrets []corev1.Secret) (*etcdstate.TLS, error) {
	if name == "" {
		return nil, nil
	}
	i := slices.IndexFunc(secrets, func(s corev1.Secret) bool { return s.Name == name && s.Namespace == ns })
	if i < 0 {
		return nil, fmt.Errorf("client certificate Secret %s/%s not found", ns, name)
	}
	data := secrets[i].Data
	for _, k := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey, secretCAKey} {
		if len(data[k]) == 0 {
			return nil, fmt.Errorf("client certificate Secret %s/%s has no %s", ns, name, k)
		}
	}
	return &etcdstate.TLS{CA: data[secretCAKey], Cert: data[corev1.TLSCertKey], Key: data[corev1.TLSPrivateKeyKey]}, nil
}

// customize asks Metacontroller for the cluster's pods, the Secrets named in spec.tls and
// status.tls (the client certificate to observe with, and the CA bundles the pods trust),
// the pods of backup Jobs, and with spec.storageSpec the members' claims and the
// StorageClasses (whether a claim may grow).
func (h *handler) customize(w http.ResponseWriter, r *http.Request) {
	body := bodies.get()
	defer bodies.put(body)
	parent, err := readCustomizeRequest(r, body)
	if err != nil {
		writeError(w, r, h.Log, err)
		return
	}
	c, err := decodeParent(parent)
	if err != nil {
		writeError(w, r, h.Log, err)
		return
	}
	// The Secrets asked for follow status.tls: as the newest answer has it.
	h.statuses.newest(&c, h.Now())
	writeJSON(w, http.StatusOK, relatedResources(&c))
}

// relatedResources selects pods by the cluster label and the TLS Secrets by name, in the
// parent's namespace: for v2 hooks Metacontroller implies no namespace, and a label rule
// without one relates the pods of every cluster of that name in any namespace.
func relatedResources(c *v1alpha1.EtcdCluster) customizeResponse {
	rules := []relatedRule{{
		APIVersion:    "v1",
		Resource:      "pods",
		Namespace:     c.Namespace,
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{sync.LabelCluster: c.Name}},
	}}
	if names := sync.SecretNames(c); len(names) > 0 {
		rules = append(rules, relatedRule{APIVersion: "v1", Resource: "secrets", Namespace: c.Namespace, Names: names})
	}
	if c.Spec.Backup != nil {
		// A backup Job's pod reports its snapshot in its termination message.
		rules = append(rules, relatedRule{APIVersion: "v1", Resource: "pods", Namespace: c.Namespace, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{sync.LabelBackupOf: c.Name}}})
	}
	if c.Spec.StorageSpec != nil {
		// The StatefulSet controller labels each claim with the set's selector. Every class is
		// asked for: a claim without a class name gets the default class, which only the
		// claims name, and a cluster holds few classes.
		rules = append(rules,
			relatedRule{APIVersion: "v1", Resource: "persistentvolumeclaims", Namespace: c.Namespace, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{sync.LabelCluster: c.Name}}},
			relatedRule{APIVersion: "storage.k8s.io/v1", Resource: "storageclasses", LabelSelector: &metav1.LabelSelector{}})
	}
	return customizeResponse{RelatedResources: rules}
}
