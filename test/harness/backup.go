package harness

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Backups and restores in the loop: a Job's pod gets its volumes (Secrets, emptyDirs) as
// directories and the termination log the kubelet would read, whose message goes into the
// pod's container status, where the planner reads a backup's report. The hook's clock can
// be moved on, so that a schedule time falls when a story needs it to.

// terminationLog is where a container writes its termination message (the kubelet's
// default terminationMessagePath).
const terminationLog = "/dev/termination-log"

// jobMounts materialises the volumes of a Job's pod under dir, as the kubelet does for etcd
// pods, and maps the termination log to a file there.
func (k *Kubelet) jobMounts(p *corev1.Pod, dir string) (map[string]string, error) {
	rt := &podRuntime{name: p.Name, dir: dir}
	if err := k.projectVolumes(p, rt); err != nil {
		return nil, err
	}
	mounts, err := k.mounts(p, rt, p.Spec.Containers[0])
	if err != nil {
		return nil, err
	}
	mounts[terminationLog] = filepath.Join(dir, "termination-log")
	return mounts, os.MkdirAll(dir, 0o755)
}

// jobPodArgs rewrites a Job pod's arguments onto its mounts and returns the termination
// log's file ("" without mounts).
func (c *Jobs) jobPodArgs(p *corev1.Pod, args []string) ([]string, string, error) {
	if c.Mounts == nil {
		return args, "", nil
	}
	mounts, err := c.Mounts(p)
	if err != nil {
		return nil, "", err
	}
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = rewritePath(a, mounts)
	}
	if c.EtcdBinary != nil && slices.ContainsFunc(out, func(a string) bool { return strings.HasPrefix(a, "--etcd=") }) {
		// A restore drill runs the etcd pods' image; its --etcd is that image's binary.
		out = withImageEtcd(out, nil, p.Spec.Containers[0].Image, c.EtcdBinary, c.logf)
	}
	return out, mounts[terminationLog], nil
}

// terminated records the container's end in the pod's status, with the termination message
// the tool wrote.
func terminated(p *corev1.Pod, logFile string, runErr error) {
	t := &corev1.ContainerStateTerminated{Reason: "Completed", FinishedAt: p.CreationTimestamp}
	if runErr != nil {
		t.ExitCode, t.Reason = 1, "Error"
	}
	if logFile != "" {
		if b, err := os.ReadFile(logFile); err == nil {
			t.Message = strings.TrimSpace(string(b))
		} else if !errors.Is(err, os.ErrNotExist) {
			t.Message = err.Error()
		}
	}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: p.Spec.Containers[0].Name, State: corev1.ContainerState{Terminated: t}}}
}

// AdvanceHookClock moves the hook's clock on by d from now on, as if that much time had
// passed for it: a schedule time falls due at once. Kubernetes and etcd keep their time.
func (e *Env) AdvanceHookClock(d time.Duration) {
	e.hookClock.Advance(d)
	e.logf("hook clock advanced by %s", d)
}

// VerifyOn reads the workload's keys back from another cluster: one restored from a snapshot
// taken after the workload stopped must hold every key it wrote.
func (w *Workload) VerifyOn(e Target, timeout time.Duration) ([]string, error) {
	w.target = e
	return w.Verify(timeout)
}
