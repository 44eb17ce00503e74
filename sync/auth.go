package sync

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	batchv1 "k8s.io/api/batch/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
)

// etcd authentication (spec.auth, docs/auth.md).
//
// One auth Job applies the whole declaration: the operator's users (root, for the Jobs;
// etcdops-observer, with no role, for the hook's observation), the applications' users and
// roles, and whether auth is on. It creates each user's credential Secret that is missing (a
// random password, made where it is used and never carried in a hook answer), then makes
// etcd match in the order that never locks the operator out (membership.ApplyAuth): users and
// roles before auth is turned on, auth turned off before a user is deleted. The Job is named
// by a digest of the declaration and of every credential Secret's password (Observed.Credentials),
// so a changed spec or a deleted Secret (a rotation) runs it again; status.auth.applied
// records the digest it applied. A lost status runs it once more, which changes nothing.

// The operator's own etcd users and the Secrets with their passwords.
const (
	// authRootUser is etcd's administrator, which the member Jobs, backups, the stream and the
	// drills log in as: etcd lets only root change membership, take a snapshot, defragment,
	// disarm an alarm, move the leader (v3.6 on) and manage users.
	authRootUser = "root"
	// authObserverUser is the hook's: a user with no role. Logged in, it may ask Status and
	// the member list (which v3.6 on refuse to a client that is not); it can read and write
	// no key. The hook's health read is made without a login (membership.readLocally).
	authObserverUser = "etcdops-observer"
	// AnnotationAuthDigest on an auth Job is the digest of what it applies;
	// AnnotationAuthEnabled whether it turns auth on; AnnotationAuthUsers and
	// AnnotationAuthRoles the applications' users and roles it leaves in etcd.
	AnnotationAuthDigest = "etcdops.dev/auth-digest"
	// AnnotationAuthDeclaration on an auth Job is the digest of its declaration alone.
	AnnotationAuthDeclaration = "etcdops.dev/auth-declaration"
	AnnotationAuthEnabled     = "etcdops.dev/auth-enabled"
	AnnotationAuthUsers       = "etcdops.dev/auth-users"
	AnnotationAuthRoles       = "etcdops.dev/auth-roles"
	// AnnotationLoginDigest on the stream's pod template is the digest of root's password
	// it logs in with.
	AnnotationLoginDigest = "etcdops.dev/login-digest"
	// SecretKeyUsername and SecretKeyPassword are the keys of a credential Secret.
	SecretKeyUsername = "username"
	SecretKeyPassword = "password"
	// authDir is where a Job finds root's credential Secret.
	authDir = "/etc/etcdops/root"
	// verbAuth applies the declaration.
	verbAuth = "auth"
)

// RootSecretName and ObserverSecretName hold the operator's own credentials.
func RootSecretName(cluster string) string     { return cluster + "-etcdops-root" }
func ObserverSecretName(cluster string) string { return cluster + "-etcdops-observer" }

// authManaged: the operator manages etcd's auth, because spec.auth asks for it or because an
// auth Job applied something that may still need undoing.
func authManaged(c *v1alpha1.EtcdCluster) bool {
	return c.Spec.Auth != nil || c.Status.Auth != nil
}

// credentialSecrets are the Secrets with the credentials of every user the operator manages:
// its own and the applications'.
func credentialSecrets(c *v1alpha1.EtcdCluster) []string {
	if !authManaged(c) {
		return nil
	}
	names := []string{RootSecretName(c.Name), ObserverSecretName(c.Name)}
	if a := c.Spec.Auth; a != nil {
		for _, u := range a.Users {
			names = append(names, v1alpha1.UserSecretName(c.Name, u.Name))
		}
	}
	return names
}

// authDeclaration is what the auth Job applies (etcdstate.AuthDeclaration): the spec's users
// and roles with the operator's, and the applications' users and roles applied before and no
// longer declared, to be deleted.
func authDeclaration(c *v1alpha1.EtcdCluster) etcdstate.AuthDeclaration {
	d := etcdstate.AuthDeclaration{
		Users: []etcdstate.AuthDeclaredUser{{Name: authRootUser, Secret: RootSecretName(c.Name), Roles: []string{authRootUser}}},
		Roles: []etcdstate.AuthDeclaredRole{{Name: authRootUser}},
	}
	var users, roles []string
	if a := c.Spec.Auth; a != nil {
		d.Enabled = a.Enabled
		d.Users = append(d.Users, etcdstate.AuthDeclaredUser{Name: authObserverUser, Secret: ObserverSecretName(c.Name)})
		for _, r := range a.Roles {
			dr := etcdstate.AuthDeclaredRole{Name: r.Name}
			for _, p := range r.Permissions {
				dr.Permissions = append(dr.Permissions, etcdstate.AuthDeclaredPermission{Type: strings.ToLower(p.Type), Key: p.Key, Prefix: p.Prefix})
			}
			d.Roles = append(d.Roles, dr)
			roles = append(roles, r.Name)
		}
		for _, u := range a.Users {
			d.Users = append(d.Users, etcdstate.AuthDeclaredUser{Name: u.Name, Secret: v1alpha1.UserSecretName(c.Name, u.Name), Roles: slices.Sorted(slices.Values(u.Roles))})
			users = append(users, u.Name)
		}
	} else {
		// spec.auth removed: auth goes off, and the observer with the applications' users.
		d.RemoveUsers = []string{authObserverUser}
	}
	if prev := c.Status.Auth; prev != nil {
		for _, u := range prev.Users {
			if !slices.Contains(users, u) {
				d.RemoveUsers = append(d.RemoveUsers, u)
			}
		}
		for _, r := range prev.Roles {
			if !slices.Contains(roles, r) {
				d.RemoveRoles = append(d.RemoveRoles, r)
			}
		}
	}
	slices.Sort(d.RemoveUsers)
	slices.Sort(d.RemoveRoles)
	return d
}

// authDigest covers the declaration and every credential Secret's password digest ("" for a
// Secret not there yet, which the Job creates).
func (v *view) authDigest(d etcdstate.AuthDeclaration) string {
	creds := map[string]string{}
	for _, name := range credentialSecrets(v.c) {
		creds[name] = v.obs.Credentials[name]
	}
	return shortHash([]any{d, creds})
}

// authSettled: nothing is left to apply after prev, what the last auth Job applied. With
// spec.auth removed, that is once auth is off and no application's user is left.
func (v *view) authSettled(prev *v1alpha1.AuthStatus, d etcdstate.AuthDeclaration, digest string) bool {
	if v.c.Spec.Auth == nil && (prev == nil || !prev.Enabled && len(prev.Users) == 0 && len(prev.Roles) == 0) {
		return true
	}
	return prev != nil && prev.Applied == digest && (!v.obs.Etcd.Auth.Known || v.obs.Etcd.Auth.Enabled == d.Enabled)
}

// authChange applies a declaration that differs from the one applied: one auth Job. It waits
// while etcd's auth state is unknown, and holds when auth is on and root's Secret is gone: a
// new root password could not be set without the old one, and a Job that made one would lock
// the operator out.
func (p *planner) authChange() (step, bool) {
	if !authManaged(p.c) {
		return step{}, false
	}
	d := authDeclaration(p.c)
	digest := p.authDigest(d)
	prev := p.obs.Cluster.Status.Auth
	if p.stage.auth != nil {
		// An auth Job succeeded in this sync: what it applied is not in status yet.
		prev = p.stage.auth
	}
	if p.authSettled(prev, d, digest) {
		return step{}, false
	}
	if !p.obs.Etcd.Auth.Known {
		return p.wait("", "etcd's auth is to change, but no member answered whether it is on: the change waits", resyncHold), true
	}
	if p.obs.Etcd.Auth.Enabled && p.obs.Credentials[RootSecretName(p.c.Name)] == "" {
		reason := fmt.Sprintf("etcd's auth is on and Secret %s, root's password, is missing: the operator cannot log in to change users, membership or backups; restore the Secret (docs/auth.md, root's Secret lost)", RootSecretName(p.c.Name))
		s := p.base(Action{Type: Hold, Reason: reason}, resyncHold)
		s.degraded, s.degradedBy = reason, ReasonAuthRootLost
		return s, true
	}
	raw, err := json.Marshal(d)
	if err != nil {
		panic(fmt.Sprintf("sync: encoding plain values cannot fail: %v", err))
	}
	what := "turning auth off"
	if d.Enabled {
		what = "applying users and roles, auth on"
	}
	j := memberJob{verb: verbAuth, auth: string(raw), authDigest: digest, authDeclaration: shortHash(d), authEnabled: d.Enabled, authUsers: usersOf(p.c), authRoles: rolesOf(p.c)}
	return p.runJob(j, ApplyAuth, fmt.Sprintf("etcd auth: %s (declaration %s)", what, digest)), true
}

// usersOf and rolesOf are the names of spec.auth's users and roles, sorted.
func usersOf(c *v1alpha1.EtcdCluster) []string {
	if a := c.Spec.Auth; a != nil {
		return sortedNames(a.Users, func(u v1alpha1.AuthUser) string { return u.Name })
	}
	return nil
}

func rolesOf(c *v1alpha1.EtcdCluster) []string {
	if a := c.Spec.Auth; a != nil {
		return sortedNames(a.Roles, func(r v1alpha1.AuthRole) string { return r.Name })
	}
	return nil
}

func sortedNames[T any](items []T, name func(T) string) []string {
	var out []string
	for _, it := range items {
		out = append(out, name(it))
	}
	slices.Sort(out)
	return out
}

// authApplied is status.auth after a succeeded auth Job. The Job created the credential
// Secrets that were missing, so the digest it was named by (with "" for them) is not the one
// to record: when its declaration is the current one and every credential Secret is there
// now, the current digest is recorded, else another auth Job would follow to apply what it
// already applied, right after it.
func (v *view) authApplied(j *batchv1.Job) *v1alpha1.AuthStatus {
	split := func(s string) []string {
		if s == "" {
			return nil
		}
		return strings.Split(s, ",")
	}
	return &v1alpha1.AuthStatus{
		Enabled: j.Annotations[AnnotationAuthEnabled] == "true",
		Applied: v.appliedDigest(j),
		Users:   split(j.Annotations[AnnotationAuthUsers]),
		Roles:   split(j.Annotations[AnnotationAuthRoles]),
	}
}

func (v *view) appliedDigest(j *batchv1.Job) string {
	if !authManaged(v.c) {
		return j.Annotations[AnnotationAuthDigest]
	}
	d := authDeclaration(v.c)
	if j.Annotations[AnnotationAuthDeclaration] != shortHash(d) {
		return j.Annotations[AnnotationAuthDigest]
	}
	for _, name := range credentialSecrets(v.c) {
		if v.obs.Credentials[name] == "" {
			return j.Annotations[AnnotationAuthDigest]
		}
	}
	return v.authDigest(d)
}

// authRecord sets status.auth: what the last auth Job applied (this sync's, or the last
// status's), with whether auth is on as etcd answered; status.client.users names each
// application's credential Secret.
func (v *view) authRecord(a *answer) {
	st := v.obs.Cluster.Status.Auth
	if a.step.auth != nil {
		st = a.step.auth
	}
	if st != nil {
		cp := *st
		if v.obs.Etcd.Auth.Known {
			cp.Enabled = v.obs.Etcd.Auth.Enabled
		}
		if v.c.Spec.Auth == nil && !cp.Enabled && len(cp.Users) == 0 && len(cp.Roles) == 0 && cp.Applied != "" {
			// spec.auth removed and undone: nothing is left to record.
			cp = v1alpha1.AuthStatus{}
		}
		if cp.Applied != "" || cp.Enabled {
			a.st.Auth = &cp
		} else {
			a.st.Auth = nil
		}
	}
}

// clientUsers are the applications' users and their Secrets, for status.client.
func clientUsers(c *v1alpha1.EtcdCluster) []v1alpha1.ClientUser {
	var out []v1alpha1.ClientUser
	if a := c.Spec.Auth; a != nil {
		for _, u := range a.Users {
			out = append(out, v1alpha1.ClientUser{Name: u.Name, Secret: v1alpha1.UserSecretName(c.Name, u.Name)})
		}
	}
	return out
}

// authLogin gives a Job root's login while the operator manages auth: etcd ignores it while
// auth is off. The Secret is mounted as optional: before the first auth Job has created it
// there is no login to give, and auth is off.
func authLogin(c *v1alpha1.EtcdCluster, container, podSpec object) {
	if !authManaged(c) {
		return
	}
	container["command"] = append(container["command"].([]string), "--user="+authRootUser, "--password-file="+authDir+"/"+SecretKeyPassword)
	mounts, _ := container["volumeMounts"].([]volumeMount)
	container["volumeMounts"] = append(mounts, volumeMount{Name: "etcd-root", MountPath: authDir, ReadOnly: true})
	vols, _ := podSpec["volumes"].([]volume)
	podSpec["volumes"] = append(vols, volume{Name: "etcd-root", Secret: &secretSource{SecretName: RootSecretName(c.Name), Optional: true}})
}
