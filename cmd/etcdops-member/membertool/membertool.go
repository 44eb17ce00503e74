// Package membertool is the etcdops-member command line, importable so that tests and the
// end-to-end harness run it in-process. Run takes the arguments after the program name.
//
// Exit codes: 0 done or already done; 1 not done yet, retryable (including a launch that
// waits for its join state); 2 bad usage; 3 refused, retrying will not help until the
// cluster changes.
package membertool

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"etcdops.dev/etcdops/backup"
	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/joinstate"
	"etcdops.dev/etcdops/launcher"
	"etcdops.dev/etcdops/membership"
)

// Exit codes of Run.
const (
	ExitOK        = 0
	ExitRetryable = 1
	ExitUsage     = 2
	ExitRefused   = 3
)

const usage = `usage: etcdops-member <command> [flags]

commands:
  add-learner --endpoints=URL[,URL] --member=POD --peer-url=URL
  promote     --endpoints=URL[,URL] --member=POD --id=HEX
  remove      --endpoints=URL[,URL] --member=POD --id=HEX
  move-leader --endpoints=URL[,URL] --member=POD --id=HEX
  compact     --endpoints=URL[,URL] --member=POD
  defragment  --endpoints=URL --member=POD --id=HEX          (the member's own endpoint)
  disarm      --endpoints=URL[,URL] --member=POD --alarm=NOSPACE|CORRUPT --id=HEX
  update-peer-url --endpoints=URL[,URL] --member=POD --id=HEX --peer-url=URL
  expand-claim --member=POD --namespace=NS --claim=NAME --size=QUANTITY [--timeout=30s]
              [--create [--access-mode=MODE] [--storage-class=NAME] [--limit=QUANTITY]
              [--label=KEY=VALUE]]   (the Kubernetes API, with the pod's service account;
              --create makes a missing claim at --size)
  restart-pod --endpoints=URL[,URL] --member=POD --namespace=NS --uid=UID [--id=HEX]
              [--timeout=30s]   (deletes the pod if its UID is still UID, once etcd says member
              HEX does not lead and every other voter is healthy; the Kubernetes API, as
              expand-claim)
  auth        --endpoints=URL[,URL] --namespace=NS --cluster=NAME --cluster-uid=UID
              --declaration=JSON [--timeout=2m]   (creates the users' missing credential
              Secrets, then makes etcd's users, roles and auth switch match; the Kubernetes
              API, as expand-claim)
  backup      --endpoints=URL[,URL] --member=POD --cluster=NAME <destination> [<lineage>]
              [--keep=N] [--keep-for=DURATION] [--keep-hourly=N] [--keep-daily=N]
              [--max-bandwidth=BYTES] [--work-dir=DIR] [--survivor]
              [--termination-log=FILE]
      destination: --s3-endpoint=URL --bucket=B [--prefix=P] [--region=R]
                   --credentials-dir=DIR [--ca-file=FILE]   or   --dir=DIR
      lineage: [--cluster-id=HEX] [--namespace=NS] [--cluster-uid=UID]
               [--restored-lineage=HEX --restored-revision=N --restored-time=RFC3339]
  drill       --endpoints=URL[,URL] --cluster=NAME --cluster-id=HEX <destination> --etcd=PATH
              [--max-bandwidth=BYTES] [--work-dir=DIR] [--termination-log=FILE]
              (restores the newest backup and compares it with the live cluster)
  stream-backup --endpoints=URL[,URL] --cluster=NAME <destination> [<lineage>] [--interval=30s]
              [--max-chunk-bytes=4194304] [--max-bandwidth=BYTES] [--work-dir=DIR]
              [--metrics-addr=:9480] [--writer=POD]   (runs until stopped)
  lineages    <destination> [--json]   (the lineages stored there, and which latest restores)
      common: --cacert=FILE --cert=FILE --key=FILE --timeout=30s
  install --to=PATH
  launch --join-state=FILE --name=POD --data-dir=DIR --etcd=PATH
         [--termination-log=FILE] [--restore-<destination flag>...] -- <etcd flags>
  probe  --join-state=FILE --data-dir=DIR --health=URL [--name=POD, else $POD_NAME]
         [--defrag-metrics=URL]
  ready  --readyz=URL --metrics=URL --join-state=FILE [--name=POD, else $POD_NAME] [--timeout=3s]
         (the etcd container's readiness: etcd ready, and not a learner)
`

// retryEvery spaces attempts of an operation that failed retryably within --timeout.
const retryEvery = 500 * time.Millisecond

// Run runs one command and returns the process exit code. Results go to stdout, one line;
// reasons for failure to stderr, one line.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return RunWithClaims(ctx, args, stdout, stderr, nil)
}

// RunWithClaims is Run with the Kubernetes API expand-claim and restart-pod use; nil is the in-cluster API
// server's, through client-go.
func RunWithClaims(ctx context.Context, args []string, stdout, stderr io.Writer, claims Claims) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ExitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "add-learner", "promote", "remove", "move-leader", "compact", "defragment", "disarm", "update-peer-url":
		return runOperation(ctx, cmd, rest, stdout, stderr)
	case "backup":
		return runBackup(ctx, rest, stdout, stderr)
	case "expand-claim":
		return runExpandClaim(ctx, claims, rest, stdout, stderr)
	case "restart-pod":
		return runRestartPod(ctx, claims, rest, stdout, stderr)
	case "auth":
		s, _ := claims.(Secrets)
		return runAuth(ctx, s, rest, stdout, stderr)
	case "stream-backup":
		return runStreamBackup(ctx, rest, stdout, stderr)
	case "drill":
		return runDrill(ctx, rest, stdout, stderr)
	case "lineages":
		return runLineages(ctx, rest, stdout, stderr)
	case "probe":
		return runProbe(ctx, rest, stderr)
	case "ready":
		return runReady(ctx, rest, stderr)
	case "install":
		return runInstall(rest, stdout, stderr)
	case "launch":
		return runLaunch(rest, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return ExitOK
	}
	fmt.Fprintf(stderr, "unknown command %q\n%s", cmd, usage)
	return ExitUsage
}

// operationFlags are the flags of the membership and maintenance commands.
type operationFlags struct {
	endpoints, member, peerURL, id, alarm string
	cacert, cert, key                     string
	// user and passwordFile: the etcd user to act as while auth is on (docs/auth.md).
	user, passwordFile string
	timeout            time.Duration
}

// flagSet registers the flags every command that talks to etcd takes.
func (f *operationFlags) flagSet(cmd string, timeout time.Duration) *flag.FlagSet {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.endpoints, "endpoints", "", "client URLs of voters, comma-separated")
	fs.StringVar(&f.member, "member", "", "pod name of the member")
	fs.StringVar(&f.cacert, "cacert", "", "CA certificate file (PEM)")
	fs.StringVar(&f.cert, "cert", "", "client certificate file (PEM)")
	fs.StringVar(&f.key, "key", "", "client key file (PEM)")
	fs.StringVar(&f.user, "user", "", "etcd user to act as while etcd's auth is on")
	fs.StringVar(&f.passwordFile, "password-file", "", "file holding --user's password")
	fs.DurationVar(&f.timeout, "timeout", timeout, "give up after this long, retrying what is retryable")
	return fs
}

// parseOperation parses a membership command's flags; the caller prints the error, on one line.
func parseOperation(cmd string, args []string) (operationFlags, error) {
	var f operationFlags
	fs := f.flagSet(cmd, 30*time.Second)
	switch cmd {
	case "add-learner":
		fs.StringVar(&f.peerURL, "peer-url", "", "peer URL of the new member")
	case "compact":
	case "disarm":
		fs.StringVar(&f.alarm, "alarm", "", "the alarm to disarm: NOSPACE or CORRUPT")
		fs.StringVar(&f.id, "id", "", "member ID in hex whose alarm is disarmed; never 0")
	default:
		fs.StringVar(&f.id, "id", "", "member ID in hex")
	}
	if cmd == "update-peer-url" {
		fs.StringVar(&f.peerURL, "peer-url", "", "the member's new peer URL")
	}
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	switch {
	case fs.NArg() > 0:
		return f, fmt.Errorf("unexpected arguments %q", fs.Args())
	case f.endpoints == "" || f.member == "":
		return f, errors.New("--endpoints and --member are required")
	case (cmd == "add-learner" || cmd == "update-peer-url") && f.peerURL == "":
		return f, errors.New("--peer-url is required")
	case cmd == "disarm" && f.alarm == "":
		return f, errors.New("--alarm is required")
	case cmd != "add-learner" && cmd != "compact" && f.id == "":
		return f, errors.New("--id is required")
	}
	return f, nil
}

// access is how the command reaches etcd: its TLS material and its login.
func (f operationFlags) access() (*etcdstate.TLS, membership.Login, error) {
	t, err := f.tls()
	if err != nil {
		return nil, membership.Login{}, err
	}
	login, err := f.login()
	return t, login, err
}

// login reads the password file; the zero Login without --user.
func (f operationFlags) login() (membership.Login, error) {
	if f.user == "" && f.passwordFile == "" {
		return membership.Login{}, nil
	}
	if f.user == "" || f.passwordFile == "" {
		return membership.Login{}, errors.New("--user and --password-file go together")
	}
	b, err := os.ReadFile(f.passwordFile)
	if errors.Is(err, os.ErrNotExist) {
		// The Secret is mounted as optional (sync/auth.go): before the first auth Job made
		// it there is no password, and etcd's auth is off.
		return membership.Login{}, nil
	}
	if err != nil {
		return membership.Login{}, err
	}
	return membership.Login{User: f.user, Password: strings.TrimRight(string(b), "\r\n")}, nil
}

// tls reads the TLS files; nil when the endpoints are plain HTTP and no file is given.
func (f operationFlags) tls() (*etcdstate.TLS, error) {
	if f.cacert == "" && f.cert == "" && f.key == "" && !strings.Contains(f.endpoints, "https://") {
		return nil, nil
	}
	var t etcdstate.TLS
	for _, file := range []struct {
		path string
		into *[]byte
	}{{f.cacert, &t.CA}, {f.cert, &t.Cert}, {f.key, &t.Key}} {
		if file.path == "" {
			continue
		}
		b, err := os.ReadFile(file.path)
		if err != nil {
			return nil, err
		}
		*file.into = b
	}
	return &t, nil
}

func runOperation(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) int {
	f, err := parseOperation(cmd, args)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return ExitUsage
	}
	var id uint64
	if f.id != "" {
		if id, err = strconv.ParseUint(f.id, 16, 64); err != nil {
			fmt.Fprintf(stderr, "%s: --id %q is not a hex member ID\n", cmd, f.id)
			return ExitUsage
		}
	}
	t, login, err := f.access()
	if err != nil {
		fmt.Fprintf(stderr, "%s %s: %v\n", cmd, f.member, err)
		return ExitUsage
	}
	op, err := membership.Dial(strings.Split(f.endpoints, ","), t, login)
	if err != nil {
		fmt.Fprintf(stderr, "%s %s: %v\n", cmd, f.member, err)
		return ExitUsage
	}
	defer op.Close()
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()

	attempt := func() (string, error) {
		switch cmd {
		case "add-learner":
			m, out, err := op.AddLearner(ctx, f.member, f.peerURL)
			return fmt.Sprintf("%v (id %x)", out, m.ID), err
		case "promote":
			out, err := op.Promote(ctx, f.member, id)
			return out.String(), err
		case "remove":
			out, err := op.Remove(ctx, f.member, id)
			return out.String(), err
		case "compact":
			out, rev, err := op.Compact(ctx)
			return fmt.Sprintf("%v (revision %d)", out, rev), err
		case "defragment":
			out, err := op.Defragment(ctx, f.member, id)
			return out.String(), err
		case "disarm":
			out, err := op.Disarm(ctx, f.alarm, id)
			return out.String(), err
		case "update-peer-url":
			out, err := op.UpdatePeerURL(ctx, f.member, id, f.peerURL)
			return out.String(), err
		default:
			out, err := op.MoveLeader(ctx, f.member, id)
			return out.String(), err
		}
	}
	for {
		result, err := attempt()
		switch {
		case err == nil:
			fmt.Fprintf(stdout, "%s %s: %s\n", cmd, f.member, result)
			return ExitOK
		case errors.Is(err, membership.ErrRefused):
			fmt.Fprintf(stderr, "%s %s: %v\n", cmd, f.member, err)
			return ExitRefused
		case !errors.Is(err, membership.ErrRetryable):
			fmt.Fprintf(stderr, "%s %s: %v\n", cmd, f.member, err)
			return ExitRetryable
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(stderr, "%s %s: %v (gave up after %v)\n", cmd, f.member, err, f.timeout)
			return ExitRetryable
		case <-time.After(retryEvery):
		}
	}
}

// runInstall copies this executable to --to: distroless images have no cp, and the etcd
// image has no shell, so the init container copies the tool into a shared volume this way.
func runInstall(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	to := fs.String("to", "", "path to copy this executable to")
	if err := fs.Parse(args); err != nil || *to == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "install: --to=PATH is required")
		return ExitUsage
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "install: %v\n", err)
		return ExitRetryable
	}
	if err := copyExecutable(self, *to); err != nil {
		fmt.Fprintf(stderr, "install: %v\n", err)
		return ExitRetryable
	}
	fmt.Fprintf(stdout, "install: copied %s to %s\n", self, *to)
	return ExitOK
}

// copyExecutable writes src to dst beside it first and renames it into place, so dst is
// never a half-written executable.
func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), filepath.Base(dst)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

// LaunchArgv does everything launch does short of exec: it parses launch's arguments,
// inspects the volume, wipes a stale data dir, restores a snapshot, records the incarnation
// and returns etcd's argv (argv[0] is the --etcd path). When the pod must not start, argv is
// nil and the decision says why. After a restore, restored is the termination message the
// container ends with instead of starting etcd (joinstate.RestoredMessage); etcd starts on
// the restored data when it restarts. The end-to-end harness runs the argv in an embedded
// etcd instead.
func LaunchArgv(args []string) (argv []string, d launcher.Decision, restored string, err error) {
	o, _, report, err := parseLaunch(args)
	if err != nil {
		return nil, launcher.Decision{}, "", err
	}
	argv, d, err = launcher.Prepare(o)
	if err == nil && d.Restore {
		restored = report.message()
	}
	return argv, d, restored, err
}

// restoreReport is what the launcher's restore restored, and how long it took, or why it
// failed, for its termination message.
type restoreReport struct {
	r      backup.Restored
	took   time.Duration
	failed error
}

func (p *restoreReport) message() string {
	return joinstate.RestoredMessage(joinstate.RestoredPoint{Revision: p.r.Revision, Time: p.r.Time, Lineage: p.r.Lineage, Object: p.r.Object, Took: p.took})
}

// maxTerminationMessage is what the kubelet keeps of a termination message.
const maxTerminationMessage = 4096

// failure is the termination message of a restore that failed: the planner reports it.
func (p *restoreReport) failure() string {
	msg := joinstate.RestoreFailed + p.failed.Error()
	if len(msg) > maxTerminationMessage {
		msg = msg[:maxTerminationMessage-3] + "..."
	}
	return msg
}

// parseLaunch reads launch's arguments: the launcher's options, the file its refusal or its
// restore is written to, and where the restore reports what it restored.
func parseLaunch(args []string) (launcher.Options, string, *restoreReport, error) {
	fs := flag.NewFlagSet("launch", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var o launcher.Options
	fs.StringVar(&o.JoinState, "join-state", "/etc/etcdops/join/join-state.json", "mounted join state file")
	fs.StringVar(&o.Name, "name", "", "pod name, which is the member name")
	fs.StringVar(&o.DataDir, "data-dir", "/var/lib/etcd/data", "etcd data dir; the incarnation marker lives beside it")
	fs.StringVar(&o.Etcd, "etcd", "/usr/local/bin/etcd", "etcd executable")
	termLog := fs.String("termination-log", "/dev/termination-log", "file a refusal or a restore is written to, for the planner")
	var from backup.DestinationFlags
	from.Register(fs, "restore-")
	if err := fs.Parse(args); err != nil {
		return o, "", nil, fmt.Errorf("%w: %v", launcher.ErrBadOptions, err)
	}
	o.Static = fs.Args()
	report := &restoreReport{}
	if from.Set() {
		etcd := o.Etcd
		o.Restore = func(rt launcher.RestoreTarget) (err error) {
			start := time.Now()
			report.r, err = restoreSnapshot(from, rt, etcd, os.Stderr)
			report.took, report.failed = time.Since(start), err
			return err
		}
	}
	return o, *termLog, report, nil
}

func runLaunch(args []string, stderr io.Writer) int {
	o, termLog, report, err := parseLaunch(args)
	var argv []string
	var d launcher.Decision
	if err == nil {
		argv, d, err = launcher.Prepare(o)
	}
	switch {
	case errors.Is(err, launcher.ErrBadOptions):
		fmt.Fprintf(stderr, "launch: %v\n", err)
		return ExitUsage
	case err != nil:
		fmt.Fprintf(stderr, "launch: %v\n", err)
		if report != nil && report.failed != nil {
			// The planner reads why the restore failed from the container's status.
			if err := os.WriteFile(termLog, []byte(report.failure()), 0o644); err != nil {
				fmt.Fprintf(stderr, "launch: termination log: %v\n", err)
			}
		}
		return ExitRetryable
	}
	switch d.Kind {
	case launcher.Wait:
		fmt.Fprintf(stderr, "launch: wait: %s\n", d.Reason)
		return ExitRetryable
	case launcher.Refuse:
		fmt.Fprintf(stderr, "launch: refuse: %s\n", d.Reason)
		// The kubelet puts this file into the container's status, where the planner reads
		// why the member does not start.
		if err := os.WriteFile(termLog, []byte(joinstate.Refused+d.Reason), 0o644); err != nil {
			fmt.Fprintf(stderr, "launch: termination log: %v\n", err)
		}
		return ExitRefused
	}
	if d.Restore {
		// The planner learns the revision restored only from the termination message: the
		// container ends here once, and its restart starts etcd on the restored data.
		fmt.Fprintf(stderr, "launch: %s (incarnation %d): restored revision %d; the restart starts etcd on it\n", d.Reason, d.Incarnation, report.r.Revision)
		if err := os.WriteFile(termLog, []byte(report.message()), 0o644); err != nil {
			fmt.Fprintf(stderr, "launch: termination log: %v\n", err)
		}
		return ExitOK
	}
	fmt.Fprintf(stderr, "launch: %s (incarnation %d)\n", d.Reason, d.Incarnation)
	err = syscall.Exec(argv[0], argv, os.Environ())
	fmt.Fprintf(stderr, "launch: exec %s: %v\n", argv[0], err)
	return ExitRetryable
}

// runProbe is the etcd container's liveness probe. It fails while a quorum recovery waits for
// this member to restart with --force-new-cluster (the kubelet then restarts the container,
// and launch applies the recovery), and when etcd's health endpoint does not answer 200,
// unless --defrag-metrics is given and etcd reports a defragmentation in flight there: a
// defragmentation holds the backend, so the health endpoint's read waits for its whole run,
// minutes on a large database, and a restart would only throw that work away and start it
// over when the Job retries.
func runProbe(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	joinState := fs.String("join-state", "/etc/etcdops/join/join-state.json", "mounted join state file")
	name := fs.String("name", os.Getenv("POD_NAME"), "pod name, which is the member name")
	dataDir := fs.String("data-dir", "/var/lib/etcd/data", "etcd data dir; the recovery marker lives beside it")
	health := fs.String("health", "", "etcd health URL to GET")
	defragMetrics := fs.String("defrag-metrics", "", "etcd metrics URL; alive while it reports a defragmentation in flight")
	timeout := fs.Duration("timeout", 3*time.Second, "bound on the health request")
	if err := fs.Parse(args); err != nil || *name == "" || *health == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "probe: --health=URL and --name (or $POD_NAME) are required")
		return ExitUsage
	}
	if raw, err := os.ReadFile(*joinState); err == nil {
		join, err := joinstate.Decode(raw)
		if err == nil {
			vol, err := launcher.Inspect(filepath.Clean(*dataDir))
			if err == nil && launcher.RecoveryPending(join, *name, vol) {
				fmt.Fprintf(stderr, "probe: quorum recovery %s waits for %s to restart\n", join.Recovery.Token, *name)
				return ExitRetryable
			}
		}
	}
	bound := *timeout
	if deadline, ok := ctx.Deadline(); ok && *defragMetrics != "" {
		// Whoever runs the probe bounds it: the metrics read keeps a third of that time.
		bound = min(bound, time.Until(deadline)*2/3)
	}
	err := getOK(ctx, *health, bound)
	if err == nil {
		if *defragMetrics != "" {
			recordVoter(ctx, *defragMetrics, *dataDir, stderr)
		}
		return ExitOK
	}
	if *defragMetrics != "" {
		inflight, merr := defragInFlight(ctx, *defragMetrics)
		if merr == nil && inflight {
			fmt.Fprintf(stderr, "probe: %v; etcd is defragmenting, so it is alive\n", err)
			return ExitOK
		}
		if merr != nil {
			err = fmt.Errorf("%w; %v", err, merr)
		}
	}
	fmt.Fprintf(stderr, "probe: %v\n", err)
	return ExitRetryable
}

// runReady is the etcd container's readiness probe: etcd's /readyz answers 200 (--readyz: local
// reads, no CORRUPT alarm), and the member is no learner, by the mounted join state (the
// planner's view of the membership) and by etcd: /readyz's own check non_learner (v3.5.19 on;
// its verbose answer lists the checks), or before it etcd_server_is_learner 0 at --metrics
// (read only then: a /metrics answer is some 160 KB). A learner refuses writes, linearizable
// reads, watches and lease keep-alives ("rpc not supported for learner"), so while it joins its
// pod stays out of the client Service's endpoints, which select Ready pods. etcd alone cannot
// say so from the start: a member that has just joined takes its membership from
// --initial-cluster, without its learner flag, until it applies its own addition from the
// leader's snapshot or log (minutes, for a large database); non_learner and the metric both
// read "voter" meanwhile. The join state lists it as a learner from before its pod can start;
// after its promotion, the mounted file says so a minute or two later, and the pod is Ready
// then.
func runReady(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("ready", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	readyURL := fs.String("readyz", "", "etcd readiness URL to GET")
	metrics := fs.String("metrics", "", "etcd metrics URL, read where /readyz has no non_learner check")
	joinState := fs.String("join-state", "", "mounted join state file")
	name := fs.String("name", os.Getenv("POD_NAME"), "pod name, which is the member name")
	timeout := fs.Duration("timeout", 3*time.Second, "bound on each request")
	if err := fs.Parse(args); err != nil || *readyURL == "" || *metrics == "" || *joinState == "" || *name == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "ready: --readyz=URL, --metrics=URL, --join-state=FILE and --name (or $POD_NAME) are required")
		return ExitUsage
	}
	err := joinedAsVoter(*joinState, *name)
	checked := false
	if err == nil {
		checked, err = readyz(ctx, *readyURL, *timeout)
	}
	if err == nil && !checked {
		var learner float64
		if learner, err = gauge(ctx, *metrics, learnerMetric); err == nil && learner != 0 {
			err = errors.New("etcd is a learner: it serves no client until it is promoted")
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "ready: %v\n", err)
		return ExitRetryable
	}
	return ExitOK
}

// nonLearnerCheck is the line of etcd's verbose /readyz answer for its learner check, passed.
const nonLearnerCheck = "[+]non_learner ok"

// readyz GETs etcd's readiness URL, verbose, within bound: nil when it answers 200, else an
// error with the checks that failed. learnerChecked: the answer lists non_learner as passed.
func readyz(ctx context.Context, raw string, bound time.Duration) (learnerChecked bool, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return false, err
	}
	q := u.Query()
	q.Set("verbose", "")
	u.RawQuery = q.Encode()
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return false, err
	}
	if resp.StatusCode != http.StatusOK {
		var failed []string
		for line := range strings.Lines(string(body)) {
			if strings.HasPrefix(line, "[-]") {
				failed = append(failed, strings.TrimSpace(line))
			}
		}
		return false, fmt.Errorf("%s answered %s %s", raw, resp.Status, strings.Join(failed, "; "))
	}
	for line := range strings.Lines(string(body)) {
		if strings.TrimSpace(line) == nonLearnerCheck {
			return true, nil
		}
	}
	return false, nil
}

// joinedAsVoter: the join state at path lists member name, not as a learner.
func joinedAsVoter(path, name string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	st, err := joinstate.Decode(raw)
	if err != nil {
		return err
	}
	switch m, ok := st.Find(name); {
	case !ok:
		return fmt.Errorf("%s is not in the join state", name)
	case m.Learner:
		return fmt.Errorf("the join state lists %s as a learner: it serves no client until it is promoted", name)
	}
	return nil
}

// getOK GETs url within bound; nil when it answers 200.
func getOK(ctx context.Context, url string, bound time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", url, resp.Status)
	}
	return nil
}

// defragMetric is etcd's gauge of a defragmentation in flight on the member (etcd v3.4.18 and
// v3.5.1 on): 1 from the moment the backend is taken until it is released.
const defragMetric = "etcd_disk_defrag_inflight"

// learnerMetric is etcd's gauge of whether the member is a learner: 0 once it is a voter.
const learnerMetric = "etcd_server_is_learner"

// recordVoter notes on the volume that the member is a voter once etcd says so
// (launcher.RecordEstablished): the launcher then refuses to start it on a lost data dir even
// while the mounted join state still predates its promotion. A failure is told, never fatal:
// the probe judges liveness.
func recordVoter(ctx context.Context, url, dataDir string, stderr io.Writer) {
	learner, err := gauge(ctx, url, learnerMetric)
	if err == nil && learner == 0 {
		err = launcher.RecordEstablished(filepath.Clean(dataDir))
	}
	if err != nil {
		fmt.Fprintf(stderr, "probe: recording whether the member is a voter: %v\n", err)
	}
}

// defragInFlight reads etcd's metrics at url and reports whether defragMetric is 1. etcd serves
// them without touching the backend, so they answer while a defragmentation holds it.
func defragInFlight(ctx context.Context, url string) (bool, error) {
	v, err := gauge(ctx, url, defragMetric)
	return err == nil && v == 1, err
}

// gauge reads the value of an unlabelled metric from etcd's metrics at url.
func gauge(ctx context.Context, url, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s answered %s", url, resp.Status)
	}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == name {
			return strconv.ParseFloat(f[1], 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s does not report %s", url, name)
}
