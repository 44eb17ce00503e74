package backup

import (
	"bytes"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/server/v3/lease"
	"go.etcd.io/etcd/server/v3/lease/leasepb"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"google.golang.org/protobuf/proto"
)

// Leases during the replay. etcd revokes a lease whose TTL has run out, deleting its keys at a
// revision of its own; in the replay server that revision is not one of the stored changes, and
// every revision after it would shift. The replay server's leader refreshes every lease when it
// is elected, to its TTL from then, so a lease of the snapshot with a TTL shorter than the
// replay would expire there. Before the server starts, every lease record of the restored
// database is rewritten with etcd's largest TTL (lease.MaxLeaseTTL, 9e9 seconds: about 285
// years) and no remaining TTL; after it has stopped, the records are written back as they
// were. In between, no lease can expire, however slow the replay; no client of the replay
// grants or revokes one. The records are plain protobuf values in the "lease" bucket, the same
// in every supported release.

// pinnedLeases are the lease records of a data dir as the snapshot held them, by key.
type pinnedLeases map[string][]byte

// dbFile is the backend database of a data dir.
func dbFile(dataDir string) string { return filepath.Join(dataDir, "member", "snap", "db") }

// openDB opens a stopped data dir's database; the timeout bounds the wait for its lock.
func openDB(dataDir string) (*bolt.DB, error) {
	return bolt.Open(dbFile(dataDir), 0o600, &bolt.Options{Timeout: 10 * time.Second})
}

// pinLeases rewrites every lease of dataDir's database with the largest TTL and returns the
// records as they were.
func pinLeases(dataDir string) (pinnedLeases, error) {
	db, err := openDB(dataDir)
	if err != nil {
		return nil, fmt.Errorf("replay: open the restored database: %w", err)
	}
	defer db.Close()
	saved := pinnedLeases{}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(schema.Lease.Name())
		if b == nil {
			return nil
		}
		if err := b.ForEach(func(k, v []byte) error {
			saved[string(k)] = bytes.Clone(v)
			return nil
		}); err != nil {
			return err
		}
		for k, v := range saved {
			l := &leasepb.Lease{}
			if err := proto.Unmarshal(v, l); err != nil {
				return fmt.Errorf("%w: lease record %x: %v", ErrCorrupt, k, err)
			}
			pinned, err := proto.Marshal(&leasepb.Lease{ID: l.GetID(), TTL: lease.MaxLeaseTTL})
			if err != nil {
				return err
			}
			if err := b.Put([]byte(k), pinned); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("replay: pin the restored leases: %w", err)
	}
	return saved, nil
}

// ids are the pinned leases' IDs: the leases a replayed key may be put on.
func (p pinnedLeases) ids() map[int64]bool {
	out := make(map[int64]bool, len(p))
	for _, v := range p {
		l := &leasepb.Lease{}
		if proto.Unmarshal(v, l) == nil {
			out[l.GetID()] = true
		}
	}
	return out
}

// unpin writes the lease records of dataDir's stopped database back as the snapshot held them,
// after checking that the replay left the same leases and ended at revision target: the last
// check that nothing but the stored changes was applied.
func (p pinnedLeases) unpin(dataDir string, target int64) error {
	db, err := openDB(dataDir)
	if err != nil {
		return fmt.Errorf("replay: open the replayed database: %w", err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		if rev := newestRevision(tx); rev != target {
			return fmt.Errorf("%w: the replayed database holds revision %d, not %d", errReplayDiverged, rev, target)
		}
		b := tx.Bucket(schema.Lease.Name())
		var now []string
		if b != nil {
			if err := b.ForEach(func(k, _ []byte) error { now = append(now, string(k)); return nil }); err != nil {
				return err
			}
		}
		if want := slices.Sorted(maps.Keys(p)); !slices.Equal(now, want) {
			return fmt.Errorf("%w: the replay left %d leases, the snapshot held %d", errReplayDiverged, len(now), len(want))
		}
		for k, v := range p {
			if err := b.Put([]byte(k), v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	return nil
}

// newestRevision is the revision of the newest change in the key bucket, 0 for none.
func newestRevision(tx *bolt.Tx) int64 {
	b := tx.Bucket(schema.Key.Name())
	if b == nil {
		return 0
	}
	k, _ := b.Cursor().Last()
	if len(k) < len(mvcc.NewRevBytes()) {
		return 0
	}
	return mvcc.BytesToRev(k).Main
}
