package sync

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/joinstate"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of sync/testdata/*.txt")

// TestScenarios runs the data-driven scenario files. Each file is a story told to a simulated
// world (sim_test.go); a block of commands ends with "----" and is followed by what it
// printed, up to a blank line. Run with -rewrite to regenerate the expected output.
//
// Commands:
//
//	new size=N [nostorage] [version=V]   a fresh world, nothing created yet
//	run                                  sync and tick until converged; prints the figures
//	step [N]                             N syncs, each followed by a tick; one line each, a
//	                                     line that consecutive syncs repeat once with (xN)
//	watch [N]                            step, with the phase and the reasons of Progressing
//	                                     and Degraded before each action
//	history                              status.history, one step a line
//	plan                                 the decision on the world as it is, not applied
//	world                                the world in three lines
//	spec size=N | version=V | options=A,B | paused | unpaused | delete | recovery=POLICY |
//	     nospace=POLICY | defragment     (defragment: spec.maintenance.defragment, defaults)
//	leader POD                           make POD's member the leader
//	fault POD crash|down|unreachable|slow|corrupt|nospace|gone|lost|wipe|partitioned|force-deleted|
//	     node-lost|node-gone|cut-off|deaf|claim-lost|pretoken-foreign|forked-cluster|forked-member|heal
//	                                     unreachable: the hook alone cannot reach it, etcd and
//	                                     the kubelet see it healthy; slow: it keeps its raft role
//	                                     but fails health checks; lost: its volume is gone for
//	                                     good, the pod restarts on an empty one; wipe: its volume
//	                                     is lost and its pod deleted; partitioned: its node stops
//	                                     answering, the pod is evicted and stays terminating with
//	                                     its etcd last reported running; force-deleted: a
//	                                     terminating pod goes, and its replacement's etcd is down
//	                                     until healed; node-lost: its node stops reporting, the
//	                                     node controller marks the pod not Ready, its etcd runs
//	                                     on cut off (sim_node_test.go); node-gone: a terminating
//	                                     pod goes, and its replacement waits for its volume, etcd
//	                                     not started, until healed; cut-off: its etcd runs on but
//	                                     answers neither the hook nor its peers, its pod still
//	                                     running; pretoken-foreign: its claim is swapped for
//	                                     another etcd cluster's, of before the cluster token;
//	                                     claim-lost: its claim and volume are gone, the
//	                                     StatefulSet creates both again from its template; deaf:
//	                                     its etcd is cut off from its peers but
//	                                     answers the hook, and never hears of its removal;
//	                                     forked-*: a second membership answers at its
//	                                     address (sim_fork_test.go)
//	mount-delay BASE STEP                mounted ConfigMaps reach pod 0 BASE late, each higher
//	                                     ordinal STEP later still; a new pod mounts them fresh
//	unschedulable POD | schedulable POD  the pod at that ordinal cannot be scheduled (any template)
//	delete statefulset [orphan] | configmap | services | pdb   a child deleted behind the planner's back
//	leader-returns N                     leadership goes back after each of the next N leader moves
//	db [POD] live=S history=S [file=S]   database sizes (all members, or POD's)
//	grow S                               a writer adds S of revisions per tick; NOSPACE at the quota
//	quota POD S|none | alarm T 0 | disarm T 0   a member's own quota; an alarm of member 0
//	                                     (sim_alarms_test.go)
//	annotate KEY=VALUE                   an annotation on the EtcdCluster
//	member-add POD                       a learner added behind the planner's back
//	member-remove POD                    a member removed behind the planner's back
//	status-reset                         the parent's status is lost
//	older-template                       pods and StatefulSet rendered by an older hook
//	bad-image VERSION                    pods of that etcd version cannot pull their image
//	allow-quorum-loss                    the story breaks quorum on purpose
//	fail-jobs N | hide-jobs              the next N Jobs fail | Job outcomes lag one sync
//	slow-backups N                       backup and drill Jobs run N ticks before they finish
//	foreign-children                     a ConfigMap, Service, budget and StatefulSet of names
//	                                     this hook does not render (sim_foreign_test.go)
//	foreign-job NAME running|done        a Job without a member Job's labels
//	etcd unreachable|inconsistent|stranger|without POD|foreign-peer POD|unhealthy POD,...  the next
//	                                     observation of etcd; foreign-peer: POD's member advertises
//	                                     another host; unhealthy: the PODs' members answer "no leader"
//	etcd new-cluster                     from now on etcd is another cluster: new cluster and
//	                                     member IDs on the same data (as after a restore)
//	recreate                             the EtcdCluster deleted with its claims kept and created
//	                                     again under the same name (a new UID) on those claims
//	age DURATION                         time passes without anything happening
//	backup SCHEDULE | suspend | resume   spec.backup to an S3 bucket on that schedule
//	                                     (@hourly, @every 30m, */3 * * * *)
//	backup verify SCHEDULE | max-age D   spec.backup.verify's restore drills; beforeRiskySteps.maxAge
//	storage refuses|alters|heals         the backups' destination refuses every store and fetch;
//	                                     holds backups that restore to other keys (sim_guard_test.go)
//	backups                              the BackedUp and BackupVerified conditions, the risky
//	                                     step's guard and the last drill
//	restore NAME [in-place] [time=T] [lineage=L]   spec.bootstrap.fromBackup: the snapshot a new
//	                                     world starts from, with the old one's backups; in-place:
//	                                     set on the world as it is; time, lineage: as in the spec
//	new ... tls=client,peer | spec tls=client|peer|client,peer|none   TLS on the client port
//	                                     (etcd-server, etcd-client Secrets) and between peers (etcd-peer)
//	secret NAME CA | secret-delete NAME  a TLS Secret with CA bundle CA (a digest), or none
//	mount-gone NAME                      a Secret or claim deleted: a pod whose template mounts
//	                                     it cannot start, one running keeps its files
//	                                     (sim_restore_test.go)
//	bad-cert NAME WHY... | good-cert NAME   members would reject the Secret's certificate, or not
//	pending POD DURATION | catch-up POD DURATION   slow nodes (sim_pending_test.go)
//	job-latency N                        Jobs act N ticks after the sync that decided them
//	                                     (sim_latency_test.go)
//	stream up REV | behind D [ERR...] | down | superseded D WRITER...   the continuous backup's
//	                                     progress as its pod serves it (sim_stream_test.go)
//	volume-size S | no-expansion | offline-resize | remount-fails | node-resize-online | volumes
//	                                     spec.storageSpec.volumeSizeRequest; the claims' class
//	                                     forbids expansion; its driver grows file systems only
//	                                     on a remount; the node then fails to; the node grows
//	                                     them while mounted; the claims in one line, and the
//	                                     VolumesExpanded condition (sim_volumes_test.go)
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenario files: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) {
			runScenarioFile(t, file)
		})
	}
}

type scenarioBlock struct {
	lines    []string // comments and commands, as written
	line     int      // where the block starts, for failure messages
	expected string
}

func parseScenario(t *testing.T, file string) []scenarioBlock {
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []scenarioBlock
	cur := scenarioBlock{line: 1}
	lines := strings.Split(string(data), "\n")
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if l != "----" {
			if l != "" || len(cur.lines) > 0 {
				cur.lines = append(cur.lines, l)
			} else {
				cur.line = i + 2
			}
			continue
		}
		var out []string
		for i++; i < len(lines) && lines[i] != ""; i++ {
			out = append(out, lines[i])
		}
		cur.expected = strings.Join(out, "\n")
		for len(cur.lines) > 0 && cur.lines[len(cur.lines)-1] == "" {
			cur.lines = cur.lines[:len(cur.lines)-1]
		}
		blocks = append(blocks, cur)
		cur = scenarioBlock{line: i + 2}
	}
	return blocks
}

func runScenarioFile(t *testing.T, file string) {
	blocks := parseScenario(t, file)
	var w *simWorld
	var out strings.Builder
	for _, b := range blocks {
		var got strings.Builder
		for _, l := range b.lines {
			if strings.HasPrefix(l, "#") || strings.TrimSpace(l) == "" {
				continue
			}
			w = runCommand(t, w, l, &got)
		}
		text := strings.TrimRight(got.String(), "\n")
		if !*rewrite && text != b.expected {
			t.Errorf("%s:%d:\n%s\n---- got:\n%s\n---- want:\n%s", file, b.line, strings.Join(b.lines, "\n"), text, b.expected)
		}
		fmt.Fprintf(&out, "%s\n----\n%s\n\n", strings.Join(b.lines, "\n"), text)
	}
	if *rewrite {
		if err := os.WriteFile(file, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func runCommand(t *testing.T, w *simWorld, line string, out *strings.Builder) *simWorld {
	t.Helper()
	f := strings.Fields(line)
	cmd, args := f[0], f[1:]
	arg := func(i int) string {
		if i >= len(args) {
			t.Fatalf("%q: missing argument", line)
		}
		return args[i]
	}
	if cmd != "new" && w == nil {
		t.Fatalf("%q before new", line)
	}
	switch cmd {
	case "new":
		size, storage, version, tls := int32(3), true, "", "none"
		for _, a := range args {
			k, v, _ := strings.Cut(a, "=")
			switch k {
			case "size":
				n, _ := strconv.Atoi(v)
				size = int32(n)
			case "nostorage":
				storage = false
			case "version":
				version = v
			case "tls":
				tls = v
			}
		}
		w = newSimWorld(t, size, storage)
		if version != "" {
			w.cluster.Spec.Version = version
		}
		w.setTLS(tls)
	case "run":
		fmt.Fprintf(out, "converged: %s\n", w.run(400))
	case "step", "watch":
		n := 1
		if len(args) > 0 {
			n, _ = strconv.Atoi(args[0])
		}
		line := func(d Decision) string { return actionLine(d.Action) }
		if cmd == "watch" {
			line = conditionsLine
		}
		// A line repeated by consecutive syncs is printed once, with its count.
		last, repeats := "", 0
		flush := func() {
			switch {
			case repeats == 1:
				fmt.Fprintf(out, "%s\n", last)
			case repeats > 1:
				fmt.Fprintf(out, "%s (x%d)\n", last, repeats)
			}
		}
		for i := 0; i < n; i++ {
			l := line(w.step())
			if l != last {
				flush()
				last, repeats = l, 0
			}
			repeats++
		}
		flush()
	case "history":
		for _, r := range w.cluster.Status.History {
			fmt.Fprintf(out, "%s\n", historyLine(r))
		}
	case "plan":
		d := Plan(simConfig, w.observe())
		if strings.HasPrefix(d.Action.Reason, "internal:") {
			t.Fatalf("%q: the planner broke an invariant; not recording it as expected output: %s", line, d.Action.Reason)
		}
		out.WriteString(decisionText(t, d))
	case "world":
		fmt.Fprintf(out, "%s\n", w.describe())
	case "volumes":
		fmt.Fprintf(out, "%s\n", w.volumesLine())
		for _, c := range w.cluster.Status.Conditions {
			if c.Type == v1alpha1.ConditionVolumesExpanded {
				fmt.Fprintf(out, "  VolumesExpanded=%s %s: %s\n", c.Status, c.Reason, c.Message)
			}
		}
	case "volume-size", "no-expansion", "offline-resize", "remount-fails", "node-resize-online":
		w.volumeCommand(t, line, cmd, args)
	case "spec":
		for _, a := range args {
			k, v, _ := strings.Cut(a, "=")
			switch k {
			case "size":
				n, _ := strconv.Atoi(v)
				w.cluster.Spec.Size = ptrTo(int32(n))
			case "version":
				w.cluster.Spec.Version = v
			case "options":
				w.cluster.Spec.EtcdOptions = strings.Split(v, ",")
			case "recovery":
				w.cluster.Spec.Recovery = &v1alpha1.RecoverySpec{QuorumLoss: v1alpha1.QuorumLossPolicy(v)}
			case "nospace":
				w.maintenance().NoSpace = v1alpha1.NoSpacePolicy(v)
			case "defragment":
				w.maintenance().Defragment = &v1alpha1.DefragmentSpec{}
			case "tls":
				w.setTLS(v)
			case "paused":
				w.cluster.Spec.Paused = true
			case "unpaused":
				w.cluster.Spec.Paused = false
			case "delete":
				ts := metav1.NewTime(w.now)
				w.cluster.DeletionTimestamp = &ts
				w.faulty = true // teardown takes quorum away on purpose
			default:
				t.Fatalf("%q: unknown spec field", line)
			}
		}
		w.cluster.Generation++
	case "leader":
		w.setLeader(w.ordinalOf(arg(0)))
	case "fault":
		ord := w.ordinalOf(arg(0))
		p, m := w.pods[ord], w.memberAt(ord)
		if p == nil || m == nil && arg(1) != "heal" {
			t.Fatalf("%q: %s has no pod or no member", line, arg(0))
		}
		switch arg(1) {
		case "crash":
			p.crash = true
		case "down":
			p.down = true
		case "corrupt":
			w.raise(m.id, "CORRUPT")
		case "nospace":
			w.raise(m.id, "NOSPACE")
		case "lost":
			// Its volume is gone for good: the pod restarts on an empty one.
			delete(w.data, ord)
			p.running = false
			if !m.learner {
				w.lost++
			}
		case "gone":
			p.terminating = true
		case "wipe":
			// The volume is lost: the pod comes back empty, and the launcher refuses to start
			// an established member on it.
			delete(w.data, ord)
			p.terminating = true
		case "partitioned":
			// Its etcd is cut off from the hook and the other members; its pod is evicted but
			// cannot go until its node answers again, so its last status stands.
			p.down, p.terminating, p.stuck = true, true, true
		case "force-deleted":
			// A partitioned pod deleted by hand: it goes, and its replacement's etcd stays
			// down while its volume is still attached to the node it left.
			p.stuck, p.terminating = false, true
			w.startDown[ord] = true
		case "pretoken-foreign":
			// Its claim is swapped for one of another etcd cluster, written by a launcher of
			// before the cluster token: a marker, data, no token. The pod goes with its old
			// claim, and its replacement mounts that one.
			w.data[ord] = &simData{inc: 0, id: 0xdead, cluster: 0xbad}
			p.running, p.terminating = false, true
		case "claim-lost":
			// Its claim and volume are gone for good: the pod goes, and the StatefulSet
			// creates both again, the claim from its template (sim_volumes_test.go).
			w.loseClaim(ord)
		case "deaf":
			// Its etcd is cut off from its peers, not from the hook: its member is down for
			// the cluster, it answers the hook, and removed it never hears of it.
			w.deafen(p)
		case "cut-off":
			// Its etcd runs on, paused or behind a partition: it answers neither the hook nor
			// its peers, and its pod's last status (running) stands.
			p.down, p.blind, p.stuck = true, true, true
		case "node-gone":
			// Its node is gone and the pod force-deleted: the replacement waits for the
			// volume to attach, its etcd not started, until healed.
			p.stuck, p.terminating = false, true
			w.attaching[ord] = true
		case "unreachable":
			p.blind = true
		case "slow":
			p.slow = true
		case "node-lost":
			w.loseNode(p)
		case simForkCluster, simForkMember, simForkCopy:
			w.fork(p, arg(1))
		case "heal":
			p.crash, p.down, p.blind, p.slow, p.stuck, p.forked, p.nodeLost, p.deaf = false, false, false, false, false, "", false, false
			delete(w.startDown, ord)
			delete(w.attaching, ord)
			if m != nil {
				w.disarm("CORRUPT", m.id)
				w.disarm("NOSPACE", m.id)
			}
		default:
			t.Fatalf("%q: unknown fault", line)
		}
	case "db":
		// db [POD] live=SIZE history=SIZE [file=SIZE]: database sizes of one member or all.
		ms := w.members
		if len(args) > 0 && !strings.Contains(args[0], "=") {
			ms = []*simMember{w.memberAt(w.ordinalOf(args[0]))}
			args = args[1:]
		}
		for _, m := range ms {
			for _, a := range args {
				k, v, _ := strings.Cut(a, "=")
				q := resource.MustParse(v)
				n := q.Value()
				switch k {
				case "live":
					m.live = n
				case "history":
					m.history = n
				case "file":
					m.file = n
				default:
					t.Fatalf("%q: unknown size", line)
				}
			}
			m.file = max(m.file, m.live+m.history)
		}
	case "grow":
		q := resource.MustParse(arg(0))
		w.growth = q.Value()
	case "unschedulable", "schedulable":
		w.unschedulable[w.ordinalOf(arg(0))] = cmd == "unschedulable"
	case "delete":
		w.deleteChild(arg(0), len(args) > 1 && args[1] == "orphan")
	case "leader-returns":
		w.leaderReturns, _ = strconv.Atoi(arg(0))
	case "annotate":
		k, v, _ := strings.Cut(arg(0), "=")
		if w.cluster.Annotations == nil {
			w.cluster.Annotations = map[string]string{}
		}
		w.cluster.Annotations[k] = v
	case "member-add":
		w.members = append(w.members, &simMember{id: w.nextID, ord: w.ordinalOf(arg(0)), learner: true, peerURL: PeerURL(&w.cluster, arg(0), simConfig.ClusterDomain)})
		w.nextID++
	case "member-remove":
		m := w.memberAt(w.ordinalOf(arg(0)))
		for i, x := range w.members {
			if x == m {
				w.members = append(w.members[:i], w.members[i+1:]...)
				break
			}
		}
		w.elect()
	case "status-reset":
		w.cluster.Status = v1alpha1.EtcdClusterStatus{}
	case "older-template":
		// A hook upgrade that renders the pod template differently: every pod, and the
		// StatefulSet's revisions, carry hashes the current hook never renders.
		for _, p := range w.pods {
			p.spec, p.config = "older", "older"
		}
		if w.sts != nil {
			w.sts.currentSpec, w.sts.currentConfig = "older", "older"
			w.sts.updateSpec, w.sts.updateConfig = "older", "older"
		}
	case "bad-image":
		w.badImage = arg(0)
	case "secret":
		w.secrets[arg(0)] = arg(1)
	case "secret-delete":
		delete(w.secrets, arg(0))
	case "mount-gone":
		w.goneMounts[arg(0)] = true
	case "bad-cert":
		w.badCerts[arg(0)] = "Secret " + arg(0) + ": " + strings.Join(args[1:], " ")
	case "good-cert":
		delete(w.badCerts, arg(0))
	case "allow-quorum-loss":
		w.faulty = true
	case "fail-jobs":
		w.failJobs, _ = strconv.Atoi(arg(0))
	case "hide-jobs":
		w.hideJobs = true
	case "foreign-children":
		w.addForeignChildren()
	case "foreign-job":
		w.foreignJob(arg(0), arg(1) == "done")
	case "slow-backups":
		w.backupTicks, _ = strconv.Atoi(arg(0))
	case "etcd":
		switch arg(0) {
		case "unreachable":
			w.etcdOverride = func(s *etcdstate.Snapshot) { *s = etcdstate.Snapshot{Err: "context deadline exceeded"} }
		case "inconsistent":
			w.etcdOverride = func(s *etcdstate.Snapshot) { s.Inconsistent = "etcd-0 and etcd-1 both lead term 7" }
		case "stranger":
			w.etcdOverride = func(s *etcdstate.Snapshot) {
				s.Members = append(s.Members, etcdstate.Member{ID: 0xbad, Name: "other-0", PeerURLs: []string{"http://other-0.other.default.svc.cluster.local:2380"}})
			}
		case "new-cluster":
			w.newCluster()
		case "foreign-peer":
			name := arg(1)
			w.etcdOverride = func(s *etcdstate.Snapshot) {
				for i := range s.Members {
					if s.Members[i].Name == name {
						s.Members[i].PeerURLs = []string{"http://" + name + ".etcd.other.svc.cluster.local:2380"}
					}
				}
			}
		case "unhealthy":
			// POD's member answers with an error (no leader, as while leadership moves); its
			// pod stays Ready.
			names := strings.Split(arg(1), ",")
			w.etcdOverride = func(s *etcdstate.Snapshot) {
				for i := range s.Members {
					if slices.Contains(names, s.Members[i].Name) {
						s.Members[i].Healthy, s.Members[i].Errors = false, []string{"etcdserver: no leader"}
					}
				}
			}
		case "without":
			// etcd's answer lags a change a Job just made.
			ord := w.ordinalOf(arg(1))
			w.etcdOverride = func(s *etcdstate.Snapshot) {
				for i, m := range s.Members {
					if w.memberByID(m.ID).ord == ord {
						s.Members = append(s.Members[:i], s.Members[i+1:]...)
						return
					}
				}
			}
		default:
			t.Fatalf("%q: unknown etcd state", line)
		}
	case "backup":
		switch arg(0) {
		case "suspend", "resume":
			w.cluster.Spec.Backup.Suspend = arg(0) == "suspend"
		case "continuous":
			w.cluster.Spec.Backup.Continuous = &v1alpha1.ContinuousBackup{}
		case "discontinue":
			w.cluster.Spec.Backup.Continuous = nil
		case "verify":
			w.cluster.Spec.Backup.Verify = &v1alpha1.BackupVerify{Schedule: strings.Join(args[1:], " ")}
		case "max-age":
			d, err := time.ParseDuration(arg(1))
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			w.cluster.Spec.Backup.BeforeRiskySteps = &v1alpha1.RiskyStepSnapshots{MaxAge: &metav1.Duration{Duration: d}}
		default:
			w.cluster.Spec.Backup = &v1alpha1.BackupSpec{Schedule: strings.Join(args, " "), Destination: v1alpha1.BackupDestination{
				S3: &v1alpha1.S3Destination{Endpoint: "https://s3.example.test", Bucket: "backups", CredentialsSecret: "s3-credentials"}}}
		}
	case "stream":
		w.streamCommand(t, line, args)
	case "storage":
		w.storageCommand(t, line, args)
	case "backups":
		st := w.cluster.Status
		for _, c := range st.Conditions {
			if c.Type == v1alpha1.ConditionBackedUp || c.Type == v1alpha1.ConditionBackupVerified {
				fmt.Fprintf(out, "%s=%s %s: %s\n", c.Type, c.Status, c.Reason, c.Message)
			}
		}
		out.WriteString(backupLine(st))
	case "restore":
		from := &v1alpha1.FromBackup{Name: arg(0), BackupDestination: v1alpha1.BackupDestination{
			S3: &v1alpha1.S3Destination{Endpoint: "https://s3.example.test", Bucket: "backups", CredentialsSecret: "s3-credentials"}}}
		for _, a := range args[1:] {
			if v, ok := strings.CutPrefix(a, "time="); ok {
				at, err := time.Parse(time.RFC3339Nano, v)
				if err != nil {
					t.Fatalf("%q: %v", line, err)
				}
				from.Time = &metav1.Time{Time: at}
			}
			if v, ok := strings.CutPrefix(a, "lineage="); ok {
				from.Lineage = v
			}
		}
		if slices.Contains(args[1:], "in-place") {
			w.cluster.Spec.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: from}
			break
		}
		// A new cluster of the same name restores the last world's backups.
		backups := w.backups
		w = newSimWorld(t, *w.cluster.Spec.Size, w.storage())
		w.cluster.UID = "uid-2"
		w.backups = backups
		w.cluster.Spec.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: from}
	case "recreate":
		w = w.recreated()
	case "pending", "catch-up":
		w.paceCommand(t, cmd, args)
	case "job-latency":
		w.latencyCommand(t, line, args)
	case "mount-delay":
		base, err1 := time.ParseDuration(arg(0))
		step, err2 := time.ParseDuration(arg(1))
		if err1 != nil || err2 != nil {
			t.Fatalf("%q: want two durations", line)
		}
		w.withMountDelays(base, step)
	case "quota", "alarm", "disarm":
		w.alarmCommand(line, cmd, args)
	case "age":
		d, err := time.ParseDuration(arg(0))
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		w.now = w.now.Add(d)
	default:
		t.Fatalf("%q: unknown command", line)
	}
	return w
}

func (w *simWorld) maintenance() *v1alpha1.MaintenanceSpec {
	if w.cluster.Spec.Maintenance == nil {
		w.cluster.Spec.Maintenance = &v1alpha1.MaintenanceSpec{}
	}
	return w.cluster.Spec.Maintenance
}

// deleteChild deletes an applied child as a person would with kubectl.
func (w *simWorld) deleteChild(what string, orphan bool) {
	w.t.Helper()
	prefix := map[string]string{"statefulset": "StatefulSet/", "configmap": "ConfigMap/", "services": "Service/", "pdb": "PodDisruptionBudget/"}[what]
	if prefix == "" {
		w.t.Fatalf("cannot delete %q", what)
	}
	for key := range w.applied {
		if strings.HasPrefix(key, prefix) {
			delete(w.applied, key)
		}
	}
	switch what {
	case "statefulset":
		// Without orphan, the garbage collector deletes the pods in the background, whatever
		// comes next: on the next tick (statefulSetController), so that one sync sees them
		// alive, still owned by the StatefulSet that is gone.
		w.deleteStatefulSet(orphan)
	case "configmap":
		w.join = nil
	}
}

// newCluster makes etcd another cluster on the same data, as a restore does: a new cluster
// ID, and new member IDs that the data dirs now belong to.
func (w *simWorld) newCluster() {
	w.clusterID++
	for _, m := range w.members {
		old := m.id
		m.id = w.nextID
		w.nextID++
		if d := w.data[m.ord]; d != nil && d.id == old {
			d.id, d.cluster = m.id, w.clusterID
		}
		if w.leader == old {
			w.leader = m.id
		}
	}
}

func (w *simWorld) ordinalOf(pod string) int {
	ord, ok := Ordinal(w.cluster.Name, pod)
	if !ok {
		w.t.Fatalf("%s is not a pod of %s", pod, w.cluster.Name)
	}
	return ord
}

func actionLine(a Action) string {
	s := a.Type.String()
	if a.Member != "" {
		s += " " + a.Member
	}
	return s + ": " + a.Reason
}

// decisionText is the compact text form of a decision: the action, the StatefulSet, the
// Jobs, the join state and the status, one line each.
func decisionText(t *testing.T, d Decision) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", actionLine(d.Action))
	var names []string
	for _, c := range d.Children {
		raw, err := json.Marshal(c.Object)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, c.Kind+"/"+c.Name)
		if c.Kind != "Job" && !ownChild("etcd", c.Kind, c.Name) {
			continue // another hook's child, kept as it is (every scenario's cluster is etcd)
		}
		switch c.Kind {
		case "StatefulSet":
			var s appsv1.StatefulSet
			if err := json.Unmarshal(raw, &s); err != nil {
				t.Fatal(err)
			}
			partition := int32(0)
			if ru := s.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.Partition != nil {
				partition = *ru.Partition
			}
			source := ""
			if slices.ContainsFunc(s.Spec.Template.Spec.Containers[0].Command, func(a string) bool { return strings.HasPrefix(a, "--restore-") }) {
				source = " restore-source"
			}
			fmt.Fprintf(&b, "  statefulset: replicas=%d partition=%d%s\n", *s.Spec.Replicas, partition, source)
		case "ConfigMap":
			var cm corev1.ConfigMap
			if err := json.Unmarshal(raw, &cm); err != nil {
				t.Fatal(err)
			}
			if c.Name == ClientConfigMapName("etcd") {
				fmt.Fprintf(&b, "  client: %s %s\n", cm.Data[ClientKeyScheme], cm.Data[ClientKeyEndpoints])
				continue
			}
			st, err := joinstate.Decode([]byte(cm.Data[joinstate.ConfigMapKey]))
			if err != nil {
				t.Fatal(err)
			}
			var ms []string
			for _, m := range st.Members {
				s := fmt.Sprintf("%s#%d", m.Name, m.Incarnation)
				if m.Established {
					s += "+"
				}
				if m.Fenced {
					s += "(fenced)"
				}
				ms = append(ms, s)
			}
			if r := st.Recovery; r != nil {
				ms = append(ms, "force="+r.Survivor)
			}
			if r := st.Restore; r != nil {
				ms = append(ms, "restore="+r.Member+"/"+r.Backup)
				if r.Lineage != "" {
					ms = append(ms, "lineage="+r.Lineage)
				}
				if r.Time != "" {
					ms = append(ms, "time="+r.Time)
				}
			}
			fmt.Fprintf(&b, "  join: %s %s\n", st.ClusterState, strings.Join(ms, " "))
		case "Job":
			var m map[string]any
			_ = json.Unmarshal(raw, &m)
			spec, _ := m["spec"].(map[string]any)
			tmpl, _ := spec["template"].(map[string]any)
			ps, _ := tmpl["spec"].(map[string]any)
			cs, _ := ps["containers"].([]any)
			var args []string
			if len(cs) > 0 {
				for _, a := range cs[0].(map[string]any)["command"].([]any) {
					args = append(args, a.(string))
				}
			}
			vols, _ := ps["volumes"].([]any)
			for _, v := range vols {
				if ed, _ := v.(map[string]any)["emptyDir"].(map[string]any); ed["sizeLimit"] != nil {
					args = append(args, fmt.Sprintf("(scratch %v)", ed["sizeLimit"]))
				}
			}
			fmt.Fprintf(&b, "  job %s: %s\n", c.Name, strings.Join(args, " "))
		}
	}
	if d.Action.Type == Hold || d.Action.Type == Teardown || d.Finalized {
		fmt.Fprintf(&b, "  children: %s\n", strings.Join(names, " "))
	}
	st := d.Status
	var conds []string
	for _, c := range st.Conditions {
		conds = append(conds, fmt.Sprintf("%s=%s", c.Type, c.Status))
	}
	fmt.Fprintf(&b, "  status: %s ready=%d leader=%s failures=%d", st.Phase, st.ReadyMembers, st.Leader, st.JobFailures)
	for _, c := range conds {
		b.WriteString(" " + c)
	}
	fmt.Fprintf(&b, " resync=%gs", d.ResyncAfterSeconds)
	if d.Finalized {
		b.WriteString(" finalized")
	}
	b.WriteString("\n")
	if m := st.Maintenance; m != nil {
		fmt.Fprintf(&b, "  maintenance: %s %s %s\n", m.Operation, m.Phase, m.Member)
	}
	if r := st.Recovery; r != nil {
		fmt.Fprintf(&b, "  recovery: %s from %s (%s)\n", r.Phase, r.Survivor, r.Trigger)
	}
	if r := st.Backup; r != nil {
		fmt.Fprintf(&b, "  backup:")
		if r.LastScheduleTime != nil {
			fmt.Fprintf(&b, " scheduled=%s", r.LastScheduleTime.UTC().Format(time.RFC3339))
		}
		if r.LastRequest != "" {
			fmt.Fprintf(&b, " request=%s", r.LastRequest)
		}
		if l := r.LastSuccessful; l != nil {
			fmt.Fprintf(&b, " last=%s@%d member=%s", l.Object, l.Revision, l.Member)
		}
		if f := r.LastFailure; f != nil {
			fmt.Fprintf(&b, " failure=%q", f.Reason)
		}
		if g := r.Guard; g != nil {
			fmt.Fprintf(&b, " guard=%s:%s", g.Step, g.Snapshot)
		}
		if d := r.LastDrill; d != nil {
			fmt.Fprintf(&b, " drill=%s", d.Result)
		}
		if c := r.Continuous; c != nil {
			fmt.Fprintf(&b, " stored=%d", c.StoredRevision)
			if c.BehindSince != nil {
				fmt.Fprintf(&b, " behind-since=%s", c.BehindSince.UTC().Format(time.RFC3339))
			}
			if c.Message != "" {
				fmt.Fprintf(&b, " stream=%q", c.Message)
			}
			if c.SupersededBy != "" {
				fmt.Fprintf(&b, " superseded-by=%q", c.SupersededBy)
			}
		}
		b.WriteString("\n")
	}
	if r := st.LastSwitchover; r != nil {
		fmt.Fprintf(&b, "  switchover: request=%s member=%s moved=%v\n", r.Request, r.Member, r.Moved)
	}
	if st.RestoredFrom != "" {
		fmt.Fprintf(&b, "  restored from: %s revision=%d", st.RestoredFrom, st.RestoredRevision)
		if st.RestoredLineage != "" {
			fmt.Fprintf(&b, " lineage=%s", st.RestoredLineage)
		}
		if st.RestoredTime != nil {
			fmt.Fprintf(&b, " time=%s", st.RestoredTime.UTC().Format(time.RFC3339Nano))
		}
		b.WriteString("\n")
	}
	for _, w := range st.Warnings {
		fmt.Fprintf(&b, "  warning: %s\n", w)
	}
	if t := st.TLS; t != nil {
		fmt.Fprintf(&b, "  tls: client=%s peer=%q secrets=%s,%s,%s progress=%q\n", t.Client, t.Peer, t.ServerSecret, t.PeerSecret, t.ClientSecret, t.Progress)
	}
	return b.String()
}
