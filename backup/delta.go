package backup

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"
)

// Delta is one stored chunk of changes: the events of revisions First to Last, every one of
// them, in a chain that starts after the full snapshot of revision Base. etcd's revisions are
// dense (each has at least one event), so a chain is whole when each chunk's First is the
// one before's Last+1 and the first chunk's First is Base+1.
type Delta struct {
	Name              string
	Base, First, Last int64
	Size              int64
}

// deltaDir holds the chains, one directory per base revision, below the store's prefix.
const deltaDir = "deltas/"

// Revisions are written with 19 digits, the most an int64 has, so that a listing's name
// order is revision order.
var deltaPattern = regexp.MustCompile(`^deltas/(\d{19})/(\d{19})-(\d{19})\.delta$`)

// DeltaName is the name of the chunk of revisions first to last in the chain after base.
func DeltaName(base, first, last int64) string {
	return fmt.Sprintf("%s%019d/%019d-%019d.delta", deltaDir, base, first, last)
}

// parseDeltaName reads a chunk's revisions from its name; false for any other name.
func parseDeltaName(name string) (Delta, bool) {
	m := deltaPattern.FindStringSubmatch(name)
	if m == nil {
		return Delta{}, false
	}
	var revs [3]int64
	for i := range revs {
		r, err := strconv.ParseInt(m[i+1], 10, 64)
		if err != nil {
			return Delta{}, false
		}
		revs[i] = r
	}
	if revs[1] <= revs[0] || revs[2] < revs[1] {
		return Delta{}, false
	}
	return Delta{Name: name, Base: revs[0], First: revs[1], Last: revs[2]}, true
}

// ErrGap marks a chain of changes with a revision missing: what follows the gap cannot be
// applied.
var ErrGap = errors.New("gap in the stored changes")

// chain returns the chunks after base in order, up to the first gap: each starts where the one
// before ended, the first right after base. A gap is returned as an error wrapping ErrGap,
// with the whole part before it.
func chain(deltas []Delta, base int64) ([]Delta, error) {
	var out []Delta
	for _, d := range deltas {
		if d.Base == base {
			out = append(out, d)
		}
	}
	slices.SortFunc(out, func(a, b Delta) int { return cmp.Compare(a.First, b.First) })
	next := base + 1
	for i, d := range out {
		if d.First != next {
			return out[:i], fmt.Errorf("%w: the chain after revision %d needs revision %d next, but %s starts at %d", ErrGap, base, next, d.Name, d.First)
		}
		next = d.Last + 1
	}
	return out, nil
}

// deltaMagic starts every chunk: its format, for a reader to refuse another.
const deltaMagic = "etcdops-delta-v1\n"

// encodeDelta writes events as a chunk: the magic, then each event (mvccpb.Event, protobuf)
// after its length (uvarint). It returns the SHA-256 of what it wrote.
func encodeDelta(w io.Writer, events []*mvccpb.Event) (string, error) {
	h := sha256.New()
	bw := bufio.NewWriter(io.MultiWriter(w, h))
	bw.WriteString(deltaMagic)
	var n [binary.MaxVarintLen64]byte
	for _, ev := range events {
		b, err := proto.Marshal(ev)
		if err != nil {
			return "", err
		}
		bw.Write(n[:binary.PutUvarint(n[:], uint64(len(b)))])
		bw.Write(b)
	}
	if err := bw.Flush(); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// maxEventBytes bounds one event as read back: etcd's own request limit is far below it.
const maxEventBytes = 64 << 20

// decodeDelta reads a chunk back and checks it against the name it was stored under and the
// checksum stored beside it: every revision from first to last present, in order, and no
// other. A chunk that fails is refused with an error wrapping ErrCorrupt.
func decodeDelta(data []byte, d Delta, sha string) ([]*mvccpb.Event, error) {
	if sum := sha256.Sum256(data); sha != "" && hex.EncodeToString(sum[:]) != sha {
		return nil, fmt.Errorf("%w: %s: its SHA-256 is %x, but it was stored as %s", ErrCorrupt, d.Name, sum, sha)
	}
	rest, ok := bytes.CutPrefix(data, []byte(deltaMagic))
	if !ok {
		return nil, fmt.Errorf("%w: %s is not a chunk of changes", ErrCorrupt, d.Name)
	}
	var events []*mvccpb.Event
	last := d.First - 1
	for len(rest) > 0 {
		size, n := binary.Uvarint(rest)
		if n <= 0 || size > maxEventBytes || uint64(len(rest)-n) < size {
			return nil, fmt.Errorf("%w: %s is truncated", ErrCorrupt, d.Name)
		}
		ev := &mvccpb.Event{}
		if err := proto.Unmarshal(rest[n:n+int(size)], ev); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, d.Name, err)
		}
		rest = rest[n+int(size):]
		rev := ev.GetKv().GetModRevision()
		if rev != last && rev != last+1 || rev == last && len(events) == 0 {
			return nil, fmt.Errorf("%w: %s: revision %d follows %d", ErrGap, d.Name, rev, last)
		}
		last = rev
		events = append(events, ev)
	}
	if last != d.Last {
		return nil, fmt.Errorf("%w: %s ends at revision %d, its name says %d", ErrGap, d.Name, last, d.Last)
	}
	return events, nil
}
