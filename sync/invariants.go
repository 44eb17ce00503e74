package sync

import (
	"errors"
	"fmt"
)

// checkInvariants checks a step before it is rendered: the rules every change keeps, whatever
// phase decided it. A hold changes nothing and always passes.
func checkInvariants(v *view, s step) error {
	if s.hold {
		return nil
	}
	voters, healthy := len(v.voters()), v.healthyVoters()
	changes := 0
	var target *member // the member a destructive change disturbs

	if s.job != nil {
		changes++
		if len(s.keep) > 0 {
			return fmt.Errorf("new %s Job while Job %s is outstanding", s.job.verb, s.keep[0].Name)
		}
		ord, _ := Ordinal(v.c.Name, s.job.member)
		m := v.byOrd[ord]
		switch s.job.verb {
		case verbAddLearner:
			if len(v.learners()) > 0 {
				return errors.New("a second learner")
			}
			if m != nil {
				return fmt.Errorf("adding %s, which is already a member", s.job.member)
			}
		case verbRemove:
			if m == nil {
				return fmt.Errorf("removing %s, which is not a member", s.job.member)
			}
			if !m.IsLearner {
				others := healthy
				if m.Healthy {
					others--
				}
				if !canRemoveVoter(voters, others) {
					return fmt.Errorf("removing voter %s would leave %d healthy of %d voters", m.name, others, voters-1)
				}
			}
			target = m
		case verbPromote:
			if m == nil || !m.IsLearner {
				return fmt.Errorf("promoting %s, which is not a learner", s.job.member)
			}
		case verbMoveLeader:
			if m == nil || m.IsLearner || !m.Healthy {
				return fmt.Errorf("moving leadership to %s, which is not a healthy voter", s.job.member)
			}
			target = v.leader
		}
	}

	if v.sts != nil && s.replicas != v.replicas {
		changes++
	}
	for _, m := range v.members {
		if s.replicas < v.replicas && m.ordinal >= s.replicas {
			return fmt.Errorf("shrinking the StatefulSet to %d would drop member %s", s.replicas, m.name)
		}
	}

	var exposed []int
	for ord, p := range v.pods {
		if ord >= s.partition && !isTerminating(p) && v.outdated(p) {
			exposed = append(exposed, ord)
		}
	}
	switch {
	case len(exposed) > 1:
		return fmt.Errorf("partition %d would replace %d pods at once", s.partition, len(exposed))
	case len(exposed) == 1:
		changes++
		if _, why := v.replacing(exposed[0]); why != "" {
			return fmt.Errorf("partition %d exposes %s while %s", s.partition, PodName(v.c.Name, exposed[0]), why)
		}
		if m := v.byOrd[exposed[0]]; m != nil && !m.IsLearner && m.Healthy {
			if !canDisruptVoter(voters, healthy-1) {
				return fmt.Errorf("replacing %s would leave %d healthy of %d voters", m.name, healthy-1, voters)
			}
			target = m
		}
	}

	if changes > 1 {
		return fmt.Errorf("%d changes in one sync", changes)
	}
	// A change that disturbs a healthy member is decided on a complete picture: every other
	// member answered, so none of them is failing unseen. (A failed member's removal counts
	// every silent member as unhealthy, which errs on the safe side.)
	if target != nil && target.Healthy {
		for _, m := range v.members {
			if m != target && !m.Reachable {
				return fmt.Errorf("disturbing %s while %s did not answer", target.name, m.name)
			}
		}
	}
	return nil
}
