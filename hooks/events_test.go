package hooks_test

import (
	gosync "sync"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/hooks"
	"etcdops.dev/etcdops/sync"
)

// eventLog is an EventSink that keeps what it is given.
type eventLog struct {
	mu     gosync.Mutex
	refs   []corev1.ObjectReference
	events []sync.Event
}

func (l *eventLog) Emit(ref *corev1.ObjectReference, events []sync.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refs = append(l.refs, *ref)
	l.events = append(l.events, events...)
}

// A decision's Events go to the sink, on the EtcdCluster of the request; a refused request
// emits none.
func TestEventsAreEmittedOnTheCluster(t *testing.T) {
	log := &eventLog{}
	srv := newServer(t, hooks.Deps{Etcd: offline(t), Events: log})
	if code, body := post(t, srv, "/sync", `{"parent":`); code != 400 {
		t.Fatalf("malformed request answered %d: %s", code, body)
	}
	if len(log.refs) != 0 {
		t.Fatalf("a refused request emitted %+v", log.events)
	}
	if code, body := post(t, srv, "/sync", syncBody(parent, emptyChildren, `{"Pod.v1":{}}`)); code != 200 {
		t.Fatalf("create answered %d: %s", code, body)
	}
	want := corev1.ObjectReference{APIVersion: "etcdops.dev/v1alpha1", Kind: "EtcdCluster", Namespace: "default", Name: "etcd", UID: "u-1"}
	if len(log.refs) != 1 || log.refs[0] != want {
		t.Fatalf("events emitted on %+v, want once on %+v", log.refs, want)
	}
	if len(log.events) == 0 || log.events[0].Reason != "Bootstrap" || log.events[0].Type != corev1.EventTypeNormal {
		t.Errorf("a new cluster's events %+v, want the Bootstrap step first", log.events)
	}
}
