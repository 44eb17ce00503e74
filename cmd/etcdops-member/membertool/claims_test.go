package membertool

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	gosync "sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	// failGet and failPatch, when set, answer every GET or PATCH with that status code.
	failGet, failPatch int
}

func (s *claimServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
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
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	claims, err := NewKubeClaims(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return s, claims
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
