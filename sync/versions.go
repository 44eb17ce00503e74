package sync

import (
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
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
			image := c.Image[strings.LastIndex(c.Image, "/")+1:]
			if _, tag, ok := strings.Cut(image, ":"); ok {
				out = append(out, tag)
			}
		}
	}
	return out
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
