package sync

// decision renders a step: the complete children, the status and the resync, after checking
// the step against the invariants. A violation is a bug; it becomes a hold with an
// "internal:" reason, so the cluster is left alone and the bug is visible in status.
func (v *view) decision(s step) Decision {
	var children []Child
	if err := checkInvariants(v, s); err != nil {
		s = v.hold("internal: "+err.Error(), "internal: "+err.Error())
	}
	if s.hold {
		children = v.heldChildren()
	} else {
		children = v.children(s)
		if missing := missingChildren(v.obs.Children, children); missing != "" {
			s = v.hold("internal: desired children lack observed "+missing, "internal: desired children lack observed "+missing)
			children = v.heldChildren()
		}
	}
	sortChildren(children)
	return Decision{
		Children:           children,
		Status:             v.status(s),
		Action:             s.action,
		ResyncAfterSeconds: s.resync,
	}
}

// children renders every child from the spec and the observed membership.
func (v *view) children(s step) []Child {
	state, l := v.joinState()
	children := []Child{
		headlessService(v.c),
		clientService(v.c),
		joinConfigMap(v.c, state, l),
		podDisruptionBudget(v.c, len(v.voters())),
		statefulSet(v.c, v.spec, s.replicas, s.partition),
	}
	for _, j := range s.keep {
		children = append(children, unchanged("batch/v1", "Job", j.ObjectMeta, j))
	}
	if s.job != nil {
		children = append(children, s.job.render(v.cfg, v.c))
	}
	return children
}

// heldChildren are the observed children unchanged, plus the Services and the
// PodDisruptionBudget when missing: those never depend on the state a hold cannot judge.
func (v *view) heldChildren() []Child {
	children := observedChildren(v.obs.Children)
	have := map[string]bool{}
	for _, c := range children {
		have[c.Kind+"/"+c.Name] = true
	}
	for _, c := range []Child{headlessService(v.c), clientService(v.c), podDisruptionBudget(v.c, v.size)} {
		if !have[c.Kind+"/"+c.Name] {
			children = append(children, c)
		}
	}
	return children
}

// missingChildren names an observed child, other than a Job, that the desired set lacks:
// Metacontroller would delete it.
func missingChildren(observed Children, desired []Child) string {
	have := map[string]bool{}
	for _, c := range desired {
		have[c.Kind+"/"+c.Name] = true
	}
	for _, c := range observedChildren(Children{
		StatefulSets: observed.StatefulSets,
		Services:     observed.Services,
		ConfigMaps:   observed.ConfigMaps,
		PDBs:         observed.PDBs,
	}) {
		if !have[c.Kind+"/"+c.Name] {
			return c.Kind + " " + c.Name
		}
	}
	return ""
}

// hold changes nothing: the observed children are returned as they are.
func (v *view) hold(reason, degraded string) step {
	return step{action: Action{Type: Hold, Reason: reason}, hold: true, resync: resyncHold, degraded: degraded}
}
