package sync_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The planner decides from values only: nothing it depends on, directly or not, may dial
// etcd or serve HTTP of ours. net/http itself does come in, through the Kubernetes API
// types, and is allowed; sync's own imports never name it.
func TestSyncDoesNoIO(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to list dependencies")
	}
	out, err := exec.Command(goTool, "list", "-deps", "etcdops.dev/etcdops/sync").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"go.etcd.io/etcd/client", "etcdops.dev/etcdops/membership", "etcdops.dev/etcdops/hooks", "google.golang.org/grpc"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("sync depends on %s", dep)
			}
		}
	}
	direct, err := exec.Command(goTool, "list", "-f", `{{join .Imports " "}}`, "etcdops.dev/etcdops/sync").Output()
	if err != nil {
		t.Fatalf("go list -f: %v", err)
	}
	for _, imp := range strings.Fields(string(direct)) {
		if imp == "net/http" || imp == "os" || imp == "os/exec" {
			t.Errorf("sync imports %s directly", imp)
		}
	}
}
