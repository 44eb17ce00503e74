package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hist builds a history on the shared key k0 from revision 10, whose one watcher saw events.
func hist(ops []Op, events ...WatchEvent) *History {
	h := &History{Initial: kvState{Revision: 10}, Keys: []string{"k0"}, Ops: ops, Watchers: [][]WatchEvent{events}, Final: 10}
	for _, ev := range events {
		h.Final = max(h.Final, ev.Revision)
	}
	return h
}

func put(client int, value string, call, ret, rev int64) Op {
	return Op{Client: client, Input: Input{Kind: OpPut, Name: "k0", Value: value}, Call: call, Return: ret, Output: Output{Revision: rev}}
}

func get(client int, call, ret, rev int64, value string, mod int64) Op {
	return Op{Client: client, Input: Input{Kind: OpGet, Name: "k0"}, Call: call, Return: ret,
		Output: Output{Revision: rev, Found: value != "", Value: value, ModRevision: mod}}
}

func putEvent(rev int64, value string) WatchEvent {
	return WatchEvent{Revision: rev, Key: "k0", Value: value}
}

func TestCheck(t *testing.T) {
	unknownPut := Op{Client: 2, Input: Input{Kind: OpPut, Name: "k0", Value: "b"}, Call: 5, Return: neverReturned,
		Output: Output{Unknown: true, Err: "context deadline exceeded"}}
	cases := []struct {
		story    string
		h        *History
		problems []string // substrings, in order; none for a good history
	}{
		{"a put, then a get that sees it", hist([]Op{put(1, "a", 0, 10, 11), get(2, 20, 30, 11, "a", 11)}, putEvent(11, "a")), nil},
		{"a get concurrent with a put may see either", hist([]Op{put(1, "a", 0, 10, 11), get(2, 5, 30, 10, "", 0)}, putEvent(11, "a")), nil},
		{"a get after a put returned sees the old value: stale",
			hist([]Op{put(1, "a", 0, 10, 11), get(2, 20, 30, 10, "", 0)}, putEvent(11, "a")), []string{"not linearizable"}},
		{"a get after a put returned names an older revision: stale",
			hist([]Op{put(1, "a", 0, 10, 11), put(1, "b", 11, 12, 12), get(2, 20, 30, 11, "a", 11)}, putEvent(11, "a"), putEvent(12, "b")),
			[]string{"not linearizable"}},
		{"an unknown put the watch saw is read back",
			hist([]Op{unknownPut, get(1, 40, 50, 11, "b", 11)}, putEvent(11, "b")), nil},
		{"an unknown put nobody saw never took effect",
			hist([]Op{unknownPut, get(1, 40, 50, 10, "", 0)}), nil},
		{"a compare-and-swap that failed took effect",
			hist([]Op{{Client: 1, Input: Input{Kind: OpCAS, Name: "k0", Value: "c"}, Call: 0, Return: 10, Output: Output{Revision: 10}}}, putEvent(11, "c")),
			[]string{"its compare-and-swap failed", "not linearizable"}},
		{"a compare-and-swap on an absent key, then one on its value",
			hist([]Op{
				{Client: 1, Input: Input{Kind: OpCAS, Name: "k0", Value: "a"}, Call: 0, Return: 10, Output: Output{Revision: 11, Succeeded: true}},
				{Client: 2, Input: Input{Kind: OpCAS, Name: "k0", Value: "b", Expect: "x"}, Call: 11, Return: 20, Output: Output{Revision: 11, Found: true, Value: "a", ModRevision: 11}},
				{Client: 2, Input: Input{Kind: OpCAS, Name: "k0", Value: "b", Expect: "a"}, Call: 21, Return: 30, Output: Output{Revision: 12, Succeeded: true}},
				{Client: 1, Input: Input{Kind: OpDelete, Name: "k0"}, Call: 31, Return: 40, Output: Output{Revision: 13, Deleted: 1}},
				{Client: 1, Input: Input{Kind: OpDelete, Name: "k0"}, Call: 41, Return: 50, Output: Output{Revision: 13}},
			}, putEvent(11, "a"), putEvent(12, "b"), WatchEvent{Revision: 13, Key: "k0", Delete: true}), nil},
		{"a watch that skips a revision", hist([]Op{put(1, "a", 0, 10, 11), put(1, "b", 11, 20, 12)}, putEvent(12, "b")), []string{"a gap"}},
		{"a watch that repeats an event after a reconnect",
			hist([]Op{put(1, "a", 0, 10, 11), put(1, "b", 11, 20, 12)}, putEvent(11, "a"), putEvent(12, "b"), WatchEvent{Revision: 12, Key: "k0", Value: "b", Reconnects: 1}),
			[]string{"a duplicate or out of order"}},
		{"a watch event that no write made", hist([]Op{put(1, "a", 0, 10, 11)}, putEvent(11, "z")), []string{"matches no write"}},
		{"a watch event at another revision than the put's", hist([]Op{put(1, "a", 0, 10, 12)}, putEvent(11, "a")), []string{"etcd answered revision 12", "not linearizable"}},
		{"an unknown write that took effect after the final read",
			func() *History { h := hist([]Op{unknownPut}, putEvent(11, "b")); h.Final = 10; return h }(), nil},
		{"a watch that stops short of the final revision",
			func() *History { h := hist([]Op{put(1, "a", 0, 10, 11)}); h.Final = 11; return h }(), []string{"final revision is 11"}},
	}
	for _, tc := range cases {
		dir := t.TempDir()
		v := tc.h.Check(dir)
		if len(v.Problems) != len(tc.problems) {
			t.Errorf("%s: problems %q, want %d like %q", tc.story, v.Problems, len(tc.problems), tc.problems)
			continue
		}
		for i, p := range tc.problems {
			if !strings.Contains(v.Problems[i], p) {
				t.Errorf("%s: problem %q, want one with %q", tc.story, v.Problems[i], p)
			}
		}
		if v.Linearizable != !strings.Contains(strings.Join(tc.problems, " "), "not linearizable") {
			t.Errorf("%s: linearizable %v with problems %q", tc.story, v.Linearizable, v.Problems)
		}
		if len(tc.problems) == 0 {
			if v.Written != "" {
				t.Errorf("%s: a good history was written to %s", tc.story, v.Written)
			}
			continue
		}
		for _, f := range []string{"history.json", "linearization.html"} {
			if _, err := os.Stat(filepath.Join(v.Written, f)); err != nil || !strings.HasPrefix(v.Written, dir) {
				t.Errorf("%s: %s not written under %s: %v", tc.story, f, dir, err)
			}
		}
	}
}

func TestCheckCountsResolvedUnknowns(t *testing.T) {
	h := hist([]Op{
		{Client: 1, Input: Input{Kind: OpPut, Name: "k0", Value: "a"}, Call: 0, Return: neverReturned, Output: Output{Unknown: true}},
		{Client: 2, Input: Input{Kind: OpPut, Name: "k0", Value: "b"}, Call: 0, Return: neverReturned, Output: Output{Unknown: true}},
	}, putEvent(11, "a"))
	v := h.Check(t.TempDir())
	// The unknown put no watch saw took no effect: it is not checked.
	if v.Ops != 1 || v.Unknown != 2 || v.Resolved != 1 || v.WatchEvents != 1 || !v.Linearizable {
		t.Errorf("verdict %+v, want 1 operation checked, 2 unknown, 1 resolved, 1 event, linearizable", v)
	}
	if h.Ops[0].Output.Revision != 11 {
		t.Errorf("the watch did not tell the unknown put its revision: %+v", h.Ops[0].Output)
	}
}

func TestAnswerForks(t *testing.T) {
	h := hist([]Op{
		{Input: Input{Kind: OpPut, Name: "k0", Value: "a"}, Output: Output{Revision: 11, Member: 1, Cluster: 7}},
		{Input: Input{Kind: OpPut, Name: "k0", Value: "b"}, Output: Output{Unknown: true, Member: 9, Cluster: 9}},
	}, WatchEvent{Revision: 11, Key: "k0", Value: "a", Member: 2, Cluster: 7})
	ledger := map[uint64]string{1: "etcd-0", 2: "etcd-1"}
	if forks := answerForks(h, ledger, 7); len(forks) != 0 {
		t.Errorf("members of the ledger answering for the cluster: forks %q", forks)
	}
	if forks := answerForks(h, ledger, 0); len(forks) != 0 {
		t.Errorf("before the cluster ID is known: forks %q", forks)
	}
	h.Ops = append(h.Ops, Op{Input: Input{Kind: OpGet, Name: "k0"}, Output: Output{Revision: 11, Member: 3, Cluster: 8}})
	forks := answerForks(h, ledger, 7)
	want := []string{"member 3 answered a client but was never a member in the ledger", "a member answered for cluster 8, not 7"}
	if strings.Join(forks, "\n") != strings.Join(want, "\n") {
		t.Errorf("a stranger answering for another cluster: forks %q, want %q", forks, want)
	}
}
