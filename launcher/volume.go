package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	gosync "sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"etcdops.dev/etcdops/internal/atomicfile"
	"etcdops.dev/etcdops/joinstate"
)

// MarkerFile is the incarnation marker's name, beside the data dir on the member's volume;
// TokenFile records the cluster (the join state's token) whose member wrote the data dir,
// RecoveredFile the last quorum recovery the volume started from, RestoredFile the cluster
// whose snapshot restore wrote the data dir.
const (
	MarkerFile    = "incarnation"
	TokenFile     = "cluster-token"
	RecoveredFile = "recovered"
	RestoredFile  = "restored"
	// EstablishedFile holds the incarnation whose member was seen a voter on this volume
	// (RecordEstablished), so that the launcher knows it even before the join state's
	// established flag reaches the pod.
	EstablishedFile = "established"
)

// MarkerPath is where the incarnation marker of dataDir lives: in its parent, so that wiping
// the data dir never loses it.
func MarkerPath(dataDir string) string {
	return filepath.Join(filepath.Dir(filepath.Clean(dataDir)), MarkerFile)
}

// TokenPath is where the cluster token of dataDir lives, beside the incarnation marker. A
// separate file, so that a launcher of before the token still reads the marker.
func TokenPath(dataDir string) string {
	return filepath.Join(filepath.Dir(filepath.Clean(dataDir)), TokenFile)
}

// RecoveredPath is where the recovery marker of dataDir lives, beside the incarnation marker.
func RecoveredPath(dataDir string) string {
	return filepath.Join(filepath.Dir(filepath.Clean(dataDir)), RecoveredFile)
}

// RestoredPath is where the restore marker of dataDir lives, beside the incarnation marker.
func RestoredPath(dataDir string) string {
	return filepath.Join(filepath.Dir(filepath.Clean(dataDir)), RestoredFile)
}

// EstablishedPath is where the established marker of dataDir lives, beside the incarnation
// marker.
func EstablishedPath(dataDir string) string {
	return filepath.Join(filepath.Dir(filepath.Clean(dataDir)), EstablishedFile)
}

// RecordEstablished notes on the volume that the member of its current incarnation is a
// voter: from then on its data must never be replaced by an empty data dir, whatever a late
// join state says. The liveness probe calls it when etcd reports itself no learner. A volume
// without an incarnation marker records nothing.
func RecordEstablished(dataDir string) error {
	v, err := Inspect(filepath.Clean(dataDir))
	if err != nil || !v.HasMarker || v.Established {
		return err
	}
	return writeMarker(EstablishedPath(dataDir), strconv.FormatInt(v.Incarnation, 10))
}

// RestoreTarget is the new member a snapshot restore writes a data dir for.
type RestoreTarget struct {
	// DataDir does not exist yet; the restore creates it.
	DataDir string
	// Member, PeerURL, InitialCluster and Token are as etcd will be started with them.
	Member, PeerURL, InitialCluster, Token string
	// Backup is the snapshot the join state asks for: a name, or "latest".
	Backup string
	// Revision is the revision the join state asks to restore to; 0: the newest stored.
	Revision int64
	// Time (RFC 3339), instead of Revision, asks for the last revision stored at or before it.
	Time string
	// Lineage is the lineage asked for; empty: the one the restore chooses.
	Lineage string
}

// ErrBadOptions marks errors in the launch command line, as opposed to I/O failures.
var ErrBadOptions = errors.New("bad launch options")

// Options are the launch command line: where things are, and etcd's static flags.
type Options struct {
	JoinState string // path of the mounted join state file
	Name      string // pod name
	DataDir   string
	Etcd      string   // etcd executable
	Static    []string // etcd flags from the pod spec, passed through
	// Restore writes a data dir from a snapshot; nil when the pod has no snapshot to
	// restore from (no --restore-* flags).
	Restore func(RestoreTarget) error
	// AnswersFor asks the other members of the join state on their peer URLs before a
	// quorum recovery forces a new cluster, and returns those that answered; nil asks with
	// PeersAnswering.
	AnswersFor func(ctx context.Context, join joinstate.State, name string) []string
}

// Prepare reads the join state, inspects the volume and decides. When the decision is to
// start, it wipes a stale data dir, records the incarnation and returns etcd's argv; otherwise
// argv is nil and the decision says why. Errors are I/O failures or bad options.
func Prepare(o Options) (argv []string, d Decision, err error) {
	if o.Name == "" || o.Etcd == "" {
		return nil, Decision{}, fmt.Errorf("%w: --name and --etcd are required", ErrBadOptions)
	}
	dataDir := filepath.Clean(o.DataDir)
	if !filepath.IsAbs(dataDir) || filepath.Dir(dataDir) == dataDir {
		return nil, Decision{}, fmt.Errorf("%w: data dir %q must be an absolute path below a volume", ErrBadOptions, o.DataDir)
	}
	if f := ownedFlagIn(o.Static); f != "" {
		return nil, Decision{}, fmt.Errorf("%w: --%s is decided by the launcher; remove it from the etcd flags", ErrBadOptions, f)
	}
	raw, err := os.ReadFile(o.JoinState)
	if errors.Is(err, os.ErrNotExist) {
		return nil, Decision{Kind: Wait, Reason: "join state file " + o.JoinState + " does not exist yet"}, nil
	}
	if err != nil {
		return nil, Decision{}, err
	}
	join, err := joinstate.Decode(raw)
	if err != nil {
		return nil, Decision{}, err
	}
	vol, err := Inspect(dataDir)
	if err != nil {
		return nil, Decision{}, err
	}
	in := Input{Join: join, Name: o.Name, DataDir: dataDir, Volume: vol}
	if RecoveryPending(join, o.Name, vol) {
		answers := o.AnswersFor
		if answers == nil {
			answers = PeersAnswering
		}
		in.Answering = answers(context.Background(), join, o.Name)
	}
	d = Decide(in)
	if d.Kind != Start {
		return nil, d, nil
	}
	if d.Wipe {
		if err := os.RemoveAll(dataDir); err != nil {
			return nil, d, fmt.Errorf("wipe %s: %w", dataDir, err)
		}
	}
	if d.Restore {
		if err := restore(o, join, dataDir, d.Incarnation); err != nil {
			return nil, d, err
		}
	}
	if err := writeMarker(MarkerPath(dataDir), strconv.FormatInt(d.Incarnation, 10)); err != nil {
		return nil, d, fmt.Errorf("write incarnation marker: %w", err)
	}
	// After the marker: a crash between the two leaves a marker without a token, which the
	// next start takes for a volume of before the token and records it then.
	if vol.Token != d.Token {
		if err := writeMarker(TokenPath(dataDir), d.Token); err != nil {
			return nil, d, fmt.Errorf("write cluster token: %w", err)
		}
	}
	if d.Recovered != "" {
		// Written before etcd starts: a crash after this point restarts without the flag,
		// which is the safe way round (forcing twice would drop members added since).
		if err := writeMarker(RecoveredPath(dataDir), d.Recovered); err != nil {
			return nil, d, fmt.Errorf("write recovery marker: %w", err)
		}
	}
	argv = append([]string{o.Etcd}, o.Static...)
	return append(argv, d.Args...), d, nil
}

// restore writes the data dir from the join state's snapshot. It restores beside the data
// dir and renames the result into place last, after both markers: a crash before the rename
// leaves an empty data dir, which is restored again; after it, a data dir restored for
// this cluster, which etcd starts on.
func restore(o Options, join joinstate.State, dataDir string, incarnation int64) error {
	if o.Restore == nil {
		return fmt.Errorf("%w: the join state asks for a restore of snapshot %s, but launch has no --restore-* flags", ErrBadOptions, join.Restore.Backup)
	}
	me, _ := join.Find(o.Name)
	work := dataDir + ".restoring"
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dataDir), 0o700); err != nil {
		return err
	}
	err := o.Restore(RestoreTarget{DataDir: work, Member: o.Name, PeerURL: me.PeerURL, InitialCluster: initialCluster(join), Token: join.Token, Backup: join.Restore.Backup, Revision: join.Restore.Revision, Time: join.Restore.Time, Lineage: join.Restore.Lineage})
	if err != nil {
		os.RemoveAll(work)
		return fmt.Errorf("restore: %w", err)
	}
	if err := writeMarker(MarkerPath(dataDir), strconv.FormatInt(incarnation, 10)); err != nil {
		return fmt.Errorf("write incarnation marker: %w", err)
	}
	if err := writeMarker(RestoredPath(dataDir), join.Token); err != nil {
		return fmt.Errorf("write restore marker: %w", err)
	}
	// An empty data dir (a crash after an earlier rename is not one: it holds data) goes.
	if err := os.RemoveAll(dataDir); err != nil {
		return err
	}
	if err := os.Rename(work, dataDir); err != nil {
		return err
	}
	return atomicfile.SyncDir(filepath.Dir(dataDir))
}

// ownedFlagIn returns the first launcher-owned flag set in args, or "".
func ownedFlagIn(args []string) string {
	for _, a := range args {
		name := strings.TrimLeft(a, "-")
		if name == a {
			continue
		}
		name, _, _ = strings.Cut(name, "=")
		for _, f := range OwnedFlags {
			if name == f {
				return f
			}
		}
	}
	return ""
}

// peerDialTimeout bounds each dial of a peer URL: a member that does not accept a connection
// by then does not answer.
const peerDialTimeout = 2 * time.Second

// PeersAnswering dials the peer URL of every established member of join but name, all at
// once, each within peerDialTimeout, and returns the names of those that accepted a
// connection: an etcd listens on its peer URL for as long as it runs, also while it is paused
// or has no quorum. A member never seen as a voter cannot be part of a quorum.
func PeersAnswering(ctx context.Context, join joinstate.State, name string) []string {
	var (
		mu       gosync.Mutex
		wg       gosync.WaitGroup
		answered []string
	)
	for _, m := range join.Members {
		u, err := url.Parse(m.PeerURL)
		if m.Name == name || !m.Established || err != nil || u.Host == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			dctx, cancel := context.WithTimeout(ctx, peerDialTimeout)
			defer cancel()
			conn, err := (&net.Dialer{}).DialContext(dctx, "tcp", hostPort(u))
			if err != nil {
				return
			}
			conn.Close()
			mu.Lock()
			answered = append(answered, m.Name)
			mu.Unlock()
		}()
	}
	wg.Wait()
	sort.Strings(answered)
	return answered
}

// hostPort is the address a URL names, with the scheme's default port when it has none.
func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// Inspect reports whether dataDir holds data, which incarnation its marker records and which
// cluster wrote it: the token beside it, or for a volume of before the token, the etcd
// cluster ID its write-ahead log records.
func Inspect(dataDir string) (Volume, error) {
	var v Volume
	entries, err := os.ReadDir(dataDir)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return Volume{}, fmt.Errorf("inspect data dir: %w", err)
	default:
		v.HasData = len(entries) > 0
	}
	for _, m := range []struct {
		path, what string
		into       *string
	}{{TokenPath(dataDir), "cluster token", &v.Token}, {RecoveredPath(dataDir), "recovery", &v.Recovered}, {RestoredPath(dataDir), "restore", &v.Restored}} {
		b, err := os.ReadFile(m.path)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return Volume{}, fmt.Errorf("read %s marker: %w", m.what, err)
		default:
			*m.into = strings.TrimSpace(string(b))
		}
	}
	if v.HasData && v.Token == "" {
		v.ClusterID = walClusterID(dataDir)
	}
	raw, err := os.ReadFile(MarkerPath(dataDir))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return v, nil
	case err != nil:
		return Volume{}, fmt.Errorf("read incarnation marker: %w", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		return Volume{}, fmt.Errorf("incarnation marker %s: %w", MarkerPath(dataDir), err)
	}
	v.HasMarker, v.Incarnation = true, n
	est, err := os.ReadFile(EstablishedPath(dataDir))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return Volume{}, fmt.Errorf("read established marker: %w", err)
	default:
		v.Established = strings.TrimSpace(string(est)) == strconv.FormatInt(n, 10)
	}
	return v, nil
}

// walClusterID is the etcd cluster ID, in hex, that the write-ahead log of dataDir records
// (the metadata every WAL file begins with); "" when there is no log or it cannot be read,
// which etcd, starting on it, judges for itself.
func walClusterID(dataDir string) string {
	dir := filepath.Join(dataDir, "member", "wal")
	if !wal.Exist(dir) {
		return ""
	}
	lg := zap.NewNop()
	// The oldest log kept begins at a snapshot of its own once older ones were purged.
	snaps, err := wal.ValidSnapshotEntries(lg, dir)
	if err != nil || len(snaps) == 0 {
		return ""
	}
	w, err := wal.OpenForRead(lg, dir, snaps[0])
	if err != nil {
		return ""
	}
	defer w.Close()
	raw, _, _, err := w.ReadAll()
	if err != nil && !errors.Is(err, wal.ErrSnapshotNotFound) || len(raw) == 0 {
		return ""
	}
	var md etcdserverpb.Metadata
	if proto.Unmarshal(raw, &md) != nil || md.GetClusterID() == 0 {
		return ""
	}
	return strconv.FormatUint(md.GetClusterID(), 16)
}

// writeMarker records value durably: a crash leaves either the old marker or the new one.
func writeMarker(path, value string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(path, func(w io.Writer) error {
		_, err := fmt.Fprintln(w, value)
		return err
	})
}
