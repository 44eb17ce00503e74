package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// ErrTimeOutside: a time to restore to before the earliest point stored or after the newest.
var ErrTimeOutside = errors.New("time outside what is stored")

// pointInTime is what a restore to a revision applies: the newest snapshot at or before the
// target, and the chunks after it that reach the target. time is when the target was stored
// (the snapshot taken, or its change received); zero when not known (chunks of format v1).
type pointInTime struct {
	snapshot Object
	deltas   []Delta
	target   int64
	time     time.Time
}

// planPointInTime chooses, in one lineage s, the snapshot and chunks that restore target, or
// the last revision stored at or before at, or, for neither, the newest change stored. A
// target the chunks do not reach without a gap is refused with an error wrapping ErrGap that
// names where each candidate chain stops; a time outside what is stored, with one wrapping
// ErrTimeOutside that names what is.
func planPointInTime(ctx context.Context, s Store, target int64, at time.Time) (pointInTime, error) {
	objs, err := s.List(ctx)
	if err != nil {
		return pointInTime{}, err
	}
	if len(objs) == 0 {
		return pointInTime{}, fmt.Errorf("%w: no snapshot in %s", ErrNotFound, s.Where(""))
	}
	deltas, err := s.ListDeltas(ctx)
	if err != nil {
		return pointInTime{}, err
	}
	// Newest snapshot first by revision; among equal revisions, the newest by time.
	newestFirst(objs)
	slices.SortStableFunc(objs, func(a, b Object) int { return int(b.Revision - a.Revision) })
	r := reachable(objs, deltas)
	var atTime time.Time
	if !at.IsZero() {
		if target, atTime, err = revisionAt(ctx, s, r, at); err != nil {
			return pointInTime{}, err
		}
	}
	if target == 0 {
		for _, o := range objs {
			target = max(target, o.Revision, wholeEnd(r.chains[o.Revision], o.Revision))
		}
	}
	var stops []string
	for _, o := range objs {
		if o.Revision > target {
			continue
		}
		c := r.chains[o.Revision]
		if end := wholeEnd(c, o.Revision); end < target {
			stops = append(stops, fmt.Sprintf("after snapshot %s (revision %d) the stored changes stop at revision %d", o.Name, o.Revision, end))
			continue
		}
		var use []Delta
		for _, d := range c {
			if d.First <= target {
				use = append(use, d)
			}
		}
		p := pointInTime{snapshot: o, deltas: use, target: target, time: atTime}
		if p.time.IsZero() {
			if p.time, err = timeOf(ctx, s, p); err != nil {
				return pointInTime{}, err
			}
		}
		return p, nil
	}
	if len(stops) == 0 {
		return pointInTime{}, fmt.Errorf("%w: no snapshot at or before revision %d in %s", ErrNotFound, target, s.Where(""))
	}
	return pointInTime{}, fmt.Errorf("%w: revision %d cannot be reached: %s", ErrGap, target, stops[0])
}

// wholeEnd is the last revision chain c after base reaches; base when it is empty.
func wholeEnd(c []Delta, base int64) int64 {
	if len(c) == 0 {
		return base
	}
	return c[len(c)-1].Last
}

// revisionAt is the last revision stored at or before at that a restore reaches in r, and
// when it was stored: the highest revision among the snapshots taken at or before at and the
// changes received at or before it. Only a chunk that straddles at is read, to find the
// revision within it. A time before the earliest point or after the newest is refused,
// naming both: before, nothing is stored; after, what the cluster did is not known.
func revisionAt(ctx context.Context, s Store, r reach, at time.Time) (int64, time.Time, error) {
	var best, first, last Point
	consider := func(p Point) {
		if p.Time.IsZero() {
			return
		}
		if first.Time.IsZero() || p.Time.Before(first.Time) {
			first = p
		}
		if p.Time.After(last.Time) || p.Time.Equal(last.Time) && p.Revision > last.Revision {
			last = p
		}
		if !p.Time.After(at) && p.Revision > best.Revision {
			best = p
		}
	}
	for _, o := range r.snapshots {
		consider(Point{Revision: o.Revision, Time: storedBy(o)})
	}
	var straddling []Delta
	for _, c := range r.chains {
		for _, d := range c {
			consider(Point{Revision: d.First, Time: d.FirstTime})
			consider(Point{Revision: d.Last, Time: d.LastTime})
			if !d.FirstTime.IsZero() && !d.FirstTime.After(at) && d.LastTime.After(at) && d.Last > best.Revision {
				straddling = append(straddling, d)
			}
		}
	}
	stored := fmt.Sprintf("%s holds %s (revision %d) to %s (revision %d)", s.Where(""),
		first.Time.Format(time.RFC3339Nano), first.Revision, last.Time.Format(time.RFC3339Nano), last.Revision)
	switch {
	case first.Time.IsZero():
		return 0, time.Time{}, fmt.Errorf("%w: nothing in %s says when it was stored", ErrTimeOutside, s.Where(""))
	case at.Before(first.Time):
		return 0, time.Time{}, fmt.Errorf("%w: %s is before anything stored: %s", ErrTimeOutside, at.Format(time.RFC3339Nano), stored)
	case at.After(last.Time):
		return 0, time.Time{}, fmt.Errorf("%w: %s is after the newest change stored, so what the cluster held then is not known: %s", ErrTimeOutside, at.Format(time.RFC3339Nano), stored)
	}
	for _, d := range straddling {
		c, err := fetchChunk(ctx, s, d)
		if err != nil {
			return 0, time.Time{}, err
		}
		for rev, t := range c.times {
			if !t.After(at) && rev > best.Revision {
				best = Point{Revision: rev, Time: t}
			}
		}
	}
	return best.Revision, best.Time, nil
}

// storedBy is a time by which snapshot o's revision was surely stored: its name keeps only
// the second of a time taken after the snapshot was read, so the end of that second. Its
// start would count a snapshot read later in the second as stored at a time within it,
// and a restore to that time would hold writes made after it.
func storedBy(o Object) time.Time { return o.Time.Add(time.Second) }

// timeOf is when p's target was stored: the snapshot's time, or the time its chunk says
// (read from the chunk when the target is not its last revision); zero when the chunk is of
// format v1.
func timeOf(ctx context.Context, s Store, p pointInTime) (time.Time, error) {
	if p.target == p.snapshot.Revision {
		return p.snapshot.Time, nil
	}
	for _, d := range slices.Backward(p.deltas) {
		switch {
		case d.First > p.target || d.Last < p.target:
			continue
		case d.LastTime.IsZero():
			return time.Time{}, nil
		case d.Last == p.target:
			return d.LastTime, nil
		}
		c, err := fetchChunk(ctx, s, d)
		if err != nil {
			return time.Time{}, err
		}
		return c.times[p.target], nil
	}
	return time.Time{}, nil
}

// fetchChunk fetches and reads one chunk.
func fetchChunk(ctx context.Context, s Store, d Delta) (chunk, error) {
	var buf bytes.Buffer
	meta, err := s.Fetch(ctx, d.Name, &buf)
	if err != nil {
		return chunk{}, err
	}
	c, err := readDelta(buf.Bytes(), d, meta.SHA256)
	if err != nil {
		return chunk{}, fmt.Errorf("changes %s refused: %w", s.Where(d.Name), err)
	}
	return c, nil
}
