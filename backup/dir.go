package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"etcdops.dev/etcdops/internal/atomicfile"
)

// dirStore keeps snapshots as files in a directory, each with a metadata file beside it
// (<name>.json). A snapshot is written to a hidden temporary file, synced and renamed into
// place, so that a listing never shows part of one. A directory that does not exist yet
// (a lineage not started) lists as empty.
type dirStore struct {
	dir string
}

// NewDir returns the store of directory dir, created when missing.
func NewDir(dir string) (Store, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("backup directory %q is not an absolute path", dir)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	return &dirStore{dir: filepath.Clean(dir)}, nil
}

func (s *dirStore) Where(name string) string { return filepath.Join(s.dir, name) }

func (s *dirStore) Sub(dir string) Store { return &dirStore{dir: filepath.Join(s.dir, dir)} }

func (s *dirStore) Put(_ context.Context, name string, r io.ReadSeeker, size int64, meta Meta) error {
	if _, err := r.Seek(0, io.SeekStart); err != nil {
		return err
	}
	// A chunk of changes goes in its chain's directory, a lineage's objects in its own.
	if err := os.MkdirAll(filepath.Dir(s.Where(name)), 0o750); err != nil {
		return err
	}
	// The metadata goes first: a snapshot is never visible without it.
	if meta != (Meta{}) {
		mb, err := json.Marshal(meta)
		if err != nil {
			return err
		}
		if err := atomicfile.Write(s.Where(name+".json"), func(w io.Writer) error { _, err := w.Write(mb); return err }); err != nil {
			return err
		}
	}
	return atomicfile.Write(s.Where(name), func(w io.Writer) error {
		n, err := io.Copy(w, r)
		if err == nil && n != size {
			err = fmt.Errorf("wrote %d bytes of %d", n, size)
		}
		return err
	})
}

func (s *dirStore) List(context.Context) ([]Object, error) {
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Object
	for _, e := range entries {
		o, ok := parseName(e.Name())
		if !ok || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return nil, err
		}
		o.Size = info.Size()
		out = append(out, o)
	}
	return out, nil
}

func (s *dirStore) ListDeltas(context.Context) ([]Delta, error) {
	chains, err := os.ReadDir(s.Where(deltaDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Delta
	for _, c := range chains {
		if !c.IsDir() {
			continue
		}
		entries, err := os.ReadDir(s.Where(deltaDir + c.Name()))
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			d, ok := parseDeltaName(deltaDir + c.Name() + "/" + e.Name())
			if !ok || !e.Type().IsRegular() {
				continue
			}
			info, err := e.Info()
			if err != nil {
				return nil, err
			}
			d.Size = info.Size()
			out = append(out, d)
		}
	}
	return out, nil
}

func (s *dirStore) Dirs(_ context.Context, dir string) ([]string, error) {
	entries, err := os.ReadDir(s.Where(dir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func (s *dirStore) Fetch(_ context.Context, name string, w io.Writer) (Meta, error) {
	f, err := os.Open(s.Where(name))
	if errors.Is(err, os.ErrNotExist) {
		return Meta{}, fmt.Errorf("%w: %s", ErrNotFound, s.Where(name))
	}
	if err != nil {
		return Meta{}, err
	}
	defer f.Close()
	if _, err := io.Copy(w, f); err != nil {
		return Meta{}, fmt.Errorf("read %s: %w", s.Where(name), err)
	}
	var meta Meta
	if b, err := os.ReadFile(s.Where(name + ".json")); err == nil {
		if err := json.Unmarshal(b, &meta); err != nil {
			return Meta{}, fmt.Errorf("metadata of %s: %w", s.Where(name), err)
		}
	}
	return meta, nil
}

func (s *dirStore) Delete(_ context.Context, name string) error {
	if err := os.Remove(s.Where(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Remove(s.Where(name + ".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	// A chain's directory goes with its last chunk; a directory with chunks left stays.
	if dir := filepath.Dir(s.Where(name)); dir != s.dir {
		os.Remove(dir)
	}
	return nil
}
