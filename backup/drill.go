package backup

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/time/rate"

	"etcdops.dev/etcdops/backupresult"
	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/membership"
)

// A restore drill proves a backup by restoring it: the newest snapshot of the cluster's own
// lineage and its stored changes are restored as a real restore does (Restore, with the etcd
// binary of the cluster's image replaying the changes) into a scratch directory, the restored
// data dir is started with that etcd on loopback, and every key of it is compared with the
// live cluster at the same revision, page by page on both sides: the live side from a
// follower, serializably and at a bounded rate, as a backup reads. Nothing is written to the
// live cluster: its only calls are Status, a linearizable read of one key for its revision,
// and ranges.
//
// The revision compared is the one restored when the live cluster still serves it. A live
// cluster compacts its history, so when the restore took long enough for the compaction to
// pass it, the restored copy is brought forward: the changes stored since in the same chain are
// replayed on it, to a revision the live cluster still serves. When none reaches one (no
// continuous backup, or one behind the compaction), the copy is compared with the live cluster
// as it is now, key by key where that still says something: a key unchanged since the restored
// revision must be the same on both sides, and a key that existed then must be in the copy
// with the same create revision; a key changed or deleted since cannot be checked, and the
// drill says how many.

// DrillOptions say what a drill restores and which live cluster it compares with.
type DrillOptions struct {
	// Store is the destination; Lineage the cluster's own lineage (its etcd cluster ID in hex),
	// which the live members must answer for.
	Store   Store
	Lineage string
	// Endpoints are the live members' client URLs; a follower is read before the leader.
	Endpoints []string
	TLS       *etcdstate.TLS
	// Login is the etcd user it reads as while auth is on.
	Login membership.Login
	// WorkDir is the drill's scratch space: the restored data dir and the files fetched.
	WorkDir string
	// Etcd is the etcd server binary of the cluster's image: it replays the stored changes and
	// serves the restored copy.
	Etcd string
	// BytesPerSecond bounds how fast the live cluster is read; 0: no bound.
	BytesPerSecond int64
	// PageKeys is how many keys one range reads; 0: drillPageKeys.
	PageKeys int64
	// SourceTimeout bounds asking one member about itself.
	SourceTimeout time.Duration
	Now           func() time.Time
}

// drillPageKeys is a range's size: the Kubernetes API server lists etcd in pages of 500.
const drillPageKeys = 500

// drillMember is the restored copy's member name, and its cluster's.
const drillMember = "drill"

type drillSeamKey struct{}

// WithDrillSeam returns ctx carrying f, which a Drill run under ctx calls with a client of the
// restored copy once it serves, before anything is compared: the end-to-end tests' way to
// write into a restored copy what the backup did not hold. The member tool sets none.
func WithDrillSeam(ctx context.Context, f func(ctx context.Context, restored *clientv3.Client) error) context.Context {
	return context.WithValue(ctx, drillSeamKey{}, f)
}

func drillSeam(ctx context.Context) func(context.Context, *clientv3.Client) error {
	f, _ := ctx.Value(drillSeamKey{}).(func(context.Context, *clientv3.Client) error)
	return f
}

// Drill restores the newest point of o.Lineage into o.WorkDir and compares it with the live
// cluster. Its outcome is in the result: Passed, Mismatch (the first difference in the message),
// RestoreFailed or Error (the live cluster could not be read).
func Drill(ctx context.Context, o DrillOptions) backupresult.Drill {
	r := backupresult.Drill{Lineage: o.Lineage}
	fail := func(outcome string, err error) backupresult.Drill {
		r.Outcome, r.Message = outcome, err.Error()
		return r
	}
	if !ValidLineage(o.Lineage) || o.Lineage == LegacyLineage {
		return fail(backupresult.DrillError, fmt.Errorf("lineage %q is not an etcd cluster ID in hex", o.Lineage))
	}
	sources, err := snapshotSources(ctx, TakeOptions{Endpoints: o.Endpoints, TLS: o.TLS, Login: o.Login, ClusterID: o.Lineage, SourceTimeout: o.SourceTimeout})
	if err != nil {
		return fail(backupresult.DrillError, fmt.Errorf("the live cluster cannot be read: %w", err))
	}
	src := sources[0]
	r.Member = fmt.Sprintf("%x", src.ID)
	live, err := membership.Dial([]string{src.Endpoint}, o.TLS, o.Login)
	if err != nil {
		return fail(backupresult.DrillError, err)
	}
	defer live.Close()

	dataDir := filepath.Join(o.WorkDir, "drill-data")
	if err := os.RemoveAll(dataDir); err != nil {
		return fail(backupresult.DrillError, err)
	}
	defer os.RemoveAll(dataDir)
	peer := "http://127.0.0.1:2380"
	start := o.Now()
	restored, err := Restore(ctx, RestoreOptions{Store: o.Store, Lineage: o.Lineage, Name: LatestName, WorkDir: o.WorkDir, DataDir: dataDir,
		Member: drillMember, PeerURL: peer, InitialCluster: drillMember + "=" + peer, Token: drillMember + "-" + o.Lineage, Etcd: o.Etcd})
	r.RestoreSeconds = o.Now().Sub(start).Seconds()
	if err != nil {
		return fail(backupresult.DrillRestoreFailed, fmt.Errorf("restore of lineage %s: %w", o.Lineage, err))
	}
	r.Snapshot, r.Chunks, r.RestoredRevision = restored.Object, restored.Changes, restored.Revision

	// The restored copy serves as the restored cluster would, its leases pinned so that none
	// expires (and deletes keys) while it is read.
	leases, err := pinLeases(dataDir)
	if err != nil {
		return fail(backupresult.DrillRestoreFailed, err)
	}
	srv, err := startReplayServer(ctx, o.Etcd, dataDir, drillMember)
	if err != nil {
		return fail(backupresult.DrillRestoreFailed, fmt.Errorf("the restored data dir does not serve: %w", err))
	}
	defer srv.kill()
	if f := drillSeam(ctx); f != nil {
		if err := f(ctx, srv.cli); err != nil {
			return fail(backupresult.DrillError, fmt.Errorf("drill seam: %w", err))
		}
	}

	d := drill{o: o, live: live, copy: srv.cli, restored: restored, leases: leases.ids(), at: restored.Revision}
	liveRev, err := live.CaughtUpRevision(ctx)
	if err != nil {
		return fail(backupresult.DrillError, fmt.Errorf("the live cluster's revision: %w", err))
	}
	if restored.Revision > liveRev {
		r.Revision = liveRev
		return fail(backupresult.DrillMismatch, fmt.Errorf("the backup holds revision %d, but the live cluster (member %s) is at revision %d: it holds changes the cluster does not",
			restored.Revision, r.Member, liveRev))
	}
	note, err := d.chooseRevision(ctx, liveRev)
	if err != nil {
		return fail(cmp.Or(d.failedAs, backupresult.DrillError), err)
	}
	c, err := d.compare(ctx)
	if err != nil {
		return fail(backupresult.DrillError, err)
	}
	r.Revision, r.Keys, r.Digest, r.LiveDigest = d.liveAt, c.keys, c.digest, c.liveDigest
	what := fmt.Sprintf("restored %s and %d chunks of changes after it (revision %d) in %s", restored.Object, restored.Changes, restored.Revision,
		time.Duration(r.RestoreSeconds*float64(time.Second)).Round(time.Millisecond))
	if c.first == "" && !d.partial() && c.digest != c.liveDigest {
		// Every key compared the same, so the digests cannot differ; if they do, this code is
		// wrong, and the drill does not pass on it.
		c.differ, c.first = 1, fmt.Sprintf("the digests differ: %s of the restored copy, %s of the live cluster", c.digest, c.liveDigest)
	}
	if c.first != "" {
		r.Outcome = backupresult.DrillMismatch
		r.Message = fmt.Sprintf("%s%s; %d keys differ from the live cluster's at revision %d (member %s), the first: %s", what, note, c.differ, d.liveAt, r.Member, c.first)
		return r
	}
	r.Outcome = backupresult.DrillPassed
	if d.partial() {
		r.Message = fmt.Sprintf("%s%s: %d keys unchanged since match the live cluster's at revision %d (member %s); %d keys changed and %d deleted since cannot be compared",
			what, note, c.unchanged, d.liveAt, r.Member, c.changed, c.gone)
	} else {
		r.Message = fmt.Sprintf("%s%s; its %d keys match the live cluster's at revision %d (member %s), digest %s", what, note, c.keys, d.liveAt, r.Member, c.digest)
	}
	return r
}

// drill is one drill's comparison: the live member, the restored copy, and the revisions.
type drill struct {
	o        DrillOptions
	live     *membership.Operator
	copy     *clientv3.Client
	restored Restored
	// leases are the snapshot's leases: the ones the restored copy can carry.
	leases map[int64]bool
	// at is the restored copy's revision; liveAt the live cluster's revision compared with it.
	at, liveAt int64
	// failedAs is the outcome of an error of chooseRevision, when not DrillError.
	failedAs string
}

func (d *drill) partial() bool { return d.liveAt != d.at }

// chooseRevision settles the revisions compared: the restored one if the live cluster still
// serves it; else a revision it serves that the stored changes after the restored one reach,
// replayed onto the copy; else the live cluster's own (partial). note says which, for the
// message.
func (d *drill) chooseRevision(ctx context.Context, liveRev int64) (string, error) {
	if ok, err := d.serves(ctx, d.at); err != nil || ok {
		d.liveAt = d.at
		return "", err
	}
	ls := LineageStore(d.o.Store, d.restored.Lineage)
	deltas, err := ls.ListDeltas(ctx)
	if err != nil {
		return "", err
	}
	c, _ := chain(deltas, d.restored.SnapshotRevision) // a gap only bounds how far it reaches
	var ahead []Delta
	for _, dl := range c {
		if dl.Last > d.at {
			ahead = append(ahead, dl)
		}
	}
	end := min(wholeEnd(c, d.restored.SnapshotRevision), liveRev)
	ok := false
	if end > d.at {
		if ok, err = d.serves(ctx, end); err != nil {
			return "", err
		}
	}
	if ok {
		from := d.at
		err := applyChanges(ctx, d.copy, RestoreOptions{Store: ls}, d.leases, from, pointInTime{deltas: ahead, target: end})
		if err != nil {
			d.failedAs = backupresult.DrillRestoreFailed
			return "", fmt.Errorf("bringing the restored copy from revision %d to %d: %w", from, end, err)
		}
		d.at, d.liveAt = end, end
		return fmt.Sprintf(", brought forward to revision %d with the changes stored since, as the live cluster no longer serves revision %d", end, from), nil
	}
	d.liveAt = liveRev
	return fmt.Sprintf(", which the live cluster no longer serves (compacted since), nor any the stored changes reach: compared with revision %d", liveRev), nil
}

// serves: the live member can be read at rev, not compacted away.
func (d *drill) serves(ctx context.Context, rev int64) (bool, error) {
	_, err := d.live.ReadPage(ctx, "\x00", rev, 1)
	if errors.Is(err, membership.ErrCompacted) {
		return false, nil
	}
	return err == nil, err
}

// comparison is what a drill's comparison found.
type comparison struct {
	keys               int64 // the restored copy's
	digest, liveDigest string
	differ             int64
	first              string // the first difference, "" when none
	// Of a partial comparison: keys unchanged since the restored revision, keys changed
	// since, and keys of the copy deleted since (or never in the cluster: it cannot tell).
	unchanged, changed, gone int64
}

// compare reads both sides in key order, page by page, and compares them key by key.
func (d *drill) compare(ctx context.Context) (comparison, error) {
	limit := cmp.Or(d.o.PageKeys, drillPageKeys)
	var lim *rate.Limiter
	if d.o.BytesPerSecond > 0 {
		lim = rate.NewLimiter(rate.Limit(d.o.BytesPerSecond), int(min(d.o.BytesPerSecond, 1<<20)))
	}
	// The copy is read as it serves, at its own newest revision: nothing but the restore and
	// the drill writes to it, so that is the revision restored, and anything else it holds is a
	// difference.
	copyRev, err := servedRevision(ctx, d.copy)
	if err != nil {
		return comparison{}, fmt.Errorf("read the restored copy: %w", err)
	}
	copyPages := &pager{read: func(from string) ([]*mvccpb.KeyValue, bool, error) {
		resp, err := d.copy.Get(ctx, from, clientv3.WithFromKey(), clientv3.WithRev(copyRev), clientv3.WithLimit(limit))
		if err != nil {
			return nil, false, fmt.Errorf("read the restored copy: %w", err)
		}
		return resp.Kvs, resp.More, nil
	}}
	livePages := &pager{read: func(from string) ([]*mvccpb.KeyValue, bool, error) {
		p, err := d.live.ReadPage(ctx, from, d.liveAt, limit)
		if errors.Is(err, membership.ErrCompacted) {
			return nil, false, fmt.Errorf("the live cluster compacted revision %d away while it was read: the next drill compares sooner", d.liveAt)
		}
		if err != nil {
			return nil, false, fmt.Errorf("read the live cluster: %w", err)
		}
		n := 0
		for _, kv := range p.KVs {
			n += len(kv.Key) + len(kv.Value)
		}
		if err := waitBytes(ctx, lim, n); err != nil {
			return nil, false, err
		}
		return p.KVs, p.More, nil
	}}
	var c comparison
	copyDigest, liveDigest := newDigest(d.leases), newDigest(d.leases)
	differ := func(format string, args ...any) {
		c.differ++
		if c.first == "" {
			c.first = fmt.Sprintf(format, args...)
		}
	}
	for {
		a, err := copyPages.peek()
		if err != nil {
			return c, err
		}
		b, err := livePages.peek()
		if err != nil {
			return c, err
		}
		switch {
		case a == nil && b == nil:
			c.digest, c.liveDigest = copyDigest.sum(), liveDigest.sum()
			return c, nil
		case b == nil || a != nil && string(a.Key) < string(b.Key):
			copyDigest.add(a)
			c.keys++
			copyPages.pop()
			if d.partial() && a.ModRevision <= d.at {
				c.gone++
				continue
			}
			differ("key %q (modified at revision %d) is in the restored copy, not in the live cluster", a.Key, a.ModRevision)
		case a == nil || string(b.Key) < string(a.Key):
			liveDigest.add(b)
			livePages.pop()
			if d.partial() && b.CreateRevision > d.at {
				continue
			}
			differ("key %q (modified at revision %d) is in the live cluster, not in the restored copy", b.Key, b.ModRevision)
		default:
			copyDigest.add(a)
			liveDigest.add(b)
			c.keys++
			copyPages.pop()
			livePages.pop()
			switch {
			case !d.partial() || b.ModRevision <= d.at || a.ModRevision > d.at:
				c.unchanged++
				if why := d.differs(a, b); why != "" {
					differ("key %q: %s", a.Key, why)
				}
			case b.CreateRevision <= d.at && a.CreateRevision != b.CreateRevision:
				c.changed++
				differ("key %q: created at revision %d in the restored copy, %d in the live cluster, which has held it since before revision %d", a.Key, a.CreateRevision, b.CreateRevision, d.at)
			default:
				c.changed++
			}
		}
	}
}

// differs says how two versions of one key differ, "" when they do not: the lease only where
// the backup carries it (a lease of the snapshot; the stored changes record a key's lease, not
// the lease's grant).
func (d *drill) differs(a, b *mvccpb.KeyValue) string {
	la, lb := d.carried(a.Lease), d.carried(b.Lease)
	switch {
	case string(a.Value) != string(b.Value):
		return fmt.Sprintf("its value differs: %d bytes of SHA-256 %.12x... in the restored copy (modified at revision %d), %d bytes of %.12x... in the live cluster (at %d)",
			len(a.Value), sha256.Sum256(a.Value), a.ModRevision, len(b.Value), sha256.Sum256(b.Value), b.ModRevision)
	case a.CreateRevision != b.CreateRevision:
		return fmt.Sprintf("its create revision differs: %d in the restored copy, %d in the live cluster", a.CreateRevision, b.CreateRevision)
	case a.ModRevision != b.ModRevision:
		return fmt.Sprintf("its modification revision differs: %d in the restored copy, %d in the live cluster", a.ModRevision, b.ModRevision)
	case a.Version != b.Version:
		return fmt.Sprintf("its version differs: %d in the restored copy, %d in the live cluster", a.Version, b.Version)
	case la != lb:
		return fmt.Sprintf("its lease differs: %x in the restored copy, %x in the live cluster", la, lb)
	}
	return ""
}

// carried is lease id as a restore can have it: a lease of the snapshot, else none.
func (d *drill) carried(id int64) int64 {
	if d.leases[id] {
		return id
	}
	return 0
}

// pager reads one side's keys a page at a time, each page after the last key of the one before.
type pager struct {
	read func(from string) ([]*mvccpb.KeyValue, bool, error)
	page []*mvccpb.KeyValue
	next string // the key the next page starts at
	done bool
}

// peek is the next key, nil at the end.
func (p *pager) peek() (*mvccpb.KeyValue, error) {
	for len(p.page) == 0 && !p.done {
		from := p.next
		if from == "" {
			from = "\x00"
		}
		kvs, more, err := p.read(from)
		if err != nil {
			return nil, err
		}
		p.page, p.done = kvs, !more || len(kvs) == 0
		if n := len(kvs); n > 0 {
			p.next = string(kvs[n-1].Key) + "\x00"
		}
	}
	if len(p.page) == 0 {
		return nil, nil
	}
	return p.page[0], nil
}

func (p *pager) pop() { p.page = p.page[1:] }

// waitBytes waits until lim allows n bytes more; a nil lim allows any.
func waitBytes(ctx context.Context, lim *rate.Limiter, n int) error {
	for lim != nil && n > 0 {
		k := min(n, lim.Burst())
		if err := lim.WaitN(ctx, k); err != nil {
			return err
		}
		n -= k
	}
	return nil
}
