package kubeevents

import (
	"errors"
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
