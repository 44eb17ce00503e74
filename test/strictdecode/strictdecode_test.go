package strictdecode_test

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"etcdops.dev/etcdops/test/strictdecode"
)

const statefulSet = `{"apiVersion":"apps/v1","kind":"StatefulSet","metadata":{"name":"etcd"},"spec":{"replicas":3,` +
	`"template":{"spec":{"containers":[{"name":"etcd","image":"etcd","imagePullPolicy":"IfNotPresent"}]}}}}`

func TestObjectDecodesIntoItsKind(t *testing.T) {
	obj, err := strictdecode.Object([]byte(statefulSet))
	if err != nil {
		t.Fatal(err)
	}
	sts, ok := obj.(*appsv1.StatefulSet)
	if !ok {
		t.Fatalf("decoded a %T, want *appsv1.StatefulSet", obj)
	}
	if *sts.Spec.Replicas != 3 || sts.Spec.Template.Spec.Containers[0].ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("decoded %+v", sts.Spec)
	}
}

func TestObjectRefuses(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"a misspelled field", strings.Replace(statefulSet, `"replicas"`, `"replica"`, 1), `unknown field "spec.replica"`},
		{"a misspelled field deep inside", strings.Replace(statefulSet, `"imagePullPolicy"`, `"imagePullPolcy"`, 1), `unknown field "spec.template.spec.containers[0].imagePullPolcy"`},
		{"a field in another case", strings.Replace(statefulSet, `"replicas"`, `"Replicas"`, 1), `unknown field "spec.Replicas"`},
		{"a field given twice", strings.Replace(statefulSet, `"replicas":3,`, `"replicas":3,"replicas":5,`, 1), `duplicate field "spec.replicas"`},
		{"a value of the wrong type", strings.Replace(statefulSet, `"replicas":3`, `"replicas":"3"`, 1), `cannot unmarshal string`},
		{"a kind Kubernetes does not serve", strings.Replace(statefulSet, `"StatefulSet"`, `"StatefulSett"`, 1), `no kind "StatefulSett"`},
		{"a status field that is not in the type", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"status":{}}`, `unknown field "status"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := strictdecode.Object([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one with %q", err, tc.want)
			}
		})
	}
}

func TestIntoRefusesUnknownFields(t *testing.T) {
	var p corev1.PodSpec
	if err := strictdecode.Into([]byte(`{"containers":[],"hostname":"a"}`), &p); err != nil || p.Hostname != "a" {
		t.Errorf("a valid pod spec: %v, %+v", err, p)
	}
	if err := strictdecode.Into([]byte(`{"containers":[],"hostName":"a"}`), &p); err == nil || !strings.Contains(err.Error(), `unknown field "hostName"`) {
		t.Errorf("error %v, want the unknown field hostName", err)
	}
}
