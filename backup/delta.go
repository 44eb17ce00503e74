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
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"
)

// Delta is one stored chunk of changes: the events of revisions First to Last, every one of
// them, in a chain that starts after the full snapshot of revision Base. etcd's revisions are
// dense (each has at least one event), so a chain is whole when each chunk starts at or before
// the revision after the one before's Last, the first at Base+1. Chunks may overlap (two
// writers of one lineage for a moment: they store the same revisions); a restore checks that
// what they both hold agrees (agree).
type Delta struct {
	Name              string
	Base, First, Last int64
	// FirstTime and LastTime are when the stream received revisions First and Last (to the
	// millisecond, on its clock), read from the name; zero for a chunk of format v1, which
	// carries no time.
	FirstTime, LastTime time.Time
	Size                int64
}

// deltaDir holds the chains, one directory per base revision, below the lineage's root.
const deltaDir = "deltas/"

// Revisions are written with 19 digits, the most an int64 has, so that a listing's name
// order is revision order. A chunk of format v2 names the times of its first and last
// revision after them.
var deltaPattern = regexp.MustCompile(`^deltas/(\d{19})/(\d{19})-(\d{19})(?:\.(\d{8}T\d{6}\.\d{3}Z)-(\d{8}T\d{6}\.\d{3}Z))?\.delta$`)

// deltaTimeLayout is a revision's time in a chunk's name: UTC, to the millisecond, sorting as
// it reads.
const deltaTimeLayout = "20060102T150405.000Z"

// DeltaName is the name of the chunk of revisions first to last in the chain after base, in
// format v1 (without times).
func DeltaName(base, first, last int64) string {
	return fmt.Sprintf("%s%019d/%019d-%019d.delta", deltaDir, base, first, last)
}

// deltaNameAt is the name of a chunk of format v2, whose first and last revisions were
// received at tFirst and tLast.
func deltaNameAt(base, first, last int64, tFirst, tLast time.Time) string {
	return fmt.Sprintf("%s%019d/%019d-%019d.%s-%s.delta", deltaDir, base, first, last,
		tFirst.UTC().Format(deltaTimeLayout), tLast.UTC().Format(deltaTimeLayout))
}

// parseDeltaName reads a chunk's revisions (and times) from its name; false for any other name.
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
	d := Delta{Name: name, Base: revs[0], First: revs[1], Last: revs[2]}
	if m[4] != "" {
		var err1, err2 error
		d.FirstTime, err1 = time.Parse(deltaTimeLayout, m[4])
		d.LastTime, err2 = time.Parse(deltaTimeLayout, m[5])
		if err1 != nil || err2 != nil || d.LastTime.Before(d.FirstTime) {
			return Delta{}, false
		}
	}
	return d, true
}

// ErrGap marks a chain of changes with a revision missing: what follows the gap cannot be
// applied.
var ErrGap = errors.New("gap in the stored changes")

// ErrConflict marks two stored chunks that hold one revision differently: one of them is not
// what the cluster did, and a restore across them is refused.
var ErrConflict = errors.New("stored chunks disagree")

// chain returns the chunks after base that reach furthest, in order: the first starts right
// after base, and each starts at or before the revision after the one before ended, so that
// together they hold every revision from base+1 on; where chunks overlap, the one reaching
// furthest is taken. What comes after the last revision reached, if anything, lies after a
// gap, returned as an error wrapping ErrGap beside the whole part before it.
func chain(deltas []Delta, base int64) ([]Delta, error) {
	var cands []Delta
	for _, d := range deltas {
		if d.Base == base {
			cands = append(cands, d)
		}
	}
	slices.SortFunc(cands, func(a, b Delta) int {
		return cmp.Or(cmp.Compare(a.First, b.First), cmp.Compare(b.Last, a.Last), strings.Compare(a.Name, b.Name))
	})
	var out []Delta
	reach, i := base, 0
	for {
		best := -1
		for ; i < len(cands) && cands[i].First <= reach+1; i++ {
			if cands[i].Last > reach && (best < 0 || cands[i].Last > cands[best].Last) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		out = append(out, cands[best])
		reach = cands[best].Last
	}
	if i < len(cands) {
		d := cands[i]
		return out, fmt.Errorf("%w: the chain after revision %d needs revision %d next, but %s starts at %d", ErrGap, base, reach+1, d.Name, d.First)
	}
	return out, nil
}

// Magic strings start every chunk: its format, for a reader to refuse another. v1 holds
// events; v2 also the time the stream received each revision.
const (
	deltaMagic   = "etcdops-delta-v1\n"
	deltaMagicV2 = "etcdops-delta-v2\n"
)

// encodeDelta writes the events of whole revisions as a chunk of format v2: the magic, then
// for each revision the time it was received (Unix milliseconds, varint), its number of
// events (uvarint) and each event (mvccpb.Event, protobuf) after its length (uvarint). at
// holds one time per revision, in order. It returns the SHA-256 of what it wrote.
func encodeDelta(w io.Writer, events []*mvccpb.Event, at []time.Time) (string, error) {
	h := sha256.New()
	bw := bufio.NewWriter(io.MultiWriter(w, h))
	bw.WriteString(deltaMagicV2)
	var n [binary.MaxVarintLen64]byte
	for i, r := 0, 0; i < len(events); r++ {
		rev := events[i].GetKv().GetModRevision()
		j := i
		for j < len(events) && events[j].GetKv().GetModRevision() == rev {
			j++
		}
		if r >= len(at) {
			return "", fmt.Errorf("no time for revision %d", rev)
		}
		bw.Write(n[:binary.PutVarint(n[:], at[r].UnixMilli())])
		bw.Write(n[:binary.PutUvarint(n[:], uint64(j-i))])
		for _, ev := range events[i:j] {
			b, err := proto.Marshal(ev)
			if err != nil {
				return "", err
			}
			bw.Write(n[:binary.PutUvarint(n[:], uint64(len(b)))])
			bw.Write(b)
		}
		i = j
	}
	if err := bw.Flush(); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// maxEventBytes bounds one event as read back: etcd's own request limit is far below it.
const maxEventBytes = 64 << 20

// chunk is a chunk read back: its events and, for format v2, when each revision was received.
type chunk struct {
	events []*mvccpb.Event
	// times maps each revision to its time; nil for format v1.
	times map[int64]time.Time
}

// decodeDelta reads a chunk's events back (readDelta).
func decodeDelta(data []byte, d Delta, sha string) ([]*mvccpb.Event, error) {
	c, err := readDelta(data, d, sha)
	return c.events, err
}

// readDelta reads a chunk back, of either format, and checks it against the name it was
// stored under and the checksum stored beside it: every revision from first to last present,
// in order, and no other; for v2, the times of its first and last revision as its name says.
// A chunk that fails is refused with an error wrapping ErrCorrupt or ErrGap.
func readDelta(data []byte, d Delta, sha string) (chunk, error) {
	if sum := sha256.Sum256(data); sha != "" && hex.EncodeToString(sum[:]) != sha {
		return chunk{}, fmt.Errorf("%w: %s: its SHA-256 is %x, but it was stored as %s", ErrCorrupt, d.Name, sum, sha)
	}
	var c chunk
	rest, v1 := bytes.CutPrefix(data, []byte(deltaMagic))
	if !v1 {
		var ok bool
		if rest, ok = bytes.CutPrefix(data, []byte(deltaMagicV2)); !ok {
			return chunk{}, fmt.Errorf("%w: %s is not a chunk of changes", ErrCorrupt, d.Name)
		}
		c.times = map[int64]time.Time{}
	}
	truncated := fmt.Errorf("%w: %s is truncated", ErrCorrupt, d.Name)
	last := d.First - 1
	// left counts the events of the current revision still to read (v2); fresh is true at
	// its first.
	var left uint64
	var at time.Time
	fresh := false
	for len(rest) > 0 {
		if !v1 && left == 0 {
			ms, n := binary.Varint(rest)
			if n <= 0 {
				return chunk{}, truncated
			}
			cnt, m := binary.Uvarint(rest[n:])
			if m <= 0 || cnt == 0 {
				return chunk{}, truncated
			}
			rest, left, at, fresh = rest[n+m:], cnt, time.UnixMilli(ms).UTC(), true
			if len(rest) == 0 {
				return chunk{}, truncated
			}
		}
		size, n := binary.Uvarint(rest)
		if n <= 0 || size > maxEventBytes || uint64(len(rest)-n) < size {
			return chunk{}, truncated
		}
		ev := &mvccpb.Event{}
		if err := proto.Unmarshal(rest[n:n+int(size)], ev); err != nil {
			return chunk{}, fmt.Errorf("%w: %s: %v", ErrCorrupt, d.Name, err)
		}
		rest = rest[n+int(size):]
		rev := ev.GetKv().GetModRevision()
		if rev != last && rev != last+1 || rev == last && len(c.events) == 0 {
			return chunk{}, fmt.Errorf("%w: %s: revision %d follows %d", ErrGap, d.Name, rev, last)
		}
		if !v1 {
			// A revision's events all come under its one time, and each time starts a revision.
			if fresh == (rev == last) {
				return chunk{}, fmt.Errorf("%w: %s: revision %d is not one group of events under one time", ErrCorrupt, d.Name, rev)
			}
			c.times[rev] = at
			left, fresh = left-1, false
		}
		last = rev
		c.events = append(c.events, ev)
	}
	if left > 0 {
		return chunk{}, truncated
	}
	if last != d.Last {
		return chunk{}, fmt.Errorf("%w: %s ends at revision %d, its name says %d", ErrGap, d.Name, last, d.Last)
	}
	if !v1 && (!c.times[d.First].Equal(d.FirstTime) || !c.times[d.Last].Equal(d.LastTime)) {
		return chunk{}, fmt.Errorf("%w: %s: its revisions were received at %s and %s, its name says %s and %s", ErrCorrupt, d.Name,
			c.times[d.First].Format(time.RFC3339Nano), c.times[d.Last].Format(time.RFC3339Nano), d.FirstTime.Format(time.RFC3339Nano), d.LastTime.Format(time.RFC3339Nano))
	}
	return c, nil
}

// agree checks two chunks replayed one after the other: the revisions both hold (where
// next starts at or before prev's last) must be the same changes. Two writers of one lineage
// store what the same watch of the same cluster sent, so they agree; chunks that do not are
// refused naming both.
func agree(s Store, prev *Delta, prevEvents []*mvccpb.Event, next Delta, events []*mvccpb.Event) error {
	if prev == nil || next.First > prev.Last {
		return nil
	}
	i := slices.IndexFunc(prevEvents, func(ev *mvccpb.Event) bool { return ev.GetKv().GetModRevision() >= next.First })
	if i < 0 {
		i = len(prevEvents)
	}
	tail := prevEvents[i:]
	for k, ev := range tail {
		if k >= len(events) || !proto.Equal(ev, events[k]) {
			return fmt.Errorf("%w: %s and %s both hold revision %d, but not the same changes", ErrConflict, s.Where(prev.Name), s.Where(next.Name), ev.GetKv().GetModRevision())
		}
	}
	if k := len(tail); k < len(events) && events[k].GetKv().GetModRevision() <= prev.Last {
		return fmt.Errorf("%w: %s and %s both hold revision %d, but not the same changes", ErrConflict, s.Where(prev.Name), s.Where(next.Name), events[k].GetKv().GetModRevision())
	}
	return nil
}
