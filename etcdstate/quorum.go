package etcdstate

// The quorum rules, shared by the planner (which decides from an observation) and the
// membership operations (which check live state before acting). Each name says which voters
// it counts and when: before the change, or what is left after it.

// Quorum is the number of voters that must agree for a change to commit.
func Quorum(voters int) int { return voters/2 + 1 }

// HasQuorum: healthy voters make a quorum of voters.
func HasQuorum(voters, healthy int) bool {
	return voters > 0 && healthy >= Quorum(voters)
}

// QuorumAfterRemoval: after one of votersBefore voters is removed, the healthyRemaining
// healthy voters other than it make a quorum of the voters left. The last voter is never
// removed.
func QuorumAfterRemoval(votersBefore, healthyRemaining int) bool {
	return votersBefore > 1 && healthyRemaining >= Quorum(votersBefore-1)
}

// QuorumWhileOneIsDown: while one of voters is down for a while (its pod recreated, its
// database defragmented), the healthyOthers healthy voters other than it make a quorum of all
// voters. A cluster of one has no redundancy: its only member may go down, its data stays on
// its volume.
func QuorumWhileOneIsDown(voters, healthyOthers int) bool {
	return voters == 1 || healthyOthers >= Quorum(voters)
}

// QuorumAfterPromotion: once a learner joins votersBefore voters, the healthy voters and it
// make a quorum of the larger set.
func QuorumAfterPromotion(votersBefore, healthyVoters int) bool {
	return healthyVoters+1 >= Quorum(votersBefore+1)
}
