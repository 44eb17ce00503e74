package manifests

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// tool returns the path of a test-only tool built by tools/build (helm, promtool): in
// ETCDOPS_TOOLS_BIN, else in etcdops-tools in the user cache directory, where tools/build
// puts it by default. A tool that is not built skips the test, unless ETCDOPS_REQUIRE_TOOLS
// is set, as .ci/run does: there a missing tool is a failure, not a silent skip.
func tool(t *testing.T, name string) string {
	t.Helper()
	dir := os.Getenv("ETCDOPS_TOOLS_BIN")
	if dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(cache, "etcdops-tools")
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("ETCDOPS_REQUIRE_TOOLS") != "" {
			t.Fatalf("%s is not built (%v); run tools/build", name, err)
		}
		t.Skipf("%s is not built at %s: run tools/build %s (.ci/run does), or set ETCDOPS_TOOLS_BIN", name, p, name)
	}
	return p
}

// run runs a tool and returns its standard output; a failure or exit status other than 0
// fails the test with the tool's output.
func run(t *testing.T, dir string, env []string, bin string, args ...string) []byte {
	t.Helper()
	out, err := runErr(dir, env, bin, args...)
	if err != nil {
		t.Fatalf("%s %q: %v\n%s", filepath.Base(bin), args, err, out)
	}
	return out
}

func runErr(dir string, env []string, bin string, args ...string) ([]byte, error) {
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return append(out, stderr.Bytes()...), err
	}
	return out, nil
}
