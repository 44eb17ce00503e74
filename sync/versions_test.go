package sync

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/etcdstate"
)

// TestGateAndRunningVersion: the gate takes the lowest of status, the answering members and the
// pods' images; status.currentVersion rises only when every member answered or has a pod.
func TestGateAndRunningVersion(t *testing.T) {
	pod := func(ord int, image string) corev1.Pod {
		p := corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd", Image: image}}}}
		p.Name, p.Labels = PodName("etcd", ord), map[string]string{LabelCluster: "etcd"}
		return p
	}
	backup := pod(9, "registry.example:5000/etcd:v3.4.0")
	backup.Name = "etcd-backup-x1"
	for _, tc := range []struct {
		name          string
		status        string
		versions      []string // each member's answer; "" when it did not answer
		pods          []corev1.Pod
		gate, running string
	}{
		{"a silent member's pod runs an older patch", "v3.5.26", []string{"", "3.5.26", "3.5.26"},
			[]corev1.Pod{pod(0, "quay.io/coreos/etcd:v3.5.25"), pod(1, "quay.io/coreos/etcd:v3.5.26"), pod(2, "quay.io/coreos/etcd:v3.5.26")}, "v3.5.25", "v3.5.25"},
		{"status is a floor for the gate", "v3.5.25", []string{"3.5.26", "3.5.26", "3.5.26"},
			[]corev1.Pod{pod(0, "e:v3.5.26"), pod(1, "e:v3.5.26"), pod(2, "e:v3.5.26")}, "v3.5.25", "v3.5.26"},
		{"a member neither answering nor with a pod keeps status as a floor", "v3.5.25", []string{"", "3.5.26", "3.5.26"},
			[]corev1.Pod{pod(1, "e:v3.5.26"), pod(2, "e:v3.5.26")}, "v3.5.25", "v3.5.25"},
		{"a registry with a port; another cluster's or a Job's pods do not count", "", []string{"3.6.16"},
			[]corev1.Pod{pod(0, "registry.example:5000/etcd:v3.6.16"), backup}, "v3.6.16", "v3.6.16"},
		{"an image without a tag says nothing", "", []string{"3.6.16"}, []corev1.Pod{pod(0, "registry.example:5000/etcd")}, "v3.6.16", "v3.6.16"},
	} {
		w := newSimWorld(t, int32(len(tc.versions)), true)
		obs := Observed{Cluster: w.cluster, Now: simStart, Pods: tc.pods}
		obs.Cluster.Status.CurrentVersion = tc.status
		obs.Etcd = etcdstate.Snapshot{Asked: true, Complete: true, ClusterID: 1}
		for i, ver := range tc.versions {
			m := etcdstate.Member{ID: uint64(i + 1), Name: PodName("etcd", i), PeerURLs: []string{PeerURL(&w.cluster, PodName("etcd", i), simConfig.ClusterDomain)}, Version: ver, Reachable: ver != ""}
			obs.Etcd.Members = append(obs.Etcd.Members, m)
		}
		if got := gateVersion(&obs); got != tc.gate {
			t.Errorf("%s: gate %s, want %s", tc.name, got, tc.gate)
		}
		c := w.cluster
		if got := newView(simConfig, &obs, &c).runningVersion(); got != tc.running {
			t.Errorf("%s: running %s, want %s", tc.name, got, tc.running)
		}
	}
}

// TestV2LogIndex: the index is recorded on the sync that first sees the cluster past v3.5, as
// the highest raft index any member reports, kept through v3.6 and cleared on v3.7; a bound
// taken without a record is kept as the record.
func TestV2LogIndex(t *testing.T) {
	members := []etcdstate.Member{{RaftIndex: 900}, {RaftIndex: 1200}, {RaftIndex: 1100}}
	for _, tc := range []struct {
		name          string
		prev, running string
		bound, index  int64
	}{
		{"the last v3.5 member left", "v3.5.35", "v3.6.16", 0, 1200},
		{"still on v3.5", "v3.5.35", "v3.5.35", 0, 0},
		{"recorded before", "v3.6.16", "v3.6.16", 700, 700},
		{"created on v3.6: no v2 requests, recorded", "v3.6.15", "v3.6.16", noV2Log, noV2Log},
		{"every member on v3.7", "v3.6.16", "v3.7.3", 700, 0},
		{"status lost, no move asked for: nothing known", "", "v3.6.16", 0, 0},
		{"status lost, v3.7 asked for: the highest index seen", "", "v3.6.16", 1200, 1200},
		{"nothing running known", "", "", 700, 700},
	} {
		if got := v2LogIndex(tc.bound, tc.prev, tc.running, members); got != tc.index {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.index)
		}
	}
}

func TestSnapshotCount(t *testing.T) {
	for _, tc := range []struct {
		options []string
		want    uint64
	}{
		{nil, 10000},
		{[]string{"--heartbeat-interval=100", "--snapshot-count=2500"}, 2500},
		{[]string{"--snapshot-count=x"}, 10000},
		{[]string{"--snapshot-count=0"}, 10000},
	} {
		if got := snapshotCount(tc.options); got != tc.want {
			t.Errorf("%v: %d, want %d", tc.options, got, tc.want)
		}
	}
}
