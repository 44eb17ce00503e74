package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/harness"
)

// unplacedHold is how long the scenario watches the operator leave an alarm of member 0
// alone: real time, because what it checks is that nothing happens while syncs keep coming
// (the harness resyncs every few seconds), not a clock of the operator's.
const unplacedHold = 8 * time.Second

// unplacedCorrupt raises CORRUPT with member ID 0 through etcd's Alarm API, as etcd's
// corruption check does when the members' hashes disagree and no majority says which one is
// wrong: every write fails while it stands. The operator must report it (Degraded, reason
// UnplacedAlarm) and do nothing on it: no member removed or replaced, no disarm, no
// recovery. A person then disarms it, and the cluster settles with every member it had.
func unplacedCorrupt(t *testing.T, env *harness.Env) int {
	ids := map[string]string{}
	for _, m := range env.Monitor.View().Members {
		ids[m.Name] = memberID(env, m.Name)
	}
	cli, err := env.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	unplaced := &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: 0, Alarm: pb.AlarmType_CORRUPT}
	if _, err := pb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(ctx, unplaced); err != nil {
		t.Fatalf("etcd refused a CORRUPT alarm of member 0: %v", err)
	}
	syncs0 := env.MC.Syncs()
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		c := condition(env.Store.Parent().Status, v1alpha1.ConditionDegraded)
		return c.Status == metav1.ConditionTrue && c.Reason == sync.ReasonUnplacedAlarm && strings.Contains(c.Message, "CORRUPT alarm of member 0"),
			"Degraded " + string(c.Status) + " " + c.Reason + ": " + c.Message
	}); err != nil {
		t.Fatalf("the alarm of member 0 not reported: %v\n%s", err, env.Describe())
	}
	time.Sleep(unplacedHold)
	for _, rec := range env.MC.History()[syncs0:] {
		a := rec.Answer.Status.Action
		if a == nil {
			continue
		}
		switch a.Type {
		case sync.RemoveMember.String(), sync.ReplacePod.String(), sync.DisarmAlarm.String(), sync.RecoverQuorum.String():
			t.Errorf("sync %d: %s %s under a CORRUPT alarm of member 0: %s", rec.N, a.Type, a.Member, a.Reason)
		}
		for _, raw := range rec.Answer.Children {
			var job struct {
				Kind     string
				Metadata struct {
					Name   string
					Labels map[string]string
				}
			}
			if json.Unmarshal(raw, &job) == nil && job.Kind == "Job" && job.Metadata.Labels[sync.LabelAction] == "disarm" {
				t.Errorf("sync %d: Job %s disarms under a CORRUPT alarm of member 0", rec.N, job.Metadata.Name)
			}
		}
	}
	if a := env.Alarms(); len(a) != 1 || a[0] != "CORRUPT of 0" {
		t.Errorf("alarms while the operator holds: %v, want the CORRUPT alarm of member 0", a)
	}
	// A person found the odd member (here none is: the alarm was raised by hand) and disarms.
	if _, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: 0, Alarm: pb.AlarmType_CORRUPT}); err != nil {
		t.Fatal(err)
	}
	waitSteady(t, env, 3)
	for name, id := range ids {
		if got := memberID(env, name); got != id {
			t.Errorf("%s: member ID %s, was %s: a member was replaced on an alarm of member 0", name, got, id)
		}
	}
	return 3
}
