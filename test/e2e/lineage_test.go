package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	gosync "sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/backup"
	"etcdops.dev/etcdops/test/harness"
	"etcdops.dev/etcdops/test/s3server"
)

// TestContinuousBackupLineages starts from a destination that is used already, four times
// over, with the continuous backup on and the workload's acknowledged writes checked key by
// key after each restore:
//
//   - A runs; a second stream of it, run by hand, supersedes the operator's (status says so),
//     stops, and the operator's stream takes the lineage back; then a backup's retention runs
//     while the stream starts a chain after a snapshot of its own, and deletes none of it.
//   - A is deleted; B, of the same name, restores A to a revision before A's last writes.
//   - B is deleted; C, of the same name, restores to a time in the middle of B's writes.
//   - C is deleted; D restores latest: C's history, with B's and A's writes as C had them,
//     and none of the writes the two restores undid.
func TestContinuousBackupLineages(t *testing.T) {
	t.Parallel()
	s3 := startHeldS3(t)
	dest := s3.destination()
	open := func() backup.Store {
		s, err := backup.NewS3(backup.S3Config{Endpoint: dest.S3.Endpoint, Bucket: dest.S3.Bucket, Prefix: dest.S3.Prefix, Region: dest.S3.Region,
			AccessKeyID: s3server.AccessKey, SecretAccessKey: s3server.SecretKey})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	keep := int32(1)
	withBackup := func(s v1alpha1.EtcdClusterSpec) v1alpha1.EtcdClusterSpec {
		s.Backup = &v1alpha1.BackupSpec{Schedule: "@daily", Destination: dest, Retention: &v1alpha1.BackupRetention{Keep: &keep},
			Continuous: &v1alpha1.ContinuousBackup{Interval: &metav1.Duration{Duration: time.Second}}}
		return s
	}
	more := func(w *harness.Workload, n int) { w.AwaitAcked(w.Acked()+n, changeBound) }
	stream := "etcd-backup-stream"
	wait := func(env *harness.Env, what string, cond func(*v1alpha1.EtcdClusterStatus) bool) {
		t.Helper()
		if _, err := env.WaitFor(changeBound, func() (bool, string) {
			p := env.Store.Parent()
			return p != nil && cond(&p.Status), what
		}); err != nil {
			t.Fatalf("%v: status %+v\n%s", err, lastBackup(env), env.Describe())
		}
	}
	stored := func(env *harness.Env, rev int64) {
		t.Helper()
		wait(env, "the stream has not stored the writes", func(st *v1alpha1.EtcdClusterStatus) bool {
			return st.Backup != nil && st.Backup.Continuous != nil && st.Backup.Continuous.StoredRevision >= rev
		})
	}
	// stopStream turns the stream off, so that the destination is at rest, and deletes the
	// cluster with everything it had.
	stopAndDelete := func(env *harness.Env) {
		t.Helper()
		env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { s.Backup.Continuous = nil })
		if _, err := env.WaitFor(changeBound, func() (bool, string) { return env.Streams.Starts(stream) == 0, "the stream still runs" }); err != nil {
			t.Fatal(err)
		}
		env.Close()
	}
	restore := func(from v1alpha1.FromBackup, continuous bool) *harness.Env {
		t.Helper()
		r := newEnv(t, false)
		addCredentials(t, r)
		s := spec(1)
		if continuous {
			s = withBackup(s)
		}
		from.BackupDestination, from.Name = dest, v1alpha1.LatestBackup
		s.Bootstrap = &v1alpha1.BootstrapSpec{FromBackup: &from}
		r.Create(s)
		if _, err := r.WaitSteady(1, createBound); err != nil {
			ls, lerr := backup.ListLineages(context.Background(), open())
			t.Fatalf("the restored cluster is not steady: %v\n%s\nlineages %+v %v", err, r.Describe(), ls, lerr)
		}
		return r
	}
	// holds checks that env's cluster holds w's keys as they were at rev, key by key.
	holds := func(env *harness.Env, w *harness.Workload, rev int64, what string) {
		t.Helper()
		diff, err := w.CheckRestoredAt(env, rev, verifyBound)
		if err != nil {
			t.Fatal(err)
		}
		if len(diff) > 0 {
			t.Fatalf("%s: at revision %d, %d differences, first %v", what, rev, len(diff), diff[:min(5, len(diff))])
		}
	}
	current := func(env *harness.Env) int64 {
		t.Helper()
		cli, err := env.Client()
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), verifyBound)
		defer cancel()
		resp, err := cli.Get(ctx, "\x00", clientv3.WithKeysOnly(), clientv3.WithLimit(1))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}

	// A.
	a := newEnv(t, false)
	addCredentials(t, a)
	a.Create(withBackup(spec(1)))
	waitSteady(t, a, 1)
	wa, err := a.StartWorkload("/a")
	if err != nil {
		t.Fatal(err)
	}
	more(wa, 50)
	idA := a.Store.Parent().Status.ClusterID
	lineageA := backup.LineageStore(open(), idA)

	// A second writer of A's lineage, once the operator's stream has claimed it: a stream
	// that claims after the one by hand supersedes it instead (a slow start on a loaded
	// machine did).
	stored(a, current(a))
	stopByHand, _, err := a.Streams.RunByHand(context.Background(), stream, "etcd-backup-stream-by-hand")
	if err != nil {
		t.Fatal(err)
	}
	wait(a, "the operator's stream is not reported superseded", func(st *v1alpha1.EtcdClusterStatus) bool {
		return st.Backup.Continuous.SupersededBy != "" && strings.Contains(st.Backup.Continuous.SupersededBy, "etcd-backup-stream-by-hand") &&
			conditionReason(st, v1alpha1.ConditionBackedUp) == "StreamSuperseded"
	})
	more(wa, 50)
	stopByHand()
	// Its pod restarted, the operator's stream claims the lineage again.
	if !a.KillStream() {
		t.Fatalf("no stream runs\n%s", a.Describe())
	}
	wait(a, "the operator's stream has not taken its lineage back", func(st *v1alpha1.EtcdClusterStatus) bool {
		return st.Backup.Continuous.SupersededBy == "" && conditionReason(st, v1alpha1.ConditionBackedUp) == "StreamCaughtUp"
	})
	more(wa, 50)

	// Retention racing a new chain: the backup's retention deletes the snapshot it expired
	// (held there), while the stream, stopped past a compaction, starts again after a
	// snapshot of its own that the retention never listed.
	s3.holdNextDelete(".db")
	a.Store.AnnotateParent(v1alpha1.AnnotationBackupNow, "race")
	held := s3.waitHeld(t, changeBound)
	a.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { s.Backup.Continuous = nil })
	if _, err := a.WaitFor(changeBound, func() (bool, string) { return a.Streams.Starts(stream) == 0, "the stream still runs" }); err != nil {
		t.Fatal(err)
	}
	more(wa, 20)
	compacted, err := wa.Compact()
	if err != nil {
		t.Fatal(err)
	}
	a.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) {
		s.Backup.Continuous = &v1alpha1.ContinuousBackup{Interval: &metav1.Duration{Duration: time.Second}}
	})
	var chainStart int64
	if _, err := a.WaitFor(changeBound, func() (bool, string) {
		objs, err1 := lineageA.List(context.Background())
		deltas, err2 := lineageA.ListDeltas(context.Background())
		for _, o := range objs {
			for _, d := range deltas {
				if o.Revision >= compacted && d.Base == o.Revision {
					chainStart = o.Revision
					return true, ""
				}
			}
		}
		return false, "no chain after a snapshot of the stream's own yet" + errText(err1, err2)
	}); err != nil {
		t.Fatal(err)
	}
	s3.release()
	wait(a, "the requested backup has not finished", func(st *v1alpha1.EtcdClusterStatus) bool {
		return st.Backup.LastRequest == "race" && st.Backup.LastSuccessful != nil && st.Backup.LastSuccessful.Revision < chainStart
	})
	deltas, err := lineageA.ListDeltas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	kept := 0
	for _, d := range deltas {
		if d.Base == chainStart {
			kept++
		}
	}
	if kept == 0 {
		t.Fatalf("retention (held at %s) deleted the chain after revision %d that the stream began meanwhile: %v", held, chainStart, deltas)
	}
	more(wa, 50)
	afterRace := current(a)
	more(wa, 50)
	wa.Stop()
	finalA := wa.History().Final
	stored(a, finalA)
	// Restored to a revision before A's last writes: those are the writes the restore undoes.
	rA := (afterRace + finalA) / 2
	stopAndDelete(a)
	t.Logf("A: lineage %s to revision %d; compacted at %d, the stream's own chain after %d; restoring to %d", idA, finalA, compacted, chainStart, rA)

	// B: A restored, under the same name, to rA.
	b := restore(v1alpha1.FromBackup{Revision: &rA}, true)
	st := b.Store.Parent().Status
	if st.RestoredRevision != rA || st.RestoredLineage != idA || st.RestoredTime == nil {
		t.Fatalf("B: restored revision %d of lineage %s at %v, want %d of %s with its time", st.RestoredRevision, st.RestoredLineage, st.RestoredTime, rA, idA)
	}
	holds(b, wa, rA, "B, restored from A")
	idB := st.ClusterID
	wb, err := b.StartWorkload("/b")
	if err != nil {
		t.Fatal(err)
	}
	more(wb, 50)
	// A time in the middle of B's writes, on the second (what the spec keeps): every change
	// before it was stored and received before it; those after come after it.
	r0 := current(b)
	stored(b, r0)
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(1100 * time.Millisecond)))
	at := time.Now().Truncate(time.Second)
	r1 := current(b)
	more(wb, 50)
	wb.Stop()
	stored(b, wb.History().Final)
	stopAndDelete(b)
	t.Logf("B: lineage %s to revision %d; restoring to %s (revisions %d to %d then)", idB, wb.History().Final, at.Format(time.RFC3339), r0, r1)

	// C: restored to that time, in the newest lineage, B's.
	c := restore(v1alpha1.FromBackup{Time: &metav1.Time{Time: at}}, true)
	st = c.Store.Parent().Status
	rC := st.RestoredRevision
	if rC < r0 || rC > r1 || st.RestoredLineage != idB || st.RestoredTime == nil || st.RestoredTime.After(at) {
		t.Fatalf("C: restored to %s: revision %d of lineage %s stored at %v; want a revision from %d to %d of %s, stored at or before it",
			at.Format(time.RFC3339), rC, st.RestoredLineage, st.RestoredTime, r0, r1, idB)
	}
	holds(c, wb, rC, "C, restored from B")
	holds(c, wa, rA, "C, A's writes as B had them")
	idC := st.ClusterID
	wc, err := c.StartWorkload("/c")
	if err != nil {
		t.Fatal(err)
	}
	more(wc, 50)
	wc.Stop()
	finalC := wc.History().Final
	stored(c, finalC)
	stopAndDelete(c)

	// D: latest is C's newest change.
	d := restore(v1alpha1.FromBackup{}, false)
	st = d.Store.Parent().Status
	if st.RestoredRevision != finalC || st.RestoredLineage != idC {
		t.Fatalf("D: restored revision %d of lineage %s, want C's newest, %d of %s", st.RestoredRevision, st.RestoredLineage, finalC, idC)
	}
	holds(d, wc, finalC, "latest, C's writes")
	holds(d, wb, rC, "latest, B's writes as C had them")
	holds(d, wa, rA, "latest, A's writes as B had them")
	ls, err := backup.ListLineages(context.Background(), open())
	if err != nil || len(ls) != 3 {
		t.Fatalf("lineages %+v, %v: want A's, B's and C's", ls, err)
	}
	t.Logf("lineages %s (to revision %d), %s (from %d, to %d), %s (from %d at %s, to %d); the chain after the stream's own snapshot of revision %d kept through retention",
		idA, finalA, idB, rA, wb.History().Final, idC, rC, at.Format(time.RFC3339), finalC, chainStart)
}

func conditionReason(st *v1alpha1.EtcdClusterStatus, typ string) string {
	for _, c := range st.Conditions {
		if c.Type == typ {
			return c.Reason
		}
	}
	return ""
}

func errText(errs ...error) string {
	var out []string
	for _, err := range errs {
		if err != nil {
			out = append(out, err.Error())
		}
	}
	if len(out) == 0 {
		return ""
	}
	return ": " + strings.Join(out, "; ")
}

// heldS3 is the real S3 server behind a proxy on loopback that can hold one request: the
// next DELETE of an object whose name ends in a suffix waits there until released.
type heldS3 struct {
	endpoint string
	mu       gosync.Mutex
	suffix   string
	held     chan string
	released chan struct{}
	once     gosync.Once
}

func startHeldS3(t *testing.T) *heldS3 {
	srv := s3server.Start(t, "etcd-backups")
	target, err := url.Parse(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	h := &heldS3{held: make(chan string, 1), released: make(chan struct{})}
	proxy := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		hold := h.suffix != "" && r.Method == http.MethodDelete && strings.HasSuffix(r.URL.Path, h.suffix)
		if hold {
			h.suffix = ""
		}
		h.mu.Unlock()
		if hold {
			h.held <- r.URL.Path
			<-h.released
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { h.release(); front.Close() })
	h.endpoint = front.URL
	return h
}

func (h *heldS3) destination() v1alpha1.BackupDestination {
	return v1alpha1.BackupDestination{S3: &v1alpha1.S3Destination{Endpoint: h.endpoint, Bucket: "etcd-backups", Prefix: "e2e/etcd/",
		Region: s3server.Region, CredentialsSecret: "s3-credentials"}}
}

func (h *heldS3) holdNextDelete(suffix string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.suffix = suffix
}

func (h *heldS3) waitHeld(t *testing.T, bound time.Duration) string {
	t.Helper()
	select {
	case p := <-h.held:
		return p
	case <-time.After(bound):
		t.Fatalf("no DELETE held in %s", bound)
		return ""
	}
}

func (h *heldS3) release() { h.once.Do(func() { close(h.released) }) }
