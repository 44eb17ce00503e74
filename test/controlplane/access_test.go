package controlplane

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"etcdops.dev/etcdops/kubeevents"
	"etcdops.dev/etcdops/sync"
)

// access is one question to the API server's authorizer, as `kubectl auth can-i` asks it: may
// the user do verb on resource (of group) named name ("" for any) in namespace?
type access struct {
	verb, group, resource, subresource, namespace, name string
	want                                                bool
}

func (a access) String() string {
	s := a.verb + " " + a.resource
	if a.subresource != "" {
		s += "/" + a.subresource
	}
	if a.group != "" {
		s += "." + a.group
	}
	if a.name != "" {
		s += " " + a.name
	}
	return s + " in " + a.namespace
}

// checkAccess asks the real authorizer (SubjectAccessReview, RBAC) each question for user and
// fails t for every answer other than the one wanted.
func checkAccess(t *testing.T, p *Plane, user string, questions []access) {
	t.Helper()
	for _, q := range questions {
		ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
		sar, err := p.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + strings.Split(user, ":")[2], "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: q.namespace, Verb: q.verb, Group: q.group,
				Resource: q.resource, Subresource: q.subresource, Name: q.name},
		}}, metav1.CreateOptions{})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != q.want {
			t.Errorf("%s may %s: %v, want %v (%s)", user, q, sar.Status.Allowed, q.want, sar.Status.Reason)
		}
	}
}

// serviceAccount is a service account's user name.
func serviceAccount(namespace, name string) string {
	return "system:serviceaccount:" + namespace + ":" + name
}

// claimsAccountReachesOnlyItsCluster checks the Role the planner rendered for c's volume Jobs
// with the real authorizer: its account may read and patch c's claims and delete c's pods,
// each by name, for every ordinal c has, and nothing of its neighbour in the namespace (another
// EtcdCluster), no other verb, no other resource, no object by a name it does not list.
func claimsAccountReachesOnlyItsCluster(t *testing.T, c, neighbour *Cluster, ordinals int) {
	ns := c.Namespace
	var qs []access
	for ord := range ordinals {
		claim, pod := sync.ClaimName(c.Name, ord), sync.PodName(c.Name, ord)
		qs = append(qs,
			access{"get", "", "persistentvolumeclaims", "", ns, claim, true},
			access{"patch", "", "persistentvolumeclaims", "", ns, claim, true},
			access{"delete", "", "pods", "", ns, pod, true},
			access{"delete", "", "persistentvolumeclaims", "", ns, claim, false},
			access{"update", "", "persistentvolumeclaims", "", ns, claim, false},
			access{"patch", "", "pods", "", ns, pod, false},
			access{"get", "", "pods", "", ns, pod, false},
		)
	}
	for ord := range 3 {
		claim, pod := sync.ClaimName(neighbour.Name, ord), sync.PodName(neighbour.Name, ord)
		qs = append(qs,
			access{"get", "", "persistentvolumeclaims", "", ns, claim, false},
			access{"patch", "", "persistentvolumeclaims", "", ns, claim, false},
			access{"update", "", "persistentvolumeclaims", "", ns, claim, false},
			access{"delete", "", "persistentvolumeclaims", "", ns, claim, false},
			access{"delete", "", "pods", "", ns, pod, false},
		)
	}
	qs = append(qs,
		// Past the ordinals the cluster has: a claim and a pod it does not list.
		access{"patch", "", "persistentvolumeclaims", "", ns, sync.ClaimName(c.Name, ordinals+2), false},
		access{"delete", "", "pods", "", ns, sync.PodName(c.Name, ordinals+2), false},
		// A create has no name to narrow it by: expand-claim creates a joining member's
		// claim, so the Role allows it for any claim (claimsTokenReachesNoNeighbour shows
		// what it cannot do with that).
		access{"create", "", "persistentvolumeclaims", "", ns, "", true},
		access{"create", "", "persistentvolumeclaims", "", "default", "", false},
		// Unnamed requests reach every object: never.
		access{"patch", "", "persistentvolumeclaims", "", ns, "", false},
		access{"delete", "", "pods", "", ns, "", false},
		access{"list", "", "pods", "", ns, "", false},
		access{"list", "", "persistentvolumeclaims", "", ns, "", false},
		access{"deletecollection", "", "pods", "", ns, "", false},
		access{"create", "", "pods", "", ns, "", false},
		access{"create", "", "pods", "eviction", ns, sync.PodName(c.Name, 0), false},
		access{"get", "", "secrets", "", ns, "", false},
		access{"get", "", "secrets", "", ns, c.Name + "-client", false},
		access{"patch", "apps", "statefulsets", "", ns, c.Name, false},
		access{"get", "etcdops.dev", "etcdclusters", "", ns, c.Name, false},
		access{"patch", "", "persistentvolumeclaims", "", "default", sync.ClaimName(c.Name, 0), false},
	)
	checkAccess(t, c.Plane, serviceAccount(ns, sync.ClaimsAccountName(c.Name)), qs)
}

// claimsTokenReachesNoNeighbour uses a token of c's volume Jobs' account, as their pods do,
// against the real API server: it creates a claim (as expand-claim does for a member about to
// join; the rule that allows it names no claim, as RBAC cannot narrow a create), and cannot
// read, patch or delete the neighbour's claims or delete its pods; a create under the name of
// the neighbour's claim is refused as existing and leaves it as it was.
func claimsTokenReachesNoNeighbour(t *testing.T, c, neighbour *Cluster) {
	p := c.Plane
	ctx, cancel := context.WithTimeout(p.ctx, time.Minute)
	defer cancel()
	tok, err := p.token(c.Namespace, sync.ClaimsAccountName(c.Name))
	if err != nil {
		t.Fatal(err)
	}
	as, err := kubernetes.NewForConfig(p.accountConfig(tok))
	if err != nil {
		t.Fatal(err)
	}
	claims, pods := as.CoreV1().PersistentVolumeClaims(c.Namespace), as.CoreV1().Pods(c.Namespace)
	newClaim := func(name string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.Namespace},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	}
	// A claim of an ordinal the cluster does not have, deleted again with the admin's rights:
	// the account may create it, and, as the Role does not name it, not delete it.
	spare := sync.ClaimName(c.Name, 9)
	if _, err := claims.Create(ctx, newClaim(spare), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the volume Jobs' account may not create claim %s: %v", spare, err)
	}
	if err := claims.Delete(ctx, spare, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("deleting claim %s as the volume Jobs' account: %v, want forbidden", spare, err)
	}
	if err := p.Client.CoreV1().PersistentVolumeClaims(c.Namespace).Delete(ctx, spare, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	mine := sync.ClaimName(c.Name, 0)
	if _, err := claims.Get(ctx, mine, metav1.GetOptions{}); err != nil {
		t.Errorf("getting its own claim %s: %v", mine, err)
	}
	theirs, theirPod := sync.ClaimName(neighbour.Name, 0), sync.PodName(neighbour.Name, 0)
	before, err := p.Client.CoreV1().PersistentVolumeClaims(c.Namespace).Get(ctx, theirs, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	grow := []byte(`{"spec":{"resources":{"requests":{"storage":"5Gi"}}}}`)
	for _, try := range []struct {
		what string
		do   func() error
	}{
		{"get claim " + theirs, func() error { _, err := claims.Get(ctx, theirs, metav1.GetOptions{}); return err }},
		{"patch claim " + theirs, func() error {
			_, err := claims.Patch(ctx, theirs, types.MergePatchType, grow, metav1.PatchOptions{})
			return err
		}},
		{"delete claim " + theirs, func() error { return claims.Delete(ctx, theirs, metav1.DeleteOptions{}) }},
		{"delete pod " + theirPod, func() error { return pods.Delete(ctx, theirPod, metav1.DeleteOptions{}) }},
		{"list claims", func() error { _, err := claims.List(ctx, metav1.ListOptions{}); return err }},
	} {
		if err := try.do(); !apierrors.IsForbidden(err) {
			t.Errorf("%s as the volume Jobs' account of %s: %v, want forbidden", try.what, c.Name, err)
		}
	}
	if _, err := claims.Create(ctx, newClaim(theirs), metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		t.Errorf("creating claim %s over the neighbour's: %v, want already exists", theirs, err)
	}
	after, err := p.Client.CoreV1().PersistentVolumeClaims(c.Namespace).Get(ctx, theirs, metav1.GetOptions{})
	if err != nil || after.UID != before.UID || after.ResourceVersion != before.ResourceVersion {
		t.Errorf("the neighbour's claim %s changed (%v)", theirs, err)
	}
	if pod, err := p.Client.CoreV1().Pods(c.Namespace).Get(ctx, theirPod, metav1.GetOptions{}); err != nil || pod.DeletionTimestamp != nil {
		t.Errorf("the neighbour's pod %s was touched (%v)", theirPod, err)
	}
}

// refusedRestart runs, as c's volume Jobs' account, a restart-pod Job of c's own command on a
// pod of its neighbour, which the Role does not name: the real API server must refuse the
// delete, the Job fail with the refusal in its pod's termination message, and the pod stay.
// Without --id the tool does not ask etcd first (the pod holds no member as far as it is
// told), so the delete is what is refused.
func refusedRestart(t *testing.T, c, neighbour *Cluster) {
	p := c.Plane
	ctx := p.ctx
	target := sync.PodName(neighbour.Name, 0)
	pod, err := p.Client.CoreV1().Pods(c.Namespace).Get(ctx, target, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	no, yes := false, true
	uid, gid := int64(65532), int64(65532)
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "refused-restart-pod", Namespace: c.Namespace},
		Spec: batchv1.JobSpec{BackoffLimit: ptr(int32(0)), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			ServiceAccountName:           sync.ClaimsAccountName(c.Name),
			AutomountServiceAccountToken: &yes,
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: &yes, RunAsUser: &uid, RunAsGroup: &gid,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{Name: "member", Image: ToolImage,
				Command: []string{"/etcdops-member", "restart-pod", "--endpoints=" + neighbour.ClientURL(target), "--member=" + target, "--namespace=" + c.Namespace, "--uid=" + string(pod.UID), "--timeout=10s"},
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &yes,
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}},
		}}},
	}
	if _, err := p.Client.BatchV1().Jobs(c.Namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		bg := metav1.DeletePropagationBackground
		_ = p.Client.BatchV1().Jobs(c.Namespace).Delete(ctx, job.Name, metav1.DeleteOptions{PropagationPolicy: &bg})
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		j, err := p.Client.BatchV1().Jobs(c.Namespace).Get(ctx, job.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if jobFinished(j) {
			if j.Status.Succeeded > 0 {
				t.Fatalf("the Job deleted %s of another cluster: its account may delete it", target)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Job did not finish in a minute: %+v", j.Status)
		}
		time.Sleep(250 * time.Millisecond)
	}
	// The container's stderr, which `kubectl logs` would show.
	msg := ""
	for _, run := range c.Jobs() {
		if run.Job == job.Name && run.Err != nil {
			msg = run.Err.Error()
		}
	}
	if !strings.Contains(msg, "forbidden") || !strings.Contains(msg, serviceAccount(c.Namespace, sync.ClaimsAccountName(c.Name))) {
		t.Errorf("the Job failed, but not as refused by RBAC: %q", msg)
	}
	if now, err := p.Client.CoreV1().Pods(c.Namespace).Get(ctx, target, metav1.GetOptions{}); err != nil || now.UID != pod.UID || now.DeletionTimestamp != nil {
		t.Errorf("pod %s of another cluster was touched (%v)", target, err)
	}
	t.Logf("restart-pod as %s on %s: %s", sync.ClaimsAccountName(c.Name), target, msg)
}

// hookAccountMayOnlyWriteEvents checks the hook's own account (manifests/.../rbac.yaml, the
// chart's rbac.yaml) with the real authorizer: Events it may create and patch, nothing else.
func hookAccountMayOnlyWriteEvents(t *testing.T, c *Cluster) {
	ns := c.Namespace
	checkAccess(t, c.Plane, serviceAccount(OperatorNamespace, HookAccount), []access{
		{"create", "", "events", "", ns, "", true},
		{"patch", "", "events", "", ns, "", true},
		{"get", "", "events", "", ns, "", false},
		{"delete", "", "events", "", ns, "", false},
		{"get", "", "secrets", "", ns, "", false},
		{"list", "", "secrets", "", ns, "", false},
		{"get", "", "secrets", "", OperatorNamespace, "", false},
		{"create", "", "pods", "", ns, "", false},
		{"list", "", "pods", "", ns, "", false},
		{"delete", "", "pods", "", ns, sync.PodName(c.Name, 0), false},
		{"get", "etcdops.dev", "etcdclusters", "", ns, c.Name, false},
		{"update", "etcdops.dev", "etcdclusters", "status", ns, c.Name, false},
		{"patch", "apps", "statefulsets", "", ns, c.Name, false},
		{"create", "batch", "jobs", "", ns, "", false},
		{"patch", "", "persistentvolumeclaims", "", ns, sync.ClaimName(c.Name, 0), false},
		{"create", "rbac.authorization.k8s.io", "roles", "", ns, "", false},
	})
}

// hookEventsOfSteps checks the Events the hook wrote on the EtcdCluster, with its own account,
// since start: each step of a scale 3 → 5 → 3 (the learners added and promoted, the members
// removed, and the steps' successes), as `kubectl describe etcdcluster` shows them; and that the
// API server refused none of the hook's writes (the hook logs each refusal).
func hookEventsOfSteps(t *testing.T, c *Cluster, start time.Time) {
	ec, err := c.Get()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(c.Plane.ctx, 10*time.Second)
	defer cancel()
	events, err := c.Plane.Client.CoreV1().Events(c.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(ec.UID)})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, e := range events.Items {
		if e.Source.Component != kubeevents.Component || e.LastTimestamp.Time.Before(start.Truncate(time.Second)) {
			continue
		}
		seen = append(seen, e.Reason+" "+e.Message)
	}
	slices.Sort(seen)
	// Each step's start, by member: the sync that decides a step writes it. A step's end is
	// written by a later sync, from the status Metacontroller hands it, which may predate the
	// step (a sync on a parent its cache has not updated yet, whose status then overwrites the
	// newer one): that step's record, and its end, are lost. So the ends are only counted.
	for _, want := range []string{
		"ExpandVolume ExpandVolume " + sync.PodName(c.Name, 3) + " ", "ExpandVolume ExpandVolume " + sync.PodName(c.Name, 4) + " ",
		"AddLearner AddLearner " + sync.PodName(c.Name, 3) + " ", "AddLearner AddLearner " + sync.PodName(c.Name, 4) + " ",
		"PromoteLearner PromoteLearner " + sync.PodName(c.Name, 3) + " ", "PromoteLearner PromoteLearner " + sync.PodName(c.Name, 4) + " ",
		"RemoveMember RemoveMember " + sync.PodName(c.Name, 3) + " ", "RemoveMember RemoveMember " + sync.PodName(c.Name, 4) + " ",
	} {
		if !slices.ContainsFunc(seen, func(s string) bool { return strings.HasPrefix(s, want) }) {
			t.Errorf("no Event %q... on the EtcdCluster; the hook's Events since the scale began:\n%s", want, strings.Join(seen, "\n"))
		}
	}
	ended := map[string]bool{}
	for _, s := range seen {
		if rest, ok := strings.CutPrefix(s, sync.EventStepSucceeded+" "); ok {
			ended[strings.Fields(rest)[0]] = true
		}
	}
	if len(ended) == 0 {
		t.Errorf("no %s Event on the EtcdCluster since the scale began:\n%s", sync.EventStepSucceeded, strings.Join(seen, "\n"))
	}
	var noEnd []string
	for _, kind := range []string{"ExpandVolume", "AddLearner", "ScaleStatefulSet", "PromoteLearner", "RemoveMember"} {
		if !ended[kind] {
			noEnd = append(noEnd, kind)
		}
	}
	if len(noEnd) > 0 {
		t.Logf("steps whose success no Event told (their record lost to a sync on a stale parent): %v", noEnd)
	}
	describe, err := c.Plane.Kubectl("describe", "etcdcluster", "-n", c.Namespace, c.Name)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(describe, "AddLearner") || !strings.Contains(describe, kubeevents.Component) {
		t.Errorf("kubectl describe etcdcluster shows no AddLearner Event from %s:\n%s", kubeevents.Component, describe)
	}
	log, err := os.ReadFile(c.Plane.file("hook.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "an event was not written"); n > 0 {
		t.Errorf("the API server refused %d of the hook's Events (%s)", n, c.Plane.file("hook.log"))
	}
	t.Logf("%d Events from the hook since the scale began", len(seen))
}

func ptr[T any](v T) *T { return &v }
