package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteKeepsTheOldFileWhenWritingFails(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "marker")
	put := func(s string) func(io.Writer) error {
		return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
	}
	if err := Write(path, put("one")); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk full")
	if err := Write(path, func(w io.Writer) error { io.WriteString(w, "tw"); return boom }); !errors.Is(err, boom) {
		t.Fatalf("a failed write: %v", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "one" {
		t.Fatalf("after a failed write: %q %v, want the old file", b, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
	if err := Write(path, put("two")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "two" {
		t.Fatalf("got %q, want two", b)
	}
}
