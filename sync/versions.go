package sync

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
)

// The upgrade gate (v1alpha1.CheckUpgrade) is asked from the lowest etcd version anything
// says the cluster runs. A member that does not answer the hook reports no version, but its
// pod still runs the image it was created from: without that image, a silent member on an old
// patch would let a minor upgrade through that etcd's upgrade guide forbids.

// gateVersion is the version the gate checks the spec against: the lowest of
// status.currentVersion, the versions the answering members report and the etcd image of
// every pod of the cluster.
func gateVersion(obs *Observed) string {
	return lowestOf(append(podVersions(obs), obs.Cluster.Status.CurrentVersion, lowestVersion(obs.Etcd.Members))...)
}

// runningVersion is status.currentVersion as a sync that observed etcd leaves it: the lowest
// version the answering members report and the pods run. It may rise (after an upgrade) only
// on a view that accounts for every member, each answering or having a pod: a member seen in
// neither may run an older release, so the recorded version stays a floor until then.
func (v *view) runningVersion() string {
	vs := append(podVersions(v.obs), lowestVersion(v.obs.Etcd.Members))
	for _, m := range v.members {
		if m.Version == "" && m.pod == nil {
			vs = append(vs, v.obs.Cluster.Status.CurrentVersion)
			break
		}
	}
	if low := lowestOf(vs...); low != "" {
		return low
	}
	return v.obs.Cluster.Status.CurrentVersion
}

// podVersions are the etcd versions of the images the cluster's pods run: the tag of each
// one's etcd container image (etcdImage). An image without a version tag says nothing.
func podVersions(obs *Observed) []string {
	var out []string
	for i := range obs.Pods {
		p := &obs.Pods[i]
		if _, ok := ownPod(&obs.Cluster, p); !ok {
			continue
		}
		for _, c := range p.Spec.Containers {
			if c.Name != "etcd" {
				continue
			}
			if tag, ok := imageTag(c.Image); ok {
				out = append(out, tag)
			}
		}
	}
	return out
}

// imageTag is an image's tag: what follows the colon after the last slash (a registry's port
// comes before it).
func imageTag(image string) (string, bool) {
	_, tag, ok := strings.Cut(image[strings.LastIndex(image, "/")+1:], ":")
	return tag, ok
}

// lowestOf is the lowest of the versions that parse, "v"-prefixed; "" when none does.
func lowestOf(versions ...string) string {
	var low *version.Version
	for _, s := range versions {
		if v, err := version.ParseSemantic(s); err == nil && (low == nil || v.LessThan(low)) {
			low = v
		}
	}
	if low == nil {
		return ""
	}
	return "v" + low.String()
}

// etcd v3.7 cannot apply the etcd v2 requests that v3.5 members write to the raft log (their
// attributes when they start, the cluster version): a member that replays one on v3.7 panics
// ("unmarshal should never fail"). A member replays its log from its last raft snapshot, and
// takes one every --snapshot-count applied entries. So the raft index at which the last v3.5
// member left is recorded (status.v2LogIndex), and the move to v3.7 waits until every member
// has applied --snapshot-count entries past it, and so taken a snapshot past it. Meanwhile the
// template keeps the release the StatefulSet runs, so no pod starts on v3.7 early: not a
// replaced member, not a new one (a learner replays the leader's snapshot and the log after it).

// v36SnapshotCount is etcd v3.6's default --snapshot-count.
const v36SnapshotCount = 10000

// v2LogMargin covers the requests a v3.5 member proposed that were still being committed when
// the index was recorded, and etcd applying entries in batches.
const v2LogMargin = 1000

// v2LogIndex is status.v2LogIndex after this sync: the bound recorded (or, without one, taken
// from what etcd answers: v2Fallback), kept until every member runs v3.7, then cleared;
// recorded as the highest raft index any member reports on the sync that first sees every
// member past v3.5 (running), after prevVersion, the last status's, was v3.5.
func v2LogIndex(bound int64, prevVersion, running string, members []etcdstate.Member) int64 {
	switch {
	case running == "":
		return bound
	case minorOf(running) >= 7:
		return 0
	case bound != 0:
		return bound
	case minorOf(prevVersion) != 5 || minorOf(running) != 6:
		return 0
	}
	return int64(topRaftIndex(members))
}

// v2LogIndexAfter is status.v2LogIndex as this sync leaves it, and the copy the join ConfigMap
// carries.
func (v *view) v2LogIndexAfter() int64 {
	if v.unknown != "" {
		return v.safe.v2LogIndex
	}
	return v2LogIndex(v.v2Bound, v.obs.Cluster.Status.CurrentVersion, v.runningVersion(), v.obs.Etcd.Members)
}

// v2Fallback is the v2 bound the move to v3.7 waits for: the one on record (status, else the
// join ConfigMap); without a record, on a cluster that runs v3.6 and is asked for v3.7 before
// any pod runs it, the highest raft index etcd reports now (at least 1, so that a cluster that
// did not answer waits too). Any v2 request was written before that index, so the wait is
// longer than the recorded bound's and never too short: the record was lost (a status lost or
// rewritten without the field, the ConfigMap deleted), or predates the copy.
func (v *view) v2Fallback() int64 {
	if v.safe.v2LogIndex != 0 {
		return v.safe.v2LogIndex
	}
	if minorOf(v.c.Spec.Version) < 7 || minorOf(v.runningVersion()) != 6 {
		return 0
	}
	for _, pv := range podVersions(v.obs) {
		if minorOf(pv) >= 7 {
			return 0
		}
	}
	return max(1, int64(topRaftIndex(v.obs.Etcd.Members)))
}

// topRaftIndex is the highest raft index a member reports.
func topRaftIndex(members []etcdstate.Member) uint64 {
	var top uint64
	for _, m := range members {
		top = max(top, m.RaftIndex)
	}
	return top
}

// bootstrapDurable is the safety state a new cluster starts with: created on v3.6 or later,
// its log never holds a v2 request (noV2Log).
func bootstrapDurable(c *v1alpha1.EtcdCluster) durable {
	if minorOf(c.Spec.Version) >= 6 {
		return durable{v2LogIndex: noV2Log}
	}
	return durable{}
}

// v37Wait says why the move to v3.7 waits for the members' raft snapshots, "" when it does not:
// no index is recorded or could be, the spec does not ask for v3.7, or a pod runs v3.7 already
// (the move began before the index was recorded, or the spec went back and forth: holding it
// half-way would help nobody).
func (v *view) v37Wait() string {
	idx := v.v2Bound
	if idx <= 0 || minorOf(v.c.Spec.Version) < 7 {
		return ""
	}
	for _, pv := range podVersions(v.obs) {
		if minorOf(pv) >= 7 {
			return ""
		}
	}
	count := snapshotCount(v.c.Spec.EtcdOptions)
	need := uint64(idx) + count + v2LogMargin
	var behind []string
	for _, m := range v.members {
		switch {
		case !m.Reachable:
			behind = append(behind, m.name+" does not answer")
		case m.RaftAppliedIndex < need:
			behind = append(behind, fmt.Sprintf("%s has applied %d", m.name, m.RaftAppliedIndex))
		}
	}
	if !v.obs.Etcd.Asked {
		behind = append(behind, "etcd was not asked")
	}
	if len(behind) == 0 {
		return ""
	}
	upTo := fmt.Sprintf("etcd v3.5 members may have written etcd v2 requests up to raft index %d", idx)
	if v.safe.v2LogIndex == 0 {
		upTo = fmt.Sprintf("no record says up to which raft index etcd v3.5 members may have written etcd v2 requests (status.v2LogIndex and its copy on the join ConfigMap are gone), so the highest index seen, %d, is taken", idx)
	}
	return fmt.Sprintf("%s, which %s cannot apply: it waits until every member has taken a raft snapshot past them, "+
		"which each does by applied index %d (--snapshot-count %d); %s", upTo, v.c.Spec.Version, need, count, strings.Join(behind, ", "))
}

// heldVersion is the release the template keeps while v37Wait holds the move: the one the
// StatefulSet's template names, or without a StatefulSet status.currentVersion; "" when that
// is not a v3.6 release. Once the template names v3.7 the move has begun, and it is never
// held again: a member already on v3.7 must not be rolled back.
func (v *view) heldVersion() string {
	if v.sts == nil {
		if cv := v.obs.Cluster.Status.CurrentVersion; minorOf(cv) == 6 {
			return cv
		}
		return ""
	}
	for _, c := range v.sts.Spec.Template.Spec.Containers {
		if tag, ok := imageTag(c.Image); c.Name == "etcd" && ok && minorOf(tag) == 6 {
			return tag
		}
	}
	return ""
}

// snapshotCount is the --snapshot-count the members run with: the spec's etcd option, else
// v3.6's default.
func snapshotCount(options []string) uint64 {
	for _, o := range options {
		if s, ok := strings.CutPrefix(o, "--snapshot-count="); ok {
			if n, err := strconv.ParseUint(s, 10, 64); err == nil && n > 0 {
				return n
			}
		}
	}
	return v36SnapshotCount
}

// minorOf is the minor release of a v3 version, -1 when it does not parse or is not v3.
func minorOf(s string) int {
	v, err := version.ParseSemantic(s)
	if err != nil || v.Major() != 3 {
		return -1
	}
	return int(v.Minor())
}
