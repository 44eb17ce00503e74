package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/sync"
	"etcdops.dev/etcdops/test/harness"
)

// authRootPassword is root's password, in a Secret made before spec.auth: the operator uses a
// credential Secret that exists, so the workload can log in as root from its start and write
// through auth turned on without a new client.
const authRootPassword = "e2e-root-password"

// TestAuth turns etcd's auth on under the workload (which logs in as root, as an application
// given credentials before would), checks that each application's user reads and writes its
// own prefix only, rotates one user's password by deleting its Secret, and turns auth off
// again; the workload's history must stay linearizable and keep every acknowledged write.
func TestAuth(t *testing.T) {
	t.Parallel()
	onCluster(t, spec(3), scenario{name: "auth-on-rotate-off", workload: authRootLogin, act: authOnRotateOff})
}

func authRootLogin(t *testing.T, env *harness.Env) harness.WorkloadOptions {
	presetRoot(t, env)
	return harness.WorkloadOptions{}
}

// presetRoot makes root's credential Secret and has the applications' clients log in as root.
func presetRoot(t *testing.T, env *harness.Env) {
	name := sync.RootSecretName(env.Cluster)
	if err := env.Store.Create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Type: corev1.SecretTypeBasicAuth,
		Data: map[string][]byte{sync.SecretKeyUsername: []byte("root"), sync.SecretKeyPassword: []byte(authRootPassword)}}); err != nil {
		t.Fatal(err)
	}
	env.UseLogin("root", authRootPassword)
}

func authOnRotateOff(t *testing.T, env *harness.Env) int {
	cluster := env.Store.Parent().Name
	env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) {
		s.Auth = &v1alpha1.AuthSpec{Enabled: true,
			Roles: []v1alpha1.AuthRole{
				{Name: "orders", Permissions: []v1alpha1.AuthPermission{{Type: v1alpha1.PermissionReadWrite, Key: "/orders/", Prefix: true}}},
				{Name: "billing", Permissions: []v1alpha1.AuthPermission{{Type: v1alpha1.PermissionReadWrite, Key: "/billing/", Prefix: true}}},
			},
			Users: []v1alpha1.AuthUser{{Name: "orders", Roles: []string{"orders"}}, {Name: "billing", Roles: []string{"billing"}}}}
	})
	waitAuth(t, env, true)
	st := env.Store.Parent().Status
	want := []v1alpha1.ClientUser{{Name: "orders", Secret: v1alpha1.UserSecretName(cluster, "orders")}, {Name: "billing", Secret: v1alpha1.UserSecretName(cluster, "billing")}}
	if st.Client == nil || !slices.Equal(st.Client.Users, want) {
		t.Errorf("status.client.users = %+v, want %+v", st.Client, want)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	orders := authClient(t, env, "orders", secretPassword(t, env, v1alpha1.UserSecretName(cluster, "orders")))
	billing := authClient(t, env, "billing", secretPassword(t, env, v1alpha1.UserSecretName(cluster, "billing")))
	mustAuth(t, "orders writes its prefix", recordedPut(env, 200, orders, "/orders/1"))
	mustAuth(t, "billing writes its prefix", recordedPut(env, 201, billing, "/billing/1"))
	denied(t, "orders reads billing's prefix", authRead(ctx, orders, "/billing/"))
	denied(t, "orders writes billing's prefix", authPut(ctx, orders, "/billing/2"))
	denied(t, "billing reads orders' prefix", authRead(ctx, billing, "/orders/"))
	anon := authClient(t, env, "", "")
	if err := authRead(ctx, anon, "/orders/"); err == nil {
		t.Error("a client without a login reads while auth is on")
	}
	root := authClient(t, env, "root", authRootPassword)
	if _, err := root.MemberList(ctx); err != nil {
		t.Errorf("root lists the members: %v", err)
	}
	mustAuth(t, "root reads every prefix", authRead(ctx, root, "/"))

	// Rotation: a deleted Secret comes back with a new password, which etcd then takes.
	secret := v1alpha1.UserSecretName(cluster, "orders")
	old := secretPassword(t, env, secret)
	env.Store.Delete("Secret", secret)
	if _, err := env.WaitFor(changeBound, func() (bool, string) {
		o, ok := env.Store.Get("Secret", secret)
		if !ok {
			return false, "no Secret yet"
		}
		pw := string(o.(*corev1.Secret).Data[sync.SecretKeyPassword])
		if pw == old {
			return false, "the old password"
		}
		cli, err := clientv3.New(loginConfig(env, "orders", pw))
		if err != nil {
			return false, "the new password is not taken yet: " + err.Error()
		}
		defer cli.Close()
		return recordedPut(env, 202, cli, "/orders/rotated") == nil, "the new password is not taken yet"
	}); err != nil {
		t.Fatalf("orders' password not rotated: %v\n%s", err, env.Describe())
	}
	if _, err := root.Authenticate(ctx, "orders", old); !errors.Is(err, rpctypes.ErrAuthFailed) {
		t.Errorf("orders' old password after the rotation: %v, want it refused", err)
	}

	env.Store.EditParentSpec(func(s *v1alpha1.EtcdClusterSpec) { s.Auth.Enabled = false })
	waitAuth(t, env, false)
	mustAuth(t, "a client without a login reads once auth is off", authRead(ctx, anon, "/orders/"))
	return 3
}

// waitAuth waits until status.auth says auth is on (or off) and the last declaration is applied.
func waitAuth(t *testing.T, env *harness.Env, on bool) {
	t.Helper()
	took, err := env.WaitFor(changeBound, func() (bool, string) {
		st := env.Store.Parent().Status
		if st.Auth == nil {
			return false, "no status.auth"
		}
		running := slices.ContainsFunc(env.Store.List("Job"), func(o harness.Object) bool { return o.GetLabels()[sync.LabelAction] == "auth" })
		return st.Auth.Enabled == on && !running && st.Action != nil && st.Action.Type == sync.Steady.String(),
			fmt.Sprintf("status.auth %+v, action %+v", *st.Auth, st.Action)
	})
	if err != nil {
		t.Fatalf("auth not %v: %v\n%s", on, err, env.Describe())
	}
	t.Logf("auth %v in %s", on, took.Round(time.Millisecond))
}

func secretPassword(t *testing.T, env *harness.Env, name string) string {
	t.Helper()
	o, ok := env.Store.Get("Secret", name)
	if !ok {
		t.Fatalf("no Secret %s", name)
	}
	return string(o.(*corev1.Secret).Data[sync.SecretKeyPassword])
}

func authClient(t *testing.T, env *harness.Env, user, password string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(loginConfig(env, user, password))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// loginConfig is an application's client configuration (with TLS when the cluster serves it)
// logging in as user.
func loginConfig(env *harness.Env, user, password string) clientv3.Config {
	cfg := env.ClientConfig()
	cfg.Username, cfg.Password = user, password
	return cfg
}

// authPut is a write etcd is expected to refuse; one it applied would be a write the
// workload's watchers do not know, and fail the check.
func authPut(ctx context.Context, cli *clientv3.Client, key string) error {
	_, err := cli.Put(ctx, key, "refused")
	return err
}

// recordedPut is a write the workload's checker accounts for, under client ID id.
func recordedPut(env *harness.Env, id int, cli *clientv3.Client, key string) error {
	recordedPuts++
	_, err := env.RecordedPut(id, cli, key, fmt.Sprintf("auth-%d", recordedPuts))
	return err
}

// recordedPuts makes each recorded value unique.
var recordedPuts int

func authRead(ctx context.Context, cli *clientv3.Client, prefix string) error {
	_, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	return err
}

func mustAuth(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v", what, err)
	}
}

func denied(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("%s: %v, want permission denied", what, err)
	}
}
