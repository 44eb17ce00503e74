package sync

import (
	"encoding/json"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// claimsRole is the claims Role a decision renders, with the names of each rule.
func claimsRole(t *testing.T, d Decision) (claims, pods []string) {
	t.Helper()
	for _, c := range d.Children {
		if c.Kind != "Role" || c.Name != ClaimsAccountName("etcd") {
			continue
		}
		b, err := json.Marshal(c.Object)
		if err != nil {
			t.Fatal(err)
		}
		var r rbacv1.Role
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		create := false
		for _, rule := range r.Rules {
			if slices.Equal(rule.Resources, []string{"persistentvolumeclaims"}) && slices.Equal(rule.Verbs, []string{"create"}) && len(rule.ResourceNames) == 0 {
				// RBAC cannot narrow a create by name: the object has none yet when the
				// request is authorized. expand-claim creates a joining member's claim.
				create = true
				continue
			}
			if len(rule.ResourceNames) == 0 {
				t.Errorf("rule %+v names no object: it reaches every %v of the namespace", rule, rule.Resources)
			}
			switch {
			case slices.Equal(rule.Resources, []string{"persistentvolumeclaims"}) && slices.Equal(rule.Verbs, []string{"get", "patch"}):
				claims = rule.ResourceNames
			case slices.Equal(rule.Resources, []string{"pods"}) && slices.Equal(rule.Verbs, []string{"delete"}):
				pods = rule.ResourceNames
			default:
				t.Errorf("unexpected rule %+v", rule)
			}
		}
		if !create {
			t.Errorf("no rule lets the volume Jobs create a claim: %+v", r.Rules)
		}
		return claims, pods
	}
	t.Fatal("no claims Role rendered")
	return nil, nil
}

// namesUpTo are the claims and pods of ordinals 0 to n-1 of cluster etcd.
func namesUpTo(n int) (claims, pods []string) {
	for ord := range n {
		claims, pods = append(claims, ClaimName("etcd", ord)), append(pods, PodName("etcd", ord))
	}
	return claims, pods
}

// TestClaimsRoleNamesTheClusterOrdinals: the Role of the volume Jobs names the claims and pods
// of the ordinals the cluster has or is about to have, and no other object of the namespace.
func TestClaimsRoleNamesTheClusterOrdinals(t *testing.T) {
	w := newSimWorld(t, 3, true)
	w.run(200)
	check := func(story string, d Decision, n int) {
		t.Helper()
		claims, pods := claimsRole(t, d)
		wantClaims, wantPods := namesUpTo(n)
		if !slices.Equal(claims, wantClaims) || !slices.Equal(pods, wantPods) {
			t.Errorf("%s: the Role names claims %v and pods %v, want %v and %v", story, claims, pods, wantClaims, wantPods)
		}
	}
	check("a steady cluster of 3", w.sync(), 3)

	// Another cluster's claim in the namespace widens nothing, nor a claim of a name that is
	// not a member's.
	obs := w.observe()
	obs.Claims = append(obs.Claims,
		corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data-etcd-restored-7", Namespace: "default"}},
		corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data-etcd-x", Namespace: "default"}},
		corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data-etcd-9", Namespace: "elsewhere"}})
	check("another cluster's claims beside it", Plan(simConfig, obs), 3)

	// The sync that raises the size names the new ordinals, before the StatefulSet grows and
	// creates their claims: a Job on them never meets a Role that lags.
	w.cluster.Spec.Size = ptrTo(int32(5))
	w.cluster.Generation++
	check("the first sync of a scale to 5", w.step(), 5)
	w.run(400)
	check("5 members", w.sync(), 5)

	// A scale-in keeps naming the removed ordinals while their pods or claims are there.
	w.cluster.Spec.Size = ptrTo(int32(3))
	w.cluster.Generation++
	check("the first sync of a scale to 3", w.step(), 5)
	w.run(400)
	left := 3
	for ord := range w.volumes.claims {
		left = max(left, ord+1)
	}
	check("3 members, the removed members' claims as retention left them", w.sync(), left)
}
