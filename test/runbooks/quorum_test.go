package runbooks

import (
	"context"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/cmd/etcdops-member/membertool"
	"etcdops.dev/etcdops/joinstate"
	"etcdops.dev/etcdops/launcher"
	"etcdops.dev/etcdops/test/etcdbin"
)

// The quorum loss runbook (docs/runbooks-quorum.md, "Quorum lost", steps 2 to 4b) followed on real
// etcd servers of each supported release, built from the Go module proxy with etcdctl and
// etcdutl of the same release (test/etcdbin). Three members start as the operator's pods
// start them: the command line the planner renders, completed by the real launcher
// (membertool.LaunchArgv) from a join state, each on its own loopback address (127.0.b.n, the
// pod's address) with its own volume directory (the claim, mounted at /var/lib/etcd: data dir,
// incarnation marker and cluster token as the launcher lays them out). Keys are written, two
// members are killed (SIGKILL: their nodes are lost) and the runbook's fenced blocks are then
// followed line by line, read from docs/runbooks-quorum.md as they stand:
//
//   - run as written, on the machine: every etcdctl and etcdutl line, on the workstation or
//     inside a pod (kubectl exec: the pod's 127.0.0.1 becomes its address, its mounts its
//     volume directory), `rm` and `ls` inside the restore helper, and a variable assignment
//     (a pod's DNS name becomes its address);
//   - played, as Kubernetes would carry them out, because no API server, kubelet or container
//     runtime runs here: `kubectl apply` of the recovery pod (its container's command from the
//     runbook's YAML block, only the binary's path, the volume and the addresses replaced),
//     `logs -f` (waits for the log line the comment names), `delete pod` (SIGTERM),
//     `port-forward` (the forwarded address is the pod's client URL), `scale --replicas=0`
//     (every member stopped), `delete pvc` (the volume directories removed), `run` (the
//     helper's mounts from its --overrides), `wait`, `cp` (the tree copied as tar would as
//     the pod's user);
//   - not run: lines that only read or change Kubernetes objects (`get`, `patch`,
//     `annotate`, `scale` up: pausing the cluster, the reclaim policy, the join ConfigMap's
//     token, which the test puts where a line says '<the token>'), and a variable read from
//     the API server. They need a real API server; the control-plane tier will run them.
//
// A line of none of these kinds fails the test: the runbook changed, and so must this test.
// After 4a the survivor starts through the launcher as its pod would and must hold every key
// as a cluster of one with the same cluster ID; 4b starts again from the volumes step 3 left
// and must give a member that holds every key under a new cluster ID.

var versionsFlag = flag.Bool("e2e.versions", false, "follow the quorum loss runbook on every supported etcd release, not only the operator's default (.ci/run does)")

// TestQuorumLossRunbook runs the operator's default release in the default run (about 8s
// once the binaries are built) and every pinned release with -e2e.versions.
func TestQuorumLossRunbook(t *testing.T) {
	versions := []string{etcdbin.Pinned[minorOf(v1alpha1.DefaultVersion)]}
	if *versionsFlag {
		versions = etcdbin.Versions()
	}
	for _, v := range versions {
		t.Run(v, func(t *testing.T) { followQuorumLoss(t, v) })
	}
}

func minorOf(v string) string {
	parts := strings.SplitN(v, ".", 3)
	return parts[0] + "." + parts[1]
}

// Bounds of the waits: each is far above what the step takes on a loaded 2-core machine.
const (
	startBound = 30 * time.Second
	stopBound  = 15 * time.Second
	callBound  = 10 * time.Second
)

// The keys written before the quorum is lost, and checked after each way back.
const (
	keyPrefix = "/runbook/"
	keyCount  = 100
)

func followQuorumLoss(t *testing.T, v string) {
	etcd, err := etcdbin.Path(v)
	if err != nil {
		t.Skipf("etcd %s cannot be built from the Go module proxy, so the runbook is not followed: %v", v, err)
	}
	tools, err := etcdbin.ToolsFor(v)
	if err != nil {
		t.Skipf("etcdctl and etcdutl %s cannot be built from the Go module proxy, so the runbook is not followed: %v", v, err)
	}
	began := time.Now()
	r := newRunner(t, v, map[string]string{"etcd": etcd, "etcdctl": tools.Etcdctl, "etcdutl": tools.Etcdutl})
	r.startCluster()
	want := r.writeKeys()
	clusterID := r.clusterID("etcd-1")
	r.lose("etcd-0", "etcd-2")

	secs := sections(readDoc(t, "runbooks-quorum.md"))
	r.follow(find(t, secs, "2. Stop the operator and take snapshots"))
	r.follow(find(t, secs, "3. Stop the pods, keep the survivor's volume, drop the others"))
	survivorVolume := r.claims["data-etcd-1"]
	kept := filepath.Join(r.root, "kept-data-etcd-1")
	copyTree(t, survivorVolume, kept, nil)

	r.follow(find(t, secs, "4a. Force a new cluster from the survivor"))
	got, id, members := r.startMember("etcd-1")
	checkKeys(t, "after 4a", got, want)
	if id != clusterID || members != 1 {
		t.Errorf("after 4a etcd-1 answers as cluster %x with %d member(s), want cluster %x alone", id, members, clusterID)
	}
	r.stop("etcd-1")

	// 4b is the other way back, from where step 3 left the volumes.
	r.pods = map[string]*pod{"etcd-1": r.pods["etcd-1"]}
	must(t, os.RemoveAll(survivorVolume))
	copyTree(t, kept, survivorVolume, nil)
	r.forward = map[string]string{}
	r.follow(find(t, secs, "4b. Or restore a snapshot"))
	got, id, members = r.startMember("etcd-1")
	checkKeys(t, "after 4b", got, want)
	if id == clusterID || members != 1 {
		t.Errorf("after 4b etcd-1 answers as cluster %x with %d member(s), want a new cluster of one (the old one was %x)", id, members, clusterID)
	}
	r.stop("etcd-1")

	r.follow(find(t, secs, "5. Let the operator rebuild"))
	t.Logf("etcd %s: the runbook's quorum loss steps took %s", v, time.Since(began).Round(100*time.Millisecond))
	t.Logf("ran: %d lines; played: %d; not run (Kubernetes objects only): %d", len(r.ran), len(r.played), len(r.skipped))
	for _, l := range r.skipped {
		t.Logf("not run: %s", l)
	}
}

// runner follows runbook lines on the machine: it holds the pods (a loopback address, the
// volumes mounted, the etcd process), the claims' directories, the port-forwards and the
// shell's variables.
type runner struct {
	t       *testing.T
	version string
	bins    map[string]string
	root    string // everything of this run
	work    string // the reader's workstation: its current directory
	join    string // the join state file the members' launchers read
	token   string
	spec    corev1.PodSpec
	pods    map[string]*pod
	claims  map[string]string
	forward map[string]string
	vars    map[string]string
	// YAML pods of the section being followed, by the file name `kubectl apply -f` gives.
	manifests map[string]*corev1.Pod

	ran, played, skipped []string
}

type pod struct {
	name, addr string
	mounts     map[string]string // mount path → directory
	id         identity
	proc       *process
}

// identity is who a pod's processes run as: the user and group its securityContext gives
// (root, the images' own user, when it gives none), and fsGroup, which the kubelet adds to
// every process and gives the pod's volumes to.
type identity struct {
	uid, gid uint32
	fsGroup  *uint32
	// onRootMismatch: the kubelet changes the volume's ownership only when its root does not
	// already have the fsGroup.
	onRootMismatch bool
}

// identityOf reads the identity of a pod's first container from its pod spec.
func identityOf(spec corev1.PodSpec) identity {
	var id identity
	if sc := spec.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			id.uid = uint32(*sc.RunAsUser)
		}
		if sc.RunAsGroup != nil {
			id.gid = uint32(*sc.RunAsGroup)
		}
		if sc.FSGroup != nil {
			g := uint32(*sc.FSGroup)
			id.fsGroup = &g
		}
		id.onRootMismatch = sc.FSGroupChangePolicy != nil && *sc.FSGroupChangePolicy == corev1.FSGroupChangeOnRootMismatch
	}
	if len(spec.Containers) > 0 {
		if sc := spec.Containers[0].SecurityContext; sc != nil {
			if sc.RunAsUser != nil {
				id.uid = uint32(*sc.RunAsUser)
			}
			if sc.RunAsGroup != nil {
				id.gid = uint32(*sc.RunAsGroup)
			}
		}
	}
	return id
}

// asRoot: the test runs as root, so it runs each pod's processes as the pod's user and plays
// the kubelet's fsGroup on its volumes; otherwise everything runs as the test's user, and
// which files the member can read is not checked.
var asRoot = os.Geteuid() == 0

// credential is what a pod's process runs as.
func (id identity) credential() *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Setpgid: true}
	if asRoot {
		attr.Credential = &syscall.Credential{Uid: id.uid, Gid: id.gid}
		if id.fsGroup != nil {
			attr.Credential.Groups = []uint32{*id.fsGroup}
		}
	}
	return attr
}

// mount gives a volume to a pod as the kubelet does with fsGroup: the tree's group becomes
// fsGroup, group read and write are added (and setgid on directories, so that new files get
// the group too); with OnRootMismatch only when the volume's root does not have it already.
func (id identity) mount(t *testing.T, dir string) {
	t.Helper()
	if !asRoot || id.fsGroup == nil {
		return
	}
	g := *id.fsGroup
	if st, err := os.Stat(dir); err == nil && id.onRootMismatch {
		sys := st.Sys().(*syscall.Stat_t)
		if sys.Gid == g && st.Mode()&os.ModeSetgid != 0 && st.Mode().Perm()&0o070 == 0o070 {
			return
		}
	}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink != 0 {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if err := os.Lchown(path, -1, int(g)); err != nil {
			return err
		}
		mode := info.Mode() | 0o660
		if d.IsDir() {
			mode |= 0o110 | os.ModeSetgid
		}
		return os.Chmod(path, mode)
	})
	if err != nil {
		t.Fatalf("giving %s to group %d: %v", dir, g, err)
	}
}

func newRunner(t *testing.T, v string, bins map[string]string) *runner {
	// Not t.TempDir, whose directories only the test's user may enter: the pods' users must
	// reach their volumes and binaries.
	root, err := os.MkdirTemp("", "etcdops-runbooks-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(root) })
	must(t, os.Chmod(root, 0o755))
	for name, path := range bins {
		bins[name] = filepath.Join(root, "bin", name)
		copyFile(t, path, bins[name], 0o755)
	}
	spec, token := rendered(t, v)
	r := &runner{t: t, version: v, bins: bins, root: root, work: filepath.Join(root, "workstation"),
		join: filepath.Join(root, "join", joinstate.ConfigMapKey), token: token, spec: spec,
		pods: map[string]*pod{}, claims: map[string]string{}, forward: map[string]string{}, vars: map[string]string{}}
	for _, d := range []string{r.work, filepath.Dir(r.join)} {
		must(t, os.MkdirAll(d, 0o755))
	}
	return r
}

// startCluster starts three members at once as a new cluster: the join state lists them all
// with state new (the launcher then gives each the same --initial-cluster), then says
// existing and established, as the operator's ledger would once they answered.
func (r *runner) startCluster() {
	mountPath, _ := memberVolume(r.t, r.spec)
	st := joinstate.State{Token: r.token, ClusterState: joinstate.StateNew}
	for i := range 3 {
		name := fmt.Sprintf("etcd-%d", i)
		claim := "data-" + name
		r.claims[claim] = filepath.Join(r.root, "volumes", claim)
		must(r.t, os.MkdirAll(r.claims[claim], 0o755))
		p := &pod{name: name, addr: allocateAddr(r.t), mounts: map[string]string{mountPath: r.claims[claim]}, id: identityOf(r.spec)}
		r.pods[name] = p
		st.Members = append(st.Members, joinstate.Member{Name: name, PeerURL: "http://" + p.addr + ":2380", Incarnation: 1})
	}
	r.writeJoin(st)
	for _, name := range []string{"etcd-0", "etcd-1", "etcd-2"} {
		r.launch(name)
	}
	for _, name := range []string{"etcd-0", "etcd-1", "etcd-2"} {
		r.pods[name].proc.waitFor(r.t, "ready to serve client requests", startBound)
	}
	st.ClusterState = joinstate.StateExisting
	for i := range st.Members {
		st.Members[i].Established = true
	}
	r.writeJoin(st)
}

func (r *runner) writeJoin(st joinstate.State) {
	must(r.t, os.WriteFile(r.join, []byte(joinstate.Encode(st)), 0o644))
}

// launch starts a member as its pod does: the rendered etcd container's launch command,
// with the kubelet's $(POD_NAME), the pod's address for the wildcard and the Services' names,
// and this machine's paths, through the real launcher.
func (r *runner) launch(name string) {
	p := r.pods[name]
	c := r.spec.Containers[0]
	var args []string
	for _, a := range append(slices.Clone(c.Command[1:]), c.Args...) {
		a = strings.ReplaceAll(a, "$(POD_NAME)", name)
		a = strings.ReplaceAll(a, "0.0.0.0", p.addr)
		a = r.resolve(a)
		a = strings.ReplaceAll(a, "/etc/etcdops/join/"+joinstate.ConfigMapKey, r.join)
		a = strings.ReplaceAll(a, "/usr/local/bin/etcd", r.bins["etcd"])
		args = append(args, p.inPaths(a))
	}
	if args[0] != "launch" {
		r.t.Fatalf("the etcd container does not run the launcher: %q", c.Command)
	}
	for _, dir := range p.mounts {
		p.id.mount(r.t, dir)
	}
	argv, d, _, err := membertool.LaunchArgv(args[1:])
	if err != nil || argv == nil {
		r.t.Fatalf("the launcher does not start %s (%v): %s", name, err, d.Reason)
	}
	// The launcher ran here, as the test's user; in the pod it runs as the pod's.
	for _, dir := range p.mounts {
		for _, f := range []string{launcher.MarkerFile, launcher.TokenFile, launcher.RecoveredFile, launcher.RestoredFile, launcher.EstablishedFile} {
			if asRoot {
				if err := os.Chown(filepath.Join(dir, f), int(p.id.uid), int(p.id.gid)); err != nil && !os.IsNotExist(err) {
					r.t.Fatal(err)
				}
			}
		}
	}
	p.proc = start(r.t, r.root, name, p.id, argv)
}

// resolve answers the cluster DNS: a pod's name under the headless Service is its address.
func (r *runner) resolve(s string) string {
	for name, p := range r.pods {
		s = strings.ReplaceAll(s, name+".etcd.etcd.svc.cluster.local", p.addr)
	}
	return s
}

// inPaths puts a path inside the pod onto the volume directory mounted there.
func (p *pod) inPaths(arg string) string {
	flagName, val, isFlag := strings.Cut(arg, "=")
	if !isFlag || !strings.HasPrefix(flagName, "-") {
		flagName, val = "", arg
	}
	mounts := make([]string, 0, len(p.mounts))
	for m := range p.mounts {
		mounts = append(mounts, m)
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	for _, m := range mounts {
		if val == m || strings.HasPrefix(val, m+"/") {
			val = p.mounts[m] + val[len(m):]
			break
		}
	}
	if flagName != "" {
		return flagName + "=" + val
	}
	return val
}

func (r *runner) client(names ...string) *clientv3.Client {
	var eps []string
	for _, n := range names {
		eps = append(eps, "http://"+r.pods[n].addr+":2379")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	must(r.t, err)
	r.t.Cleanup(func() { cli.Close() })
	return cli
}

// writeKeys writes the keys through all members, then reads them back linearizably from
// etcd-1 alone, so that the survivor has applied every one before the others are lost.
func (r *runner) writeKeys() map[string]string {
	cli := r.client("etcd-0", "etcd-1", "etcd-2")
	want := map[string]string{}
	for i := range keyCount {
		k, v := fmt.Sprintf("%skey-%03d", keyPrefix, i), fmt.Sprintf("value %d of %s", i, r.version)
		ctx, cancel := context.WithTimeout(context.Background(), callBound)
		_, err := cli.Put(ctx, k, v)
		cancel()
		must(r.t, err)
		want[k] = v
	}
	checkKeys(r.t, "on etcd-1 before the loss", r.keys("etcd-1"), want)
	return want
}

func (r *runner) keys(name string) map[string]string {
	cli := r.client(name)
	ctx, cancel := context.WithTimeout(context.Background(), callBound)
	defer cancel()
	resp, err := cli.Get(ctx, keyPrefix, clientv3.WithPrefix())
	must(r.t, err)
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out
}

func (r *runner) clusterID(name string) uint64 {
	id, _ := r.membership(name)
	return id
}

func (r *runner) membership(name string) (clusterID uint64, members int) {
	cli := r.client(name)
	ctx, cancel := context.WithTimeout(context.Background(), callBound)
	defer cancel()
	resp, err := cli.MemberList(ctx)
	must(r.t, err)
	return resp.Header.ClusterId, len(resp.Members)
}

// lose kills members as a lost node does, and checks that the rest have lost quorum: a
// linearizable read on a survivor does not succeed.
func (r *runner) lose(names ...string) {
	for _, n := range names {
		r.pods[n].proc.kill()
	}
	cli := r.client("etcd-1")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := cli.Get(ctx, keyPrefix, clientv3.WithPrefix()); err == nil {
		r.t.Fatalf("etcd-1 still serves linearizable reads with %v killed: quorum is not lost", names)
	}
}

// startMember starts a member through the launcher, as its pod would after the runbook, and
// returns what it holds, its cluster ID and how many members it lists.
func (r *runner) startMember(name string) (map[string]string, uint64, int) {
	r.launch(name)
	r.pods[name].proc.waitFor(r.t, "ready to serve client requests", startBound)
	id, n := r.membership(name)
	return r.keys(name), id, n
}

func (r *runner) stop(name string) {
	if p := r.pods[name]; p != nil && p.proc != nil {
		p.proc.stop(r.t)
		p.proc = nil
	}
}

func checkKeys(t *testing.T, when string, got, want map[string]string) {
	t.Helper()
	missing := 0
	for k, v := range want {
		if got[k] != v {
			missing++
		}
	}
	if missing > 0 || len(got) != len(want) {
		t.Errorf("%s: %d of %d keys missing or different, %d keys held", when, missing, len(want), len(got))
	}
}

// follow runs every line of every shell block of a runbook section, and takes the YAML pods
// of the section as the files `kubectl apply -f` names.
func (r *runner) follow(sec section) {
	r.manifests = map[string]*corev1.Pod{}
	for _, b := range sec.blocks {
		if b.lang != "yaml" {
			continue
		}
		var p corev1.Pod
		must(r.t, yaml.UnmarshalStrict([]byte(b.text), &p))
		r.manifests[p.Name+".yaml"] = &p
	}
	for _, b := range sec.blocks {
		if b.lang != "sh" {
			continue
		}
		for _, l := range lines(b.text) {
			r.line(sec.title, l)
		}
	}
}

// line runs, plays or passes over one logical line (see the comment at the top).
func (r *runner) line(step, line string) {
	t := r.t
	switch {
	case strings.Contains(line, "=$(kubectl "):
		// What it reads stays unknown; lines that use it are Kubernetes' too.
		name, _, _ := strings.Cut(line, "=")
		r.vars[name] = "<" + name + " from the API server>"
		r.skipped = append(r.skipped, line)
		return
	}
	c, err := parse(line, r.vars)
	if err != nil {
		t.Fatalf("%s: %v", step, err)
	}
	w := c.words
	if c.pipe && w[0] != "kubectl" {
		t.Fatalf("%s: %q pipes into another command, which the test does not run", step, line)
	}
	switch {
	case len(w) == 1 && strings.Contains(w[0], "=") && !strings.HasPrefix(w[0], "-"):
		name, val, _ := strings.Cut(w[0], "=")
		r.vars[name] = r.resolve(val)
		r.ran = append(r.ran, line)
	case w[0] == "etcdctl" || w[0] == "etcdutl":
		out := r.run(step, line, r.work, nil, r.onWorkstation(w))
		r.check(step, c, out)
		r.ran = append(r.ran, line)
	case w[0] == "kubectl":
		r.kubectl(step, c)
	default:
		t.Fatalf("%s: the test does not know how to run %q: the runbook changed; teach the test (quorum_test.go) the new line", step, line)
	}
}

// onWorkstation is a line run on the reader's machine: the port-forwards' local addresses
// reach the pods, and the token the runbook says to read is the join state's.
func (r *runner) onWorkstation(w []string) []string {
	out := []string{r.bins[w[0]]}
	for _, a := range w[1:] {
		for local, remote := range r.forward {
			a = strings.ReplaceAll(a, local, remote)
		}
		if a == "<the token>" {
			a = r.token
		}
		out = append(out, a)
	}
	return out
}

func (r *runner) kubectl(step string, c command) {
	t := r.t
	w := c.words[1:]
	if len(w) > 1 && (w[0] == "-n" || w[0] == "--namespace") {
		w = w[2:]
	}
	verb := w[0]
	switch {
	case verb == "exec":
		if c.pipe {
			t.Fatalf("%s: %q pipes into another command, which the test does not run", step, c.line)
		}
		p := r.pod(step, w[1])
		i := slices.Index(w, "--")
		if i < 0 {
			t.Fatalf("%s: kubectl exec without --: %q", step, c.line)
		}
		argv := slices.Clone(w[i+1:])
		if bin, ok := r.bins[filepath.Base(argv[0])]; ok {
			argv[0] = bin
		} else if path, err := exec.LookPath(argv[0]); err == nil {
			argv[0] = path
		} else {
			t.Fatalf("%s: no %s to run inside the pod: %v", step, argv[0], err)
		}
		for j := 1; j < len(argv); j++ {
			argv[j] = p.inPaths(strings.ReplaceAll(argv[j], "127.0.0.1", p.addr))
		}
		out := r.run(step, c.line, "/", &p.id, argv)
		r.check(step, c, out)
		r.ran = append(r.ran, c.line)
	case verb == "port-forward":
		p := r.pod(step, strings.TrimPrefix(w[1], "pod/"))
		local, remote, _ := strings.Cut(w[2], ":")
		r.forward["127.0.0.1:"+local] = p.addr + ":" + remote
		r.played = append(r.played, c.line)
	case verb == "apply" && len(w) == 3 && w[1] == "-f":
		m, ok := r.manifests[w[2]]
		if !ok {
			t.Fatalf("%s: %q applies %s, which no YAML block of the step shows", step, c.line, w[2])
		}
		r.startHelper(step, m)
		r.played = append(r.played, c.line)
	case verb == "logs" && w[1] == "-f":
		_, until, ok := strings.Cut(c.comment, `until "`)
		until, _, _ = strings.Cut(until, `"`)
		if !ok || until == "" {
			t.Fatalf("%s: %q: the comment does not say until what", step, c.line)
		}
		r.pod(step, w[2]).proc.waitFor(t, until, startBound)
		r.played = append(r.played, c.line)
	case verb == "delete" && w[1] == "pod":
		for _, n := range w[2:] {
			if p := r.pod(step, n); p.proc != nil {
				p.proc.stop(t)
			}
			delete(r.pods, n)
		}
		r.played = append(r.played, c.line)
	case verb == "delete" && w[1] == "pvc":
		for _, n := range w[2:] {
			dir, ok := r.claims[n]
			if !ok {
				t.Fatalf("%s: %q deletes claim %s, which does not exist", step, c.line, n)
			}
			must(t, os.RemoveAll(dir))
			delete(r.claims, n)
		}
		r.played = append(r.played, c.line)
	case verb == "scale" && slices.Contains(w, "--replicas=0"):
		for _, p := range r.pods {
			if p.proc != nil {
				p.proc.stop(t)
				p.proc = nil
			}
		}
		r.played = append(r.played, c.line)
	case verb == "run":
		p, ok := runPod(t, "runbooks-quorum.md", c.line)
		if !ok {
			t.Fatalf("%s: %q does not make a pod", step, c.line)
		}
		r.addPod(step, p.meta)
		r.played = append(r.played, c.line)
	case verb == "wait":
		r.played = append(r.played, c.line)
	case verb == "cp":
		pname, path, ok := strings.Cut(w[2], ":")
		if !ok {
			t.Fatalf("%s: %q copies into no pod", step, c.line)
		}
		dst := r.pod(step, pname).inPaths(path)
		if _, err := os.Stat(dst); err == nil {
			t.Fatalf("%s: %q copies onto %s, which exists: kubectl cp would put the copy inside it", step, c.line, path)
		}
		// tar in the pod extracts as the pod's user, under its umask.
		p := r.pod(step, pname)
		copyTree(t, filepath.Join(r.work, w[1]), dst, &p.id)
		r.played = append(r.played, c.line)
	case verb == "get" || verb == "patch" || verb == "annotate" || verb == "scale":
		r.skipped = append(r.skipped, c.line)
	default:
		t.Fatalf("%s: the test does not know kubectl %s (%q): the runbook changed; teach the test (quorum_test.go) the new line", step, verb, c.line)
	}
}

func (r *runner) pod(step, name string) *pod {
	p, ok := r.pods[name]
	if !ok {
		r.t.Fatalf("%s: no pod %s at this step", step, name)
	}
	return p
}

// addPod makes a pod of a manifest: a fresh address, and its claims mounted where it says.
func (r *runner) addPod(step string, m *corev1.Pod) *pod {
	p := &pod{name: m.Name, addr: allocateAddr(r.t), mounts: map[string]string{}, id: identityOf(m.Spec)}
	claims := map[string]string{}
	for _, v := range m.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			dir, ok := r.claims[v.PersistentVolumeClaim.ClaimName]
			if !ok {
				r.t.Fatalf("%s: pod %s mounts claim %s, which does not exist", step, m.Name, v.PersistentVolumeClaim.ClaimName)
			}
			claims[v.Name] = dir
		}
	}
	for _, c := range m.Spec.Containers {
		for _, vm := range c.VolumeMounts {
			if dir, ok := claims[vm.Name]; ok {
				p.mounts[vm.MountPath] = dir
				p.id.mount(r.t, dir)
			}
		}
	}
	r.pods[m.Name] = p
	return p
}

// startHelper starts a helper pod's one container: its command as the YAML block has it,
// with this machine's binary, the pod's address for its loopback and its volume's directory.
func (r *runner) startHelper(step string, m *corev1.Pod) {
	p := r.addPod(step, m)
	if len(m.Spec.Containers) != 1 {
		r.t.Fatalf("%s: pod %s has %d containers, the test runs one", step, m.Name, len(m.Spec.Containers))
	}
	c := m.Spec.Containers[0]
	argv := append(slices.Clone(c.Command), c.Args...)
	bin, ok := r.bins[filepath.Base(argv[0])]
	if !ok {
		r.t.Fatalf("%s: pod %s runs %s, which the test does not have", step, m.Name, argv[0])
	}
	argv[0] = bin
	for i := 1; i < len(argv); i++ {
		argv[i] = p.inPaths(strings.ReplaceAll(argv[i], "127.0.0.1", p.addr))
	}
	p.proc = start(r.t, r.root, m.Name, p.id, argv)
}

// run runs a command to its end within callBound, as the pod's identity or, nil, as the
// reader on the workstation (the test's user), and returns its output; a failure fails the
// test with the output.
func (r *runner) run(step, line, dir string, id *identity, argv []string) string {
	r.t.Helper()
	checkLoopback(r.t, argv)
	ctx, cancel := context.WithTimeout(context.Background(), callBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	if id != nil {
		cmd.SysProcAttr = id.credential()
	}
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("%s: %s\nran %q: %v\n%s", step, line, argv, err, out)
	}
	r.t.Logf("ran: %s", line)
	return string(out)
}

var memberRow = regexp.MustCompile(`(?m)^[|│] *[0-9a-f]+ *[|│]`)

// check holds a command's output to what the runbook says of it.
func (r *runner) check(step string, c command, out string) {
	t := r.t
	w := c.words
	has := func(words ...string) bool {
		for _, x := range words {
			if !slices.Contains(w, x) {
				return false
			}
		}
		return true
	}
	switch {
	case has("endpoint", "status"):
		// Step 2 picks the survivor by these two columns.
		for _, col := range []string{"RAFT INDEX", "RAFT TERM"} {
			if !strings.Contains(out, col) {
				t.Errorf("%s: %q shows no %s column:\n%s", step, c.line, col, out)
			}
		}
	case has("snapshot", "save"):
		if fi, err := os.Stat(filepath.Join(r.work, w[len(w)-1])); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %q saved no snapshot: %v", step, c.line, err)
		}
	case has("snapshot", "restore"):
		i := slices.Index(w, "--data-dir")
		if _, err := os.Stat(filepath.Join(r.work, w[i+1], "member")); err != nil {
			t.Errorf("%s: %q restored no data dir: %v", step, c.line, err)
		}
	case has("member", "list"):
		if strings.Contains(c.comment, "one member") {
			// A row per member, its ID in hex first; v3.7 draws the table with box characters.
			rows := len(memberRow.FindAllString(out, -1))
			if rows != 1 {
				t.Errorf("%s: %q lists %d members, the runbook says one:\n%s", step, c.line, rows, out)
			}
		}
	case has("get", "--prefix", "--keys-only"):
		var keys []string
		for _, l := range strings.Split(out, "\n") {
			if l != "" {
				keys = append(keys, l)
			}
		}
		limit := keyCount
		for _, a := range w {
			if v, ok := strings.CutPrefix(a, "--limit="); ok {
				fmt.Sscan(v, &limit)
			}
		}
		if len(keys) != min(limit, keyCount) || !strings.HasPrefix(keys[0], keyPrefix) {
			t.Errorf("%s: %q lists %d keys, want %d of %s*:\n%s", step, c.line, len(keys), min(limit, keyCount), keyPrefix, out)
		}
	case w[0] == "kubectl" && slices.Contains(w, "ls"):
		for _, want := range []string{"data", launcher.MarkerFile} {
			if !slices.Contains(strings.Fields(out), want) {
				t.Errorf("%s: %q shows no %s:\n%s", step, c.line, want, out)
			}
		}
	}
}

// process is an etcd started by the test, its output in a log file.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func start(t *testing.T, root, name string, id identity, argv []string) *process {
	t.Helper()
	checkLoopback(t, argv)
	logs := filepath.Join(root, "logs")
	must(t, os.MkdirAll(logs, 0o755))
	f, err := os.CreateTemp(logs, name+"-*.log")
	must(t, err)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = id.credential()
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &process{name: name, cmd: cmd, log: f.Name(), done: make(chan struct{})}
	go func() {
		cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	return p
}

// waitFor waits until the log holds s; the process ending first, or the bound passing,
// fails the test with the log's end.
func (p *process) waitFor(t *testing.T, s string, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		data, _ := os.ReadFile(p.log)
		if strings.Contains(string(data), s) {
			return
		}
		select {
		case <-p.done:
			t.Fatalf("%s ended before logging %q:\n%s", p.name, s, tail(string(data), 20))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q within %s:\n%s", p.name, s, bound, tail(string(data), 20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop is the kubelet's stop: SIGTERM, then SIGKILL once the grace period is over.
func (p *process) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopBound):
		p.kill()
		t.Errorf("%s did not stop within %s of SIGTERM", p.name, stopBound)
	}
}

// kill is a lost node: SIGKILL, and wait until the process is gone.
func (p *process) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// checkLoopback refuses a command line that names an address outside 127.0.0.0/8: nothing
// this test runs may listen or dial elsewhere.
func checkLoopback(t *testing.T, argv []string) {
	t.Helper()
	for _, a := range argv {
		for _, s := range strings.FieldsFunc(a, func(r rune) bool { return r == ',' || r == '=' }) {
			u, err := url.Parse(s)
			if err != nil || u.Host == "" || u.Scheme == "" {
				continue
			}
			if ip := net.ParseIP(u.Hostname()); ip == nil || !ip.IsLoopback() {
				t.Fatalf("%q names %s, which is not a loopback address", argv, u.Host)
			}
		}
	}
}

// lastAddr numbers the addresses handed out: 127.0.b.n, with b drawn from the process ID so
// that test processes side by side use other addresses (test/harness uses 127.1.0.0 and up).
var lastAddr = func() *atomic.Int64 {
	var n atomic.Int64
	n.Store(int64(os.Getpid()%250) * 250)
	return &n
}()

// allocateAddr is a fresh loopback address whose etcd ports are free.
func allocateAddr(t *testing.T) string {
	t.Helper()
	for range 1000 {
		n := lastAddr.Add(1)
		addr := fmt.Sprintf("127.0.%d.%d", 1+n/250%250, 1+n%250)
		if portsFree(addr) {
			return addr
		}
	}
	t.Fatal("no free loopback address for an etcd member")
	return ""
}

func portsFree(addr string) bool {
	for _, port := range []string{"2379", "2380", "2381"} {
		ln, err := net.Listen("tcp", net.JoinHostPort(addr, port))
		if err != nil {
			return false
		}
		ln.Close()
	}
	return true
}

// copyTree copies a directory tree. With as nil it keeps every mode and owner (a copy of the
// volume); otherwise it writes as that pod's user would, as tar does in the pod: files its
// own, their group the directory's when that is setgid, modes less the umask 022.
func copyTree(t *testing.T, src, dst string, as *identity) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := info.Mode() & (fs.ModePerm | os.ModeSetgid)
		if as != nil {
			mode &^= 0o022 | os.ModeSetgid
		}
		if d.IsDir() {
			err = os.Mkdir(to, 0o700)
		} else {
			err = copyFileErr(path, to, 0o600)
		}
		if err != nil {
			return err
		}
		if asRoot {
			uid, gid := info.Sys().(*syscall.Stat_t).Uid, info.Sys().(*syscall.Stat_t).Gid
			if as != nil {
				uid, gid = as.uid, as.gid
				if parent, err := os.Stat(filepath.Dir(to)); err == nil && parent.Mode()&os.ModeSetgid != 0 {
					gid = parent.Sys().(*syscall.Stat_t).Gid
					if d.IsDir() {
						mode |= os.ModeSetgid
					}
				}
			}
			if err := os.Lchown(to, int(uid), int(gid)); err != nil {
				return err
			}
		}
		return os.Chmod(to, mode)
	})
	if err != nil {
		t.Fatalf("copy %s to %s: %v", src, dst, err)
	}
}

func copyFile(t *testing.T, src, dst string, mode fs.FileMode) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(dst), 0o755))
	must(t, copyFileErr(src, dst, mode))
	must(t, os.Chmod(dst, mode))
}

func copyFileErr(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
