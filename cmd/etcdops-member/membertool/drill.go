package membertool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"etcdops.dev/etcdops/backup"
	"etcdops.dev/etcdops/backupresult"
)

// runDrill runs one restore drill (backup.Drill) and reports it on stdout or stderr and in
// the termination log, where the planner reads it from the Job's pod. A drill that reached a
// verdict (passed, or found a difference) succeeds; one whose restore failed, or that could
// not read the live cluster, fails and is retried by its Job.
func runDrill(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var f operationFlags
	fs := f.flagSet("drill", 50*time.Minute)
	var dest backup.DestinationFlags
	var cluster, clusterID, workDir, etcd, termLog string
	var bandwidth int64
	fs.StringVar(&cluster, "cluster", "", "cluster name, for the report")
	fs.StringVar(&clusterID, "cluster-id", "", "etcd cluster ID (hex): the lineage restored, which the live members must answer for")
	fs.StringVar(&workDir, "work-dir", os.TempDir(), "scratch directory the backup is restored into")
	fs.StringVar(&etcd, "etcd", "/usr/local/bin/etcd", "the etcd binary of the cluster's release, which replays the changes and serves the restored copy")
	fs.StringVar(&termLog, "termination-log", "/dev/termination-log", "file the result is written to for the planner")
	fs.Int64Var(&bandwidth, "max-bandwidth", 0, "bytes per second read from the live cluster; 0: no bound")
	dest.Register(fs, "")
	err := fs.Parse(args)
	switch {
	case err != nil:
	case fs.NArg() > 0:
		err = fmt.Errorf("unexpected arguments %q", fs.Args())
	case f.endpoints == "" || cluster == "" || clusterID == "":
		err = errors.New("--endpoints, --cluster and --cluster-id are required")
	case !backup.ValidLineage(clusterID) || clusterID == backup.LegacyLineage:
		err = fmt.Errorf("--cluster-id %q is not an etcd cluster ID in hex", clusterID)
	case !dest.Set():
		err = errors.New("a destination is required: --s3-endpoint or --dir")
	case bandwidth < 0:
		err = errors.New("--max-bandwidth must not be negative")
	}
	if err != nil {
		fmt.Fprintf(stderr, "drill: %v\n", err)
		return ExitUsage
	}
	report := func(d backupresult.Drill) int {
		if err := os.WriteFile(termLog, []byte(backupresult.EncodeDrill(d)), 0o644); err != nil {
			fmt.Fprintf(stderr, "drill: termination log: %v\n", err)
		}
		switch d.Outcome {
		case backupresult.DrillPassed:
			fmt.Fprintf(stdout, "drill %s: passed: %s\n", cluster, d.Message)
			return ExitOK
		case backupresult.DrillMismatch:
			fmt.Fprintf(stderr, "drill %s: the backup differs from the cluster: %s\n", cluster, d.Message)
			return ExitOK
		}
		fmt.Fprintf(stderr, "drill %s: %s: %s\n", cluster, d.Outcome, d.Message)
		return ExitRetryable
	}
	t, login, err := f.access()
	if err != nil {
		return report(backupresult.Drill{Outcome: backupresult.DrillError, Message: err.Error()})
	}
	store, err := dest.Open()
	if err != nil {
		return report(backupresult.Drill{Outcome: backupresult.DrillRestoreFailed, Message: err.Error()})
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	return report(backup.Drill(ctx, backup.DrillOptions{
		Store: store, Lineage: clusterID, Endpoints: strings.Split(f.endpoints, ","), TLS: t, Login: login, WorkDir: workDir, Etcd: etcd,
		BytesPerSecond: bandwidth, Now: time.Now,
	}))
}
