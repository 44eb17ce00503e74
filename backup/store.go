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

// Retention says which snapshots are kept, in tiers. A snapshot is kept when it is the
// newest; or when it is among the newest Keep (0: no bound) and younger than KeepFor (0: no
// bound), the recent tier, which is empty when neither is set but a calendar tier is; or when it
// is the newest snapshot of one of the Hourly most recent hours, or of the Daily most recent
// days (UTC), that hold a snapshot. Every other snapshot goes. Without the calendar tiers this
// is what Keep and KeepFor always meant: a snapshot beyond either bound goes.
//
// A calendar tier counts hours (days) that hold a snapshot, not the hours (days) on the clock:
// on a regular schedule that is the last Hourly hours, and after backups stopped for a while
// (the hook down, the storage refusing) it reaches back over the gap, so that a pause never
// costs the history before it.
type Retention struct {
	Keep    int
	KeepFor time.Duration
	Hourly  int
	Daily   int
}

// tiered: a calendar tier is set.
func (r Retention) tiered() bool { return r.Hourly > 0 || r.Daily > 0 }

// Expired are the snapshots r deletes at now, oldest first.
func (r Retention) Expired(objs []Object, now time.Time) []Object {
	objs = slices.Clone(objs)
	newestFirst(objs)
	kept := r.kept(objs, now)
	var out []Object
	for i := len(objs) - 1; i >= 0; i-- {
		if !kept[i] {
			out = append(out, objs[i])
		}
	}
	return out
}

// kept marks, of objs sorted newest first, the snapshots r keeps at now.
func (r Retention) kept(objs []Object, now time.Time) []bool {
	kept := make([]bool, len(objs))
	hours, days := map[time.Time]bool{}, map[time.Time]bool{}
	for i, o := range objs {
		recent := r.Keep > 0 || r.KeepFor > 0 || !r.tiered()
		if r.Keep > 0 && i >= r.Keep || r.KeepFor > 0 && now.Sub(o.Time) > r.KeepFor {
			recent = false
		}
		kept[i] = i == 0 || recent
		// Newest first: the first snapshot met in an hour or a day is its newest.
		if h := o.Time.UTC().Truncate(time.Hour); !hours[h] {
			hours[h] = true
			kept[i] = kept[i] || len(hours) <= r.Hourly
		}
		y, m, d := o.Time.UTC().Date()
		if day := time.Date(y, m, d, 0, 0, 0, 0, time.UTC); !days[day] {
			days[day] = true
			kept[i] = kept[i] || len(days) <= r.Daily
		}
	}
	return kept
}
