package kubebin

import (
	"os"
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
	k1, err := contentKey(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	k2, _ := contentKey(dir, "")
	write("package a // changed")
	k3, _ := contentKey(dir, "")
	if k1 != k2 || k1 == k3 {
		t.Errorf("keys %s %s %s: want the first two equal and the third different", k1, k2, k3)
	}
}
