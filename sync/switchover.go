package sync

import (
	"encoding/json"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// switchover: a person asks for leadership on a member (annotation etcdops.dev/switchover-to),
// before maintenance of the leader's node, say. It is the last of the normal phases, so it
// runs only when nothing else is to do: no fix, no Job outstanding, no step of a roll, a scale
// or a maintenance under way. Leadership moves by the move-leader Job the planner's own steps
// use. A request is served once: when the Job starts, or at once when the member asked for
// leads already; status.lastSwitchover records it, so the annotation, which the hook cannot
// remove, asks nothing more until its value changes. A target that cannot lead (not a member,
// a learner, not healthy) is refused with a Hold that says why, and nothing is done; the
// request stays, and is served once the target can lead.
//
// Metacontroller may hand a sync the EtcdCluster as its cache held it before the status that
// recorded the request served, and write that sync's status over it: the target, leading by
// then, would be served again as leading already. So the Job carries the record
// (AnnotationSwitchover), and stays, once done, until a sync is handed the record in status
// (switchoverJob); meanwhile the record is read from it.
func (p *planner) switchover() (step, bool) {
	req := p.c.Annotations[v1alpha1.AnnotationSwitchoverTo]
	if last := p.obs.Cluster.Status.LastSwitchover; req == "" || last != nil && last.Request == req {
		return step{}, false
	}
	if r := p.stage.switchover; r != nil && r.Request == req {
		return step{switchover: r}, false
	}
	name := v1alpha1.SwitchoverTarget(req)
	why := fmt.Sprintf("switchover requested (%s=%s)", v1alpha1.AnnotationSwitchoverTo, req)
	var to *member
	for _, m := range p.members {
		if m.name == name {
			to = m
		}
	}
	refuse := func(reason string) (step, bool) {
		return p.base(Action{Type: Hold, Member: name, Reason: why + ": refused: " + reason}, resyncHold), true
	}
	switch {
	case to == nil:
		return refuse(fmt.Sprintf("%s is no member of the cluster (members: %s); name a voter's pod", name, memberNames(p.members)))
	case to.IsLearner:
		return refuse(name + " is a learner, which cannot lead; it is served once the learner is promoted")
	case !to.Healthy || !to.Started():
		return refuse(name + " is not healthy; it is asked to lead once it is")
	case p.leader == nil:
		return refuse("no member is known to lead; it is served once one is")
	case p.leader == to:
		return step{switchover: &v1alpha1.SwitchoverRecord{Request: req, Member: name, Time: metav1.NewTime(p.obs.Now)}}, false
	}
	if pod, what := p.unsettled(); pod != "" {
		return p.wait(pod, why+": waiting for "+what, resyncSoon), true
	}
	from := p.leader.name
	rec := &v1alpha1.SwitchoverRecord{Request: req, Member: from, Moved: true, Time: metav1.NewTime(p.obs.Now)}
	s := p.runJob(memberJob{verb: verbMoveLeader, member: to.name, id: to.ID, switchover: rec}, MoveLeader, why+": moving leadership from "+from+" to "+to.name)
	if s.job != nil {
		s.switchover = rec
	}
	return s, true
}

// AnnotationSwitchover on a move-leader Job started for a switchover request is the
// status.lastSwitchover record of it, in JSON.
const AnnotationSwitchover = "etcdops.dev/switchover"

// switchoverJob is the switchover record move-leader Job j carries while it is the record's
// only one: the request is still the one asked for, and the status this sync was handed does
// not hold it. nil otherwise, when j may go once done.
func (p *planner) switchoverJob(j *batchv1.Job) *v1alpha1.SwitchoverRecord {
	raw := j.Annotations[AnnotationSwitchover]
	if j.Labels[LabelAction] != verbMoveLeader || raw == "" {
		return nil
	}
	var r v1alpha1.SwitchoverRecord
	if err := json.Unmarshal([]byte(raw), &r); err != nil || r.Request == "" || r.Request != p.c.Annotations[v1alpha1.AnnotationSwitchoverTo] {
		return nil
	}
	if last := p.obs.Cluster.Status.LastSwitchover; last != nil && last.Request == r.Request {
		return nil
	}
	return &r
}

// unsettled names a member's pod that is missing, going, on an outdated template or not
// Ready, and says so: the StatefulSet may be replacing it, as the last step of a roll, and
// leadership handed over now could be lost again at once. "" when every pod is settled.
func (p *planner) unsettled() (pod, why string) {
	for _, m := range p.members {
		switch {
		case m.pod == nil:
			return m.name, "pod " + m.name + " to be created"
		case isTerminating(m.pod):
			return m.name, "pod " + m.name + " to be replaced"
		case p.outdated(m.pod):
			return m.name, "pod " + m.name + " to run the current template"
		case !isReady(m.pod):
			return m.name, "pod " + m.name + " to be Ready"
		}
	}
	return "", ""
}
