// Package defraghold makes an embedded etcd member look, for as long as a test wants, like a
// member in the middle of a long defragmentation: its backend held the way etcd's defrag holds
// it (the batch transaction, then reads), and etcd_disk_defrag_inflight at 1. A real
// defragmentation of a test-sized database takes milliseconds; one of a production database
// takes minutes, and it is those minutes that probes must survive. Test code only.
package defraghold

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/server/v3/etcdserver"
)

// Hold takes srv's backend as a defragmentation does and raises etcd's defrag-in-flight gauge;
// release undoes both. Reads and writes on srv block until release, as during a real run;
// raft keeps its heartbeats. The gauge is etcd's own, which is one per process: in a process
// that embeds several members, every member's /metrics shows it.
func Hold(srv *etcdserver.EtcdServer) (release func(), err error) {
	gauge, err := defragGauge()
	if err != nil {
		return nil, err
	}
	reads, ok := srv.Backend().ReadTx().(interface {
		Lock()
		Unlock()
	})
	if !ok {
		return nil, errors.New("defraghold: the backend's read transaction cannot be locked")
	}
	batch := srv.Backend().BatchTx()
	// etcd's order (backend.defrag): the batch transaction first, then reads.
	batch.LockOutsideApply()
	reads.Lock()
	gauge.Set(1)
	return func() {
		gauge.Set(0)
		reads.Unlock()
		batch.Unlock()
	}, nil
}

// defragGauge is etcd's etcd_disk_defrag_inflight, found by registering an identical gauge:
// the registry answers with the one etcd registered.
func defragGauge() (prometheus.Gauge, error) {
	probe := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "etcd",
		Subsystem: "disk",
		Name:      "defrag_inflight",
		Help:      "Whether or not defrag is active on the member. 1 means active, 0 means not.",
	})
	err := prometheus.Register(probe)
	var already prometheus.AlreadyRegisteredError
	if errors.As(err, &already) {
		if g, ok := already.ExistingCollector.(prometheus.Gauge); ok {
			return g, nil
		}
	}
	if err == nil {
		prometheus.Unregister(probe)
	}
	return nil, fmt.Errorf("defraghold: etcd's etcd_disk_defrag_inflight gauge not found (%v)", err)
}
