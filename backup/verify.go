package backup

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"go.uber.org/zap"
)

// ErrCorrupt marks a snapshot that must not be restored: truncated, its checksum wrong, or
// not an etcd database.
var ErrCorrupt = errors.New("corrupt snapshot")

// Verified is what a snapshot file was checked to hold.
type Verified struct {
	Size int64
	// SHA256 is the checksum of the database, hex, as etcd appended it to the snapshot.
	SHA256   string
	Revision int64
	Keys     int
}

// sectorSize: etcd's database is whole 512-byte sectors; its snapshot appends a SHA-256.
const sectorSize = 512

// Verify checks the snapshot file at path as etcdutl snapshot restore would before using it:
// a database of whole sectors followed by its SHA-256, the checksum matching, and a database
// that bbolt reads without error. It returns the revision the database holds.
func Verify(path string) (Verified, error) {
	f, err := os.Open(path)
	if err != nil {
		return Verified{}, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return Verified{}, err
	}
	size := info.Size()
	if size < sectorSize+sha256.Size || size%sectorSize != sha256.Size {
		return Verified{}, fmt.Errorf("%w: %d bytes is not a database of whole %d-byte sectors followed by its %d-byte SHA-256: truncated, or not an etcd snapshot",
			ErrCorrupt, size, sectorSize, sha256.Size)
	}
	h := sha256.New()
	if _, err := io.CopyN(h, f, size-sha256.Size); err != nil {
		return Verified{}, err
	}
	want := make([]byte, sha256.Size)
	if _, err := io.ReadFull(f, want); err != nil {
		return Verified{}, err
	}
	if got := h.Sum(nil); !bytes.Equal(got, want) {
		return Verified{}, fmt.Errorf("%w: the database's SHA-256 is %x, the snapshot says %x", ErrCorrupt, got, want)
	}
	st, err := snapshot.NewV3(zap.NewNop()).Status(path)
	if err != nil {
		return Verified{}, fmt.Errorf("%w: not a readable etcd database: %v", ErrCorrupt, err)
	}
	compacted, err := compactedRevision(path)
	if err != nil {
		return Verified{}, fmt.Errorf("%w: not a readable etcd database: %v", ErrCorrupt, err)
	}
	// The newest key revision undercounts when the last changes were deletions that a
	// compaction since removed; an empty store is at revision 1, as etcd reports it.
	return Verified{Size: size, SHA256: hex.EncodeToString(want), Revision: max(st.Revision, compacted, 1), Keys: st.TotalKey}, nil
}

// compactedRevision is the revision the database was last compacted at, 0 if never.
func compactedRevision(path string) (int64, error) {
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true})
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var rev int64
	err = db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(schema.Meta.Name()); b != nil {
			if v := b.Get(schema.FinishedCompactKeyName); len(v) > 0 {
				rev = mvcc.BytesToRev(v).Main
			}
		}
		return nil
	})
	return rev, err
}
