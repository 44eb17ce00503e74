package harness

import (
	"context"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"etcdops.dev/etcdops/test/defraghold"
)

// A defragmentation of the small databases scenarios write ends in milliseconds; one of a
// production database holds the member's backend for minutes while the kubelet probes it.
// HoldNextDefragment makes the next one long: the member that receives the next Defragment
// call holds its backend for d as etcd's defragmentation does (defraghold: reads and writes
// wait, etcd_disk_defrag_inflight reads 1), then runs the real defragmentation. Only the
// duration is made up; what the member does meanwhile, and what its probes see, is etcd's.
func (e *Env) HoldNextDefragment(d time.Duration) {
	e.Kubelet.defragHolds.next.Store(int64(d))
}

// DefragmentsHeld counts the defragmentations HoldNextDefragment held so far.
func (e *Env) DefragmentsHeld() int {
	return int(e.Kubelet.defragHolds.held.Load())
}

// defragHolds are a kubelet's: how long the next Defragment call holds its member, and how
// many were held.
type defragHolds struct {
	next, held atomic.Int64
}

const defragmentMethod = "/etcdserverpb.Maintenance/Defragment"

// holdDefragment is the member's interceptor for HoldNextDefragment. The hold ends early when
// the process is killed, as the real run would.
func (p *etcdProcess) holdDefragment(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if info.FullMethod != defragmentMethod || p.holds == nil {
		return h(ctx, req)
	}
	d := time.Duration(p.holds.next.Swap(0))
	if d <= 0 {
		return h(ctx, req)
	}
	p.holds.held.Add(1)
	release, err := defraghold.Hold(p.e.Server)
	if err != nil {
		return nil, err
	}
	select {
	case <-time.After(d):
	case <-p.exit:
	}
	release()
	return h(ctx, req)
}
