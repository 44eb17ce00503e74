package sync

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
)

// simAuth is etcd's authentication as the simulator keeps it: whether it is on, the users
// etcd has, and the credential Secrets (by name, a digest of the password in each).
type simAuth struct {
	enabled bool
	users   []string
	secrets map[string]string
	made    int // passwords made, to tell a new one from the old
	jobs    int // auth Jobs run
	// unknown hides whether auth is on from the next observations.
	unknown bool
}

// refuses: etcd refuses a member Job that does not log in while auth is on (expand-claim and
// restart-pod talk to the Kubernetes API, which the simulator runs before).
func (a *simAuth) refuses(j *simJob) bool {
	return a.enabled && !j.login
}

func (w *simWorld) observeAuth(obs *Observed) {
	if obs.Etcd.Asked && !w.auth.unknown {
		obs.Etcd.Auth = etcdstate.AuthState{Known: true, Enabled: w.auth.enabled}
	}
	obs.Credentials = maps.Clone(w.auth.secrets)
}

// applyAuth does what the member tool's auth command does: the missing Secrets first (never
// root's while auth is on), then etcd, as root.
func (w *simWorld) applyAuth(j *simJob) bool {
	var d etcdstate.AuthDeclaration
	if err := json.Unmarshal([]byte(j.declaration), &d); err != nil {
		w.t.Fatalf("auth Job %s: declaration: %v", j.name, err)
	}
	w.auth.jobs++
	if w.auth.secrets == nil {
		w.auth.secrets = map[string]string{}
	}
	for _, u := range d.Users {
		// It reads each user's Secret, and creates those missing, as the claims account.
		w.mustBeAllowed(j, "secrets", "get", u.Secret)
		if _, ok := w.auth.secrets[u.Secret]; ok {
			continue
		}
		w.mustBeAllowed(j, "secrets", "create", "")
		if u.Name == authRootUser && w.auth.enabled {
			return false
		}
		w.auth.made++
		w.auth.secrets[u.Secret] = fmt.Sprintf("pw-%d", w.auth.made)
	}
	if d.Enabled && !slices.ContainsFunc(d.Users, func(u etcdstate.AuthDeclaredUser) bool { return u.Name == authRootUser }) {
		w.t.Fatalf("auth Job %s turns auth on without root", j.name)
	}
	var users []string
	for _, u := range d.Users {
		users = append(users, u.Name)
	}
	for _, u := range w.auth.users {
		if !slices.Contains(users, u) && !slices.Contains(d.RemoveUsers, u) {
			users = append(users, u)
		}
	}
	slices.Sort(users)
	w.auth.users = users
	w.auth.enabled = d.Enabled
	return true
}

// TestSimAuthOnRotateOff turns auth on under a running cluster, rotates a user's password by
// deleting its Secret, removes a user, turns auth off and drops spec.auth: each converges,
// one auth Job at a time, the member Jobs logging in as root all along (the simulator fails a
// Job that does not while auth is on), and status and the client ConfigMap name the users'
// Secrets.
func TestSimAuthOnRotateOff(t *testing.T) {
	w := newSimWorld(t, 3, true)
	w.run(200)
	// The auth Jobs are counted: a status handed in stale runs the last one again, by design
	// (it changes nothing), so it is left out here.
	w.staleParent, w.lag = nil, nil
	w.cluster.Spec.Auth = &v1alpha1.AuthSpec{Enabled: true,
		Roles: []v1alpha1.AuthRole{{Name: "orders", Permissions: []v1alpha1.AuthPermission{{Type: v1alpha1.PermissionReadWrite, Key: "/orders/", Prefix: true}}},
			{Name: "audit", Permissions: []v1alpha1.AuthPermission{{Type: v1alpha1.PermissionRead, Prefix: true}}}},
		Users: []v1alpha1.AuthUser{{Name: "orders-api", Roles: []string{"orders"}}, {Name: "auditor", Roles: []string{"audit"}}}}
	w.runAuth(t)
	if !w.auth.enabled || !slices.Equal(w.auth.users, []string{"auditor", "etcdops-observer", "orders-api", "root"}) {
		t.Fatalf("auth on: enabled %v, users %v", w.auth.enabled, w.auth.users)
	}
	if w.auth.jobs != 1 {
		// The Secrets the Job made are not a change to apply again.
		t.Fatalf("auth on took %d auth Jobs, want 1:\n%s", w.auth.jobs, strings.Join(lastN(w.log, 12), "\n"))
	}
	st := w.cluster.Status
	if st.Auth == nil || !st.Auth.Enabled || !slices.Equal(st.Auth.Users, []string{"auditor", "orders-api"}) {
		t.Fatalf("status.auth after auth on: %+v", st.Auth)
	}
	wantUsers := []v1alpha1.ClientUser{{Name: "orders-api", Secret: "etcd-user-orders-api"}, {Name: "auditor", Secret: "etcd-user-auditor"}}
	if !slices.Equal(st.Client.Users, wantUsers) {
		t.Fatalf("status.client.users: %+v, want %+v", st.Client.Users, wantUsers)
	}
	w.checkClientUsers(t, "orders-api=etcd-user-orders-api,auditor=etcd-user-auditor")

	// Rotation: the deleted Secret gets a new password, which an auth Job sets.
	old := w.auth.secrets["etcd-user-orders-api"]
	delete(w.auth.secrets, "etcd-user-orders-api")
	jobs := w.auth.jobs
	w.runAuth(t)
	if now := w.auth.secrets["etcd-user-orders-api"]; now == "" || now == old || w.auth.jobs != jobs+1 {
		t.Fatalf("rotation: password %q (was %q), %d auth Jobs (were %d, want one more)", now, old, w.auth.jobs, jobs)
	}

	// Removal: the user leaves spec.auth and etcd.
	w.cluster.Spec.Auth.Users = w.cluster.Spec.Auth.Users[:1]
	w.runAuth(t)
	if slices.Contains(w.auth.users, "auditor") || !slices.Equal(w.cluster.Status.Auth.Users, []string{"orders-api"}) {
		t.Fatalf("after removing auditor: etcd users %v, status %+v", w.auth.users, w.cluster.Status.Auth)
	}

	// Off, then spec.auth gone: the observer goes, status.auth is dropped once nothing is left.
	w.cluster.Spec.Auth.Enabled = false
	w.runAuth(t)
	if w.auth.enabled {
		t.Fatal("auth still on after spec.auth.enabled: false")
	}
	w.cluster.Spec.Auth = nil
	w.runAuth(t)
	if slices.Contains(w.auth.users, "orders-api") || slices.Contains(w.auth.users, authObserverUser) || w.cluster.Status.Auth != nil {
		t.Fatalf("after dropping spec.auth: etcd users %v, status.auth %+v", w.auth.users, w.cluster.Status.Auth)
	}
}

// TestSimAuthWaitsOnUnknownState: while no member says whether auth is on, no auth Job starts.
func TestSimAuthWaitsOnUnknownState(t *testing.T) {
	w := newSimWorld(t, 3, true)
	w.run(200)
	w.cluster.Spec.Auth = &v1alpha1.AuthSpec{Enabled: true}
	w.auth.unknown = true
	for range 5 {
		d := w.step()
		if d.Action.Type == ApplyAuth {
			t.Fatalf("an auth Job started while auth's state is unknown: %v", d.Action)
		}
	}
	if w.auth.jobs != 0 {
		t.Fatalf("%d auth Jobs ran while auth's state was unknown", w.auth.jobs)
	}
	w.auth.unknown = false
	w.runAuth(t)
	if !w.auth.enabled {
		t.Fatal("auth not on once its state is known")
	}
}

// TestSimAuthRootSecretLost: with auth on and root's Secret gone, the operator holds and says
// so; it never makes root a new password it could not set.
func TestSimAuthRootSecretLost(t *testing.T) {
	w := newSimWorld(t, 3, true)
	w.run(200)
	w.cluster.Spec.Auth = &v1alpha1.AuthSpec{Enabled: true, Users: []v1alpha1.AuthUser{{Name: "app"}}}
	w.runAuth(t)
	delete(w.auth.secrets, RootSecretName(w.cluster.Name))
	delete(w.auth.secrets, v1alpha1.UserSecretName(w.cluster.Name, "app"))
	jobs := w.auth.jobs
	d := w.step()
	if d.Action.Type != Hold || w.auth.jobs != jobs || !slices.ContainsFunc(w.cluster.Status.Conditions, func(c metav1.Condition) bool {
		return c.Type == v1alpha1.ConditionDegraded && c.Reason == ReasonAuthRootLost
	}) {
		t.Fatalf("root's Secret lost: action %v, auth Jobs %d (were %d), conditions %+v", d.Action, w.auth.jobs, jobs, w.cluster.Status.Conditions)
	}
}

// runAuth steps until the cluster converges with status.auth matching what etcd has.
func (w *simWorld) runAuth(t *testing.T) {
	t.Helper()
	for range 60 {
		w.run(200)
		obs := w.observe()
		c := v1alpha1.Defaulted(obs.Cluster)
		v := newView(simConfig, &obs, &c)
		if !authManaged(&c) || v.authSettled(c.Status.Auth, authDeclaration(&c), v.authDigest(authDeclaration(&c))) {
			return
		}
		w.step()
	}
	t.Fatalf("auth not settled: status.auth %+v, etcd on %v", w.cluster.Status.Auth, w.auth.enabled)
}

// checkClientUsers: the client ConfigMap names each user's Secret.
func (w *simWorld) checkClientUsers(t *testing.T, want string) {
	t.Helper()
	var cm struct {
		Data map[string]string `json:"data"`
	}
	w.decode(w.applied["ConfigMap/"+ClientConfigMapName(w.cluster.Name)], &cm)
	if got := cm.Data[ClientKeyUsers]; got != want {
		t.Fatalf("client ConfigMap %s: %q, want %q", ClientKeyUsers, got, want)
	}
}
