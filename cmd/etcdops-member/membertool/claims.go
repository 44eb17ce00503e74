package membertool

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"etcdops.dev/etcdops/membership"
)

// Claims is the part of the Kubernetes API the volume Jobs use: expand-claim's claims, and
// the pod restart-pod deletes. The Job's pod reaches it through client-go (KubeClaims); the
// end-to-end harness passes its own API server's.
type Claims interface {
	// Requested is the claim's spec.resources.requests.storage.
	Requested(ctx context.Context, namespace, name string) (resource.Quantity, error)
	// Request sets the claim's spec.resources.requests.storage.
	Request(ctx context.Context, namespace, name string, size resource.Quantity) error
	// Create creates the claim; ErrClaimExists when one of its name exists already.
	Create(ctx context.Context, claim *corev1.PersistentVolumeClaim) error
	// DeletePod deletes the pod if its UID is uid (a delete precondition); ErrPodGone when
	// there is no such pod, or it has another UID.
	DeletePod(ctx context.Context, namespace, name string, uid types.UID) error
}

// Errors a Claims implementation wraps: a missing claim, a request the API server refuses
// for good (its StorageClass does not allow expansion, a quota, a missing permission), and a
// pod already gone or recreated.
var (
	ErrClaimNotFound = errors.New("claim not found")
	ErrClaimExists   = errors.New("claim exists")
	ErrClaimRefused  = errors.New("refused by the API server")
	ErrPodGone       = errors.New("pod gone or recreated")
)

// KubeClaims is Claims over client-go.
type KubeClaims struct{ Client kubernetes.Interface }

// NewKubeClaims connects to the API server of cfg; nil for the in-cluster configuration of
// the pod's service account.
func NewKubeClaims(cfg *rest.Config) (*KubeClaims, error) {
	if cfg == nil {
		in, err := rest.InClusterConfig()
		if err != nil {
			return nil, err
		}
		cfg = in
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &KubeClaims{Client: c}, nil
}

// Requested reads the claim.
func (k *KubeClaims) Requested(ctx context.Context, namespace, name string) (resource.Quantity, error) {
	pvc, err := k.Client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return resource.Quantity{}, kubeError(err)
	}
	return pvc.Spec.Resources.Requests[corev1.ResourceStorage], nil
}

// Request patches only the storage request (a merge patch), so nothing else of the claim is
// written back from a possibly stale copy.
func (k *KubeClaims) Request(ctx context.Context, namespace, name string, size resource.Quantity) error {
	patch := fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":%q}}}}`, size.String())
	_, err := k.Client.CoreV1().PersistentVolumeClaims(namespace).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return kubeError(err)
}

// Create creates the claim.
func (k *KubeClaims) Create(ctx context.Context, claim *corev1.PersistentVolumeClaim) error {
	_, err := k.Client.CoreV1().PersistentVolumeClaims(claim.Namespace).Create(ctx, claim, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("%w: %v", ErrClaimExists, err)
	}
	return kubeError(err)
}

// DeletePod deletes the pod with a UID precondition, so that a pod the StatefulSet already
// created again under the same name is never deleted in its place.
func (k *KubeClaims) DeletePod(ctx context.Context, namespace, name string, uid types.UID) error {
	err := k.Client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	// The API server answers a precondition that does not hold with a conflict.
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return fmt.Errorf("%w: %v", ErrPodGone, err)
	}
	return kubeError(err)
}

// kubeError classifies an API error: not found and forbidden or invalid are for good, the
// rest may pass.
func kubeError(err error) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: %v", ErrClaimNotFound, err)
	case apierrors.IsForbidden(err) || apierrors.IsInvalid(err):
		return fmt.Errorf("%w: %v", ErrClaimRefused, err)
	}
	return err
}

// runExpandClaim asks for --size on --claim, retrying what may pass within --timeout. A claim
// that already asks for as much is done: the Job may run again after a lost answer. With
// --create a missing claim is created at --size as the StatefulSet would create it from its
// claim template (--access-mode, --storage-class, --limit, and the --label the StatefulSet's
// selector gives its claims), so that the StatefulSet adopts it for the member's pod; without,
// a missing claim is refused.
func runExpandClaim(ctx context.Context, claims Claims, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("expand-claim", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	member := fs.String("member", "", "pod name of the member")
	namespace := fs.String("namespace", "", "namespace of the claim")
	claim := fs.String("claim", "", "name of the member's PersistentVolumeClaim")
	sizeFlag := fs.String("size", "", "storage to ask for, e.g. 16Gi")
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long, retrying what is retryable")
	create := fs.Bool("create", false, "create the claim when it is missing")
	accessMode := fs.String("access-mode", "ReadWriteOnce", "a created claim's access mode")
	class := fs.String("storage-class", "", "a created claim's StorageClass; none: the default class")
	limitFlag := fs.String("limit", "", "a created claim's storage limit")
	label := fs.String("label", "", "a created claim's label, key=value")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 || *member == "" || *namespace == "" || *claim == "" || *sizeFlag == "" {
		fmt.Fprintln(stderr, "expand-claim: --member, --namespace, --claim and --size are required")
		return ExitUsage
	}
	size, err := resource.ParseQuantity(*sizeFlag)
	if err != nil || size.Sign() <= 0 {
		fmt.Fprintf(stderr, "expand-claim: --size %q is not a positive quantity\n", *sizeFlag)
		return ExitUsage
	}
	var want *corev1.PersistentVolumeClaim
	if *create {
		if want, err = newClaim(*namespace, *claim, size, *accessMode, *class, *limitFlag, *label); err != nil {
			fmt.Fprintf(stderr, "expand-claim: %v\n", err)
			return ExitUsage
		}
	}
	if claims == nil {
		if claims, err = NewKubeClaims(nil); err != nil {
			fmt.Fprintf(stderr, "expand-claim %s: %v\n", *member, err)
			return ExitRetryable
		}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	for {
		result, err := expandOnce(ctx, claims, *namespace, *claim, size, want)
		switch {
		case err == nil:
			fmt.Fprintf(stdout, "expand-claim %s: %s\n", *member, result)
			return ExitOK
		case errors.Is(err, ErrClaimNotFound) || errors.Is(err, ErrClaimRefused):
			fmt.Fprintf(stderr, "expand-claim %s: %v\n", *member, err)
			return ExitRefused
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(stderr, "expand-claim %s: %v (gave up after %v)\n", *member, err, *timeout)
			return ExitRetryable
		case <-time.After(retryEvery):
		}
	}
}

// expandOnce asks for size on the claim, or creates it as want when it is missing and want is
// given.
func expandOnce(ctx context.Context, claims Claims, namespace, claim string, size resource.Quantity, want *corev1.PersistentVolumeClaim) (string, error) {
	got, err := claims.Requested(ctx, namespace, claim)
	if errors.Is(err, ErrClaimNotFound) && want != nil {
		err = claims.Create(ctx, want)
		if err == nil {
			return fmt.Sprintf("claim %s created, asking for %s", claim, size.String()), nil
		}
		if errors.Is(err, ErrClaimExists) {
			// Created meanwhile (the StatefulSet, or an earlier run): look at it again.
			return "", err
		}
	}
	if err != nil {
		return "", err
	}
	if got.Cmp(size) >= 0 {
		return fmt.Sprintf("claim %s already asks for %s", claim, got.String()), nil
	}
	if err := claims.Request(ctx, namespace, claim, size); err != nil {
		return "", err
	}
	return fmt.Sprintf("claim %s asks for %s (was %s)", claim, size.String(), got.String()), nil
}

// newClaim is the claim --create makes: the StatefulSet's claim template as the planner
// renders it, at size, with the label the StatefulSet's selector gives its claims.
func newClaim(namespace, name string, size resource.Quantity, accessMode, class, limit, label string) (*corev1.PersistentVolumeClaim, error) {
	c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.PersistentVolumeAccessMode(accessMode)}
	c.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: size}
	if class != "" {
		c.Spec.StorageClassName = &class
	}
	if limit != "" {
		q, err := resource.ParseQuantity(limit)
		if err != nil {
			return nil, fmt.Errorf("--limit %q is not a quantity", limit)
		}
		c.Spec.Resources.Limits = corev1.ResourceList{corev1.ResourceStorage: q}
	}
	if label != "" {
		k, v, ok := strings.Cut(label, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--label %q is not key=value", label)
		}
		c.Labels = map[string]string{k: v}
	}
	return c, nil
}

// runRestartPod deletes the member's pod if it is still the one of --uid, retrying what may
// pass within --timeout. A pod gone or recreated is done: the Job may run again after a lost
// answer, and must not delete the pod that replaced it. Before each delete it asks etcd, at
// --endpoints, whether member --id may be taken down now (membership.CheckRestart): the step
// was decided on a view that may be minutes old by the time the Job runs, and a voter that
// failed since, or leadership that came back to the member, must not cost a second voter or
// an election. Without --id the pod holds no member of the cluster, and etcd is not asked.
func runRestartPod(ctx context.Context, claims Claims, args []string, stdout, stderr io.Writer) int {
	var f operationFlags
	fs := f.flagSet("restart-pod", 30*time.Second)
	namespace := fs.String("namespace", "", "namespace of the pod")
	uid := fs.String("uid", "", "UID of the pod to delete")
	fs.StringVar(&f.id, "id", "", "member ID in hex of the member on the pod, if it has one")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 || f.member == "" || *namespace == "" || *uid == "" || f.endpoints == "" {
		fmt.Fprintln(stderr, "restart-pod: --endpoints, --member, --namespace and --uid are required")
		return ExitUsage
	}
	var id uint64
	if f.id != "" {
		var err error
		if id, err = strconv.ParseUint(f.id, 16, 64); err != nil {
			fmt.Fprintf(stderr, "restart-pod: --id %q is not a hex member ID\n", f.id)
			return ExitUsage
		}
	}
	t, login, err := f.access()
	if err != nil {
		fmt.Fprintf(stderr, "restart-pod %s: %v\n", f.member, err)
		return ExitUsage
	}
	op, err := membership.Dial(strings.Split(f.endpoints, ","), t, login)
	if err != nil {
		fmt.Fprintf(stderr, "restart-pod %s: %v\n", f.member, err)
		return ExitUsage
	}
	defer op.Close()
	if claims == nil {
		if claims, err = NewKubeClaims(nil); err != nil {
			fmt.Fprintf(stderr, "restart-pod %s: %v\n", f.member, err)
			return ExitRetryable
		}
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	for {
		err := restartOnce(ctx, op, claims, *namespace, f.member, id, types.UID(*uid))
		switch {
		case err == nil:
			fmt.Fprintf(stdout, "restart-pod %s: deleted pod %s (uid %s)\n", f.member, f.member, *uid)
			return ExitOK
		case errors.Is(err, ErrPodGone):
			fmt.Fprintf(stdout, "restart-pod %s: pod %s of uid %s is already gone\n", f.member, f.member, *uid)
			return ExitOK
		case errors.Is(err, ErrClaimRefused) || errors.Is(err, membership.ErrRefused):
			fmt.Fprintf(stderr, "restart-pod %s: %v\n", f.member, err)
			return ExitRefused
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(stderr, "restart-pod %s: %v (gave up after %v)\n", f.member, err, f.timeout)
			return ExitRetryable
		case <-time.After(retryEvery):
		}
	}
}

// restartOnce asks etcd whether the member may go down now (id 0: the pod holds none), then
// deletes its pod by UID.
func restartOnce(ctx context.Context, op *membership.Operator, claims Claims, namespace, member string, id uint64, uid types.UID) error {
	if id != 0 {
		if err := op.CheckRestart(ctx, member, id); err != nil {
			return err
		}
	}
	return claims.DeletePod(ctx, namespace, member, uid)
}
