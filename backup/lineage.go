package backup

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"
)

// A lineage is one incarnation of a cluster: everything one etcd cluster ID stored. Its
// snapshots, its chains of changes (deltas/), its manifest and its writer's claim go below
// lineages/<cluster ID in hex>/ of the destination. Revisions are one history only within a
// lineage: a cluster restored to an earlier revision is a new cluster ID, and numbers the
// revisions after it again, so that "revision N" and "the newest" mean something only in one
// lineage. What an older release stored directly below the prefix reads as one lineage of its
// own, LegacyLineage; nothing new is written there.

const (
	lineageDir = "lineages/"
	// LegacyLineage names the objects stored directly below the prefix, before lineages.
	LegacyLineage = "legacy"
	// manifestName says which cluster a lineage is and where it came from (Manifest).
	manifestName = "lineage.json"
	// claimName is the writer claim of the lineage's continuous backup (Claim).
	claimName = "writer.json"
	// maxSmallObject bounds a manifest or a claim read back.
	maxSmallObject = 64 << 10
)

var lineagePattern = regexp.MustCompile(`^[0-9a-f]{1,16}$`)

// ValidLineage reports whether id names a lineage: an etcd cluster ID in lower-case hex, or
// LegacyLineage.
func ValidLineage(id string) bool { return id == LegacyLineage || lineagePattern.MatchString(id) }

// LineageStore is the store of lineage id below the destination root.
func LineageStore(root Store, id string) Store {
	if id == LegacyLineage {
		return root
	}
	return root.Sub(lineageDir + id + "/")
}

// LineageOf is the lineage of an etcd cluster ID.
func LineageOf(clusterID uint64) string { return fmt.Sprintf("%x", clusterID) }

// Manifest is what a lineage says of itself, written by its first writer.
type Manifest struct {
	// Cluster is the EtcdCluster that wrote it.
	Cluster ClusterRef `json:"cluster"`
	// ClusterID is etcd's cluster ID, hex: the lineage's name.
	ClusterID string `json:"clusterID"`
	// Created is when the lineage's first writer started, on its clock.
	Created time.Time `json:"created"`
	// RestoredFrom, for a cluster restored from a backup, is what it was restored from.
	RestoredFrom *Parent `json:"restoredFrom,omitempty"`
}

// ClusterRef names an EtcdCluster.
type ClusterRef struct {
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
}

// Parent is the point a restored cluster started from.
type Parent struct {
	// Lineage is the lineage restored from (of the destination restored from).
	Lineage string `json:"lineage,omitempty"`
	// Revision and Time are the point restored; Time is zero when unknown.
	Revision int64     `json:"revision"`
	Time     time.Time `json:"time,omitzero"`
}

// putJSON stores v as JSON under name.
func putJSON(ctx context.Context, s Store, name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.Put(ctx, name, bytes.NewReader(b), int64(len(b)), Meta{})
}

// getJSON reads object name into v; a missing one is an error wrapping ErrNotFound.
func getJSON(ctx context.Context, s Store, name string, v any) error {
	var buf bytes.Buffer
	if _, err := s.Fetch(ctx, name, &limitedBuffer{buf: &buf, left: maxSmallObject}); err != nil {
		return err
	}
	if err := json.Unmarshal(buf.Bytes(), v); err != nil {
		return fmt.Errorf("%s: %w", s.Where(name), err)
	}
	return nil
}

// limitedBuffer refuses to hold more than left bytes.
type limitedBuffer struct {
	buf  *bytes.Buffer
	left int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if len(p) > l.left {
		return 0, errors.New("object too large")
	}
	l.left -= len(p)
	return l.buf.Write(p)
}

// ensureManifest writes m as the lineage's manifest when it has none, or when m says where
// the cluster was restored from and the stored one does not (its first writer started before
// it was told).
func ensureManifest(ctx context.Context, ls Store, m Manifest) error {
	var have Manifest
	err := getJSON(ctx, ls, manifestName, &have)
	switch {
	case err == nil && (have.RestoredFrom != nil || m.RestoredFrom == nil):
		return nil
	case err == nil:
		m.Created = have.Created
	case !errors.Is(err, ErrNotFound):
		return fmt.Errorf("lineage manifest: %w", err)
	}
	if err := putJSON(ctx, ls, manifestName, m); err != nil {
		return fmt.Errorf("lineage manifest: %w", err)
	}
	return nil
}

// LineageInfo is one lineage as stored.
type LineageInfo struct {
	ID string `json:"lineage"`
	// Manifest is nil for the legacy lineage, or one whose manifest is missing.
	Manifest  *Manifest `json:"manifest,omitempty"`
	Snapshots int       `json:"snapshots"`
	Chunks    int       `json:"chunks"`
	// First and Last are the earliest and the newest point a restore reaches: the oldest
	// snapshot, and the newest revision a chain reaches without a gap. A time is zero when
	// unknown (chunks of format v1).
	First Point `json:"first"`
	Last  Point `json:"last"`
	// Earliest and Newest are the earliest and newest time of any point a restore reaches.
	Earliest time.Time `json:"earliest,omitzero"`
	Newest   time.Time `json:"newest,omitzero"`
}

// Point is a revision and when it was stored: a snapshot's time is when it was taken, a
// change's when the stream received it.
type Point struct {
	Revision int64     `json:"revision"`
	Time     time.Time `json:"time,omitzero"`
}

// ListLineages lists the lineages of the destination root, the legacy one first if it holds
// a snapshot, then by the time of their newest point, newest last.
func ListLineages(ctx context.Context, root Store) ([]LineageInfo, error) {
	ids, err := root.Dirs(ctx, lineageDir)
	if err != nil {
		return nil, err
	}
	var out []LineageInfo
	for _, id := range append([]string{LegacyLineage}, ids...) {
		if !ValidLineage(id) {
			continue
		}
		li, err := describe(ctx, LineageStore(root, id), id)
		if err != nil {
			return nil, err
		}
		if id == LegacyLineage && li.Snapshots == 0 {
			continue
		}
		out = append(out, li)
	}
	slices.SortStableFunc(out, func(a, b LineageInfo) int {
		if (a.ID == LegacyLineage) != (b.ID == LegacyLineage) {
			if a.ID == LegacyLineage {
				return -1
			}
			return 1
		}
		return cmp.Or(a.Newest.Compare(b.Newest), cmp.Compare(a.ID, b.ID))
	})
	return out, nil
}

// describe reads one lineage's manifest and listings.
func describe(ctx context.Context, ls Store, id string) (LineageInfo, error) {
	li := LineageInfo{ID: id}
	if id != LegacyLineage {
		var m Manifest
		switch err := getJSON(ctx, ls, manifestName, &m); {
		case err == nil:
			li.Manifest = &m
		case !errors.Is(err, ErrNotFound):
			return LineageInfo{}, err
		}
	}
	objs, err := ls.List(ctx)
	if err != nil {
		return LineageInfo{}, err
	}
	deltas, err := ls.ListDeltas(ctx)
	if err != nil {
		return LineageInfo{}, err
	}
	li.Snapshots, li.Chunks = len(objs), len(deltas)
	reach := reachable(objs, deltas)
	for i, p := range reach.points() {
		if i == 0 || p.Revision < li.First.Revision {
			li.First = p
		}
		if p.Revision > li.Last.Revision || p.Revision == li.Last.Revision && p.Time.After(li.Last.Time) {
			li.Last = p
		}
		if !p.Time.IsZero() && (li.Earliest.IsZero() || p.Time.Before(li.Earliest)) {
			li.Earliest = p.Time
		}
		li.Newest = later(li.Newest, p.Time)
	}
	return li, nil
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// reach is what a restore can reach in one lineage: its snapshots, and after each the chunks
// of its chain up to the first gap.
type reach struct {
	snapshots []Object
	chains    map[int64][]Delta
}

func reachable(objs []Object, deltas []Delta) reach {
	r := reach{snapshots: objs, chains: map[int64][]Delta{}}
	for _, o := range objs {
		if _, ok := r.chains[o.Revision]; !ok {
			r.chains[o.Revision], _ = chain(deltas, o.Revision) // a gap only bounds the chain
		}
	}
	return r
}

// points are the snapshots and the first and last revision of every chunk reached.
func (r reach) points() []Point {
	var out []Point
	for _, o := range r.snapshots {
		out = append(out, Point{Revision: o.Revision, Time: o.Time})
	}
	for _, c := range r.chains {
		for _, d := range c {
			out = append(out, Point{Revision: d.First, Time: d.FirstTime}, Point{Revision: d.Last, Time: d.LastTime})
		}
	}
	return out
}

// defaultLineage is the lineage "latest" restores when none is named: the one whose newest
// point is the newest by time. Revision numbers are no guide: a restored cluster numbers its
// revisions again from the one it was restored to.
func defaultLineage(ctx context.Context, root Store) (string, error) {
	ls, err := ListLineages(ctx, root)
	if err != nil {
		return "", err
	}
	id, ok := LatestLineage(ls)
	if !ok {
		return "", fmt.Errorf("%w: no snapshot in any lineage of %s", ErrNotFound, root.Where(""))
	}
	return id, nil
}

// LatestLineage is, of ls, the lineage a restore of "latest" without a lineage named reads:
// of those with a snapshot, the one whose newest point is the newest by time.
func LatestLineage(ls []LineageInfo) (string, bool) {
	best := -1
	for i, l := range ls {
		if l.Snapshots > 0 && (best < 0 || !l.Newest.Before(ls[best].Newest)) {
			best = i
		}
	}
	if best < 0 {
		return "", false
	}
	return ls[best].ID, true
}

// Claim is the writer claim of a lineage's continuous backup: the newest claim wins, and a
// writer that finds another's claim stores nothing more.
type Claim struct {
	// Writer names the writer for people: its pod.
	Writer string `json:"writer"`
	// ID is the writer's own, random: two writers of one name are told apart.
	ID    string    `json:"id"`
	Since time.Time `json:"since"`
}

func (c Claim) String() string {
	return fmt.Sprintf("%s (writer %s, since %s)", c.Writer, c.ID, c.Since.UTC().Format(time.RFC3339))
}

// ErrSuperseded: another writer claimed the lineage after this one; this one must not store.
var ErrSuperseded = errors.New("superseded by another writer of the lineage")

// SupersededError is ErrSuperseded with the claim that superseded: By claimed Where after Me.
type SupersededError struct {
	By, Me Claim
	Where  string
}

func (e *SupersededError) Error() string {
	return fmt.Sprintf("%v: %s claimed %s after this stream, %s", ErrSuperseded, e.By, e.Where, e.Me)
}

func (e *SupersededError) Unwrap() error { return ErrSuperseded }

// claim makes c the lineage's writer: whatever claim was there is superseded. It reads the
// claim back, so that of two writers claiming at once the one whose claim stays knows it.
// It returns the claim it replaced, if any.
func claim(ctx context.Context, ls Store, c Claim) (*Claim, error) {
	var prev Claim
	err := getJSON(ctx, ls, claimName, &prev)
	switch {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		return nil, fmt.Errorf("writer claim: %w", err)
	}
	if err := putJSON(ctx, ls, claimName, c); err != nil {
		return nil, fmt.Errorf("writer claim: %w", err)
	}
	if err := checkClaim(ctx, ls, c); err != nil {
		return nil, err
	}
	if prev.ID == "" {
		return nil, nil
	}
	return &prev, nil
}

// checkClaim returns a *SupersededError, naming the claim's holder, when the
// lineage's claim is another writer's. A claim deleted (by a person) is made again.
func checkClaim(ctx context.Context, ls Store, me Claim) error {
	var c Claim
	err := getJSON(ctx, ls, claimName, &c)
	switch {
	case errors.Is(err, ErrNotFound):
		if err := putJSON(ctx, ls, claimName, me); err != nil {
			return fmt.Errorf("writer claim: %w", err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("writer claim: %w", err)
	case c.ID != me.ID:
		return &SupersededError{By: c, Me: me, Where: ls.Where("")}
	}
	return nil
}
