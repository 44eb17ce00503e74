package harness

import (
	"context"
	"fmt"
	"sort"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// What day-2 scenarios read from and do to the members directly: etcd's own database sizes
// and alarms, an alarm raised as etcd would raise it, and a client of their own.

// DBSize is one member's database file and the part of it in use.
type DBSize struct {
	File, InUse int64
}

// DBSizes are the running members' database sizes, by pod.
func (e *Env) DBSizes() map[string]DBSize {
	out := map[string]DBSize{}
	for pod, p := range e.Kubelet.procs() {
		out[pod] = serverDBSize(p)
	}
	return out
}

// Alarms are the cluster's active alarms as a running member holds them ("NOSPACE" of
// member ID), sorted; nil when no member runs.
func (e *Env) Alarms() []string {
	for _, p := range e.Kubelet.procs() {
		var out []string
		alarms, err := serverAlarms(p)
		if err != nil {
			continue
		}
		for _, a := range alarms {
			out = append(out, fmt.Sprintf("%s of %x", a.Alarm, a.MemberID))
		}
		sort.Strings(out)
		return out
	}
	return nil
}

// RaiseAlarm raises alarm on pod's member through etcd's Alarm API, as its corruption check
// would: the alarm is proposed through raft and every member applies it.
func (e *Env) RaiseAlarm(pod string, alarm pb.AlarmType) error {
	var id uint64
	for _, m := range e.Monitor.View().Members {
		if m.Name == pod {
			id = m.ID
		}
	}
	if id == 0 {
		return fmt.Errorf("%s is not a member", pod)
	}
	for _, p := range e.Kubelet.procs() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		e.Monitor.markFault(pod)
		e.logf("fault: %s alarm raised on %s", alarm, pod)
		return serverAlarm(ctx, p, &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: id, Alarm: alarm})
	}
	return fmt.Errorf("no member runs")
}

// Client is a client of the running voters, configured as the workload's (ClientConfig);
// the caller closes it.
func (e *Env) Client() (*clientv3.Client, error) {
	return clientv3.New(e.ClientConfig())
}
