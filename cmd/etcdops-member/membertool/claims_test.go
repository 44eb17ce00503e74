package membertool

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	gosync "sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// claimServer plays the kube-apiserver's claims endpoint on loopback, which a unit test cannot
// run: GET and merge PATCH of one namespace's claims, and the errors it is told to answer. It
// is an httptest server rather than client-go's fake clientset so that the test sees what
// KubeClaims sends on the wire: the patch type and body, and that only the request changes.
type claimServer struct {
	mu      gosync.Mutex
	claims  map[string]*corev1.PersistentVolumeClaim
	patches []string
	// created are the names of the claims POSTed.
	created []string
	// failGet and failPatch, when set, answer every GET or PATCH with that status code.
	failGet, failPatch int
}

func (s *claimServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Method == http.MethodPost && r.URL.Path == "/api/v1/namespaces/ns/persistentvolumeclaims" {
		s.create(w, r)
		return
	}
	name, ok := strings.CutPrefix(r.URL.Path, "/api/v1/namespaces/ns/persistentvolumeclaims/")
	c := s.claims[name]
	fail := s.failGet
	if r.Method == http.MethodPatch {
		fail = s.failPatch
	}
	switch {
	case !ok:
		status(w, http.StatusNotFound, metav1.StatusReasonNotFound, "no such path")
		return
	case fail == http.StatusForbidden:
		status(w, fail, metav1.StatusReasonForbidden, `persistentvolumeclaims "`+name+`" is forbidden: only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize`)
		return
	case fail != 0:
		status(w, fail, metav1.StatusReasonServiceUnavailable, "the server is currently unable to handle the request")
		return
	case c == nil:
		status(w, http.StatusNotFound, metav1.StatusReasonNotFound, `persistentvolumeclaims "`+name+`" not found`)
		return
	}
	if r.Method == http.MethodPatch {
		body, _ := io.ReadAll(r.Body)
		s.patches = append(s.patches, r.Header.Get("Content-Type")+" "+string(body))
		var p struct {
			Spec struct {
				Resources struct {
					Requests map[string]string `json:"requests"`
				} `json:"resources"`
			} `json:"spec"`
		}
		if err := json.Unmarshal(body, &p); err != nil {
			status(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error())
			return
		}
		c.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse(p.Spec.Resources.Requests["storage"])
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(c)
}

// create is the API server's POST of a claim: it records the body and keeps the claim, or
// answers AlreadyExists.
func (s *claimServer) create(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	// client-go may send the claim as protobuf or JSON: decode either, as the API server does.
	o, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
	c, ok := o.(*corev1.PersistentVolumeClaim)
	if err != nil || !ok {
		status(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("not a claim: %v", err))
		return
	}
	s.created = append(s.created, c.Name)
	if _, ok := s.claims[c.Name]; ok {
		status(w, http.StatusConflict, metav1.StatusReasonAlreadyExists, `persistentvolumeclaims "`+c.Name+`" already exists`)
		return
	}
	s.claims[c.Name] = c
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(c)
}

func status(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Code: int32(code), Reason: reason, Message: msg})
}

func newClaimServer(t *testing.T) (*claimServer, Claims) {
	s := &claimServer{claims: map[string]*corev1.PersistentVolumeClaim{}}
	pvc := &corev1.PersistentVolumeClaim{TypeMeta: metav1.TypeMeta{Kind: "PersistentVolumeClaim", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "data-etcd-0", Namespace: "ns"}}
	pvc.Spec.StorageClassName = new("standard")
	pvc.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	s.claims[pvc.Name] = pvc
	return s, kubeClaimsOf(t, s)
}

// kubeClaimsOf is the client-go adapter talking to api, served on loopback until the test ends.
func kubeClaimsOf(t *testing.T, api http.Handler) Claims {
	t.Helper()
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	claims, err := NewKubeClaims(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return claims
}

func expand(t *testing.T, claims Claims, args ...string) (int, string) {
	var stdout, stderr bytes.Buffer
	code := RunWithClaims(context.Background(), append([]string{"expand-claim", "--member=etcd-0", "--namespace=ns"}, args...), &stdout, &stderr, claims)
	return code, strings.TrimSpace(stdout.String() + stderr.String())
}

// TestExpandClaim: expand-claim raises the claim's request with a merge patch of the request
// alone, and is done without a patch when the claim already asks for as much (a retried Job).
func TestExpandClaim(t *testing.T) {
	s, claims := newClaimServer(t)
	if code, out := expand(t, claims, "--claim=data-etcd-0", "--size=2Gi"); code != ExitOK || !strings.Contains(out, "asks for 2Gi (was 1Gi)") {
		t.Fatalf("exit %d, %q; want 0 and the claim expanded", code, out)
	}
	want := `application/merge-patch+json {"spec":{"resources":{"requests":{"storage":"2Gi"}}}}`
	if len(s.patches) != 1 || s.patches[0] != want {
		t.Fatalf("patches %q, want exactly %q", s.patches, want)
	}
	for _, size := range []string{"2Gi", "2048Mi", "1Gi"} {
		if code, out := expand(t, claims, "--claim=data-etcd-0", "--size="+size); code != ExitOK || !strings.Contains(out, "already asks for 2Gi") {
			t.Errorf("--size=%s again: exit %d, %q; want 0, already done", size, code, out)
		}
	}
	if len(s.patches) != 1 {
		t.Errorf("a claim already big enough was patched again: %q", s.patches)
	}
}

// TestExpandClaimCreates: with --create a missing claim is created at --size as the
// StatefulSet would create it (its template's access mode, class and limit, the selector's
// label), and a claim that exists is expanded, never created again.
func TestExpandClaimCreates(t *testing.T) {
	s, claims := newClaimServer(t)
	create := []string{"--size=2Gi", "--create", "--access-mode=ReadWriteOnce", "--storage-class=fast", "--limit=4Gi", "--label=etcdops.dev/cluster=etcd"}
	code, out := expand(t, claims, append([]string{"--claim=data-etcd-3"}, create...)...)
	if code != ExitOK || !strings.Contains(out, "claim data-etcd-3 created, asking for 2Gi") {
		t.Fatalf("exit %d, %q; want the claim created", code, out)
	}
	c := s.claims["data-etcd-3"]
	if c == nil || c.Namespace != "ns" || c.Labels["etcdops.dev/cluster"] != "etcd" || *c.Spec.StorageClassName != "fast" ||
		c.Spec.AccessModes[0] != corev1.ReadWriteOnce || c.Spec.Resources.Requests.Storage().String() != "2Gi" || c.Spec.Resources.Limits.Storage().String() != "4Gi" {
		t.Fatalf("created %q", s.created)
	}
	if code, out := expand(t, claims, append([]string{"--claim=data-etcd-3"}, create...)...); code != ExitOK || !strings.Contains(out, "already asks for 2Gi") || len(s.created) != 1 {
		t.Errorf("again: exit %d, %q, %d creates; want done without a create", code, out, len(s.created))
	}
	if code, out := expand(t, claims, append([]string{"--claim=data-etcd-0"}, create...)...); code != ExitOK || !strings.Contains(out, "asks for 2Gi (was 1Gi)") || len(s.created) != 1 {
		t.Errorf("an existing claim: exit %d, %q, %d creates; want it expanded", code, out, len(s.created))
	}
	if code, _ := expand(t, claims, "--claim=data-etcd-4", "--size=2Gi", "--create", "--label=nokey"); code != ExitUsage {
		t.Errorf("a bad --label: exit %d, want %d", code, ExitUsage)
	}
}

// TestExpandClaimRefusals: what no retry mends exits 3 at once (a missing claim, the API
// server refusing the expansion), what may pass is retried until --timeout and exits 1, and
// a bad command line exits 2.
func TestExpandClaimRefusals(t *testing.T) {
	s, claims := newClaimServer(t)
	if code, out := expand(t, claims, "--claim=data-etcd-9", "--size=2Gi"); code != ExitRefused || !strings.Contains(out, "not found") {
		t.Errorf("a missing claim: exit %d, %q; want %d", code, out, ExitRefused)
	}
	s.failPatch = http.StatusForbidden
	if code, out := expand(t, claims, "--claim=data-etcd-0", "--size=2Gi"); code != ExitRefused || !strings.Contains(out, "must support resize") {
		t.Errorf("a class that does not allow expansion: exit %d, %q; want %d with the API server's reason", code, out, ExitRefused)
	}
	s.failPatch, s.failGet = 0, http.StatusServiceUnavailable
	if code, out := expand(t, claims, "--claim=data-etcd-0", "--size=2Gi", "--timeout=1s"); code != ExitRetryable || !strings.Contains(out, "gave up after 1s") {
		t.Errorf("an API server that does not answer: exit %d, %q; want %d after retrying", code, out, ExitRetryable)
	}
	for _, args := range [][]string{{"--size=2Gi"}, {"--claim=data-etcd-0", "--size=0"}, {"--claim=data-etcd-0", "--size=big"}} {
		if code, _ := expand(t, claims, args...); code != ExitUsage {
			t.Errorf("%q: exit %d, want %d", args, code, ExitUsage)
		}
	}
	if got := s.claims["data-etcd-0"].Spec.Resources.Requests[corev1.ResourceStorage]; got.String() != "1Gi" {
		t.Errorf("the claim asks for %s after refusals, want 1Gi", got.String())
	}
}

// podServer plays the kube-apiserver's pod DELETE on loopback: it records each request's
// delete options and answers as the API server does for a UID precondition: the pod deleted
// when its UID matches, a conflict when it does not, not found when there is no pod.
type podServer struct {
	mu      gosync.Mutex
	uid     string // the pod etcd-1's UID; "" when there is no pod
	deleted bool
	bodies  []string
	// fail, when set, answers every request with that status code.
	fail int
}

func (s *podServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	body, _ := io.ReadAll(r.Body)
	// client-go may send the options as protobuf or JSON: decode either, as the API server does.
	var opts metav1.DeleteOptions
	if o, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil); err == nil {
		if d, ok := o.(*metav1.DeleteOptions); ok {
			opts = *d
		}
	}
	uid := ""
	if opts.Preconditions != nil && opts.Preconditions.UID != nil {
		uid = string(*opts.Preconditions.UID)
	}
	s.bodies = append(s.bodies, r.Method+" "+r.URL.Path+" precondition uid="+uid)
	switch {
	case r.Method != http.MethodDelete || r.URL.Path != "/api/v1/namespaces/ns/pods/etcd-1":
		status(w, http.StatusNotFound, metav1.StatusReasonNotFound, "no such path")
	case s.fail == http.StatusForbidden:
		status(w, s.fail, metav1.StatusReasonForbidden, `pods "etcd-1" is forbidden: User "system:serviceaccount:ns:etcd-claims" cannot delete resource "pods"`)
	case s.fail != 0:
		status(w, s.fail, metav1.StatusReasonServiceUnavailable, "the server is currently unable to handle the request")
	case s.uid == "" || s.deleted:
		status(w, http.StatusNotFound, metav1.StatusReasonNotFound, `pods "etcd-1" not found`)
	case opts.Preconditions == nil || opts.Preconditions.UID == nil:
		// Without a precondition the API server would delete whatever pod has the name.
		s.deleted = true
		status(w, http.StatusOK, "", "")
	case string(*opts.Preconditions.UID) != s.uid:
		status(w, http.StatusConflict, metav1.StatusReasonConflict, fmt.Sprintf(`Operation cannot be fulfilled on pods "etcd-1": Precondition failed: UID in precondition: %s, UID in object meta: %s`, *opts.Preconditions.UID, s.uid))
	default:
		s.deleted = true
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess})
	}
}

func newPodServer(t *testing.T, uid string) (*podServer, Claims) {
	s := &podServer{uid: uid}
	return s, kubeClaimsOf(t, s)
}

func restart(endpoint string, claims Claims, args ...string) (int, string) {
	var stdout, stderr bytes.Buffer
	code := RunWithClaims(context.Background(), append([]string{"restart-pod", "--endpoints=" + endpoint, "--member=etcd-1", "--namespace=ns"}, args...), &stdout, &stderr, claims)
	return code, strings.TrimSpace(stdout.String() + stderr.String())
}

// TestRestartPod: restart-pod deletes the pod with a UID precondition, so that a pod already
// recreated under the name is left alone; a pod gone or of another UID is done (a retried
// Job), never deleted. A pod whose member etcd does not list (no --id, or an ID of a member
// removed) is deleted once etcd answered.
func TestRestartPod(t *testing.T) {
	endpoint, _ := startSeed(t)
	s, claims := newPodServer(t, "uid-a")
	if code, out := restart(endpoint, claims, "--uid=uid-a", "--id=abc"); code != ExitOK || !strings.Contains(out, "deleted pod etcd-1 (uid uid-a)") || !s.deleted {
		t.Fatalf("exit %d, %q, deleted %v; want the pod deleted", code, out, s.deleted)
	}
	if want := "DELETE /api/v1/namespaces/ns/pods/etcd-1 precondition uid=uid-a"; len(s.bodies) != 1 || s.bodies[0] != want {
		t.Fatalf("requests %q; want exactly %q", s.bodies, want)
	}
	if code, out := restart(endpoint, claims, "--uid=uid-a"); code != ExitOK || !strings.Contains(out, "already gone") {
		t.Errorf("the pod gone: exit %d, %q; want done", code, out)
	}
	s.uid, s.deleted = "uid-b", false
	if code, out := restart(endpoint, claims, "--uid=uid-a"); code != ExitOK || !strings.Contains(out, "already gone") || s.deleted {
		t.Errorf("the pod recreated as uid-b: exit %d, %q, deleted %v; want done and the new pod kept", code, out, s.deleted)
	}
}

// TestRestartPodAsksEtcd: restart-pod asks etcd at the moment it acts, not when the step was
// decided: a member that leads is not taken down (the seed of a one-member cluster leads), it
// is retried until --timeout and exits 1, the pod kept; etcd that does not answer is retried
// the same way.
func TestRestartPodAsksEtcd(t *testing.T) {
	endpoint, seed := startSeed(t)
	s, claims := newPodServer(t, "uid-a")
	code, out := restart(endpoint, claims, "--member=e-0", "--uid=uid-a", fmt.Sprintf("--id=%x", seed), "--timeout=3s")
	if code != ExitRetryable || !strings.Contains(out, "leads: leadership must move first") || s.deleted {
		t.Fatalf("the leader: exit %d, %q, deleted %v; want %d, the pod kept", code, out, s.deleted, ExitRetryable)
	}
	code, out = restart("http://127.0.0.1:1", claims, "--member=e-0", "--uid=uid-a", fmt.Sprintf("--id=%x", seed), "--timeout=1s")
	if code != ExitRetryable || s.deleted {
		t.Fatalf("etcd not answering: exit %d, %q, deleted %v; want %d, the pod kept", code, out, s.deleted, ExitRetryable)
	}
}

// TestRestartPodRefusals: a missing permission exits 3 at once, an API server that does not
// answer is retried until --timeout and exits 1, and a bad command line exits 2.
func TestRestartPodRefusals(t *testing.T) {
	endpoint, _ := startSeed(t)
	s, claims := newPodServer(t, "uid-a")
	s.fail = http.StatusForbidden
	if code, out := restart(endpoint, claims, "--uid=uid-a"); code != ExitRefused || !strings.Contains(out, `cannot delete resource "pods"`) {
		t.Errorf("forbidden: exit %d, %q; want %d with the API server's reason", code, out, ExitRefused)
	}
	s.fail = http.StatusServiceUnavailable
	if code, out := restart(endpoint, claims, "--uid=uid-a", "--timeout=1s"); code != ExitRetryable || !strings.Contains(out, "gave up after 1s") {
		t.Errorf("an API server that does not answer: exit %d, %q; want %d after retrying", code, out, ExitRetryable)
	}
	if code, _ := restart(endpoint, claims); code != ExitUsage {
		t.Errorf("no --uid: exit %d, want %d", code, ExitUsage)
	}
	if code, _ := restart("", claims, "--uid=uid-a"); code != ExitUsage {
		t.Errorf("no --endpoints: exit %d, want %d", code, ExitUsage)
	}
	if s.deleted {
		t.Error("the pod was deleted")
	}
}
