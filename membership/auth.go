package membership

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"go.etcd.io/etcd/api/v3/authpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcd authentication: users, roles and whether auth is on, made to match a declaration.
// ApplyAuth is idempotent like the membership changes: it reads etcd's users and roles first
// and changes only what differs, so a retried Job or one that died half-way does no harm.

// RootUser is etcd's administrator: the only user etcd lets enable or disable auth, manage
// users and roles, change membership, take a snapshot, defragment or move the leader (v3.6
// on; v3.5 lets anyone move the leader).
const RootUser = "root"

// Login is a user name and password for etcd; the zero Login asks without credentials.
type Login struct {
	User, Password string
}

// Permission types, as etcd's role permissions name them.
const (
	PermRead      = "read"
	PermWrite     = "write"
	PermReadWrite = "readwrite"
)

// AuthPermission grants a role access to one key, or every key starting with Key when Prefix.
// With Prefix and an empty Key it is the whole key space.
type AuthPermission struct {
	Type   string
	Key    string
	Prefix bool
}

// AuthRole is a role and every permission it has.
type AuthRole struct {
	Name        string
	Permissions []AuthPermission
}

// AuthUser is a user, its password and every role it has.
type AuthUser struct {
	Name     string
	Password string
	Roles    []string
}

// Auth is the access etcd is to grant. Users and Roles are the declared ones, the operator's
// own included (root with the root role); RemoveUsers and RemoveRoles were declared before and
// are no longer, and are deleted. A user or role neither declared nor to be removed (made by a
// person) is left as it is.
type Auth struct {
	Enabled     bool
	Users       []AuthUser
	Roles       []AuthRole
	RemoveUsers []string
	RemoveRoles []string
}

// ApplyAuth makes etcd's users, roles and auth switch match a. The order never locks the
// caller out: turning auth on, every user and role exists with its password and permissions
// before auth is enabled, and root with them; turning it off, auth is disabled before any
// user is deleted. The Operator must be dialled as root (RootUser) whenever auth may be on.
func (o *Operator) ApplyAuth(ctx context.Context, a Auth) (Outcome, error) {
	if a.Enabled && !hasRoot(a.Users) {
		return 0, fmt.Errorf("%w: turning auth on needs user %s with role %s declared", ErrAuthLockout, RootUser, RootUser)
	}
	st, err := o.cli.AuthStatus(ctx)
	if err != nil {
		return 0, transient("read whether auth is on", err)
	}
	changed := false
	if !a.Enabled && st.Enabled {
		if _, err := o.cli.AuthDisable(ctx); err != nil {
			return 0, transient("disable auth", err)
		}
		changed = true
	}
	c, err := o.applyRolesAndUsers(ctx, a, st.Enabled && a.Enabled)
	if err != nil {
		return 0, err
	}
	changed = changed || c
	if a.Enabled && !st.Enabled {
		if _, err := o.cli.AuthEnable(ctx); err != nil {
			return 0, transient("enable auth", err)
		}
		changed = true
	}
	if changed {
		return Done, nil
	}
	return AlreadyDone, nil
}

func hasRoot(users []AuthUser) bool {
	for _, u := range users {
		if u.Name == RootUser && slices.Contains(u.Roles, RootUser) {
			return true
		}
	}
	return false
}

// applyRolesAndUsers creates and updates the declared roles and users, then deletes the ones
// to remove. Roles come first: a user is granted only roles that exist.
func (o *Operator) applyRolesAndUsers(ctx context.Context, a Auth, enabled bool) (bool, error) {
	changed := false
	haveRoles, err := o.cli.RoleList(ctx)
	if err != nil {
		return false, transient("list roles", err)
	}
	for _, r := range a.Roles {
		c, err := o.applyRole(ctx, r, slices.Contains(haveRoles.Roles, r.Name))
		if err != nil {
			return false, err
		}
		changed = changed || c
	}
	haveUsers, err := o.cli.UserList(ctx)
	if err != nil {
		return false, transient("list users", err)
	}
	for _, u := range a.Users {
		c, err := o.applyUser(ctx, u, slices.Contains(haveUsers.Users, u.Name), enabled)
		if err != nil {
			return false, err
		}
		changed = changed || c
	}
	for _, name := range a.RemoveUsers {
		if name == RootUser || !slices.Contains(haveUsers.Users, name) {
			continue
		}
		if _, err := o.cli.UserDelete(ctx, name); err != nil && !isEtcdError(err, rpctypes.ErrUserNotFound) {
			return false, transient("delete user "+name, err)
		}
		changed = true
	}
	for _, name := range a.RemoveRoles {
		if name == RootUser || !slices.Contains(haveRoles.Roles, name) {
			continue
		}
		if _, err := o.cli.RoleDelete(ctx, name); err != nil && !isEtcdError(err, rpctypes.ErrRoleNotFound) {
			return false, transient("delete role "+name, err)
		}
		changed = true
	}
	return changed, nil
}

// applyRole makes role r have exactly its declared permissions. The root role is etcd's own
// and has no permissions to declare.
func (o *Operator) applyRole(ctx context.Context, r AuthRole, exists bool) (bool, error) {
	changed := false
	if !exists {
		if _, err := o.cli.RoleAdd(ctx, r.Name); err != nil && !isEtcdError(err, rpctypes.ErrRoleAlreadyExist) {
			return false, transient("add role "+r.Name, err)
		}
		changed = true
	}
	if r.Name == RootUser {
		return changed, nil
	}
	got, err := o.cli.RoleGet(ctx, r.Name)
	if err != nil {
		return false, transient("read role "+r.Name, err)
	}
	want := map[[2]string]clientv3.PermissionType{}
	for _, p := range r.Permissions {
		key, end := permRange(p)
		want[[2]string{key, end}] = permType(p.Type)
	}
	for _, p := range got.Perm {
		k := [2]string{string(p.Key), string(p.RangeEnd)}
		if t, ok := want[k]; ok && t == clientv3.PermissionType(p.PermType) {
			delete(want, k)
			continue
		}
		if _, ok := want[k]; ok {
			// A different type on the same range: granting replaces it.
			continue
		}
		if _, err := o.cli.RoleRevokePermission(ctx, r.Name, k[0], k[1]); err != nil && !isEtcdError(err, rpctypes.ErrPermissionNotGranted) {
			return false, transient("revoke a permission of role "+r.Name, err)
		}
		changed = true
	}
	for _, k := range sortedKeys(want) {
		if _, err := o.cli.RoleGrantPermission(ctx, r.Name, k[0], k[1], want[k]); err != nil {
			return false, transient("grant a permission to role "+r.Name, err)
		}
		changed = true
	}
	return changed, nil
}

// applyUser makes user u exist with its password and exactly its roles. etcd keeps only a
// hash of a password, so whether the user's is still u's is found out by logging in with it
// (while auth is on); while auth is off it is set again.
func (o *Operator) applyUser(ctx context.Context, u AuthUser, exists, enabled bool) (bool, error) {
	changed := false
	switch {
	case !exists:
		if _, err := o.cli.UserAdd(ctx, u.Name, u.Password); err != nil && !isEtcdError(err, rpctypes.ErrUserAlreadyExist) {
			return false, transient("add user "+u.Name, err)
		}
		changed = true
	case !enabled || !o.passwordWorks(ctx, u):
		if _, err := o.cli.UserChangePassword(ctx, u.Name, u.Password); err != nil {
			return false, transient("set the password of user "+u.Name, err)
		}
		changed = true
	}
	got, err := o.cli.UserGet(ctx, u.Name)
	if err != nil {
		return false, transient("read user "+u.Name, err)
	}
	for _, r := range u.Roles {
		if !slices.Contains(got.Roles, r) {
			if _, err := o.cli.UserGrantRole(ctx, u.Name, r); err != nil {
				return false, transient("grant role "+r+" to user "+u.Name, err)
			}
			changed = true
		}
	}
	for _, r := range got.Roles {
		if !slices.Contains(u.Roles, r) {
			if _, err := o.cli.UserRevokeRole(ctx, u.Name, r); err != nil && !isEtcdError(err, rpctypes.ErrRoleNotGranted) {
				return false, transient("revoke role "+r+" from user "+u.Name, err)
			}
			changed = true
		}
	}
	return changed, nil
}

// passwordWorks: u can log in with its password. Any failure counts as no: the password is
// then set again, which is harmless.
func (o *Operator) passwordWorks(ctx context.Context, u AuthUser) bool {
	_, err := o.cli.Authenticate(ctx, u.Name, u.Password)
	return err == nil
}

// AuthEnabled reads whether etcd's authentication is on.
func (o *Operator) AuthEnabled(ctx context.Context) (bool, error) {
	st, err := o.cli.AuthStatus(ctx)
	if err != nil {
		return false, transient("read whether auth is on", err)
	}
	return st.Enabled, nil
}

// permRange is the key range of p as etcd stores it: one key, or a prefix's range end. The
// whole key space is the range from "\x00" to "\x00" (etcd's "from key" end).
func permRange(p AuthPermission) (key, end string) {
	if !p.Prefix {
		return p.Key, ""
	}
	if p.Key == "" {
		return "\x00", "\x00"
	}
	return p.Key, clientv3.GetPrefixRangeEnd(p.Key)
}

func permType(t string) clientv3.PermissionType {
	switch t {
	case PermRead:
		return clientv3.PermissionType(authpb.READ)
	case PermWrite:
		return clientv3.PermissionType(authpb.WRITE)
	}
	return clientv3.PermissionType(authpb.READWRITE)
}

func sortedKeys(m map[[2]string]clientv3.PermissionType) [][2]string {
	out := make([][2]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b [2]string) int {
		return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1]))
	})
	return out
}

// ErrAuthLockout is what ApplyAuth refuses: auth turned on without root, which would leave
// no one to turn it off or change membership.
var ErrAuthLockout = errors.New("auth on without root")
