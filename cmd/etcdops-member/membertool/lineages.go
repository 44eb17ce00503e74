package membertool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"etcdops.dev/etcdops/backup"
)

// runLineages lists the lineages of a backup destination (backup.ListLineages): one line
// each, with the cluster that wrote it, where it was restored from, the revisions and times
// a restore reaches and how many objects it holds, the one "latest" restores marked; or, with
// --json, the same as JSON.
func runLineages(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var f operationFlags
	fs := f.flagSet("lineages", time.Minute)
	var dest backup.DestinationFlags
	dest.Register(fs, "")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	err := fs.Parse(args)
	switch {
	case err != nil:
	case fs.NArg() > 0:
		err = fmt.Errorf("unexpected arguments %q", fs.Args())
	case !dest.Set():
		err = errors.New("a destination is required: --s3-endpoint or --dir")
	}
	if err != nil {
		fmt.Fprintf(stderr, "lineages: %v\n", err)
		return ExitUsage
	}
	store, err := dest.Open()
	if err != nil {
		fmt.Fprintf(stderr, "lineages: %v\n", err)
		return ExitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	ls, err := backup.ListLineages(ctx, store)
	if err != nil {
		fmt.Fprintf(stderr, "lineages: %v\n", err)
		return ExitRetryable
	}
	latest, _ := backup.LatestLineage(ls)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			Destination string               `json:"destination"`
			Latest      string               `json:"latest,omitempty"`
			Lineages    []backup.LineageInfo `json:"lineages"`
		}{store.Where(""), latest, ls}); err != nil {
			fmt.Fprintf(stderr, "lineages: %v\n", err)
			return ExitRetryable
		}
		return ExitOK
	}
	fmt.Fprintf(stdout, "lineages in %s, oldest first (latest: the one marked *):\n", store.Where(""))
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LINEAGE\tCLUSTER\tCREATED\tRESTORED FROM\tREVISIONS\tSTORED\tSNAPSHOTS\tCHUNKS")
	for _, l := range ls {
		id := l.ID
		if id == latest {
			id += " *"
		}
		cluster, created, parent := "-", "-", "-"
		if m := l.Manifest; m != nil {
			cluster = m.Cluster.Name
			if m.Cluster.Namespace != "" {
				cluster = m.Cluster.Namespace + "/" + cluster
			}
			if m.Cluster.UID != "" {
				cluster += " (" + m.Cluster.UID + ")"
			}
			created = stamp(m.Created)
			if p := m.RestoredFrom; p != nil {
				parent = fmt.Sprintf("%s@%d", p.Lineage, p.Revision)
				if !p.Time.IsZero() {
					parent += " (" + stamp(p.Time) + ")"
				}
			}
		}
		revs, times := "-", "-"
		if l.Snapshots > 0 {
			revs = fmt.Sprintf("%d to %d", l.First.Revision, l.Last.Revision)
			times = stamp(l.Earliest) + " to " + stamp(l.Newest)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", id, cluster, created, parent, revs, times, l.Snapshots, l.Chunks)
	}
	if err := tw.Flush(); err != nil {
		fmt.Fprintf(stderr, "lineages: %v\n", err)
		return ExitRetryable
	}
	return ExitOK
}

// stamp is a time as the table shows it: RFC 3339, UTC, with its milliseconds when it has
// any; "-" when not known.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.999Z07:00")
}
