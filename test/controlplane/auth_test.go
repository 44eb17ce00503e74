package controlplane

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// withAuth is manifest with etcd's authentication on or off and one application user,
// orders-api, that may read and write the keys under /orders/ alone.
func withAuth(manifest string, enabled bool) string {
	on := "false"
	if enabled {
		on = "true"
	}
	return manifest + `  auth:
    enabled: ` + on + `
    roles:
    - name: orders
      permissions:
      - {type: ReadWrite, key: /orders/, prefix: true}
    users:
    - {name: orders-api, roles: [orders]}
`
}

// authOnAndOff turns etcd's authentication on through spec.auth on the real API server: the
// auth Job (the claims account, under the real RBAC) makes the user's credential Secret and
// applies users, roles and the switch; the user reaches its prefix alone, a client without a
// login nothing, the cluster stays steady (the hook observes as its own user); then auth goes
// off and a client without a login is served again.
func authOnAndOff(t *testing.T, c *Cluster, manifest string, size int) {
	c.Apply(withAuth(manifest, true))
	took, err := c.WaitFor(2*time.Minute, func(ec *v1alpha1.EtcdCluster) (bool, string) {
		if a := ec.Status.Auth; a == nil || !a.Enabled {
			return false, "status.auth not enabled yet"
		}
		return c.Steady(size)(ec)
	})
	if err != nil {
		t.Fatalf("auth not turned on: %v", err)
	}
	t.Logf("auth on and the cluster steady in %s", took.Round(time.Second))
	ctx, cancel := context.WithTimeout(c.Plane.ctx, 30*time.Second)
	defer cancel()
	name := v1alpha1.UserSecretName(c.Name, "orders-api")
	sec, err := c.Plane.Client.CoreV1().Secrets(c.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the user's Secret: %v", err)
	}
	ec, err := c.Get()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, u := range ec.Status.Client.Users {
		found = found || u.Name == "orders-api" && u.Secret == name
	}
	if !found {
		t.Errorf("status.client.users %+v does not name %s", ec.Status.Client.Users, name)
	}
	cfg := c.ClientConfig()
	cfg.Username, cfg.Password = string(sec.Data["username"]), string(sec.Data["password"])
	user, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer user.Close()
	if _, err := user.Put(ctx, "/orders/1", "v"); err != nil {
		t.Errorf("orders-api writing its own prefix: %v", err)
	}
	if _, err := user.Get(ctx, "/orders/1"); err != nil {
		t.Errorf("orders-api reading its own prefix: %v", err)
	}
	if _, err := user.Put(ctx, "/billing/1", "v"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("orders-api writing /billing/1: %v, want permission denied", err)
	}
	if _, err := user.Get(ctx, "/billing/", clientv3.WithPrefix()); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("orders-api reading /billing/: %v, want permission denied", err)
	}
	anon, err := clientv3.New(c.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, err := anon.Get(ctx, "/orders/1"); err == nil {
		t.Errorf("a client without a login read /orders/1 with auth on")
	}

	c.Apply(withAuth(manifest, false))
	if _, err := c.WaitFor(2*time.Minute, func(ec *v1alpha1.EtcdCluster) (bool, string) {
		if a := ec.Status.Auth; a == nil || a.Enabled {
			return false, "status.auth still enabled"
		}
		return c.Steady(size)(ec)
	}); err != nil {
		t.Fatalf("auth not turned off: %v", err)
	}
	if _, err := anon.Get(ctx, "/orders/1"); err != nil {
		t.Errorf("a client without a login, auth off: %v", err)
	}
}
