package harness

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// forkBound is how long members get to catch up with the revision their key spaces are
// compared at.
const forkBound = 20 * time.Second

// Forks looks for a fork once a scenario has settled: every running voter must report the
// same cluster ID and the same hash of the key space (etcd's HashKV) at the same revision,
// and every member that answered a client of the history (operations and watch events) must
// have been in the ledger, the join ConfigMap, as a member of the cluster, and answered with
// the cluster's ID. It returns what it found.
func (e *Env) Forks(h *History) []string {
	want := e.clusterID()
	return append(answerForks(h, e.Monitor.Ledger(), want), e.hashForks(want)...)
}

// answerForks checks who answered the history's clients: members of the ledger, for the
// cluster want (0: not known yet).
func answerForks(h *History, ledger map[uint64]string, want uint64) []string {
	answered := map[uint64]bool{}
	clusters := map[uint64]bool{}
	h.mu.Lock()
	for _, op := range h.Ops {
		if !op.Output.Unknown {
			answered[op.Output.Member] = true
			clusters[op.Output.Cluster] = true
		}
	}
	for _, evs := range h.Watchers {
		for _, ev := range evs {
			answered[ev.Member] = true
			clusters[ev.Cluster] = true
		}
	}
	h.mu.Unlock()
	var forks []string
	for _, id := range sortedIDs(answered) {
		if _, ok := ledger[id]; !ok {
			forks = append(forks, fmt.Sprintf("member %x answered a client but was never a member in the ledger", id))
		}
	}
	for _, id := range sortedIDs(clusters) {
		if want != 0 && id != want {
			forks = append(forks, fmt.Sprintf("a member answered for cluster %x, not %x", id, want))
		}
	}
	return forks
}

func sortedIDs(set map[uint64]bool) []uint64 {
	out := make([]uint64, 0, len(set))
	for id := range set {
		out = append(out, id)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// clusterID is the cluster ID the hook recorded in status, or 0 before it has one.
func (e *Env) clusterID() uint64 {
	p := e.Store.Parent()
	if p == nil {
		return 0
	}
	id, err := strconv.ParseUint(p.Status.ClusterID, 16, 64)
	if err != nil {
		return 0
	}
	return id
}

// hashForks compares the running voters' cluster IDs and their HashKV at the revision a
// linearizable read returns; a member behind that revision is waited for.
func (e *Env) hashForks(want uint64) []string {
	var voters []string
	for _, m := range e.Monitor.View().Members {
		if m.Running && !m.IsLearner {
			voters = append(voters, m.Name)
		}
	}
	if len(voters) == 0 {
		return []string{"no running voter to compare"}
	}
	cli, err := clientv3.New(e.ClientConfig())
	if err != nil {
		return []string{"comparing members: " + err.Error()}
	}
	defer cli.Close()
	resp, err := readUntil(cli, "\x00", forkBound)
	if err != nil {
		return []string{"comparing members: reading the revision: " + err.Error()}
	}
	rev := resp.Header.Revision
	type answer struct {
		cluster uint64
		hash    uint32
		compact int64
	}
	answers := map[string]answer{}
	var forks []string
	for _, pod := range voters {
		url := e.ClientURL(pod)
		deadline := time.Now().Add(forkBound)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			h, err := cli.HashKV(ctx, url, rev)
			cancel()
			if err == nil {
				answers[pod] = answer{h.Header.ClusterId, h.Hash, h.CompactRevision}
				break
			}
			if time.Now().After(deadline) {
				forks = append(forks, fmt.Sprintf("%s gave no hash of the key space at revision %d: %v", pod, rev, err))
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	first := ""
	for _, pod := range voters {
		a, ok := answers[pod]
		if !ok {
			continue
		}
		if want != 0 && a.cluster != want {
			forks = append(forks, fmt.Sprintf("%s reports cluster %x, not %x", pod, a.cluster, want))
		}
		if first == "" {
			first = pod
			continue
		}
		if b := answers[first]; a != b {
			forks = append(forks, fmt.Sprintf("%s and %s differ at revision %d: cluster %x hash %08x compacted at %d, cluster %x hash %08x compacted at %d",
				first, pod, rev, b.cluster, b.hash, b.compact, a.cluster, a.hash, a.compact))
		}
	}
	return forks
}
