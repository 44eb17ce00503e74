package membertool

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"etcdops.dev/etcdops/etcdstate"
	"etcdops.dev/etcdops/membership"
)

// Secrets is the part of the Kubernetes API the auth Job uses: the credential Secrets of
// etcd's users.
type Secrets interface {
	// Password is the password in Secret name; ErrSecretNotFound when there is none.
	Password(ctx context.Context, namespace, name string) (string, error)
	// CreateCredential creates Secret name with user's name and password, owned by owner;
	// ErrSecretExists when one of its name exists already.
	CreateCredential(ctx context.Context, namespace, name, user, password string, owner metav1.OwnerReference) error
}

// Errors a Secrets implementation wraps.
var (
	ErrSecretNotFound = errors.New("secret not found")
	ErrSecretExists   = errors.New("secret exists")
)

// Keys of a credential Secret (sync.SecretKeyUsername, sync.SecretKeyPassword).
const (
	secretKeyUsername = "username"
	secretKeyPassword = "password"
)

// Password reads the Secret's password.
func (k *KubeClaims) Password(ctx context.Context, namespace, name string) (string, error) {
	s, err := k.Client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("%w: %s/%s", ErrSecretNotFound, namespace, name)
	case err != nil:
		return "", err
	case len(s.Data[secretKeyPassword]) == 0:
		return "", fmt.Errorf("secret %s/%s has no %s", namespace, name, secretKeyPassword)
	}
	return string(s.Data[secretKeyPassword]), nil
}

// CreateCredential creates the Secret.
func (k *KubeClaims) CreateCredential(ctx context.Context, namespace, name, user, password string, owner metav1.OwnerReference) error {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, OwnerReferences: []metav1.OwnerReference{owner},
			Labels: map[string]string{"app.kubernetes.io/managed-by": "etcdops"}},
		Type: corev1.SecretTypeBasicAuth,
		Data: map[string][]byte{secretKeyUsername: []byte(user), secretKeyPassword: []byte(password)},
	}
	_, err := k.Client.CoreV1().Secrets(namespace).Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("%w: %s/%s", ErrSecretExists, namespace, name)
	}
	return err
}

// runAuth makes etcd's users, roles and auth switch match --declaration (sync/auth.go): it
// creates each user's credential Secret that is missing, with a new random password, then
// applies the declaration as root (membership.ApplyAuth). Root's Secret is never made anew
// while etcd's auth is on: a new password could not be set without the old one.
func runAuth(ctx context.Context, secrets Secrets, args []string, stdout, stderr io.Writer) int {
	var f operationFlags
	fs := f.flagSet("auth", 2*time.Minute)
	var namespace, cluster, clusterUID, raw string
	fs.StringVar(&namespace, "namespace", "", "namespace of the cluster and its Secrets")
	fs.StringVar(&cluster, "cluster", "", "the EtcdCluster's name, which owns the Secrets")
	fs.StringVar(&clusterUID, "cluster-uid", "", "the EtcdCluster's UID")
	fs.StringVar(&raw, "declaration", "", "what to apply (JSON, etcdstate.AuthDeclaration)")
	err := parseFlags(fs, args)
	var d etcdstate.AuthDeclaration
	switch {
	case err != nil:
	case f.endpoints == "" || namespace == "" || cluster == "" || clusterUID == "" || raw == "":
		err = errors.New("--endpoints, --namespace, --cluster, --cluster-uid and --declaration are required")
	default:
		if err = json.Unmarshal([]byte(raw), &d); err != nil {
			err = fmt.Errorf("--declaration: %w", err)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "auth: %v\n", err)
		return ExitUsage
	}
	t, err := f.tls()
	if err != nil {
		fmt.Fprintf(stderr, "auth: %v\n", err)
		return ExitUsage
	}
	if secrets == nil {
		k, err := NewKubeClaims(nil)
		if err != nil {
			fmt.Fprintf(stderr, "auth: %v\n", err)
			return ExitRetryable
		}
		secrets = k
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	owner := metav1.OwnerReference{APIVersion: "etcdops.dev/v1alpha1", Kind: "EtcdCluster", Name: cluster, UID: types.UID(clusterUID)}
	for {
		result, err := applyAuth(ctx, secrets, namespace, owner, strings.Split(f.endpoints, ","), t, d)
		switch {
		case err == nil:
			fmt.Fprintf(stdout, "auth: %s\n", result)
			return ExitOK
		case errors.Is(err, membership.ErrRefused) || errors.Is(err, membership.ErrAuthLockout):
			fmt.Fprintf(stderr, "auth: %v\n", err)
			return ExitRefused
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(stderr, "auth: %v (gave up after %v)\n", err, f.timeout)
			return ExitRetryable
		case <-time.After(retryEvery):
		}
	}
}

// applyAuth is one attempt: the Secrets, then etcd.
func applyAuth(ctx context.Context, secrets Secrets, namespace string, owner metav1.OwnerReference, endpoints []string, t *etcdstate.TLS, d etcdstate.AuthDeclaration) (string, error) {
	a := membership.Auth{Enabled: d.Enabled, RemoveUsers: d.RemoveUsers, RemoveRoles: d.RemoveRoles}
	for _, r := range d.Roles {
		ar := membership.AuthRole{Name: r.Name}
		for _, p := range r.Permissions {
			ar.Permissions = append(ar.Permissions, membership.AuthPermission{Type: p.Type, Key: p.Key, Prefix: p.Prefix})
		}
		a.Roles = append(a.Roles, ar)
	}
	var root membership.Login
	for _, u := range d.Users {
		pw, err := secrets.Password(ctx, namespace, u.Secret)
		if errors.Is(err, ErrSecretNotFound) {
			if u.Name == membership.RootUser {
				if on, err := authOn(ctx, endpoints, t); err != nil || on {
					return "", fmt.Errorf("%w: etcd's auth is on (or could not be read: %v) and root's Secret %s is missing; restore it", membership.ErrRefused, err, u.Secret)
				}
			}
			pw, err = newCredential(ctx, secrets, namespace, u.Secret, u.Name, owner)
		}
		if err != nil {
			return "", fmt.Errorf("%w: credentials of %s: %v", membership.ErrRetryable, u.Name, err)
		}
		a.Users = append(a.Users, membership.AuthUser{Name: u.Name, Password: pw, Roles: u.Roles})
		if u.Name == membership.RootUser {
			root = membership.Login{User: u.Name, Password: pw}
		}
	}
	op, err := membership.Dial(endpoints, t, root)
	if err != nil {
		return "", err
	}
	defer op.Close()
	out, err := op.ApplyAuth(ctx, a)
	return fmt.Sprintf("%v (auth on: %t, %d users, %d roles, removed %d users and %d roles)", out, d.Enabled, len(a.Users), len(a.Roles), len(d.RemoveUsers), len(d.RemoveRoles)), err
}

// authOn asks etcd, without logging in, whether its auth is on.
func authOn(ctx context.Context, endpoints []string, t *etcdstate.TLS) (bool, error) {
	op, err := membership.Dial(endpoints, t, membership.Login{})
	if err != nil {
		return false, err
	}
	defer op.Close()
	return op.AuthEnabled(ctx)
}

// newCredential creates a Secret with a new random password; when another attempt created
// it meanwhile, that one's password is used.
func newCredential(ctx context.Context, secrets Secrets, namespace, name, user string, owner metav1.OwnerReference) (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	pw := base64.RawURLEncoding.EncodeToString(b)
	err := secrets.CreateCredential(ctx, namespace, name, user, pw, owner)
	if errors.Is(err, ErrSecretExists) {
		return secrets.Password(ctx, namespace, name)
	}
	return pw, err
}

// parseFlags parses args, refusing positional ones.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return nil
}
