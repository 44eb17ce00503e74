package membership

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

func TestUpdatePeerURL(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	op := dialTest(t, c, c.members...)
	ctx := opContext(t)
	m, other := c.members[2], c.members[1]
	id := m.id()
	moved := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))

	out, err := op.UpdatePeerURL(ctx, m.name, id, m.peerURL.String())
	wantOutcome(t, "update to the URL it has", out, err, AlreadyDone)
	out, err = eventually(t, func() (Outcome, error) { return op.UpdatePeerURL(ctx, m.name, id, moved) })
	wantOutcome(t, "update", out, err, Done)
	ms, err := op.members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := findByID(ms, id); got == nil || !slices.Equal(got.PeerURLs, []string{moved}) {
		t.Fatalf("after the update the member list has %+v, want peer URL %s", got, moved)
	}
	out, err = op.UpdatePeerURL(ctx, m.name, id, moved)
	wantOutcome(t, "update again", out, err, AlreadyDone)

	for _, tc := range []struct {
		story      string
		name       string
		id         uint64
		url        string
		wantRefuse bool
	}{
		{"another member's URL", m.name, id, other.peerURL.String(), true},
		{"the member under another pod's name", other.name, id, m.peerURL.String(), true},
		{"a member that is not there", m.name, 0xdead, m.peerURL.String(), true},
	} {
		if _, err := op.UpdatePeerURL(ctx, tc.name, tc.id, tc.url); !errors.Is(err, ErrRefused) {
			t.Errorf("%s: got %v, want refused", tc.story, err)
		}
	}
	// A member that lists the URL among others keeps only it: the URL is its own, not
	// another member's.
	if _, err := op.cli.MemberUpdate(ctx, id, []string{moved, m.peerURL.String()}); err != nil {
		t.Fatal(err)
	}
	out, err = eventually(t, func() (Outcome, error) { return op.UpdatePeerURL(ctx, m.name, id, m.peerURL.String()) })
	wantOutcome(t, "update back from two URLs to one of them", out, err, Done)
	if ms, err = op.members(ctx); err != nil {
		t.Fatal(err)
	}
	if got := findByID(ms, id); got == nil || !slices.Equal(got.PeerURLs, []string{m.peerURL.String()}) {
		t.Fatalf("after the update back the member list has %+v, want peer URL %s", got, m.peerURL.String())
	}
}
