// Package s3server runs a real S3 server for tests: versitygw (github.com/versity/versitygw)
// serving a temporary directory on 127.0.0.1. The server is built from its pinned module,
// tools/versitygw/go.mod, into the directory where tools/build puts the test-only tools, by
// tools/build or, when that has not run, by the first test that needs it (file-locked, so
// that packages testing at once build it once). Only _test.go files import it.
package s3server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	gosync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"etcdops.dev/etcdops/test/buildlock"
	"etcdops.dev/etcdops/test/etcdtest"
)

// toolPkg is the package the tool module pins (its tool directive).
const toolPkg = "github.com/versity/versitygw/cmd/versitygw"

// buildBound bounds one build: the module download and the compile, on a slow shared machine.
const buildBound = 20 * time.Minute

// readyBound bounds the server's start, generous for a loaded machine.
const readyBound = 30 * time.Second

// The server's one account, and its region.
const (
	AccessKey = "etcdops-test"
	SecretKey = "etcdops-test-secret"
	Region    = "us-east-1"
)

// Server is a running versitygw.
type Server struct {
	// Endpoint is the server's URL, http://127.0.0.1:<port>.
	Endpoint string
	// Dir is the served directory: each bucket is a subdirectory, each object a file.
	Dir string
}

// Start builds the server when needed, starts it on a free loopback port over a new
// temporary directory, creates the buckets and stops the server when the test ends. A server
// that cannot be built skips the test, unless ETCDOPS_REQUIRE_TOOLS is set (.ci/run): there
// it fails it.
func Start(t testing.TB, buckets ...string) *Server {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the S3 server is a process of its own, built from its module (minutes cold); the full run starts it")
	}
	bin, err := Binary()
	if err != nil {
		if os.Getenv("ETCDOPS_REQUIRE_TOOLS") != "" {
			t.Fatalf("versitygw, the S3 server of the tests: %v", err)
		}
		t.Skipf("versitygw, the S3 server of the tests, cannot be built (run tools/build versitygw, or set ETCDOPS_REQUIRE_TOOLS to make this a failure): %v", err)
	}
	s := &Server{Dir: t.TempDir()}
	// A free port may be taken between the pick and the server's listen: try another.
	for attempt := 0; ; attempt++ {
		err := s.start(t, bin)
		if err == nil {
			break
		}
		if attempt == 2 {
			t.Fatal(err)
		}
	}
	cli, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyBound)
	defer cancel()
	for _, b := range buckets {
		if err := cli.MakeBucket(ctx, b, minio.MakeBucketOptions{Region: Region}); err != nil {
			t.Fatalf("versitygw: create bucket %s: %v", b, err)
		}
	}
	return s
}

func (s *Server) start(t testing.TB, bin string) error {
	addr := fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))
	logPath := filepath.Join(t.TempDir(), "versitygw.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	out := func() string { b, _ := os.ReadFile(logPath); return lastLines(string(b), 20) }
	cmd := exec.Command(bin, "--port", addr, "--access", AccessKey, "--secret", SecretKey,
		"--region", Region, "--quiet", "posix", s.Dir)
	// Only the flags configure it: no VGW_* or ROOT_* variable of the caller's environment.
	cmd.Env = []string{"HOME=" + s.Dir, "PATH=" + os.Getenv("PATH")}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	s.Endpoint = "http://" + addr
	deadline := time.Now().Add(readyBound)
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("versitygw on %s exited before serving: %v: %s", addr, err, out())
		default:
		}
		// Any S3 answer, an error for the unsigned request included, means it serves.
		if resp, err := http.Get(s.Endpoint); err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			return fmt.Errorf("versitygw on %s did not serve within %s: %s", addr, readyBound, out())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	return nil
}

// Client is an S3 client of the server's account.
func (s *Server) Client() (*minio.Client, error) {
	return minio.New(strings.TrimPrefix(s.Endpoint, "http://"), &minio.Options{
		Creds: credentials.NewStaticV4(AccessKey, SecretKey, ""), Region: Region})
}

var (
	once    gosync.Once
	binPath string
	binErr  error
)

// Binary returns the path of the server built from the pinned module, building it on first
// use.
func Binary() (string, error) {
	once.Do(func() { binPath, binErr = build() })
	return binPath, binErr
}

// ToolsDir is where the test-only tools are kept: ETCDOPS_TOOLS_BIN, else etcdops-tools in
// the user's cache directory, as tools/build has it.
func ToolsDir() (string, error) {
	if d := os.Getenv("ETCDOPS_TOOLS_BIN"); d != "" {
		return d, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(cache, "etcdops-tools"), nil
}

// moduleDir finds tools/versitygw from the working directory, which go test sets to the
// package's own, somewhere in the repository.
func moduleDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "tools", "versitygw", "go.mod")); err == nil {
			return filepath.Join(dir, "tools", "versitygw"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no tools/versitygw/go.mod above the working directory")
		}
		dir = parent
	}
}

func build() (string, error) {
	mod, err := moduleDir()
	if err != nil {
		return "", err
	}
	stamp, err := pinStamp(mod)
	if err != nil {
		return "", err
	}
	dir, err := ToolsDir()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "versitygw")
	unlock, err := buildlock.Lock(filepath.Join(dir, "versitygw.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if old, err := os.ReadFile(bin + ".stamp"); err == nil && strings.TrimSpace(string(old)) == stamp {
		if _, err := os.Stat(bin); err == nil {
			return bin, nil
		}
	}
	tmp := bin + ".tmp"
	if err := goBuild(mod, tmp); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	return bin, os.WriteFile(bin+".stamp", []byte(stamp+"\n"), 0o644)
}

// pinStamp is what tools/build records beside a tool it built: the SHA-256 of its go.mod,
// go.sum and build tags (none), so that either may reuse the other's build.
func pinStamp(mod string) (string, error) {
	h := sha256.New()
	for _, name := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(mod, name))
		if err != nil {
			return "", err
		}
		h.Write(b)
	}
	h.Write([]byte("\n"))
	return hex.EncodeToString(h.Sum(nil)), nil
}

func goBuild(mod, out string) error {
	goBin := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			return errors.New("no go command to build versitygw with")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), buildBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "build", "-trimpath", "-buildvcs=false", "-o", out, toolPkg)
	cmd.Dir = mod
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	cmd.WaitDelay = time.Second
	if b, err := cmd.CombinedOutput(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (after %s)", err, buildBound)
		}
		return fmt.Errorf("building versitygw from the Go module proxy (tools/versitygw): %w: %s", err, lastLines(string(b), 10))
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
