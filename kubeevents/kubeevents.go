// Package kubeevents emits the planner's Events (sync.Event) on the EtcdClusters they are
// about, through client-go's event recorder: what `kubectl describe etcdcluster` and
// `kubectl get events` show. Metacontroller emits Events only for its own failures, so the
// hook writes these itself, with a ServiceAccount whose one permission is to create and patch
// Events (manifests/metacontroller/rbac.yaml).
//
// Emitting never blocks a sync: the recorder queues Events and drops them when its queue is
// full. It also rate-limits them per EtcdCluster and folds repeats of one Event into a count
// (client-go's correlator), so that a hook replayed by Metacontroller, or two replicas telling
// the same change, do not flood the API server. The correlator's defaults suit a controller
// that repeats itself (25 Events per object, then one per 5 minutes); the hook emits one only
// when a step starts or ends or a condition changes, a few per step, so a cluster's creation
// and a volume growth used the 25 up and a scale after them showed nothing. Its budget is
// eventBurst per EtcdCluster, then one every eventRefill.
package kubeevents

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"etcdops.dev/etcdops/sync"
)

// Component is the source the Events name (kubectl get events: FROM).
const Component = "etcdops"

// Recorder emits Events on EtcdClusters.
type Recorder struct {
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
	failures    prometheus.Counter
}

// New starts a recorder that writes through the API server cfg names. Stop it with Stop.
func New(cfg *rest.Config, log *slog.Logger) (*Recorder, error) {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	return newRecorder(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")}, log, retryAfter), nil
}

// retryAfter is how long a refused write waits before its retry (client-go's default; it
// retries a write up to 12 times).
const retryAfter = 10 * time.Second

// The correlator's budget per EtcdCluster and kind of Event: eventBurst, then one every
// eventRefill; past eventSimilar Events of one reason in 10 minutes, the next ones of that
// reason fold into one (client-go's "combined from similar events").
const (
	eventBurst   = 250
	eventRefill  = 5 * time.Second
	eventSimilar = 50
)

func newRecorder(sink record.EventSink, log *slog.Logger, retry time.Duration) *Recorder {
	r := &Recorder{
		broadcaster: record.NewBroadcaster(record.WithSleepDuration(retry), record.WithCorrelatorOptions(record.CorrelatorOptions{
			BurstSize: eventBurst, QPS: float32(time.Second) / float32(eventRefill), MaxEvents: eventSimilar,
		})),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "etcdops_hook_event_failures_total",
			Help: "Events on EtcdClusters the API server did not take (RBAC, network, rate).",
		}),
	}
	r.broadcaster.StartRecordingToSink(&countingSink{sink: sink, failed: func(e *corev1.Event, err error) {
		r.failures.Inc()
		log.Warn("an event was not written", slog.String("cluster", e.InvolvedObject.Namespace+"/"+e.InvolvedObject.Name),
			slog.String("reason", e.Reason), slog.String("error", err.Error()))
	}})
	r.recorder = r.broadcaster.NewRecorder(runtime.NewScheme(), corev1.EventSource{Component: Component})
	return r
}

// Emit queues events on the EtcdCluster ref names.
func (r *Recorder) Emit(ref *corev1.ObjectReference, events []sync.Event) {
	for _, e := range events {
		r.recorder.Event(ref, e.Type, e.Reason, e.Message)
	}
}

// Stop writes what is queued, within client-go's bounds, and stops.
func (r *Recorder) Stop() { r.broadcaster.Shutdown() }

// Describe and Collect make the failures a metric of the hook's.
func (r *Recorder) Describe(ch chan<- *prometheus.Desc) { r.failures.Describe(ch) }

// Collect is prometheus.Collector's.
func (r *Recorder) Collect(ch chan<- prometheus.Metric) { r.failures.Collect(ch) }

// countingSink reports every write the API server refused.
type countingSink struct {
	sink   record.EventSink
	failed func(*corev1.Event, error)
}

func (s *countingSink) Create(e *corev1.Event) (*corev1.Event, error) {
	out, err := s.sink.Create(e)
	s.report(e, err)
	return out, err
}

func (s *countingSink) Update(e *corev1.Event) (*corev1.Event, error) {
	out, err := s.sink.Update(e)
	s.report(e, err)
	return out, err
}

func (s *countingSink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	out, err := s.sink.Patch(e, data)
	s.report(e, err)
	return out, err
}

func (s *countingSink) report(e *corev1.Event, err error) {
	if err != nil {
		s.failed(e, err)
	}
}
