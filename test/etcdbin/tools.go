package etcdbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"etcdops.dev/etcdops/test/buildlock"
	"etcdops.dev/etcdops/test/gobuild"
)

// Tools are etcd's command-line tools of one release, as the release's tarball and image ship
// them: etcdctl talks to a member, etcdutl works on its files (snapshot restore).
type Tools struct {
	Etcdctl, Etcdutl string
}

// toolModules are the modules whose main packages are the tools, by binary name.
var toolModules = map[string]string{
	"etcdctl": "go.etcd.io/etcd/etcdctl/v3",
	"etcdutl": "go.etcd.io/etcd/etcdutl/v3",
}

// ToolsFor returns etcdctl and etcdutl of a pinned release, building them from the Go module
// proxy on first use (the modules go.etcd.io/etcd/etcdctl/v3 and etcdutl/v3 at that version,
// in a throwaway module under the same cache as the servers). The error says why they cannot
// be built; callers skip on it.
func ToolsFor(version string) (Tools, error) {
	return toolBuilds.get(version, buildTools)
}

// ToolsDir is where the release's tools and their module are cached.
func ToolsDir(version string) (string, error) {
	dir, err := Dir(version)
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(dir), "etcdtools-"+version), nil
}

func buildTools(version string) (Tools, error) {
	dir, err := ToolsDir(version)
	if err != nil {
		return Tools{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Tools{}, err
	}
	unlock, err := buildlock.Lock(filepath.Join(dir, "lock"))
	if err != nil {
		return Tools{}, err
	}
	defer unlock()
	tools := Tools{Etcdctl: filepath.Join(dir, "etcdctl"), Etcdutl: filepath.Join(dir, "etcdutl")}
	if toolReports(tools.Etcdctl, version) && toolReports(tools.Etcdutl, version) {
		return tools, nil
	}
	gomod := "module etcdops.test/etcdtools\n\ngo 1.24\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		return Tools{}, err
	}
	os.Remove(filepath.Join(dir, "go.sum"))
	// go get, not go mod tidy: the module has no code of its own to import the tools' main
	// packages (a main package cannot be imported), so tidy would drop them again.
	get := []string{"get"}
	for _, name := range []string{"etcdctl", "etcdutl"} {
		get = append(get, toolModules[name]+"@"+version)
	}
	if err := gobuild.Run(dir, buildBound, get...); err != nil {
		return Tools{}, fmt.Errorf("fetching etcdctl and etcdutl %s from the Go module proxy: %w", version, err)
	}
	for name, bin := range map[string]string{"etcdctl": tools.Etcdctl, "etcdutl": tools.Etcdutl} {
		os.Remove(bin)
		tmp := bin + ".tmp"
		if err := gobuild.Run(dir, buildBound, "build", "-trimpath", "-o", tmp, toolModules[name]); err != nil {
			return Tools{}, fmt.Errorf("building %s %s from the Go module proxy: %w", name, version, err)
		}
		if err := os.Rename(tmp, bin); err != nil {
			return Tools{}, err
		}
		if !toolReports(bin, version) {
			return Tools{}, fmt.Errorf("the %s %s built in %s does not report its release", name, version, dir)
		}
	}
	return tools, nil
}

// toolReports runs `<tool> version` and checks that it names version ("etcdctl version:
// 3.6.16").
func toolReports(bin, version string) bool {
	out, err := exec.Command(bin, "version").Output()
	return err == nil && strings.Contains(string(out), filepath.Base(bin)+" version: "+strings.TrimPrefix(version, "v")+"\n")
}

// isPinned: version is one the tests build.
func isPinned(version string) bool {
	pinned := version == BelowUpgradeMinimum
	for _, v := range Pinned {
		pinned = pinned || v == version
	}
	return pinned
}
