// Package gobuild runs the go command for the tests' builds of cached binaries (etcd servers,
// the Kubernetes control plane, Metacontroller): in a throwaway module outside the checkout,
// apart from the caller's workspace and module flags, bounded in time, with the build's last
// lines in the error.
package gobuild

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Run runs `go args...` in dir, killing it after bound.
func Run(dir string, bound time.Duration, args ...string) error {
	goBin := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			return errors.New("no go command to build with")
		}
	}
	cmd := exec.Command(goBin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
	cmd.WaitDelay = time.Second
	done := make(chan struct{})
	timer := time.AfterFunc(bound, func() {
		if cmd.Process != nil {
			cmd.Process.Kill()
		}
		close(done)
	})
	defer timer.Stop()
	out, err := cmd.CombinedOutput()
	if err != nil {
		select {
		case <-done:
			err = fmt.Errorf("%w (after %s)", err, bound)
		default:
		}
		return fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, LastLines(string(out), 10))
	}
	return nil
}

// LastLines is the last n lines of s.
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
