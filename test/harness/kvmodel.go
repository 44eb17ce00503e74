package harness

import (
	"fmt"
	"strings"

	"github.com/anishathalye/porcupine"
)

// SharedKeys is how many keys the checked clients share: few, so that their operations
// collide and the checker has orderings to rule out.
const SharedKeys = 4

// OpKind names a client operation.
type OpKind string

// The operations of the checked workload.
const (
	// OpPut puts a value on a shared key.
	OpPut OpKind = "put"
	// OpGet reads a shared key linearizably.
	OpGet OpKind = "get"
	// OpCAS puts a value on a shared key if it holds the expected value (or is absent when
	// Expect is empty), and reads the key otherwise, in one transaction.
	OpCAS OpKind = "cas"
	// OpDelete deletes a shared key.
	OpDelete OpKind = "delete"
	// OpAppend puts a key of its own, written once and read back at the end; the model
	// counts its revision only.
	OpAppend OpKind = "append"
)

// Input is what a client asked.
type Input struct {
	Kind   OpKind `json:"kind"`
	Key    int    `json:"key"` // index of the shared key; -1 for OpAppend
	Name   string `json:"name"`
	Value  string `json:"value,omitempty"`
	Expect string `json:"expect,omitempty"`
}

// Output is what etcd answered. An operation that got no answer (an error or a timeout)
// has an unknown outcome: it may take effect at any time after its call, or never; a
// watch event that shows its effect tells its revision.
type Output struct {
	Unknown  bool   `json:"unknown,omitempty"`
	Err      string `json:"err,omitempty"`
	Revision int64  `json:"revision,omitempty"` // the header's revision; for an unknown write, the watch's
	// Found, Value and ModRevision are the key as read, by a get or a failed cas.
	Found       bool   `json:"found,omitempty"`
	Value       string `json:"value,omitempty"`
	ModRevision int64  `json:"modRevision,omitempty"`
	Succeeded   bool   `json:"succeeded,omitempty"` // cas
	Deleted     int64  `json:"deleted,omitempty"`
	Member      uint64 `json:"member,omitempty"`  // who answered, from the header
	Cluster     uint64 `json:"cluster,omitempty"` // the answering member's cluster ID
}

// kvCell is one shared key in the model; ModRevision 0 is absent.
type kvCell struct {
	Value       string
	ModRevision int64
}

// kvState is the model's state: etcd's revision and the shared keys. It is a comparable
// value, so porcupine compares and caches states with ==.
type kvState struct {
	Revision int64
	Keys     [SharedKeys]kvCell
}

// kvModel is etcd's key-value store as the workload uses it, with revisions: every write
// that changes something increments the revision by one, and every answer names the
// revision it was served at, which pins each operation to one point of the sequence.
func kvModel(initial kvState) porcupine.Model {
	return porcupine.Model{
		Init: func() any { return initial },
		Step: func(state, input, output any) (bool, any) {
			return kvStep(state.(kvState), input.(Input), output.(Output))
		},
		Hash: func(state any) uint64 { return uint64(state.(kvState).Revision) },
		DescribeOperation: func(input, output any) string {
			return describeOp(input.(Input), output.(Output))
		},
		DescribeState: func(state any) string {
			s := state.(kvState)
			var b strings.Builder
			fmt.Fprintf(&b, "rev %d", s.Revision)
			for i, c := range s.Keys {
				if c.ModRevision != 0 {
					fmt.Fprintf(&b, ", k%d=%s@%d", i, c.Value, c.ModRevision)
				}
			}
			return b.String()
		},
	}
}

// kvStep applies one operation to s and reports whether etcd could have answered out.
func kvStep(s kvState, in Input, out Output) (bool, kvState) {
	next := s
	cell := kvCell{}
	if in.Key >= 0 {
		cell = s.Keys[in.Key]
	}
	wrote := false
	switch in.Kind {
	case OpAppend:
		next.Revision++
		wrote = true
	case OpPut:
		next.Revision++
		next.Keys[in.Key] = kvCell{in.Value, next.Revision}
		wrote = true
	case OpDelete:
		if cell.ModRevision != 0 {
			next.Revision++
			next.Keys[in.Key] = kvCell{}
			wrote = true
		}
	case OpCAS:
		if holds := (in.Expect == "" && cell.ModRevision == 0) || (in.Expect != "" && cell.ModRevision != 0 && cell.Value == in.Expect); holds {
			next.Revision++
			next.Keys[in.Key] = kvCell{in.Value, next.Revision}
			wrote = true
		}
	}
	if out.Unknown {
		// Taken effect at the revision a watch showed, or at some time not known.
		return out.Revision == 0 || (wrote && next.Revision == out.Revision), next
	}
	if out.Revision != next.Revision {
		return false, next
	}
	read := func() bool {
		return out.Found == (cell.ModRevision != 0) && (!out.Found || (out.Value == cell.Value && out.ModRevision == cell.ModRevision))
	}
	switch in.Kind {
	case OpGet:
		return read(), next
	case OpCAS:
		return out.Succeeded == wrote && (wrote || read()), next
	case OpDelete:
		deleted := int64(0)
		if wrote {
			deleted = 1
		}
		return out.Deleted == deleted, next
	}
	return true, next
}

func describeOp(in Input, out Output) string {
	var call string
	switch in.Kind {
	case OpGet:
		call = fmt.Sprintf("get(%s)", in.Name)
	case OpDelete:
		call = fmt.Sprintf("delete(%s)", in.Name)
	case OpCAS:
		expect := in.Expect
		if expect == "" {
			expect = "absent"
		}
		call = fmt.Sprintf("cas(%s, %s→%s)", in.Name, expect, in.Value)
	default:
		call = fmt.Sprintf("%s(%s, %s)", in.Kind, in.Name, in.Value)
	}
	var res string
	switch {
	case out.Unknown && out.Revision != 0:
		res = fmt.Sprintf("unknown (%s), seen by a watch @%d", out.Err, out.Revision)
	case out.Unknown:
		res = fmt.Sprintf("unknown (%s)", out.Err)
	case in.Kind == OpGet || (in.Kind == OpCAS && !out.Succeeded):
		v := "absent"
		if out.Found {
			v = fmt.Sprintf("%s@%d", out.Value, out.ModRevision)
		}
		res = fmt.Sprintf("%s @%d", v, out.Revision)
		if in.Kind == OpCAS {
			res = "failed, " + res
		}
	case in.Kind == OpDelete:
		res = fmt.Sprintf("deleted %d @%d", out.Deleted, out.Revision)
	default:
		res = fmt.Sprintf("ok @%d", out.Revision)
	}
	return call + " → " + res
}
