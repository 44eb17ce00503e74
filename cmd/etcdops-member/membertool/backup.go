package membertool

import (
	"context"
	"errors"
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
	var keep int
	var keepFor time.Duration
	var bandwidth int64
	fs.StringVar(&cluster, "cluster", "", "cluster name, which names the snapshots")
	fs.StringVar(&workDir, "work-dir", os.TempDir(), "directory the snapshot is verified in")
	fs.StringVar(&termLog, "termination-log", "/dev/termination-log", "file the result is written to for the planner")
	fs.IntVar(&keep, "keep", 0, "snapshots to keep, newest first; 0: no bound")
	fs.DurationVar(&keepFor, "keep-for", 0, "how long snapshots are kept; 0: no bound")
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
	case keep < 0 || keepFor < 0 || bandwidth < 0:
		err = errors.New("--keep, --keep-for and --max-bandwidth must not be negative")
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
	t, err := f.tls()
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
		Cluster:        cluster,
		Store:          store,
		WorkDir:        workDir,
		Retention:      backup.Retention{Keep: keep, KeepFor: keepFor},
		BytesPerSecond: bandwidth,
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
	var cluster, workDir, metricsAddr string
	var interval time.Duration
	var maxChunk, bandwidth int64
	fs.StringVar(&cluster, "cluster", "", "cluster name, which names the snapshots")
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
	if err != nil {
		fmt.Fprintf(stderr, "stream-backup: %v\n", err)
		return ExitUsage
	}
	m := newStreamMetrics(cluster, time.Now)
	t, err := f.tls()
	if err == nil && metricsAddr != "" {
		err = m.serve(ctx, metricsAddr)
	}
	if err == nil {
		var store backup.Store
		if store, err = dest.Open(); err == nil {
			eps := strings.Split(f.endpoints, ",")
			err = backup.Stream(ctx, backup.StreamOptions{
				Endpoints: eps, TLS: t, Interval: interval, MaxChunkBytes: maxChunk,
				Take: backup.TakeOptions{Endpoints: eps, TLS: t, Cluster: cluster, Store: store, WorkDir: workDir,
					BytesPerSecond: bandwidth, Now: time.Now},
				TakeTimeout: f.timeout,
				Stored: func(d backup.Delta) {
					m.chunkStored(d)
					fmt.Fprintf(stdout, "stream-backup %s: stored %s (revisions %d to %d, %d bytes)\n", cluster, store.Where(d.Name), d.First, d.Last, d.Size)
				},
				Watched:  m.watchedUpTo,
				Resumed:  m.resumed,
				CaughtUp: m.caughtUp,
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
	r, err := backup.Restore(ctx, backup.RestoreOptions{
		Store: store, Name: rt.Backup, Revision: rt.Revision, WorkDir: filepath.Dir(rt.DataDir), DataDir: rt.DataDir,
		Member: rt.Member, PeerURL: rt.PeerURL, InitialCluster: rt.InitialCluster, Token: rt.Token, Etcd: etcd,
	})
	if err != nil {
		return backup.Restored{}, err
	}
	fmt.Fprintf(log, "launch: restored %s (%d keys) and %d chunks of changes after it: revision %d\n", r.Object, r.Keys, r.Changes, r.Revision)
	return r, nil
}
