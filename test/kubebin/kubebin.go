// Package kubebin builds the real control plane for the control-plane test tier, once, into
// the user's cache directory: kube-apiserver, kube-controller-manager and kubectl from the Go
// module proxy (module k8s.io/kubernetes, its staging modules replaced by their releases), and
// Metacontroller from its source in ../shared/metacontroller/src, which the proxy cannot
// serve. Each build runs in a throwaway module outside the checkout, file-locked so that one
// test process builds while the others wait, and bounded in time; a later run finds it built.
package kubebin

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	gosync "sync"
	"time"

	"etcdops.dev/etcdops/test/buildlock"
	"etcdops.dev/etcdops/test/gobuild"
)

// Kubernetes is the release of kube-apiserver, kube-controller-manager and kubectl; Staging
// is the release of its staging modules (k8s.io/api, apimachinery, client-go, ...), which
// k8s.io/kubernetes requires at v0.0.0 and replaces by directories of its own repository.
const (
	Kubernetes = "v1.37.2"
	Staging    = "v0.37.2"
)

// stagingModules are the modules k8s.io/kubernetes replaces by its staging directories
// (its go.mod's replace block).
var stagingModules = []string{
	"k8s.io/api",
	"k8s.io/apiextensions-apiserver",
	"k8s.io/apimachinery",
	"k8s.io/apiserver",
	"k8s.io/cli-runtime",
	"k8s.io/client-go",
	"k8s.io/cloud-provider",
	"k8s.io/cluster-bootstrap",
	"k8s.io/code-generator",
	"k8s.io/component-base",
	"k8s.io/component-helpers",
	"k8s.io/controller-manager",
	"k8s.io/cri-api",
	"k8s.io/cri-client",
	"k8s.io/cri-streaming",
	"k8s.io/csi-translation-lib",
	"k8s.io/dynamic-resource-allocation",
	"k8s.io/endpointslice",
	"k8s.io/externaljwt",
	"k8s.io/kms",
	"k8s.io/kube-aggregator",
	"k8s.io/kube-controller-manager",
	"k8s.io/kube-proxy",
	"k8s.io/kube-scheduler",
	"k8s.io/kubectl",
	"k8s.io/kubelet",
	"k8s.io/metrics",
	"k8s.io/mount-utils",
	"k8s.io/pod-security-admission",
	"k8s.io/sample-apiserver",
	"k8s.io/sample-cli-plugin",
	"k8s.io/sample-controller",
	"k8s.io/streaming",
}

// programs are the control plane's commands, built in one go build.
var programs = []string{"kube-apiserver", "kube-controller-manager", "kubectl"}

// kubeBound bounds the Kubernetes build: the module download and the compile of three large
// programs, about 6 minutes cold on 2 idle cores. mcBound bounds Metacontroller's, about 2.
const (
	kubeBound = 25 * time.Minute
	mcBound   = 15 * time.Minute
)

// Binaries are the paths of the built control-plane programs.
type Binaries struct {
	APIServer, ControllerManager, Kubectl string
}

var (
	kubeOnce gosync.Once
	kubeBins Binaries
	kubeErr  error

	mcMu    gosync.Mutex
	mcPaths = map[string]string{}
)

// Control returns kube-apiserver, kube-controller-manager and kubectl, building them on first
// use. The error says why they cannot be built (no proxy, no Go toolchain, the bound passed);
// callers skip on it.
func Control() (Binaries, error) {
	kubeOnce.Do(func() { kubeBins, kubeErr = buildKubernetes() })
	return kubeBins, kubeErr
}

// cacheDir is a directory under the tests' cache (shared with test/etcdbin).
func cacheDir(name string) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "etcdops-test", name)
	return dir, os.MkdirAll(dir, 0o755)
}

// kubeGoMod is the throwaway module: k8s.io/kubernetes with its programs as tools, and every
// staging module replaced by its release.
func kubeGoMod() string {
	var b strings.Builder
	fmt.Fprintf(&b, "module etcdops.test/kubernetes\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes %s\n\ntool (\n", Kubernetes)
	for _, p := range programs {
		fmt.Fprintf(&b, "\tk8s.io/kubernetes/cmd/%s\n", p)
	}
	b.WriteString(")\n\nreplace (\n")
	for _, m := range stagingModules {
		fmt.Fprintf(&b, "\t%s => %s %s\n", m, m, Staging)
	}
	b.WriteString(")\n")
	return b.String()
}

// ldflags stamp the release into the programs, as the Kubernetes build does: kubectl and the
// API server's /version report it. Without a symbol table and DWARF (-s -w) the three links,
// a large part of a cold build, are quicker; stack traces keep their function names.
func ldflags() string {
	minor := strings.Split(Kubernetes, ".")[1]
	flags := []string{"-s", "-w"}
	for _, kv := range [][2]string{{"gitVersion", Kubernetes}, {"gitMajor", "1"}, {"gitMinor", minor}, {"gitTreeState", "clean"}} {
		flags = append(flags, fmt.Sprintf("-X k8s.io/component-base/version.%s=%s", kv[0], kv[1]))
	}
	return strings.Join(flags, " ")
}

func buildKubernetes() (Binaries, error) {
	dir, err := cacheDir("kubernetes-" + Kubernetes)
	if err != nil {
		return Binaries{}, err
	}
	bins := Binaries{
		APIServer:         filepath.Join(dir, "bin", "kube-apiserver"),
		ControllerManager: filepath.Join(dir, "bin", "kube-controller-manager"),
		Kubectl:           filepath.Join(dir, "bin", "kubectl"),
	}
	unlock, err := buildlock.Lock(filepath.Join(dir, "lock"))
	if err != nil {
		return Binaries{}, err
	}
	defer unlock()
	gomod := kubeGoMod()
	stamp := gomod + ldflags()
	if old, err := os.ReadFile(filepath.Join(dir, "built")); err == nil && string(old) == stamp && reports(bins.Kubectl, "version", "--client") {
		return bins, nil
	}
	os.Remove(filepath.Join(dir, "built"))
	os.Remove(filepath.Join(dir, "go.sum"))
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		return Binaries{}, err
	}
	tmp := filepath.Join(dir, "bin.tmp")
	os.RemoveAll(tmp)
	build := []string{"build", "-trimpath", "-ldflags", ldflags(), "-o", tmp + "/"}
	for _, p := range programs {
		build = append(build, "k8s.io/kubernetes/cmd/"+p)
	}
	for _, args := range [][]string{{"mod", "tidy"}, build} {
		if err := gobuild.Run(dir, kubeBound, args...); err != nil {
			return Binaries{}, fmt.Errorf("building Kubernetes %s from the Go module proxy: %w", Kubernetes, err)
		}
	}
	os.RemoveAll(filepath.Join(dir, "bin"))
	if err := os.Rename(tmp, filepath.Join(dir, "bin")); err != nil {
		return Binaries{}, err
	}
	if !reports(bins.Kubectl, "version", "--client") {
		return Binaries{}, fmt.Errorf("the kubectl built in %s does not report %s", dir, Kubernetes)
	}
	return bins, os.WriteFile(filepath.Join(dir, "built"), []byte(stamp), 0o644)
}

// reports runs the program and checks that it names the release.
func reports(bin string, args ...string) bool {
	out, err := exec.Command(bin, args...).CombinedOutput()
	return err == nil && strings.Contains(string(out), Kubernetes)
}

// Metacontroller returns Metacontroller built from the source directory src (a copy of its
// repository's go.mod, go.sum and pkg/), building it on first use. The binary is cached by
// src's content and the build's flags, so a changed source is built again; the source is copied out first, since
// it may lie in a read-only tree or inside a checkout whose go.mod would claim it.
func Metacontroller(src string) (string, error) {
	key, err := contentKey(src, strings.Join(mcBuild, " "))
	if err != nil {
		return "", fmt.Errorf("reading Metacontroller's source in %s: %w", src, err)
	}
	mcMu.Lock()
	defer mcMu.Unlock()
	if p, ok := mcPaths[key]; ok {
		return p, nil
	}
	dir, err := cacheDir("metacontroller-" + key)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "metacontroller")
	unlock, err := buildlock.Lock(filepath.Join(dir, "lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(filepath.Join(dir, "built")); err != nil {
		work := filepath.Join(dir, "src")
		os.RemoveAll(work)
		if err := copyTree(src, work); err != nil {
			return "", err
		}
		if err := gobuild.Run(work, mcBound, append(mcBuild, "-o", bin, "./pkg/cmd/metacontroller")...); err != nil {
			return "", fmt.Errorf("building Metacontroller from %s: %w", src, err)
		}
		os.RemoveAll(work)
		if err := os.WriteFile(filepath.Join(dir, "built"), nil, 0o644); err != nil {
			return "", err
		}
	}
	mcPaths[key] = bin
	return bin, nil
}

// mcBuild is Metacontroller's build command, less its output and package; part of the cache
// key with the source.
var mcBuild = []string{"build", "-trimpath", "-ldflags=-s -w"}

// contentKey is a digest of extra and of every file's path and content under dir.
func contentKey(dir, extra string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00", extra)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		fmt.Fprintf(h, "%s\x00", rel)
		_, err = io.Copy(h, f)
		return err
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// copyTree copies the regular files under src to dst, writable.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o644)
	})
}
