package hooks_test

import (
	"os/exec"
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
