package launcher

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"etcdops.dev/etcdops/internal/etcdtest"
	"etcdops.dev/etcdops/joinstate"
)

// pod is a member volume and a mounted join state in a temp dir.
type pod struct {
	t       *testing.T
	volume  string
	dataDir string
	join    string
}

func newPod(t *testing.T) *pod {
	root := t.TempDir()
	p := &pod{t: t, volume: filepath.Join(root, "volume"), join: filepath.Join(root, "join", joinstate.ConfigMapKey)}
	p.dataDir = filepath.Join(p.volume, "data")
	if err := os.MkdirAll(filepath.Dir(p.join), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *pod) mount(s joinstate.State) {
	if err := os.WriteFile(p.join, []byte(joinstate.Encode(s)), 0o600); err != nil {
		p.t.Fatal(err)
	}
}

// etcdWrites stands for etcd writing its data dir.
func (p *pod) etcdWrites() {
	if err := os.MkdirAll(filepath.Join(p.dataDir, "member", "wal"), 0o700); err != nil {
		p.t.Fatal(err)
	}
}

func (p *pod) launch(name string) ([]string, Decision, error) {
	return Prepare(Options{JoinState: p.join, Name: name, DataDir: p.dataDir, Etcd: "/usr/local/bin/etcd", Static: []string{"--listen-peer-urls=http://0.0.0.0:2380"}})
}

func TestPrepareLifeOfAMember(t *testing.T) {
	p := newPod(t)

	// The pod starts before the kubelet has mounted the join state.
	if argv, d, err := p.launch("e-1"); err != nil || d.Kind != Wait || argv != nil {
		t.Fatalf("no join state file: got %v %+v %v", argv, d, err)
	}
	p.mount(join("existing", member("e-0", 1, true)))
	if _, d, err := p.launch("e-1"); err != nil || d.Kind != Wait {
		t.Fatalf("not yet in the join state: got %+v %v", d, err)
	}

	// Added as a learner: joins with the full initial cluster.
	p.mount(join("existing", member("e-0", 1, true), member("e-1", 1, false)))
	argv, d, err := p.launch("e-1")
	if err != nil || d.Kind != Start {
		t.Fatalf("joiner: got %+v %v", d, err)
	}
	want := []string{"/usr/local/bin/etcd", "--listen-peer-urls=http://0.0.0.0:2380", "--name=e-1", "--data-dir=" + p.dataDir,
		"--initial-cluster=e-0=" + peer("e-0") + ",e-1=" + peer("e-1"), "--initial-cluster-state=existing", "--initial-cluster-token=ns/e/uid-1"}
	if !slices.Equal(argv, want) {
		t.Fatalf("argv\n got %q\nwant %q", argv, want)
	}
	p.etcdWrites()

	// Promoted and established; a restart keeps the data.
	p.mount(join("existing", member("e-0", 1, true), member("e-1", 1, true)))
	if _, d, err := p.launch("e-1"); err != nil || d.Kind != Start || d.Wipe {
		t.Fatalf("restart: got %+v %v", d, err)
	}

	// Its data is lost: it must not start empty.
	if err := os.RemoveAll(p.dataDir); err != nil {
		t.Fatal(err)
	}
	if _, d, err := p.launch("e-1"); err != nil || d.Kind != Refuse {
		t.Fatalf("established on an empty dir: got %+v %v", d, err)
	}

	// The planner replaces it with incarnation 2; a leftover data dir of 1 is wiped.
	p.etcdWrites()
	p.mount(join("existing", member("e-0", 1, true), member("e-1", 2, false)))
	if _, d, err := p.launch("e-1"); err != nil || d.Kind != Start || !d.Wipe {
		t.Fatalf("replacement: got %+v %v", d, err)
	}
	if _, err := os.Stat(p.dataDir); !os.IsNotExist(err) {
		t.Fatalf("stale data dir not wiped: %v", err)
	}
	v, err := Inspect(p.dataDir)
	if err != nil || v != (Volume{HasMarker: true, Incarnation: 2, Token: "ns/e/uid-1"}) {
		t.Fatalf("after the wipe: %+v %v", v, err)
	}
}

func TestPrepareRejectsBadOptions(t *testing.T) {
	p := newPod(t)
	p.mount(join("new", member("e-0", 1, false)))
	_, _, err := Prepare(Options{JoinState: p.join, Name: "e-0", DataDir: p.dataDir, Etcd: "etcd", Static: []string{"--initial-cluster-state", "new"}})
	if !errors.Is(err, ErrBadOptions) || !strings.Contains(err.Error(), "initial-cluster-state") {
		t.Fatalf("got %v, want the owned flag named", err)
	}
	for _, dir := range []string{"data", "/"} {
		if _, _, err := Prepare(Options{JoinState: p.join, Name: "e-0", DataDir: dir, Etcd: "etcd"}); !errors.Is(err, ErrBadOptions) {
			t.Errorf("data dir %q: got %v", dir, err)
		}
	}
}

func TestInspectRejectsBadMarker(t *testing.T) {
	p := newPod(t)
	if err := os.MkdirAll(p.volume, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(MarkerPath(p.dataDir), []byte("two\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Inspect(p.dataDir); err == nil {
		t.Fatal("a marker that is not a number was accepted")
	}
}

// TestPrepareQuorumRecovery: the survivor starts once with --force-new-cluster, recording the
// recovery first; the fenced members wait; a restart afterwards starts normally.
func TestPrepareQuorumRecovery(t *testing.T) {
	p := newPod(t)
	p.mount(join("new", member("e-0", 1, false)))
	if _, d, err := p.launch("e-0"); err != nil || d.Kind != Start {
		t.Fatalf("seed: %+v %v", d, err)
	}
	p.etcdWrites()

	recovering := join("existing", member("e-0", 1, true), fenced(member("e-1", 1, true)), fenced(member("e-2", 1, true)))
	recovering.Recovery = &joinstate.Recovery{Survivor: "e-0", Token: "r1"}
	p.mount(recovering)
	if v, _ := Inspect(p.dataDir); !RecoveryPending(recovering, "e-0", v) {
		t.Fatal("the survivor's probe would not ask for the restart")
	}
	argv, d, err := p.launch("e-0")
	if err != nil || d.Kind != Start || d.Recovered != "r1" || argv[len(argv)-1] != "--force-new-cluster" {
		t.Fatalf("survivor: got %q %+v %v", argv, d, err)
	}
	v, err := Inspect(p.dataDir)
	if err != nil || v.Recovered != "r1" || RecoveryPending(recovering, "e-0", v) {
		t.Fatalf("recovery marker: %+v %v", v, err)
	}
	argv, d, err = p.launch("e-0")
	if err != nil || d.Kind != Start || d.Recovered != "" || slices.Contains(argv, "--force-new-cluster") {
		t.Fatalf("a restart after the recovery forces again: %q %+v %v", argv, d, err)
	}
	if _, d, err := p.launch("e-1"); err != nil || d.Kind != Wait || !strings.Contains(d.Reason, "fenced") {
		t.Fatalf("fenced member: got %+v %v", d, err)
	}
}

func fenced(m joinstate.Member) joinstate.Member {
	m.Fenced = true
	return m
}

func TestPrepareRestoresOnceAndSurvivesACrash(t *testing.T) {
	p := newPod(t)
	p.mount(restoring(join("new", member("e-0", 1, false))))
	var targets []RestoreTarget
	fail := true
	restore := func(rt RestoreTarget) error {
		targets = append(targets, rt)
		// etcdutl writes the whole data dir; a crash part-way leaves part of it.
		if err := os.MkdirAll(filepath.Join(rt.DataDir, "member", "snap"), 0o700); err != nil {
			return err
		}
		if fail {
			return errors.New("connection reset")
		}
		return os.WriteFile(filepath.Join(rt.DataDir, "member", "snap", "db"), []byte("restored"), 0o600)
	}
	launch := func() ([]string, Decision, error) {
		return Prepare(Options{JoinState: p.join, Name: "e-0", DataDir: p.dataDir, Etcd: "/usr/local/bin/etcd", Restore: restore})
	}

	if argv, d, err := launch(); err == nil || argv != nil || !d.Restore {
		t.Fatalf("a failed restore: got %v %+v %v", argv, d, err)
	}
	if v, err := Inspect(p.dataDir); err != nil || v.HasData || v.HasMarker || v.Restored != "" {
		t.Fatalf("a failed restore left %+v %v; want nothing", v, err)
	}
	fail = false
	argv, d, err := launch()
	if err != nil || argv == nil || !d.Restore {
		t.Fatalf("restore: got %v %+v %v", argv, d, err)
	}
	want := RestoreTarget{DataDir: p.dataDir + ".restoring", Member: "e-0", PeerURL: peer("e-0"), InitialCluster: "e-0=" + peer("e-0"), Token: "ns/e/uid-1", Backup: "latest", Revision: 42}
	if got := targets[len(targets)-1]; got != want {
		t.Fatalf("restored for %+v, want %+v", got, want)
	}
	if b, err := os.ReadFile(filepath.Join(p.dataDir, "member", "snap", "db")); err != nil || string(b) != "restored" {
		t.Fatalf("data dir after restore: %q %v", b, err)
	}
	if _, err := os.Stat(p.dataDir + ".restoring"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the restore's work dir is left: %v", err)
	}

	// A restart restarts on the restored data, restoring nothing again.
	n := len(targets)
	if argv, d, err := launch(); err != nil || argv == nil || d.Restore || len(targets) != n {
		t.Fatalf("restart after restore: got %v %+v %v, %d restores", argv, d, err, len(targets)-n)
	}
}

func TestPrepareRestoreWithoutFlagsIsBadOptions(t *testing.T) {
	p := newPod(t)
	p.mount(restoring(join("new", member("e-0", 1, false))))
	if _, _, err := p.launch("e-0"); !errors.Is(err, ErrBadOptions) || !strings.Contains(err.Error(), "--restore-") {
		t.Fatalf("restore asked without restore flags: %v", err)
	}
}

// TestPrepareRefusesAnEarlierClustersVolume: an EtcdCluster deleted with its claims kept and
// re-created under the same name has a new UID, so a new token. Its seed finds the old
// cluster's data on the claim and refuses; nothing on the volume changes.
func TestPrepareRefusesAnEarlierClustersVolume(t *testing.T) {
	p := newPod(t)
	p.mount(join("new", member("e-0", 0, false)))
	if _, d, err := p.launch("e-0"); err != nil || d.Kind != Start {
		t.Fatalf("first cluster's seed: %+v %v", d, err)
	}
	p.etcdWrites()
	if v, err := Inspect(p.dataDir); err != nil || v.Token != "ns/e/uid-1" {
		t.Fatalf("the start did not record the cluster token: %+v %v", v, err)
	}

	recreated := join("new", member("e-0", 0, false))
	recreated.Token = "ns/e/uid-2"
	p.mount(recreated)
	argv, d, err := p.launch("e-0")
	if err != nil || d.Kind != Refuse || argv != nil || !strings.HasPrefix(d.Reason, joinstate.ForeignCluster+"ns/e/uid-1") {
		t.Fatalf("re-created cluster's seed on the old claim: got %q %+v %v", argv, d, err)
	}
	v, err := Inspect(p.dataDir)
	if err != nil || v != (Volume{HasData: true, HasMarker: true, Incarnation: 0, Token: "ns/e/uid-1"}) {
		t.Fatalf("the refusal changed the volume: %+v %v", v, err)
	}
}

// TestPrepareRecordsTheTokenOnAVolumeOfBefore: a volume written before the launcher recorded
// the cluster token has a marker and no token. It keeps starting, and its first start under a
// join state records the token, after which another cluster's join state is refused.
func TestPrepareRecordsTheTokenOnAVolumeOfBefore(t *testing.T) {
	p := newPod(t)
	p.etcdWrites()
	if err := os.WriteFile(MarkerPath(p.dataDir), []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p.mount(join("existing", member("e-0", 1, true)))
	if _, d, err := p.launch("e-0"); err != nil || d.Kind != Start || d.Wipe {
		t.Fatalf("a volume without a token: got %+v %v", d, err)
	}
	if b, err := os.ReadFile(TokenPath(p.dataDir)); err != nil || string(b) != "ns/e/uid-1\n" {
		t.Fatalf("token file after the start: %q %v", b, err)
	}
	other := join("existing", member("e-0", 1, true))
	other.Token = "ns/e/uid-2"
	p.mount(other)
	if _, d, err := p.launch("e-0"); err != nil || d.Kind != Refuse {
		t.Fatalf("another cluster after the token was recorded: got %+v %v", d, err)
	}
}

// TestPrepareRefusesToForceWhileAPeerAnswers: a fenced member whose etcd still runs (its
// process paused, or started on a mount older than the fence) listens on its peer URL. The
// survivor must not force a new cluster then: the old membership may keep a quorum beside it.
// A real listener on loopback stands for that member's etcd.
func TestPrepareRefusesToForceWhileAPeerAnswers(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p := newPod(t)
	p.mount(join("new", member("e-0", 1, false)))
	if _, d, err := p.launch("e-0"); err != nil || d.Kind != Start {
		t.Fatalf("seed: %+v %v", d, err)
	}
	p.etcdWrites()
	alive := fenced(member("e-1", 1, true))
	alive.PeerURL = "http://" + l.Addr().String()
	recovering := join("existing", member("e-0", 1, true), alive, fenced(member("e-2", 1, true)))
	recovering.Recovery = &joinstate.Recovery{Survivor: "e-0", Token: "r1"}
	p.mount(recovering)
	argv, d, err := p.launch("e-0")
	if err != nil || d.Kind != Wait || argv != nil || !strings.Contains(d.Reason, "e-1") {
		t.Fatalf("survivor while e-1 answers: got %q %+v %v", argv, d, err)
	}
	if v, _ := Inspect(p.dataDir); v.Recovered != "" {
		t.Fatalf("the recovery was recorded though etcd did not force: %+v", v)
	}
	l.Close()
	argv, d, err = p.launch("e-0")
	if err != nil || d.Kind != Start || argv[len(argv)-1] != "--force-new-cluster" {
		t.Fatalf("survivor once e-1 is gone: got %q %+v %v", argv, d, err)
	}
}

// TestRecordEstablished: the probe's note that the member is a voter binds to the volume's
// incarnation, survives a wiped data dir, and then makes Prepare refuse the empty dir although
// the mounted join state still says the member is not established; a later incarnation of the
// member is not bound by it.
func TestRecordEstablished(t *testing.T) {
	p := newPod(t)
	if err := RecordEstablished(p.dataDir); err != nil {
		t.Fatalf("a volume without a marker: %v", err)
	}
	if _, err := os.Stat(EstablishedPath(p.dataDir)); !os.IsNotExist(err) {
		t.Fatalf("recorded on a volume without a marker: %v", err)
	}
	p.mount(join("existing", member("e-0", 1, true), member("e-1", 1, false)))
	if err := os.MkdirAll(p.dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(MarkerPath(p.dataDir), []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := RecordEstablished(p.dataDir); err != nil {
		t.Fatal(err)
	}
	if v, err := Inspect(p.dataDir); err != nil || !v.Established {
		t.Fatalf("after recording: %+v %v", v, err)
	}
	if err := os.RemoveAll(p.dataDir); err != nil {
		t.Fatal(err)
	}
	if _, d, err := p.launch("e-1"); err != nil || d.Kind != Refuse {
		t.Fatalf("a lost data dir of a recorded voter: %+v %v, want a refusal", d, err)
	}
	p.mount(join("existing", member("e-0", 1, true), member("e-1", 2, false)))
	if _, d, err := p.launch("e-1"); err != nil || d.Kind != Start {
		t.Fatalf("the member added back as incarnation 2: %+v %v, want a start", d, err)
	}
}

// TestPrepareReadsTheClusterIDOfAVolumeOfBeforeTheToken: a data dir a real etcd wrote, whose
// volume has an incarnation marker but no token (left by a launcher of before the token),
// is refused when its etcd cluster ID is not the one the join state records, and nothing of
// it is wiped; of that ID, it starts and the token is recorded.
func TestPrepareReadsTheClusterIDOfAVolumeOfBeforeTheToken(t *testing.T) {
	p := newPod(t)
	cfg := etcdtest.Config("e-0", p.dataDir, etcdtest.FreeURL(t), etcdtest.FreeURL(t))
	e := etcdtest.Start(t, cfg)
	id := fmt.Sprintf("%x", uint64(e.Server.Cluster().ID()))
	e.Stop()
	if err := os.WriteFile(MarkerPath(p.dataDir), []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if v, err := Inspect(p.dataDir); err != nil || v.ClusterID != id || v.Token != "" {
		t.Fatalf("inspect: %+v %v, want cluster ID %s and no token", v, err, id)
	}
	other := join("existing", member("e-0", 1, true))
	other.ClusterID = "c0ffee"
	p.mount(other)
	if argv, d, err := p.launch("e-0"); err != nil || d.Kind != Refuse || argv != nil || !strings.HasPrefix(d.Reason, joinstate.ForeignCluster+id) {
		t.Fatalf("another cluster ID on record: got %v %+v %v, want refused naming %s", argv, d, err, id)
	}
	if _, err := os.Stat(filepath.Join(p.dataDir, "member", "wal")); err != nil {
		t.Fatalf("the refused data was touched: %v", err)
	}
	mine := join("existing", member("e-0", 1, true))
	mine.ClusterID = id
	p.mount(mine)
	if _, d, err := p.launch("e-0"); err != nil || d.Kind != Start || d.Wipe {
		t.Fatalf("its own cluster ID on record: got %+v %v, want a start on the data", d, err)
	}
	if v, err := Inspect(p.dataDir); err != nil || v.Token != mine.Token {
		t.Fatalf("after the start: %+v %v, want the token recorded", v, err)
	}
}
