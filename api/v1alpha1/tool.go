package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// ToolRole is what a container running the operator's image does in a pod of the
// operator's own; each role has its own default resources.
type ToolRole int

// Roles of the operator's containers.
const (
	// ToolMemberJob: a member Job's one change (add-learner, promote, remove, move-leader,
	// compact, defragment, disarm, update-peer-url, expand-claim, restart-pod). Each asks
	// etcd or the Kubernetes API once and waits for the answer.
	ToolMemberJob ToolRole = iota
	// ToolBackup: a backup Job. It reads a whole snapshot into its scratch volume, checks
	// it and stores it.
	ToolBackup
	// ToolStream: the continuous backup. It holds up to spec.backup.continuous.maxChunkSize
	// of changes before it stores them, and takes a snapshot when a chain starts afresh.
	ToolStream
	// ToolDrill: a restore drill. It restores the newest backup into its scratch volume and
	// serves the copy with an etcd server in the same container, whose index of every key is
	// held in memory, while it reads both copies page by page.
	ToolDrill
)

// MinToolMemory is the least memory spec.tool.resources may bound: etcdops-member's resident
// set, its binary's pages included, is about 50 MiB for the smallest command
// (docs/operate.md, "Resources and pull secrets").
const MinToolMemory = "64Mi"

// The default resources of each role, from TestToolUsage (test/bench; docs/operate.md has
// its table and command): a member Job's command peaks at about 7 MiB of heap and 44 to 53
// MiB resident (its binary's pages included) and 0.03 s of CPU; a backup of a 1 GiB database
// at 32 to 36 MiB of heap, the snapshot's pages aside, and 7 s of CPU; the stream at about
// 20 MiB plus twice the chunk it holds (148 to 163 MiB with 64 MiB chunks), and under a
// sixth of a core while writes pour in. The limits leave room above those peaks; the pages
// a backup maps and writes are page cache, which the kernel reclaims under the limit rather
// than killing the container. CPU is limited too, so that a ResourceQuota on limits.cpu
// admits the pods.
var (
	toolDefaults = map[ToolRole]corev1.ResourceRequirements{
		ToolMemberJob: resources("10m", "32Mi", "500m", "128Mi"),
		ToolBackup:    resources("100m", "64Mi", "1", "256Mi"),
		// Not measured like the others: etcd's own memory on the restored copy grows with the
		// key space, so the limit leaves it a gibibyte; spec.tool.resources sets another.
		ToolDrill: resources("100m", "128Mi", "1", "1Gi"),
	}
	// streamBase is the stream's memory without the chunks it holds.
	streamBase = resource.MustParse("64Mi")
)

// streamChunkCopies is how many times its chunk the stream's memory limit holds: the events
// received and the chunk encoded from them, and room for the next events arriving meanwhile.
const streamChunkCopies = 3

func resources(cpuRequest, memoryRequest, cpuLimit, memoryLimit string) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpuRequest), corev1.ResourceMemory: resource.MustParse(memoryRequest)},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpuLimit), corev1.ResourceMemory: resource.MustParse(memoryLimit)},
	}
}

// ToolResources are the resources of a container of role in a pod of the operator's own:
// spec.tool.resources when set, else the role's default. s is a defaulted spec (Defaulted).
// The result is the caller's to keep.
func ToolResources(s EtcdClusterSpec, role ToolRole) corev1.ResourceRequirements {
	if t := s.Tool; t != nil && t.Resources != nil {
		return *t.Resources.DeepCopy()
	}
	if role == ToolStream {
		chunk := resource.MustParse(DefaultMaxChunkSize)
		if b := s.Backup; b != nil && b.Continuous != nil && b.Continuous.MaxChunkSize != nil {
			chunk = *b.Continuous.MaxChunkSize
		}
		limit := streamBase.DeepCopy()
		for range streamChunkCopies {
			limit.Add(chunk)
		}
		r := resources("50m", "64Mi", "500m", "0")
		r.Limits[corev1.ResourceMemory] = limit
		return r
	}
	d := toolDefaults[role]
	return *d.DeepCopy()
}
