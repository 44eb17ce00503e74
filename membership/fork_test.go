package membership

import (
	"context"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/test/etcdtest"
)

// TestObserveTwoClustersUnderOneName: the endpoints of one cluster's pods reach members of
// two separate clusters (a pod's address reused by another cluster's member). Whichever side
// serves the member list, the members of the other answer for another cluster ID: the
// snapshot is inconsistent and names them as forked.
func TestObserveTwoClustersUnderOneName(t *testing.T) {
	a := newTestCluster(t, 2, nil)
	b := newTestCluster(t, 1, nil)
	req := a.request()
	stray := b.endpoint(b.members[0])
	stray.Member = "m-2"
	req.Endpoints = append(req.Endpoints, stray)

	snap := observeTimed(t, newTestObserver(t), req)
	if !strings.Contains(snap.Inconsistent, "answers for cluster") || len(snap.Forked) == 0 {
		t.Fatalf("a member of another cluster must make the snapshot inconsistent and name the forked side; got %+v", snap)
	}
	if !slices.Equal(snap.Forked, []string{"m-2"}) && !slices.Equal(snap.Forked, []string{"m-0", "m-1"}) {
		t.Errorf("forked %v: want the one side or the other", snap.Forked)
	}
}

// TestObserveForcedCopyOfARemovedMember is the fork a botched recovery makes: a copy of a
// member's data dir is started with --force-new-cluster after that member was removed. It
// keeps the cluster ID and its member ID, forms a one-member cluster of its own and leads
// it. Seen beside the real members it answers under an ID their member list lacks, and a
// second leader reports itself: inconsistent, and named.
func TestObserveForcedCopyOfARemovedMember(t *testing.T) {
	slowTest(t)
	c := newTestCluster(t, 3, nil)
	leader := c.leader()
	var gone *testMember
	for _, m := range c.members {
		if m != leader {
			gone = m
		}
	}
	goneID := gone.id()
	c.stop(gone)
	copyDir := t.TempDir()
	if err := os.CopyFS(copyDir, os.DirFS(gone.dir)); err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{leader.clientURL.String()}, DialTimeout: testDeadline})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	if _, err := cli.MemberRemove(ctx, goneID); err != nil {
		t.Fatal(err)
	}
	cli.Close()
	// The copy would hear from the members it still knows, before its forced membership
	// applies, that it was removed, and stop: they are down while it starts.
	survivors := slices.DeleteFunc(slices.Clone(c.members), func(m *testMember) bool { return m == gone })
	for _, m := range survivors {
		c.stop(m)
	}
	clientURL := etcdtest.FreeURL(t)
	cfg := etcdtest.Config(gone.name, copyDir, etcdtest.FreeURL(t), clientURL)
	cfg.ForceNewCluster = true
	forked := etcdtest.Start(t, cfg)
	if got := uint64(forked.Server.MemberID()); got != goneID {
		t.Fatalf("the forced copy runs as member %x, want %x", got, goneID)
	}
	var wg sync.WaitGroup
	for _, m := range survivors {
		wg.Go(func() { c.start(m, "existing", c.initialCluster()) })
	}
	wg.Wait()
	c.leader()

	var req etcdstate.Request
	for _, m := range c.members {
		ep := c.endpoint(m)
		if m == gone {
			ep.Address = clientURL.Host
		}
		req.Endpoints = append(req.Endpoints, ep)
	}
	req.Key = c.token
	snap := observeTimed(t, newTestObserver(t), req)
	if !snap.Asked || !strings.Contains(snap.Inconsistent, "not in the member list") || !strings.Contains(snap.Inconsistent, "each report themselves leader") {
		t.Fatalf("want an inconsistent snapshot: a member outside the list, and two leaders; got %+v", snap)
	}
	if !slices.Contains(snap.Forked, gone.name) && !slices.Contains(snap.Forked, leader.name) {
		t.Errorf("forked %v: want %s or %s named", snap.Forked, gone.name, leader.name)
	}
}
