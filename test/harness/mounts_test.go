package harness

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// TestKubeletRefreshesMountsLate: with MountDelay a changed ConfigMap reaches a pod's mounted
// file only once the pod's own delay has passed since the last refresh, longer for a higher
// ordinal; a new pod mounts it as it is. The delays here are real time, scaled by TimeScale.
func TestKubeletRefreshesMountsLate(t *testing.T) {
	s := NewStore("ns")
	cm := &corev1.ConfigMap{Data: map[string]string{"k": "v1"}}
	cm.Name = "join"
	if err := s.Create(cm); err != nil {
		t.Fatal(err)
	}
	k := NewKubelet(s, nil, nil, Tools{}, "cluster.local", t.TempDir(), 0.01)
	k.MountDelay = 40 * time.Second // 400ms for ordinal 0, 500ms for ordinal 1
	k.mu.Lock()
	got := []time.Duration{k.mountDelay("e-0"), k.mountDelay("e-1")}
	k.mu.Unlock()
	if got[0] != 400*time.Millisecond || got[1] != 500*time.Millisecond {
		t.Fatalf("delays %v, want 400ms and 500ms", got)
	}
	pods := map[string]*podRuntime{}
	read := func(name string) string {
		t.Helper()
		p := &corev1.Pod{}
		p.Name = name
		p.Spec.Volumes = []corev1.Volume{{Name: "join", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "join"}}}}}
		rt := pods[name]
		if rt == nil {
			rt = &podRuntime{name: name, dir: filepath.Join(k.Root, name)}
			pods[name] = rt
		}
		if err := k.projectVolumes(p, rt); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(rt.dir, "join", "k"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	start := time.Now()
	if got := read("e-0") + read("e-1"); got != "v1v1" {
		t.Fatalf("first mounts read %q", got)
	}
	cm.Data["k"] = "v2"
	if err := s.Update(cm); err != nil {
		t.Fatal(err)
	}
	if got := read("e-0") + read("e-1") + read("e-2"); got != "v1v1v2" {
		t.Fatalf("right after the change the mounts read %q, want the old value in the old pods and the new one in a new pod", got)
	}
	seen := map[string]time.Duration{}
	for time.Since(start) < 2*time.Second && len(seen) < 2 {
		for _, name := range []string{"e-0", "e-1"} {
			if _, ok := seen[name]; !ok && read(name) == "v2" {
				seen[name] = time.Since(start)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if seen["e-0"] < 400*time.Millisecond || seen["e-1"] < 500*time.Millisecond {
		t.Errorf("the change reached e-0 after %s and e-1 after %s, want no sooner than 400ms and 500ms", seen["e-0"], seen["e-1"])
	}
	if len(seen) < 2 {
		t.Errorf("the change never reached every pod: %v", seen)
	}
}

// TestKubeletWaitsForMissingSecrets: a pod that never started, one of whose Secret volumes
// names a Secret that is not there, cannot start (a real kubelet's "MountVolume.SetUp
// failed"); an optional one does not hold it, and once the Secret is there or the pod has
// started, its deletion holds nothing.
func TestKubeletWaitsForMissingSecrets(t *testing.T) {
	s := NewStore("ns")
	k := NewKubelet(s, nil, nil, Tools{}, "cluster.local", t.TempDir(), 0.01)
	secretPod := func(optional bool) *corev1.Pod {
		p := &corev1.Pod{}
		p.Name = "e-0"
		p.Spec.Volumes = []corev1.Volume{{Name: "restore", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds", Optional: &optional}}}}
		return p
	}
	rt := &podRuntime{name: "e-0"}
	if why := k.unmountable(secretPod(false), rt); why != `MountVolume.SetUp failed for volume "restore" : secret "creds" not found` {
		t.Fatalf("a missing Secret: %q", why)
	}
	if why := k.unmountable(secretPod(true), &podRuntime{name: "e-0"}); why != "" {
		t.Fatalf("a missing optional Secret holds the pod: %q", why)
	}
	creds := &corev1.Secret{Data: map[string][]byte{"k": []byte("v")}}
	creds.Name = "creds"
	if err := s.Create(creds); err != nil {
		t.Fatal(err)
	}
	if why := k.unmountable(secretPod(false), rt); why != "" {
		t.Fatalf("with the Secret there: %q", why)
	}
	s.Delete("Secret", "creds")
	if why := k.unmountable(secretPod(false), rt); why != "" {
		t.Fatalf("a pod that started, its Secret deleted since: %q", why)
	}
}
