package backup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"golang.org/x/time/rate"

	"etcdops.dev/etcdops/backupresult"
	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/membership"
)

// TakeOptions say where a snapshot is read from and where it goes.
type TakeOptions struct {
	// Endpoints are the members' client URLs in order of preference; followers are tried
	// before the leader whatever the order.
	Endpoints []string
	TLS       *etcdstate.TLS
	// Login is the etcd user it reads as while auth is on.
	Login membership.Login
	// Cluster names the snapshots (SnapshotName).
	Cluster string
	// Store is the destination; each snapshot goes into the lineage of the cluster ID its
	// member answers with (LineageStore).
	Store Store
	// ClusterID, when set, is the etcd cluster ID (hex) the members must answer with: a member
	// of another cluster is not read, so that two clusters under one name never write into
	// one lineage.
	ClusterID string
	// Origin is what the lineage's manifest says of the cluster when this backup starts it.
	Origin Origin
	// BeforeStore, when set, is asked right before the snapshot is stored into lineage ls; an
	// error stores nothing (the continuous backup's writer claim).
	BeforeStore func(ctx context.Context, ls Store) error
	// WorkDir holds the snapshot while it is verified.
	WorkDir   string
	Retention Retention
	// BytesPerSecond bounds how fast the snapshot is read from the member; 0: no bound.
	BytesPerSecond int64
	// SourceTimeout bounds asking one member about itself.
	SourceTimeout time.Duration
	// Survivor reads the snapshot from a member that has lost quorum (the survivor of a quorum
	// recovery): its "no leader" does not refuse it. Endpoints are then the survivor's alone.
	Survivor bool
	Now      func() time.Time
}

// Origin is what a lineage's manifest says of the cluster beside its name and ID.
type Origin struct {
	Namespace, UID string
	// RestoredFrom, for a cluster restored from a backup, is the point it was restored to.
	RestoredFrom *Parent
}

// manifest is the manifest of lineage id that o's cluster starts at now.
func (o TakeOptions) manifest(id string, now time.Time) Manifest {
	return Manifest{Cluster: ClusterRef{Namespace: o.Origin.Namespace, Name: o.Cluster, UID: o.Origin.UID}, ClusterID: id,
		Created: now.UTC(), RestoredFrom: o.Origin.RestoredFrom}
}

// Take reads a snapshot from the first member that can give one (a follower before the
// leader; a learner, a member that does not answer, that reports an alarm or that answers
// for another cluster than ClusterID is skipped), verifies it (checksum, a readable database,
// a revision at least the member's own before the read), stores it atomically into the
// lineage of the member's cluster ID (writing its manifest when the lineage starts) and
// applies retention there. A failed retention does not undo the backup: it is reported in
// the error beside a result that names the stored snapshot.
func Take(ctx context.Context, o TakeOptions) (backupresult.Result, error) {
	sources, err := snapshotSources(ctx, o)
	if err != nil {
		return backupresult.Result{}, err
	}
	var errs []error
	for _, src := range sources {
		ls := LineageStore(o.Store, LineageOf(src.ClusterID))
		r, err := takeFrom(ctx, o, ls, src)
		if err == nil {
			return r, retain(ctx, o, ls, &r)
		}
		errs = append(errs, fmt.Errorf("%s: %w", src.Endpoint, err))
		if ctx.Err() != nil {
			break
		}
	}
	return backupresult.Result{}, fmt.Errorf("no snapshot stored: %w", errors.Join(errs...))
}

// snapshotSources asks every endpoint about its member and orders those that can give a
// snapshot: followers in the given order, then the leader.
func snapshotSources(ctx context.Context, o TakeOptions) ([]membership.SnapshotSource, error) {
	var followers, leaders []membership.SnapshotSource
	var errs []error
	for _, ep := range o.Endpoints {
		src, err := askSource(ctx, o, ep)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", ep, err))
		case o.ClusterID != "" && LineageOf(src.ClusterID) != o.ClusterID:
			errs = append(errs, fmt.Errorf("%s answers for etcd cluster %x, but this cluster is %s: not read, so that nothing of it goes into this cluster's lineage", ep, src.ClusterID, o.ClusterID))
		case src.IsLeader:
			leaders = append(leaders, src)
		default:
			followers = append(followers, src)
		}
	}
	if len(followers)+len(leaders) == 0 {
		return nil, fmt.Errorf("no member can give a snapshot: %w", errors.Join(errs...))
	}
	return append(followers, leaders...), nil
}

func askSource(ctx context.Context, o TakeOptions, ep string) (membership.SnapshotSource, error) {
	op, err := membership.Dial([]string{ep}, o.TLS, o.Login)
	if err != nil {
		return membership.SnapshotSource{}, err
	}
	defer op.Close()
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(o.SourceTimeout, 5*time.Second))
	defer cancel()
	if o.Survivor {
		return op.SurvivorSnapshotSource(ctx)
	}
	return op.SnapshotSource(ctx)
}

func takeFrom(ctx context.Context, o TakeOptions, ls Store, src membership.SnapshotSource) (backupresult.Result, error) {
	op, err := membership.Dial([]string{src.Endpoint}, o.TLS, o.Login)
	if err != nil {
		return backupresult.Result{}, err
	}
	defer op.Close()
	f, err := os.CreateTemp(o.WorkDir, "snapshot-*.db")
	if err != nil {
		return backupresult.Result{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	var w io.Writer = f
	if o.BytesPerSecond > 0 {
		w = newLimitedWriter(ctx, f, o.BytesPerSecond)
	}
	if _, err := op.Snapshot(ctx, w); err != nil {
		return backupresult.Result{}, err
	}
	if err := f.Sync(); err != nil {
		return backupresult.Result{}, err
	}
	v, err := Verify(f.Name())
	if err != nil {
		return backupresult.Result{}, err
	}
	if v.Revision < src.Revision {
		return backupresult.Result{}, fmt.Errorf("%w: it holds revision %d, but the member was at %d before it was read", ErrCorrupt, v.Revision, src.Revision)
	}
	now := o.Now()
	if err := ensureManifest(ctx, ls, o.manifest(LineageOf(src.ClusterID), now)); err != nil {
		return backupresult.Result{}, err
	}
	if o.BeforeStore != nil {
		if err := o.BeforeStore(ctx, ls); err != nil {
			return backupresult.Result{}, err
		}
	}
	name := SnapshotName(o.Cluster, now, v.Revision)
	if err := ls.Put(ctx, name, f, v.Size, Meta{SHA256: v.SHA256, Revision: v.Revision, Member: fmt.Sprintf("%x", src.ID)}); err != nil {
		return backupresult.Result{}, err
	}
	return backupresult.Result{Object: ls.Where(name), Revision: v.Revision, Size: v.Size, SHA256: v.SHA256, MemberID: fmt.Sprintf("%x", src.ID),
		Lineage: LineageOf(src.ClusterID)}, nil
}

// retain applies retention within lineage ls, counting the snapshots deleted in r, and
// deletes the chains of changes that no snapshot kept can use: those whose snapshot it deletes
// (unless a snapshot kept holds the same revision), and those that start below the oldest
// snapshot kept. A chain that starts at or after the oldest snapshot kept at a revision no
// snapshot listed holds is never deleted: the continuous backup may have stored a newer
// snapshot and begun its chain meanwhile, and that chain is the newest history there is.
// Other lineages are left alone.
func retain(ctx context.Context, o TakeOptions, ls Store, r *backupresult.Result) error {
	if o.Retention == (Retention{}) {
		return nil
	}
	objs, err := ls.List(ctx)
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	expired := o.Retention.Expired(objs, o.Now())
	var oldestKept int64
	keptRevs, expiredRevs := map[int64]bool{}, map[int64]bool{}
	for _, obj := range objs {
		if slices.ContainsFunc(expired, func(e Object) bool { return e.Name == obj.Name }) {
			expiredRevs[obj.Revision] = true
			continue
		}
		keptRevs[obj.Revision] = true
		if oldestKept == 0 || obj.Revision < oldestKept {
			oldestKept = obj.Revision
		}
	}
	for _, obj := range expired {
		if err := ls.Delete(ctx, obj.Name); err != nil {
			return fmt.Errorf("retention: %w", err)
		}
		r.Deleted++
	}
	if oldestKept == 0 {
		return nil
	}
	deltas, err := ls.ListDeltas(ctx)
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	for _, d := range deltas {
		if !keptRevs[d.Base] && (d.Base < oldestKept || expiredRevs[d.Base]) {
			if err := ls.Delete(ctx, d.Name); err != nil {
				return fmt.Errorf("retention: %w", err)
			}
		}
	}
	return nil
}

// limitedWriter writes at most a rate's bytes per second: the snapshot stream is read only as
// fast as it is written, so the member sends no faster.
type limitedWriter struct {
	ctx context.Context
	w   io.Writer
	lim *rate.Limiter
}

func newLimitedWriter(ctx context.Context, w io.Writer, bytesPerSecond int64) *limitedWriter {
	burst := int(min(bytesPerSecond, 1<<20))
	return &limitedWriter{ctx: ctx, w: w, lim: rate.NewLimiter(rate.Limit(bytesPerSecond), burst)}
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		n := min(len(p), l.lim.Burst())
		if err := l.lim.WaitN(l.ctx, n); err != nil {
			return written, err
		}
		m, err := l.w.Write(p[:n])
		written += m
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}
