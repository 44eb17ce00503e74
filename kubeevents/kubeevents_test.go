package kubeevents

import (
	"errors"
	"fmt"
	"log/slog"
	gosync "sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/sync"
)

// sinkFuncs is a record.EventSink of functions: the API server's part, which the control-plane
// tier plays with the real one (test/controlplane).
type sinkFuncs struct {
	create func(*corev1.Event) (*corev1.Event, error)
}

func (s sinkFuncs) Create(e *corev1.Event) (*corev1.Event, error) { return s.create(e) }
func (s sinkFuncs) Update(e *corev1.Event) (*corev1.Event, error) { return s.create(e) }
func (s sinkFuncs) Patch(e *corev1.Event, _ []byte) (*corev1.Event, error) {
	return s.create(e)
}

func TestRecorderWritesEventsOnTheCluster(t *testing.T) {
	var mu gosync.Mutex
	var got []*corev1.Event
	refuse := true
	r := newRecorder(sinkFuncs{create: func(e *corev1.Event) (*corev1.Event, error) {
		mu.Lock()
		defer mu.Unlock()
		if refuse {
			refuse = false
			return nil, errors.New("events is forbidden")
		}
		got = append(got, e)
		return e, nil
	}}, slog.New(slog.DiscardHandler), 10*time.Millisecond)
	defer r.Stop()

	ref := &corev1.ObjectReference{APIVersion: "etcdops.dev/v1alpha1", Kind: "EtcdCluster", Namespace: "apps", Name: "etcd", UID: "u-1"}
	r.Emit(ref, []sync.Event{{Type: corev1.EventTypeWarning, Reason: "MemberUnhealthy", Message: "Degraded=True: etcd-1"}})
	r.Emit(ref, []sync.Event{{Type: corev1.EventTypeNormal, Reason: "AddLearner", Message: "AddLearner etcd-3"}})
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) == 0 {
		t.Fatal("no event was written")
	}
	last := got[len(got)-1]
	if last.InvolvedObject.UID != "u-1" || last.InvolvedObject.Kind != "EtcdCluster" || last.Namespace != "apps" ||
		last.Source.Component != Component || last.Reason != "AddLearner" || last.Type != corev1.EventTypeNormal {
		t.Errorf("event written %+v", last)
	}
	if n := testutil.ToFloat64(r.failures); n < 1 {
		t.Errorf("the refused write counted %v failures, want 1", n)
	}
}

// TestRecorderKeepsEveryStepOfABusyCluster: a cluster's creation, a volume growth and a scale
// emit over a hundred Events on one EtcdCluster within minutes, each once; every one is
// written as emitted (client-go's defaults kept 25 and dropped the rest for minutes).
func TestRecorderKeepsEveryStepOfABusyCluster(t *testing.T) {
	var mu gosync.Mutex
	got := map[string]bool{}
	r := newRecorder(sinkFuncs{create: func(e *corev1.Event) (*corev1.Event, error) {
		mu.Lock()
		defer mu.Unlock()
		got[e.Reason+" "+e.Message] = true
		return e, nil
	}}, slog.New(slog.DiscardHandler), 10*time.Millisecond)
	defer r.Stop()
	ref := &corev1.ObjectReference{APIVersion: "etcdops.dev/v1alpha1", Kind: "EtcdCluster", Namespace: "apps", Name: "etcd", UID: "u-1"}
	const n = 120
	reasons := []string{"AddLearner", "PromoteLearner", sync.EventStepSucceeded}
	for i := range n {
		r.Emit(ref, []sync.Event{{Type: corev1.EventTypeNormal, Reason: reasons[i%len(reasons)], Message: fmt.Sprintf("step %d", i)}})
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		k := len(got)
		mu.Unlock()
		if k >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		if want := reasons[i%len(reasons)] + fmt.Sprintf(" step %d", i); !got[want] {
			t.Errorf("%d of %d Events written as emitted; missing %q", len(got), n, want)
			break
		}
	}
}
