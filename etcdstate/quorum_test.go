package etcdstate

import "testing"

func TestQuorumAfterRemoval(t *testing.T) {
	for _, tc := range []struct {
		voters, healthyOthers int
		want                  bool
	}{
		{3, 2, true},  // a healthy 3-member cluster may lose one: 2 of 2 left
		{3, 1, false}, // one other already down: 1 of 2 left is no quorum
		{5, 3, true},  // 5 → 4 needs 3 healthy among the rest
		{5, 2, false}, // two others down: 2 of 4 is no quorum
		{2, 1, true},  // 2 → 1: the survivor must be healthy
		{2, 0, false}, // 2 → 1 with the survivor down: nothing left
		{1, 0, false}, // never remove the last voter
		{4, 2, true},  // 4 → 3 needs 2
	} {
		if got := QuorumAfterRemoval(tc.voters, tc.healthyOthers); got != tc.want {
			t.Errorf("QuorumAfterRemoval(%d, %d) = %v, want %v", tc.voters, tc.healthyOthers, got, tc.want)
		}
	}
}

func TestQuorumWhileOneIsDown(t *testing.T) {
	for _, tc := range []struct {
		voters, healthyOthers int
		want                  bool
	}{
		{3, 2, true},  // one pod down, two of three still vote
		{3, 1, false}, // one already down: taking another loses quorum
		{5, 3, true},  // 3 of 5 is quorum
		{5, 2, false}, // 2 of 5 is not
		{1, 0, true},  // a single member has no redundancy to keep; its volume keeps the data
		{2, 1, false}, // 1 of 2 is no quorum: a two-member cluster cannot roll without downtime
	} {
		if got := QuorumWhileOneIsDown(tc.voters, tc.healthyOthers); got != tc.want {
			t.Errorf("QuorumWhileOneIsDown(%d, %d) = %v, want %v", tc.voters, tc.healthyOthers, got, tc.want)
		}
	}
}

func TestQuorumAfterPromotion(t *testing.T) {
	for _, tc := range []struct {
		voters, healthy int
		want            bool
	}{
		{1, 1, true},  // 1 → 2 voters: the seed and the learner make 2 of 2
		{2, 2, true},  // 2 → 3: 3 of 3
		{3, 2, true},  // 3 → 4 with one down: 3 of 4 is quorum
		{3, 1, false}, // 3 → 4 with two down: 2 of 4 is not
		{4, 2, true},  // 4 → 5: 3 of 5
	} {
		if got := QuorumAfterPromotion(tc.voters, tc.healthy); got != tc.want {
			t.Errorf("QuorumAfterPromotion(%d, %d) = %v, want %v", tc.voters, tc.healthy, got, tc.want)
		}
	}
}

func TestHasQuorum(t *testing.T) {
	for _, tc := range []struct {
		voters, healthy int
		want            bool
	}{
		{1, 1, true},
		{1, 0, false},
		{3, 2, true},
		{3, 1, false},
		{4, 2, false}, // an even cluster needs more than half
		{5, 3, true},
		{0, 0, false}, // no voters: nothing can commit
	} {
		if got := HasQuorum(tc.voters, tc.healthy); got != tc.want {
			t.Errorf("HasQuorum(%d, %d) = %v, want %v", tc.voters, tc.healthy, got, tc.want)
		}
	}
}
