package membership

import (
	"context"
	"errors"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"etcdops.dev/etcdops/etcdstate"
)

// testAuth is a declaration with root, two applications each on its own prefix, and the
// stream's read-only user.
func testAuth(enabled bool, pw map[string]string) Auth {
	return Auth{
		Enabled: enabled,
		Roles: []AuthRole{
			{Name: RootUser},
			{Name: "app-a", Permissions: []AuthPermission{{Type: PermReadWrite, Key: "/a/", Prefix: true}}},
			{Name: "app-b", Permissions: []AuthPermission{{Type: PermReadWrite, Key: "/b/", Prefix: true}, {Type: PermRead, Key: "/shared", Prefix: false}}},
			{Name: "read-all", Permissions: []AuthPermission{{Type: PermRead, Prefix: true}}},
		},
		Users: []AuthUser{
			{Name: RootUser, Password: pw[RootUser], Roles: []string{RootUser}},
			{Name: "a", Password: pw["a"], Roles: []string{"app-a"}},
			{Name: "b", Password: pw["b"], Roles: []string{"app-b"}},
			{Name: "stream", Password: pw["stream"], Roles: []string{"read-all"}},
		},
	}
}

// clientAs is a plain clientv3 client logged in as user, as an application would be.
func clientAs(t *testing.T, c *testCluster, user, password string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: clientURLs(c.members...), Username: user, Password: password, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func wantDenied(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("%s: got %v, want permission denied", what, err)
	}
}

func wantNoError(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestApplyAuthOnAndOff turns auth on under a cluster that holds data, checks each user is
// confined to its prefix and that root keeps every right the operator needs, rotates a
// password, removes a user, and turns auth off again with nothing lost.
func TestApplyAuthOnAndOff(t *testing.T) {
	c := newTestCluster(t, 1, nil)
	ctx := opContext(t)
	pw := map[string]string{RootUser: "root-pw", "a": "a-pw", "b": "b-pw", "stream": "stream-pw"}
	anon := clientAs(t, c, "", "")
	for _, k := range []string{"/a/1", "/b/1", "/shared", "/other"} {
		wantNoError(t, "put "+k, put(ctx, anon, k))
	}

	lockout := testAuth(true, pw)
	lockout.Users = lockout.Users[1:]
	if _, err := dialTest(t, c, c.members...).ApplyAuth(ctx, lockout); !errors.Is(err, ErrAuthLockout) {
		t.Fatalf("auth on without root: got %v, want %v", err, ErrAuthLockout)
	}

	// Dialled as root before auth is on, as the operator's Job is: etcd ignores the login.
	root := dialAs(t, c, Login{RootUser, pw[RootUser]})
	out, err := root.ApplyAuth(ctx, testAuth(true, pw))
	wantOutcome(t, "auth on", out, err, Done)
	out, err = root.ApplyAuth(ctx, testAuth(true, pw))
	wantOutcome(t, "auth on again", out, err, AlreadyDone)
	if on, err := root.AuthEnabled(ctx); err != nil || !on {
		t.Fatalf("auth enabled: %v, %v", on, err)
	}
	observeWithAuth(t, c, pw)

	_, err = anon.Get(ctx, "/a/1")
	if !errors.Is(err, rpctypes.ErrUserEmpty) && !errors.Is(err, rpctypes.ErrInvalidAuthToken) {
		t.Fatalf("a read without a login while auth is on: got %v, want it refused", err)
	}
	a := clientAs(t, c, "a", pw["a"])
	wantNoError(t, "a writes its prefix", put(ctx, a, "/a/2"))
	wantNoError(t, "a reads its prefix", get(ctx, a, "/a/", true))
	wantDenied(t, "a reads b's prefix", get(ctx, a, "/b/", true))
	wantDenied(t, "a writes b's prefix", put(ctx, a, "/b/2"))
	wantDenied(t, "a reads a key outside every prefix", get(ctx, a, "/other", false))
	b := clientAs(t, c, "b", pw["b"])
	wantNoError(t, "b reads the one key it may", get(ctx, b, "/shared", false))
	wantDenied(t, "b writes the key it may only read", put(ctx, b, "/shared"))
	wantDenied(t, "b reads a's prefix", get(ctx, b, "/a/", true))

	// The stream's user reads and watches everything, and may not take a snapshot: etcd
	// keeps snapshots (and membership, defragmentation) to root.
	stream := clientAs(t, c, "stream", pw["stream"])
	wantNoError(t, "stream reads the whole key space", get(ctx, stream, "\x00", true))
	wantDenied(t, "stream writes", put(ctx, stream, "/a/3"))
	wc, cancel := context.WithCancel(ctx)
	w := stream.Watch(wc, "", clientv3.WithPrefix(), clientv3.WithRev(1))
	if r := <-w; r.Err() != nil || len(r.Events) == 0 {
		t.Fatalf("stream watches the whole key space from revision 1: %v, %d events", r.Err(), len(r.Events))
	}
	cancel()
	snap, err := stream.Snapshot(ctx)
	if err == nil {
		_, err = snap.Read(make([]byte, 1))
		snap.Close()
	}
	wantDenied(t, "stream takes a snapshot", err)
	_, err = stream.MemberList(ctx)
	wantNoError(t, "any user lists the members", err)

	// Root keeps what the operator does: membership, snapshots, the whole key space.
	rootCli := clientAs(t, c, RootUser, pw[RootUser])
	_, err = rootCli.MemberList(ctx)
	wantNoError(t, "root lists the members", err)
	snap, err = rootCli.Snapshot(ctx)
	wantNoError(t, "root takes a snapshot", err)
	snap.Close()
	wantNoError(t, "root writes anywhere", put(ctx, rootCli, "/b/root"))

	// Rotation: a's new password works, the old one no longer does.
	pw["a"] = "a-pw-2"
	out, err = root.ApplyAuth(ctx, testAuth(true, pw))
	wantOutcome(t, "rotate a", out, err, Done)
	if _, err := rootCli.Authenticate(ctx, "a", "a-pw"); !errors.Is(err, rpctypes.ErrAuthFailed) {
		t.Fatalf("a's old password: got %v, want it refused", err)
	}
	wantNoError(t, "a with its new password", put(ctx, clientAs(t, c, "a", pw["a"]), "/a/4"))

	// Removal: b and its role go; a user made by a person stays.
	_, err = rootCli.UserAdd(ctx, "by-hand", "x")
	wantNoError(t, "a user made by hand", err)
	gone := testAuth(true, pw)
	gone.Users = append(gone.Users[:2], gone.Users[3])
	gone.Roles = append(gone.Roles[:2], gone.Roles[3])
	gone.RemoveUsers, gone.RemoveRoles = []string{"b"}, []string{"app-b"}
	out, err = root.ApplyAuth(ctx, gone)
	wantOutcome(t, "remove b", out, err, Done)
	users, err := rootCli.UserList(ctx)
	wantNoError(t, "list users", err)
	if got := users.Users; len(got) != 5 || got[0] != "a" || got[1] != "by-hand" || got[2] != "etcdops-observer" || got[3] != RootUser || got[4] != "stream" {
		t.Fatalf("users after removing b: %v", got)
	}

	// Off again: auth is disabled first, and every key written before and during is there.
	out, err = root.ApplyAuth(ctx, Auth{Enabled: false, RemoveUsers: []string{"a", "stream"}, RemoveRoles: []string{"app-a", "read-all"}})
	wantOutcome(t, "auth off", out, err, Done)
	if on, err := dialTest(t, c, c.members...).AuthEnabled(ctx); err != nil || on {
		t.Fatalf("auth enabled after turning it off: %v, %v", on, err)
	}
	resp, err := anon.Get(ctx, "/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	wantNoError(t, "read everything without a login", err)
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	want := []string{"/a/1", "/a/2", "/a/4", "/b/1", "/b/root", "/other", "/shared"}
	if len(keys) != len(want) {
		t.Fatalf("keys after auth off: %q, want %q", keys, want)
	}
	for i := range want {
		if keys[i] != want[i] {
			t.Fatalf("keys after auth off: %q, want %q", keys, want)
		}
	}
}

// observeWithAuth: the observer sees auth on, and with a user of no role at all (the
// operator's observer) it reads the membership as before; it needs no permission on any key.
func observeWithAuth(t *testing.T, c *testCluster, pw map[string]string) {
	t.Helper()
	ctx := opContext(t)
	root := dialAs(t, c, Login{RootUser, pw[RootUser]})
	_, err := root.ApplyAuth(ctx, Auth{Enabled: true, Roles: []AuthRole{{Name: RootUser}},
		Users: []AuthUser{{Name: RootUser, Password: pw[RootUser], Roles: []string{RootUser}}, {Name: "etcdops-observer", Password: "obs"}}})
	wantNoError(t, "add the observer", err)
	o := newTestObserver(t)
	req := c.request(c.members...)
	req.Login = &etcdstate.Login{User: "etcdops-observer", Password: "obs"}
	snap := o.Observe(ctx, req)
	if !snap.Asked || !snap.Complete || snap.Auth != (etcdstate.AuthState{Known: true, Enabled: true}) {
		t.Fatalf("observed with the observer's login: asked %v, complete %v, auth %+v, err %q", snap.Asked, snap.Complete, snap.Auth, snap.Err)
	}
	if len(snap.Members) != 1 || !snap.Members[0].Healthy {
		t.Fatalf("observed with the observer's login: members %+v", snap.Members)
	}
}

// TestObserveAuthOverClientTLS: over client TLS a call without a login is made as the user
// the client certificate's common name names (etcd's rule), which has no permission on the
// key the health read asks for: the member still counts as serving, and auth as on.
func TestObserveAuthOverClientTLS(t *testing.T) {
	pki := newTestPKI(t)
	c := newTestCluster(t, 1, pki)
	ctx := opContext(t)
	op, err := Dial(clientURLs(c.members...), pki.clientTLS, Login{RootUser, "root-pw"})
	wantNoError(t, "dial", err)
	t.Cleanup(func() { op.Close() })
	_, err = op.ApplyAuth(ctx, Auth{Enabled: true, Roles: []AuthRole{{Name: RootUser}},
		Users: []AuthUser{{Name: RootUser, Password: "root-pw", Roles: []string{RootUser}}, {Name: "etcdops-observer", Password: "obs"}}})
	wantNoError(t, "auth on", err)
	req := c.request(c.members...)
	req.Login = &etcdstate.Login{User: "etcdops-observer", Password: "obs"}
	snap := newTestObserver(t).Observe(ctx, req)
	if !snap.Asked || snap.Auth != (etcdstate.AuthState{Known: true, Enabled: true}) || len(snap.Members) != 1 || !snap.Members[0].Healthy {
		t.Fatalf("observed over client TLS with auth on: asked %v, auth %+v, members %+v, err %q", snap.Asked, snap.Auth, snap.Members, snap.Err)
	}
}

func dialAs(t *testing.T, c *testCluster, login Login) *Operator {
	t.Helper()
	op, err := Dial(clientURLs(c.members...), nil, login)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { op.Close() })
	return op
}

func put(ctx context.Context, cli *clientv3.Client, key string) error {
	_, err := cli.Put(ctx, key, "v")
	return err
}

func get(ctx context.Context, cli *clientv3.Client, key string, prefix bool) error {
	var opts []clientv3.OpOption
	if prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	if key == "\x00" {
		opts = []clientv3.OpOption{clientv3.WithFromKey()}
	}
	_, err := cli.Get(ctx, key, opts...)
	return err
}
