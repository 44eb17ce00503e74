package backup

import (
	"context"
	"fmt"
	"os"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
)

// RestoreOptions say which snapshot to restore and the member it becomes.
type RestoreOptions struct {
	Store Store
	// Name is the snapshot's name, or LatestName: then the snapshot and stored changes that
	// reach Revision, or the newest change stored when Revision is 0.
	Name     string
	Revision int64
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
	// Revision is the revision the data dir holds: the snapshot's, or the last change
	// replayed after it.
	Revision int64
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
// For LatestName, the snapshot is the newest at or before the target revision, and the
// changes stored after it are replayed up to the target with the etcd binary o.Etcd (replay);
// a target they do not reach is refused with an error wrapping ErrGap that says where they
// stop.
func Restore(ctx context.Context, o RestoreOptions) (Restored, error) {
	name := o.Name
	var pit pointInTime
	if name == LatestName {
		var err error
		if pit, err = planPointInTime(ctx, o.Store, o.Revision); err != nil {
			return Restored{}, err
		}
		name = pit.snapshot.Name
	} else if o.Revision != 0 {
		return Restored{}, fmt.Errorf("a restore to revision %d chooses its snapshot: name %q, not %s", o.Revision, LatestName, name)
	}
	where := o.Store.Where(name)
	f, err := os.CreateTemp(o.WorkDir, "restore-*.db")
	if err != nil {
		return Restored{}, err
	}
	defer os.Remove(f.Name())
	meta, err := o.Store.Fetch(ctx, name, f)
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
	r := Restored{Object: where, Revision: v.Revision, Keys: v.Keys}
	if pit.target > v.Revision {
		if err := replay(ctx, o, v.Revision, pit); err != nil {
			// A half-replayed data dir must not start as the cluster's.
			os.RemoveAll(o.DataDir)
			return Restored{}, err
		}
		r.Revision, r.Changes = pit.target, len(pit.deltas)
	}
	return r, nil
}
