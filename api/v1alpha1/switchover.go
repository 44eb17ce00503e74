package v1alpha1

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AnnotationSwitchoverTo on an EtcdCluster names the member (its pod's name, e.g. etcd-1)
// to hand leadership to, once. status.lastSwitchover records the request served: the same
// value asks nothing again, a new one asks again. To ask for the same member once more, tell
// the request apart after an "@": etcd-1@2, etcd-1@2026-12-03T18:00Z (docs/scale.md,
// "Switchover").
const AnnotationSwitchoverTo = "etcdops.dev/switchover-to"

// SwitchoverTarget is the member a switchover request names: its value up to any "@".
func SwitchoverTarget(request string) string {
	member, _, _ := strings.Cut(request, "@")
	return member
}

// SwitchoverRecord is a switchover request served.
type SwitchoverRecord struct {
	// Request is the annotation's value served: the member asked to lead.
	Request string `json:"request"`
	// Member is the member that led when the request was served: the one asked for when it
	// led already, else the one leadership was moved from by a move-leader Job (the Job's
	// outcome is in status.history).
	//
	// +optional
	Member string `json:"member,omitempty"`
	// Moved: a move-leader Job was started; false when the member asked for led already.
	//
	// +optional
	Moved bool `json:"moved,omitempty"`
	// Time is when the request was served.
	Time metav1.Time `json:"time"`
}
