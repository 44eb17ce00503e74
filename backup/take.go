package backup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
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
	// Cluster names the snapshots (SnapshotName).
	Cluster string
	Store   Store
	// WorkDir holds the snapshot while it is verified.
	WorkDir   string
	Retention Retention
	// BytesPerSecond bounds how fast the snapshot is read from the member; 0: no bound.
	BytesPerSecond int64
	// SourceTimeout bounds asking one member about itself.
	SourceTimeout time.Duration
	Now           func() time.Time
}

// Take reads a snapshot from the first member that can give one (a follower before the
// leader; a learner, a member that does not answer or that reports an alarm is skipped),
// verifies it (checksum, a readable database, a revision at least the member's own before
// the read), stores it atomically and applies retention. A failed retention does not undo
// the backup: it is reported in the error beside a result that names the stored snapshot.
func Take(ctx context.Context, o TakeOptions) (backupresult.Result, error) {
	sources, err := snapshotSources(ctx, o)
	if err != nil {
		return backupresult.Result{}, err
	}
	var errs []error
	for _, src := range sources {
		r, err := takeFrom(ctx, o, src)
		if err == nil {
			return r, retain(ctx, o, &r)
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
	op, err := membership.Dial([]string{ep}, o.TLS)
	if err != nil {
		return membership.SnapshotSource{}, err
	}
	defer op.Close()
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(o.SourceTimeout, 5*time.Second))
	defer cancel()
	return op.SnapshotSource(ctx)
}

func takeFrom(ctx context.Context, o TakeOptions, src membership.SnapshotSource) (backupresult.Result, error) {
	op, err := membership.Dial([]string{src.Endpoint}, o.TLS)
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
	name := SnapshotName(o.Cluster, o.Now(), v.Revision)
	if err := o.Store.Put(ctx, name, f, v.Size, Meta{SHA256: v.SHA256, Revision: v.Revision, Member: fmt.Sprintf("%x", src.ID)}); err != nil {
		return backupresult.Result{}, err
	}
	return backupresult.Result{Object: o.Store.Where(name), Revision: v.Revision, Size: v.Size, SHA256: v.SHA256, MemberID: fmt.Sprintf("%x", src.ID)}, nil
}

// retain deletes the snapshots beyond the retention, counting them in r, and the chunks of
// changes after a snapshot no longer kept: a chain is only of use from its snapshot on.
func retain(ctx context.Context, o TakeOptions, r *backupresult.Result) error {
	if o.Retention == (Retention{}) {
		return nil
	}
	objs, err := o.Store.List(ctx)
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	// Snapshots taken with no change between them share a revision, and a chain.
	kept := map[int64]int{}
	for _, obj := range objs {
		kept[obj.Revision]++
	}
	for _, obj := range o.Retention.Expired(objs, o.Now()) {
		if err := o.Store.Delete(ctx, obj.Name); err != nil {
			return fmt.Errorf("retention: %w", err)
		}
		kept[obj.Revision]--
		r.Deleted++
	}
	deltas, err := o.Store.ListDeltas(ctx)
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	for _, d := range deltas {
		if kept[d.Base] == 0 {
			if err := o.Store.Delete(ctx, d.Name); err != nil {
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
