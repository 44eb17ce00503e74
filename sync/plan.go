package sync

import (
	"fmt"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/joinstate"
)

// Resync intervals, in seconds.
const (
	resyncHold = 10
)

// Plan decides the one next step for an EtcdCluster from one observation and renders the
// complete desired children.
func Plan(cfg Config, obs Observed) Decision {
	c := &obs.Cluster
	if len(obs.Children.StatefulSets) == 0 && len(obs.Pods) == 0 && c.Status.ClusterID == "" {
		return bootstrap(cfg, c)
	}
	// Not yet able to judge etcd: keep everything as it is.
	return Decision{
		Children:           observedChildren(obs.Children),
		Status:             c.Status,
		Action:             Action{Type: Hold, Reason: "etcd state not yet evaluated"},
		ResyncAfterSeconds: resyncHold,
	}
}

// bootstrap renders the first children: the Services, the join state naming one seed that
// forms a new cluster, and a StatefulSet of one.
func bootstrap(cfg Config, c *v1alpha1.EtcdCluster) Decision {
	seed := PodName(c.Name, 0)
	state := joinstate.State{
		Token:        clusterToken(c),
		ClusterState: joinstate.StateNew,
		Members:      []joinstate.Member{{Name: seed, PeerURL: PeerURL(c, seed, cfg.ClusterDomain)}},
	}
	children := []Child{
		headlessService(c),
		clientService(c),
		joinConfigMap(c, state, ledger{seed: {}}),
		statefulSet(c, renderPodSpec(cfg, c), 1, 0),
	}
	sortChildren(children)
	return Decision{
		Children:           children,
		Status:             v1alpha1.EtcdClusterStatus{Phase: v1alpha1.PhaseCreating},
		Action:             Action{Type: Bootstrap, Member: seed, Reason: "no cluster yet: starting seed " + seed},
		ResyncAfterSeconds: resyncHold,
	}
}

// clusterToken is unique per cluster incarnation: a deleted and re-created EtcdCluster of the
// same name gets a new UID, so its members can never be mistaken for the old ones.
func clusterToken(c *v1alpha1.EtcdCluster) string {
	return fmt.Sprintf("%s/%s/%s", c.Namespace, c.Name, c.UID)
}
