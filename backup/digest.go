package backup

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// digest is a drill's digest of one side's key space: SHA-256 over every key in key order,
// each as its name and value (each after its length), then its create and modification
// revisions, version and lease (varints). The lease counts only where a restore can carry it
// (a lease of the snapshot, else 0), so that a restored copy that holds what the cluster held
// has the very digest of the cluster.
type digest struct {
	h      hash.Hash
	leases map[int64]bool
	buf    []byte
}

func newDigest(leases map[int64]bool) *digest {
	return &digest{h: sha256.New(), leases: leases}
}

func (d *digest) add(kv *mvccpb.KeyValue) {
	lease := kv.Lease
	if !d.leases[lease] {
		lease = 0
	}
	b := d.buf[:0]
	b = binary.AppendUvarint(b, uint64(len(kv.Key)))
	b = append(b, kv.Key...)
	b = binary.AppendUvarint(b, uint64(len(kv.Value)))
	b = append(b, kv.Value...)
	for _, n := range []int64{kv.CreateRevision, kv.ModRevision, kv.Version, lease} {
		b = binary.AppendVarint(b, n)
	}
	d.h.Write(b)
	d.buf = b
}

func (d *digest) sum() string { return hex.EncodeToString(d.h.Sum(nil)) }
