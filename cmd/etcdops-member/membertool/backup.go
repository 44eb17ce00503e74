package membertool

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"etcdops.dev/etcdops/backup"
	"etcdops.dev/etcdops/backupresult"
	"etcdops.dev/etcdops/launcher"
)

// restoreTimeout bounds fetching and restoring a snapshot in the launcher; past it the pod
// exits and the kubelet starts it again.
const restoreTimeout = 30 * time.Minute

// runBackup takes one backup (backup.Take) and reports it on stdout and in the termination
// log, where the planner reads it from the Job's pod.
func runBackup(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var f operationFlags
	fs := f.flagSet("backup", 10*time.Minute)
	var dest backup.DestinationFlags
	var cluster, workDir, termLog string
	var keep, hourly, daily int
	var keepFor time.Duration
	var bandwidth int64
	var survivor bool
	var lf lineageFlags
	lf.register(fs)
	fs.StringVar(&cluster, "cluster", "", "cluster name, which names the snapshots")
	fs.StringVar(&workDir, "work-dir", os.TempDir(), "directory the snapshot is verified in")
	fs.BoolVar(&survivor, "survivor", false, "read from the survivor of a quorum recovery, which sees no leader (one endpoint)")
	fs.StringVar(&termLog, "termination-log", "/dev/termination-log", "file the result is written to for the planner")
	fs.IntVar(&keep, "keep", 0, "snapshots to keep, newest first; 0: no bound")
	fs.DurationVar(&keepFor, "keep-for", 0, "how long snapshots are kept; 0: no bound")
	fs.IntVar(&hourly, "keep-hourly", 0, "also keep the newest snapshot of each of this many most recent hours that hold one")
	fs.IntVar(&daily, "keep-daily", 0, "also keep the newest snapshot of each of this many most recent days (UTC) that hold one")
	fs.Int64Var(&bandwidth, "max-bandwidth", 0, "bytes per second read from etcd; 0: no bound")
	dest.Register(fs, "")
	err := fs.Parse(args)
	switch {
	case err != nil:
	case fs.NArg() > 0:
		err = fmt.Errorf("unexpected arguments %q", fs.Args())
	case f.endpoints == "" || f.member == "" || cluster == "":
		err = errors.New("--endpoints, --member and --cluster are required")
	case !dest.Set():
		err = errors.New("a destination is required: --s3-endpoint or --dir")
	case survivor && strings.Contains(f.endpoints, ","):
		err = errors.New("--survivor reads from one member: give its endpoint alone")
	case keep < 0 || keepFor < 0 || hourly < 0 || daily < 0 || bandwidth < 0:
		err = errors.New("--keep, --keep-for, --keep-hourly, --keep-daily and --max-bandwidth must not be negative")
	}
	var origin backup.Origin
	if err == nil {
		origin, err = lf.origin()
	}
	if err != nil {
		fmt.Fprintf(stderr, "backup: %v\n", err)
		return ExitUsage
	}
	report := func(r backupresult.Result, code int) int {
		if err := os.WriteFile(termLog, []byte(backupresult.Encode(r)), 0o644); err != nil {
			fmt.Fprintf(stderr, "backup: termination log: %v\n", err)
		}
		if r.Error != "" {
			fmt.Fprintf(stderr, "backup %s: %s\n", cluster, r.Error)
		} else {
			fmt.Fprintf(stdout, "backup %s: stored %s (revision %d, %d bytes, member %s; retention deleted %d)\n", cluster, r.Object, r.Revision, r.Size, r.MemberID, r.Deleted)
		}
		return code
	}
	t, login, err := f.access()
	if err != nil {
		return report(backupresult.Result{Error: err.Error()}, ExitUsage)
	}
	store, err := dest.Open()
	if err != nil {
		return report(backupresult.Result{Error: err.Error()}, ExitUsage)
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	r, err := backup.Take(ctx, backup.TakeOptions{
		Endpoints:      strings.Split(f.endpoints, ","),
		TLS:            t,
		Login:          login,
		Cluster:        cluster,
		ClusterID:      lf.clusterID,
		Origin:         origin,
		Store:          store,
		WorkDir:        workDir,
		Retention:      backup.Retention{Keep: keep, KeepFor: keepFor, Hourly: hourly, Daily: daily},
		BytesPerSecond: bandwidth,
		Survivor:       survivor,
		Now:            time.Now,
	})
	switch {
	case err != nil && r.Object != "":
		// Stored; only retention failed. The backup counts, the next one retries retention.
		fmt.Fprintf(stderr, "backup %s: %v\n", cluster, err)
	case err != nil:
		return report(backupresult.Result{Error: err.Error()}, ExitRetryable)
	}
	return report(r, ExitOK)
}

// runStreamBackup stores every change of the cluster after its newest snapshot in the
// destination (backup.Stream) until ctx ends, as the continuous backup's Deployment runs it:
// one line on stdout for each chunk stored, one on stderr for each failure, from which it
// resumes by itself.
func runStreamBackup(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var f operationFlags
	// --timeout bounds each full snapshot the stream takes.
	fs := f.flagSet("stream-backup", 10*time.Minute)
	var dest backup.DestinationFlags
	var cluster, workDir, metricsAddr, writer string
	var interval time.Duration
	var maxChunk, bandwidth int64
	var lf lineageFlags
	lf.register(fs)
	fs.StringVar(&cluster, "cluster", "", "cluster name, which names the snapshots")
	fs.StringVar(&writer, "writer", "", "this stream's name in its lineage's writer claim, its pod's; the host name when empty")
	fs.StringVar(&workDir, "work-dir", os.TempDir(), "directory chunks and snapshots are written in before they are stored")
	fs.DurationVar(&interval, "interval", 30*time.Second, "longest a change waits before it is stored")
	fs.Int64Var(&maxChunk, "max-chunk-bytes", 4<<20, "largest chunk of changes, in bytes")
	fs.Int64Var(&bandwidth, "max-bandwidth", 0, "bytes per second a full snapshot is read at; 0: no bound")
	fs.StringVar(&metricsAddr, "metrics-addr", "", "address to serve the stream's metrics (/metrics) and progress (/progress) on; none when empty")
	dest.Register(fs, "")
	err := fs.Parse(args)
	switch {
	case err != nil:
	case fs.NArg() > 0:
		err = fmt.Errorf("unexpected arguments %q", fs.Args())
	case f.endpoints == "" || cluster == "":
		err = errors.New("--endpoints and --cluster are required")
	case !dest.Set():
		err = errors.New("a destination is required: --s3-endpoint or --dir")
	case interval <= 0 || maxChunk <= 0 || bandwidth < 0:
		err = errors.New("--interval and --max-chunk-bytes must be positive, --max-bandwidth not negative")
	}
	var origin backup.Origin
	if err == nil {
		origin, err = lf.origin()
	}
	if err != nil {
		fmt.Fprintf(stderr, "stream-backup: %v\n", err)
		return ExitUsage
	}
	if writer == "" {
		writer, _ = os.Hostname()
	}
	m := newStreamMetrics(cluster, time.Now)
	t, login, err := f.access()
	if err == nil && metricsAddr != "" {
		err = m.serve(ctx, metricsAddr)
	}
	if err == nil {
		var store backup.Store
		if store, err = dest.Open(); err == nil {
			eps := strings.Split(f.endpoints, ",")
			err = backup.Stream(ctx, backup.StreamOptions{
				Endpoints: eps, TLS: t, Login: login, Interval: interval, MaxChunkBytes: maxChunk, Writer: writer,
				Take: backup.TakeOptions{Endpoints: eps, TLS: t, Login: login, Cluster: cluster, ClusterID: lf.clusterID, Origin: origin, Store: store, WorkDir: workDir,
					BytesPerSecond: bandwidth, Now: time.Now},
				TakeTimeout: f.timeout,
				Stored: func(d backup.Delta, where string) {
					m.chunkStored(d)
					fmt.Fprintf(stdout, "stream-backup %s: stored %s (revisions %d to %d, %d bytes)\n", cluster, where, d.First, d.Last, d.Size)
				},
				Watched:  m.watchedUpTo,
				Resumed:  m.resumed,
				CaughtUp: m.caughtUp,
				Claimed: func(lineage string, replaced *backup.Claim) {
					m.claimed(lineage)
					was := ""
					if replaced != nil {
						was = "; it supersedes " + replaced.String()
					}
					fmt.Fprintf(stdout, "stream-backup %s: writes lineage %s as %s%s\n", cluster, store.Where("lineages/"+lineage+"/"), writer, was)
				},
				Superseded: func(e *backup.SupersededError) {
					m.supersededBy(e.By.String())
					fmt.Fprintf(stderr, "stream-backup %s: %v; this stream stores nothing more and stays up until stopped\n", cluster, e)
				},
				Failed: func(err error) {
					m.failed(err)
					fmt.Fprintf(stderr, "stream-backup %s: %v\n", cluster, err)
				},
			})
		}
	}
	if ctx.Err() != nil {
		return ExitOK
	}
	fmt.Fprintf(stderr, "stream-backup %s: %v\n", cluster, err)
	return ExitUsage
}

// restoreSnapshot is the launcher's restore: the snapshot the join state names, from the
// destination the launch flags name, into the target data dir, fetched beside it on the
// member volume. Stored changes after the snapshot are replayed with etcd, the pod's own etcd
// binary.
func restoreSnapshot(from backup.DestinationFlags, rt launcher.RestoreTarget, etcd string, log io.Writer) (backup.Restored, error) {
	store, err := from.Open()
	if err != nil {
		return backup.Restored{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), restoreTimeout)
	defer cancel()
	o := backup.RestoreOptions{
		Store: store, Lineage: rt.Lineage, Name: rt.Backup, Revision: rt.Revision, WorkDir: filepath.Dir(rt.DataDir), DataDir: rt.DataDir,
		Member: rt.Member, PeerURL: rt.PeerURL, InitialCluster: rt.InitialCluster, Token: rt.Token, Etcd: etcd,
	}
	if rt.Time != "" {
		if o.Time, err = time.Parse(time.RFC3339Nano, rt.Time); err != nil {
			return backup.Restored{}, fmt.Errorf("time to restore to: %w", err)
		}
	}
	r, err := backup.Restore(ctx, o)
	if err != nil {
		return backup.Restored{}, err
	}
	at := "time not recorded"
	if !r.Time.IsZero() {
		at = "stored at " + r.Time.Format(time.RFC3339Nano)
	}
	fmt.Fprintf(log, "launch: restored %s (%d keys) and %d chunks of changes after it: revision %d (%s) of lineage %s\n", r.Object, r.Keys, r.Changes, r.Revision, at, r.Lineage)
	return r, nil
}

// lineageFlags say which cluster a backup is of: the etcd cluster ID its members must
// answer with, and what its lineage's manifest says when the backup starts the lineage.
type lineageFlags struct {
	clusterID, namespace, uid     string
	restoredLineage, restoredTime string
	restoredRevision              int64
}

func (l *lineageFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.clusterID, "cluster-id", "", "etcd cluster ID (hex) the members must answer with; any when empty")
	fs.StringVar(&l.namespace, "namespace", "", "the EtcdCluster's namespace, for the lineage's manifest")
	fs.StringVar(&l.uid, "cluster-uid", "", "the EtcdCluster's UID, for the lineage's manifest")
	fs.StringVar(&l.restoredLineage, "restored-lineage", "", "the lineage the cluster was restored from")
	fs.Int64Var(&l.restoredRevision, "restored-revision", 0, "the revision the cluster was restored to")
	fs.StringVar(&l.restoredTime, "restored-time", "", "when the revision restored was stored (RFC 3339)")
}

// origin is what the flags say of the cluster's origin.
func (l *lineageFlags) origin() (backup.Origin, error) {
	o := backup.Origin{Namespace: l.namespace, UID: l.uid}
	if l.clusterID != "" && (l.clusterID == backup.LegacyLineage || !backup.ValidLineage(l.clusterID)) {
		return o, fmt.Errorf("--cluster-id %q is not an etcd cluster ID in hex", l.clusterID)
	}
	if l.restoredRevision == 0 {
		return o, nil
	}
	p := &backup.Parent{Lineage: l.restoredLineage, Revision: l.restoredRevision}
	if l.restoredTime != "" {
		t, err := time.Parse(time.RFC3339Nano, l.restoredTime)
		if err != nil {
			return o, fmt.Errorf("--restored-time: %w", err)
		}
		p.Time = t
	}
	o.RestoredFrom = p
	return o, nil
}
