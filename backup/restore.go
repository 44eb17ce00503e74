package backup

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
)

// RestoreOptions say which snapshot to restore and the member it becomes.
type RestoreOptions struct {
	// Store is the destination restored from.
	Store Store
	// Lineage is the lineage restored from (ValidLineage). Empty: for LatestName the lineage
	// whose newest point is the newest by time; for a snapshot's name the one lineage that
	// holds it, or the destination's root.
	Lineage string
	// Name is the snapshot's name (or lineages/<lineage>/<name>), or LatestName: then the
	// snapshot and stored changes that reach Revision, or the last revision stored at or
	// before Time, or the newest change stored when neither is set.
	Name     string
	Revision int64
	Time     time.Time
	// WorkDir holds the downloaded snapshot while it is checked.
	WorkDir string
	// DataDir is the new data dir; it must not exist or be empty.
	DataDir string
	// Member, PeerURL, InitialCluster and Token are the new cluster's first member, as its
	// --name, --initial-advertise-peer-urls, --initial-cluster and --initial-cluster-token.
	Member, PeerURL, InitialCluster, Token string
	// Etcd is the etcd server binary that replays the stored changes after the snapshot: the
	// pod's own (launch's --etcd), the release that will run the data dir, so that what it
	// writes there (the storage schema, the cluster version) is that release's. Only a restore
	// that replays changes needs it.
	Etcd string

	// replayed, when set, hears of each revision replayed and checked, before the next is
	// applied: the tests' way to make a replay slow.
	replayed func(rev int64)
}

// Restored says what was restored.
type Restored struct {
	Object string
	// Lineage is the lineage restored from.
	Lineage string
	// Revision is the revision the data dir holds: the snapshot's, or the last change
	// replayed after it.
	Revision int64
	// Time is when that revision was stored: the snapshot taken, or its change received by
	// the stream; zero when not known (chunks of format v1, a snapshot not named by this
	// package).
	Time time.Time
	// SnapshotRevision is the snapshot's revision, the chain's base.
	SnapshotRevision int64
	// Keys is how many keys the snapshot held.
	Keys int
	// Changes counts the chunks of changes replayed after the snapshot.
	Changes int
}

// Restore fetches a snapshot, checks it (Verify, and against the checksum and revision the
// store kept beside it) and writes a data dir from it as etcdutl snapshot restore does: a new
// cluster ID from the token and the initial cluster, the old membership dropped. A snapshot
// that fails a check is refused with an error wrapping ErrCorrupt.
//
// Everything comes from one lineage. For LatestName, the snapshot is the newest at or before
// the target revision or time, and the changes stored after it are replayed up to the target
// with the etcd binary o.Etcd (replay); a target they do not reach is refused with an error
// wrapping ErrGap that says where they stop.
func Restore(ctx context.Context, o RestoreOptions) (Restored, error) {
	if o.Revision != 0 && !o.Time.IsZero() {
		return Restored{}, fmt.Errorf("restore to revision %d or to time %s, not both", o.Revision, o.Time.Format(time.RFC3339Nano))
	}
	ls, lineage, name, err := locate(ctx, o)
	if err != nil {
		return Restored{}, err
	}
	var pit pointInTime
	if name == LatestName {
		if pit, err = planPointInTime(ctx, ls, o.Revision, o.Time); err != nil {
			return Restored{}, fmt.Errorf("lineage %s: %w", lineage, err)
		}
		name = pit.snapshot.Name
	} else if o.Revision != 0 || !o.Time.IsZero() {
		return Restored{}, fmt.Errorf("a restore to a revision or a time chooses its snapshot: name %q, not %s", LatestName, name)
	} else if obj, ok := parseName(name); ok {
		pit.time = obj.Time
	}
	where := ls.Where(name)
	f, err := os.CreateTemp(o.WorkDir, "restore-*.db")
	if err != nil {
		return Restored{}, err
	}
	defer os.Remove(f.Name())
	meta, err := ls.Fetch(ctx, name, f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Restored{}, err
	}
	v, err := Verify(f.Name())
	if err != nil {
		return Restored{}, fmt.Errorf("snapshot %s refused: %w", where, err)
	}
	if meta.SHA256 != "" && meta.SHA256 != v.SHA256 {
		return Restored{}, fmt.Errorf("snapshot %s refused: %w: its SHA-256 is %s, but it was stored as %s", where, ErrCorrupt, v.SHA256, meta.SHA256)
	}
	if meta.Revision != 0 && meta.Revision != v.Revision {
		return Restored{}, fmt.Errorf("snapshot %s refused: %w: it holds revision %d, but it was stored as %d", where, ErrCorrupt, v.Revision, meta.Revision)
	}
	err = snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath:        f.Name(),
		Name:                o.Member,
		OutputDataDir:       o.DataDir,
		PeerURLs:            []string{o.PeerURL},
		InitialCluster:      o.InitialCluster,
		InitialClusterToken: o.Token,
	})
	if err != nil {
		return Restored{}, fmt.Errorf("restore %s: %w", where, err)
	}
	r := Restored{Object: where, Lineage: lineage, Revision: v.Revision, SnapshotRevision: v.Revision, Keys: v.Keys, Time: pit.time}
	if pit.target > v.Revision {
		lo := o
		lo.Store = ls
		if err := replay(ctx, lo, v.Revision, pit); err != nil {
			// A half-replayed data dir must not start as the cluster's.
			os.RemoveAll(o.DataDir)
			return Restored{}, err
		}
		r.Revision, r.Changes = pit.target, len(pit.deltas)
	}
	return r, nil
}

// locate is the lineage a restore reads, its store, and the snapshot's name in it (or
// LatestName).
func locate(ctx context.Context, o RestoreOptions) (Store, string, string, error) {
	lineage, name := o.Lineage, o.Name
	if o.Lineage != "" && !ValidLineage(o.Lineage) {
		return nil, "", "", fmt.Errorf("lineage %q is not an etcd cluster ID in hex, nor %q", o.Lineage, LegacyLineage)
	}
	if in, ok := strings.CutPrefix(name, lineageDir); ok {
		id, rest, _ := strings.Cut(in, "/")
		if !ValidLineage(id) || id == LegacyLineage || rest == "" || strings.Contains(rest, "/") || lineage != "" && lineage != id {
			return nil, "", "", fmt.Errorf("snapshot %q: want %s<lineage>/<name>, of lineage %q if one is named", name, lineageDir, lineage)
		}
		lineage, name = id, rest
	}
	switch {
	case lineage != "":
	case name == LatestName:
		var err error
		if lineage, err = defaultLineage(ctx, o.Store); err != nil {
			return nil, "", "", err
		}
	default:
		var err error
		if lineage, err = lineageHolding(ctx, o.Store, name); err != nil {
			return nil, "", "", err
		}
	}
	return LineageStore(o.Store, lineage), lineage, name, nil
}

// lineageHolding is the one lineage with a snapshot of that name; the legacy lineage (the
// destination's root, where a name is any object's) when none has one.
func lineageHolding(ctx context.Context, root Store, name string) (string, error) {
	ids, err := root.Dirs(ctx, lineageDir)
	if err != nil {
		return "", err
	}
	var in []string
	for _, id := range ids {
		if !ValidLineage(id) {
			continue
		}
		objs, err := LineageStore(root, id).List(ctx)
		if err != nil {
			return "", err
		}
		if slices.ContainsFunc(objs, func(o Object) bool { return o.Name == name }) {
			in = append(in, id)
		}
	}
	switch len(in) {
	case 0:
		return LegacyLineage, nil
	case 1:
		return in[0], nil
	}
	return "", fmt.Errorf("snapshot %s is in lineages %s: name the lineage", name, strings.Join(in, ", "))
}
