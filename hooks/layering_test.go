package hooks_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// hooks speaks HTTP to Metacontroller and hands etcd requests to an Observer: it reaches etcd
// only through that interface, so neither membership nor an etcd or gRPC client may be among
// its dependencies.
func TestHooksDependsOnNoEtcdClient(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to list dependencies")
	}
	out, err := exec.Command(goTool, "list", "-deps", "etcdops.dev/etcdops/hooks").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"etcdops.dev/etcdops/membership", "go.etcd.io/etcd/client", "google.golang.org/grpc"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("hooks depends on %s", dep)
			}
		}
	}
}

// TestBinariesImportNoTestPackage: the two binaries build from the product's packages alone;
// what lives under test/ (the harness, etcdtest, the tools' builders) is for tests only.
func TestBinariesImportNoTestPackage(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to list dependencies")
	}
	out, err := exec.Command(goTool, "list", "-deps", "etcdops.dev/etcdops/cmd/hook-server", "etcdops.dev/etcdops/cmd/etcdops-member").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "etcdops.dev/etcdops/sync") {
		t.Fatalf("the binaries' dependencies %v lack the planner: the listing is wrong", deps)
	}
	for _, dep := range deps {
		if strings.HasPrefix(dep, "etcdops.dev/etcdops/test/") {
			t.Errorf("a binary depends on %s", dep)
		}
	}
}
