package harness

import "testing"

func TestOperatorLostQuorum(t *testing.T) {
	const (
		up      = voterUp
		fault   = voterFaulted
		before  = voterDownAtFault
		planned = voterDown
	)
	tests := []struct {
		name   string
		voters []voterState
		want   bool
	}{
		{"all up", []voterState{up, up, up}, false},
		{"one pod of a roll down", []voterState{up, up, planned}, false},
		{"two down by the operator", []voterState{up, planned, planned}, true},
		{"the operator took one down while a fault was in force", []voterState{up, fault, planned}, true},
		{"a fault during a roll's pod replacement", []voterState{up, fault, before}, false},
		{"two faults", []voterState{up, fault, fault}, false},
		{"every voter faulted", []voterState{fault, fault, fault}, false},
		{"five: one more taken down after the fault", []voterState{up, up, fault, before, planned}, true},
		{"five: the fault during a roll", []voterState{up, up, up, fault, before}, false},
		{"one member down by the operator", []voterState{planned}, true},
		{"one member killed", []voterState{fault}, false},
	}
	for _, tt := range tests {
		if got := operatorLostQuorum(tt.voters); got != tt.want {
			t.Errorf("%s: operatorLostQuorum(%v) = %v, want %v", tt.name, tt.voters, got, tt.want)
		}
	}
}
