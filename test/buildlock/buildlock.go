// Package buildlock serialises the tests' builds of a cached binary: test processes of several
// packages may need it at once, so one builds and the others wait, then find it built.
package buildlock

import (
	"os"
	"syscall"
)

// Lock takes an exclusive lock on the file at path, created when missing, and waits for it.
// The returned function releases it.
func Lock(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
