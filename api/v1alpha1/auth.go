package v1alpha1

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// etcd users and roles per client (docs/auth.md).

// AuthSpec turns etcd's authentication on and declares the users applications connect as and
// the roles they have. Each user's password is in a Secret the operator creates,
// <cluster>-user-<name> (keys username and password); the operator's own users are its own
// and not declared here.
//
// +kubebuilder:validation:XValidation:rule="!has(self.users) || self.users.all(u, !has(u.roles) || u.roles.all(r, has(self.roles) && self.roles.exists(x, x.name == r)))",message="every role a user has must be declared in spec.auth.roles"
type AuthSpec struct {
	// Enabled turns etcd's authentication on: from then on every client must log in, and
	// may do only what its roles allow. Turning it off lets every client do everything again;
	// the users and their Secrets stay while they are declared.
	Enabled bool `json:"enabled"`
	// Users are the applications' users.
	//
	// +kubebuilder:validation:MaxItems=64
	// +listType=map
	// +listMapKey=name
	// +optional
	Users []AuthUser `json:"users,omitempty"`
	// Roles are the permissions users may be given.
	//
	// +kubebuilder:validation:MaxItems=64
	// +listType=map
	// +listMapKey=name
	// +optional
	Roles []AuthRole `json:"roles,omitempty"`
}

// AuthUser is one application's etcd user. Its credentials are the Secret
// <cluster>-user-<name>; deleting that Secret rotates its password.
type AuthUser struct {
	// Name is the etcd user name. root and names starting with etcdops are the operator's.
	//
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=40
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self != 'root' && !self.startsWith('etcdops')",message="root and names starting with etcdops are the operator's own users"
	Name string `json:"name"`
	// Roles are the names of the roles, from spec.auth.roles, the user has.
	//
	// +kubebuilder:validation:MaxItems=16
	// +listType=set
	// +optional
	Roles []string `json:"roles,omitempty"`
}

// AuthRole is a set of permissions on keys, as etcd's roles are.
type AuthRole struct {
	// Name is the etcd role name. root and names starting with etcdops are the operator's.
	//
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self != 'root' && !self.startsWith('etcdops')",message="root and names starting with etcdops are the operator's own roles"
	Name string `json:"name"`
	// Permissions are what the role may do, each on one key or on every key with a prefix.
	//
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Permissions []AuthPermission `json:"permissions,omitempty"`
}

// Permission types.
const (
	PermissionRead      = "Read"
	PermissionWrite     = "Write"
	PermissionReadWrite = "ReadWrite"
)

// AuthPermission is one of a role's permissions: reading, writing or both, on the key Key, or
// with Prefix on every key that starts with Key.
//
// +kubebuilder:validation:XValidation:rule="self.prefix || (has(self.key) && self.key.size() > 0)",message="a permission on one key needs the key; for the whole key space set prefix: true with an empty key"
type AuthPermission struct {
	// Type is Read, Write or ReadWrite.
	//
	// +kubebuilder:validation:Enum=Read;Write;ReadWrite
	Type string `json:"type"`
	// Key is the key, or with Prefix the prefix; empty with Prefix is the whole key space.
	//
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Key string `json:"key,omitempty"`
	// Prefix grants the permission on every key starting with Key.
	//
	// +optional
	Prefix bool `json:"prefix,omitempty"`
}

// AuthStatus is etcd's authentication as the operator last applied it.
type AuthStatus struct {
	// Enabled is whether etcd's authentication is on, as etcd last answered.
	Enabled bool `json:"enabled"`
	// Applied is the digest of the declaration (users, roles, every password) the last
	// auth Job applied; a declaration that differs is applied again.
	//
	// +optional
	Applied string `json:"applied,omitempty"`
	// Users and Roles are the applications' users and roles that were applied: those that
	// leave spec.auth are deleted from etcd by the next auth Job.
	//
	// +listType=set
	// +optional
	Users []string `json:"users,omitempty"`
	// +listType=set
	// +optional
	Roles []string `json:"roles,omitempty"`
}

// ClientUser names an etcd user and the Secret with its credentials.
type ClientUser struct {
	// Name is the etcd user name.
	Name string `json:"name"`
	// Secret holds the user's name (username) and password (password).
	Secret string `json:"secret"`
}

// UserSecretName is the Secret with the credentials of an application's user.
func UserSecretName(cluster, user string) string { return cluster + "-user-" + user }

// isOperatorName: root and names starting with etcdops belong to the operator.
func isOperatorName(name string) bool { return name == "root" || strings.HasPrefix(name, "etcdops") }

// checkAuth lists what is wrong with spec.auth, each problem with the field and what to do.
func checkAuth(cluster string, a AuthSpec) []string {
	var p []string
	roles := map[string]bool{}
	for i, r := range a.Roles {
		field := fmt.Sprintf("spec.auth.roles[%d]", i)
		switch {
		case len(validation.IsDNS1123Label(r.Name)) > 0:
			p = append(p, fmt.Sprintf("%s.name %q is not a DNS-1123 label", field, r.Name))
		case isOperatorName(r.Name):
			p = append(p, fmt.Sprintf("%s.name %q is the operator's: root and names starting with etcdops are reserved", field, r.Name))
		case roles[r.Name]:
			p = append(p, fmt.Sprintf("%s.name %q is declared twice", field, r.Name))
		}
		roles[r.Name] = true
		for j, perm := range r.Permissions {
			pf := fmt.Sprintf("%s.permissions[%d]", field, j)
			if !slices.Contains([]string{PermissionRead, PermissionWrite, PermissionReadWrite}, perm.Type) {
				p = append(p, fmt.Sprintf("%s.type %q is not a permission; allowed: %s, %s, %s", pf, perm.Type, PermissionRead, PermissionWrite, PermissionReadWrite))
			}
			if !perm.Prefix && perm.Key == "" {
				p = append(p, pf+" has no key: a permission on one key needs the key; for the whole key space set prefix: true with an empty key")
			}
		}
	}
	users := map[string]bool{}
	for i, u := range a.Users {
		field := fmt.Sprintf("spec.auth.users[%d]", i)
		switch {
		case len(validation.IsDNS1123Label(u.Name)) > 0 || len(u.Name) > 40:
			p = append(p, fmt.Sprintf("%s.name %q is not a DNS-1123 label of at most 40 characters; it names the Secret %s", field, u.Name, UserSecretName(cluster, u.Name)))
		case isOperatorName(u.Name):
			p = append(p, fmt.Sprintf("%s.name %q is the operator's: root and names starting with etcdops are reserved", field, u.Name))
		case users[u.Name]:
			p = append(p, fmt.Sprintf("%s.name %q is declared twice", field, u.Name))
		}
		users[u.Name] = true
		for _, r := range u.Roles {
			if !roles[r] {
				p = append(p, fmt.Sprintf("%s has role %q, which spec.auth.roles does not declare", field, r))
			}
		}
		if n := len(UserSecretName(cluster, u.Name)); n > validation.DNS1123SubdomainMaxLength {
			p = append(p, fmt.Sprintf("%s.name %q makes its Secret's name %d characters; at most %d are allowed", field, u.Name, n, validation.DNS1123SubdomainMaxLength))
		}
	}
	return p
}
