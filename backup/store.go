// Package backup takes, stores, keeps and restores snapshots of an etcd cluster. The member
// tool runs it: Take in a backup Job (read a snapshot from a member, verify it, store it
// atomically, apply retention) and Restore in the launcher of a cluster's first member
// (fetch a snapshot, verify it, and write a new data dir from it as etcdutl snapshot restore
// does). A Store is S3-compatible object storage (minio-go) or a directory on a volume.
package backup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Object is one stored snapshot.
type Object struct {
	// Name is the snapshot's name below the store's prefix or directory.
	Name string
	Size int64
	// Time is when the snapshot was taken, read from its name.
	Time time.Time
	// Revision is the etcd revision it holds, read from its name.
	Revision int64
}

// Meta is what a store keeps beside a snapshot, for the restore to check it against.
type Meta struct {
	SHA256   string
	Revision int64
	Member   string
}

// Store keeps snapshots and chunks of changes (Delta) below one prefix or directory. Put
// makes an object visible under its name only once it is complete: a reader never sees part
// of one. List returns only snapshots named by this package (SnapshotName) directly below the
// store's root, ListDeltas only chunks (DeltaName) of its deltas/, so nothing else under the
// prefix is ever deleted. Each lineage is a store of its own below the destination's
// (LineageStore, lineage.go).
type Store interface {
	// Put stores what r holds (size bytes) under name, with meta beside it; a zero meta is
	// not kept.
	Put(ctx context.Context, name string, r io.ReadSeeker, size int64, meta Meta) error
	List(ctx context.Context) ([]Object, error)
	ListDeltas(ctx context.Context) ([]Delta, error)
	// Fetch copies object name into w and returns what was stored beside it; a Meta with
	// no SHA256 when the store kept none. A missing object is an error wrapping ErrNotFound.
	Fetch(ctx context.Context, name string, w io.Writer) (Meta, error)
	Delete(ctx context.Context, name string) error
	// Where names an object for people: s3://bucket/prefix/name or the path in the claim.
	Where(name string) string
	// Sub is the store of the directory dir ("a/b/") below this one's root.
	Sub(dir string) Store
	// Dirs lists the names of the directories directly below dir ("a/") of this store.
	Dirs(ctx context.Context, dir string) ([]string, error)
}

// ErrNotFound: no snapshot (or other object) of that name, or none at all for "latest".
var ErrNotFound = errors.New("snapshot not found")

// timeLayout sorts as it reads: name order is time order.
const timeLayout = "20060102T150405Z"

var snapshotPattern = regexp.MustCompile(`^(.+)-(\d{8}T\d{6}Z)-r(\d+)\.db$`)

// SnapshotName is the name of cluster's snapshot taken at t holding revision.
func SnapshotName(cluster string, t time.Time, revision int64) string {
	return fmt.Sprintf("%s-%s-r%d.db", cluster, t.UTC().Format(timeLayout), revision)
}

// parseName reads a snapshot's time and revision from its name; false for any other name.
func parseName(name string) (Object, bool) {
	m := snapshotPattern.FindStringSubmatch(name)
	if m == nil {
		return Object{}, false
	}
	t, err := time.Parse(timeLayout, m[2])
	if err != nil {
		return Object{}, false
	}
	rev, err := strconv.ParseInt(m[3], 10, 64)
	if err != nil {
		return Object{}, false
	}
	return Object{Name: name, Time: t, Revision: rev}, true
}

// newestFirst sorts snapshots by time, then revision, newest first.
func newestFirst(objs []Object) {
	slices.SortFunc(objs, func(a, b Object) int {
		if c := b.Time.Compare(a.Time); c != 0 {
			return c
		}
		if a.Revision != b.Revision {
			return int(b.Revision - a.Revision)
		}
		return strings.Compare(b.Name, a.Name)
	})
}

// LatestName, as a snapshot name to restore, is the newest snapshot.
const LatestName = "latest"

// Newest is the newest snapshot in s.
func Newest(ctx context.Context, s Store) (Object, error) {
	objs, err := s.List(ctx)
	if err != nil {
		return Object{}, err
	}
	if len(objs) == 0 {
		return Object{}, fmt.Errorf("%w: no snapshot in %s", ErrNotFound, s.Where(""))
	}
	newestFirst(objs)
	return objs[0], nil
}

// Retention says which snapshots are kept: the newest Keep (0: no bound), and those younger
// than KeepFor (0: no bound). A snapshot beyond either bound goes; the newest never does.
type Retention struct {
	Keep    int
	KeepFor time.Duration
}

// Expired are the snapshots r deletes at now, oldest first.
func (r Retention) Expired(objs []Object, now time.Time) []Object {
	objs = slices.Clone(objs)
	newestFirst(objs)
	var out []Object
	for i := len(objs) - 1; i >= 1; i-- {
		o := objs[i]
		if r.Keep > 0 && i >= r.Keep || r.KeepFor > 0 && now.Sub(o.Time) > r.KeepFor {
			out = append(out, o)
		}
	}
	return out
}
