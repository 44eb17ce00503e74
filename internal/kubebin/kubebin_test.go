package kubebin

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGoModReplacesEveryStagingModule: a staging module left out resolves to v0.0.0, which
// the proxy does not serve, and the build fails.
func TestGoModReplacesEveryStagingModule(t *testing.T) {
	mod := kubeGoMod()
	for _, m := range []string{"k8s.io/api", "k8s.io/client-go", "k8s.io/kubectl", "k8s.io/component-base"} {
		if !strings.Contains(mod, "\t"+m+" => "+m+" "+Staging+"\n") {
			t.Errorf("the throwaway go.mod does not replace %s:\n%s", m, mod)
		}
	}
}

// TestContentKeyFollowsContent: Metacontroller is rebuilt when its source changes, and only
// then.
func TestContentKeyFollowsContent(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "pkg"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(s string) {
		if err := os.WriteFile(filepath.Join(dir, "pkg", "a.go"), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("package a")
	k1, err := contentKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	k2, _ := contentKey(dir)
	write("package a // changed")
	k3, _ := contentKey(dir)
	if k1 != k2 || k1 == k3 {
		t.Errorf("keys %s %s %s: want the first two equal and the third different", k1, k2, k3)
	}
}

// TestControlPlaneBuilds builds (or finds cached) the control plane and checks each program
// reports its release; the first run pays the build, about 6 minutes on 2 cores. It runs
// only with the control-plane tier, which needs it anyway.
func TestControlPlaneBuilds(t *testing.T) {
	if os.Getenv("ETCDOPS_CONTROLPLANE") == "" {
		t.Skip("set ETCDOPS_CONTROLPLANE=1 to build the control plane (test/controlplane does)")
	}
	bins, err := Control()
	if err != nil {
		t.Skipf("the control plane cannot be built here: %v", err)
	}
	for _, bin := range []string{bins.APIServer, bins.ControllerManager} {
		out, err := exec.Command(bin, "--version").CombinedOutput()
		if err != nil || !strings.Contains(string(out), Kubernetes) {
			t.Errorf("%s --version: %v %s", bin, err, out)
		}
	}
}
