package sync

import (
	"strings"
	"testing"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// podTools is the member tool image each pod's template installs, by ordinal.
func (w *simWorld) podTools() map[int]string {
	tools := map[int]string{}
	for ord, p := range w.pods {
		for _, c := range p.tmpl.Spec.InitContainers {
			if c.Name == installContainer {
				tools[ord] = c.Image
			}
		}
	}
	return tools
}

// checkTools: every pod installs tool, and podsMade pods were created since made (a roll
// creates each of the three pods once).
func (w *simWorld) checkTools(what, tool string, made, podsMade int) {
	w.t.Helper()
	for ord, got := range w.podTools() {
		if got != tool {
			w.t.Fatalf("%s: pod %s installs %s, want %s\n%s", what, w.podName(ord), got, tool, w.describe())
		}
	}
	if w.podSeq-made != podsMade {
		w.t.Fatalf("%s: %d pods created, want %d\n%s", what, w.podSeq-made, podsMade, w.describe())
	}
}

// TestOperatorUpgradeRollsNoPod: a hook with a new member tool image alone rolls no etcd pod;
// the pods take it at the next roll for another reason, or when the cluster asks for that
// image (etcdops.dev/take-member-tool), one pod at a time; a request naming another image
// asks nothing, so one left behind does not roll the cluster at the next upgrade.
func TestOperatorUpgradeRollsNoPod(t *testing.T) {
	for _, storage := range []bool{true, false} {
		t.Run(map[bool]string{true: "volumes", false: "emptyDir"}[storage], func(t *testing.T) {
			w := newSimWorld(t, 3, storage)
			w.run(100)
			old := w.cfg.ToolImage
			w.checkTools("created", old, 0, w.podSeq)

			made := w.podSeq
			w.cfg.ToolImage = "etcdops:next"
			w.run(20)
			w.checkTools("after the operator's upgrade", old, made, 0)

			w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=5000"}
			w.cluster.Generation++
			w.run(300)
			w.checkTools("after a configuration roll", "etcdops:next", made, 3)

			made = w.podSeq
			w.cfg.ToolImage = "etcdops:third"
			w.cluster.Annotations = map[string]string{v1alpha1.AnnotationTakeMemberTool: "etcdops:next"}
			w.run(20)
			w.checkTools("asked for another image", "etcdops:next", made, 0)

			w.cluster.Annotations[v1alpha1.AnnotationTakeMemberTool] = "etcdops:third"
			w.run(300)
			w.checkTools("asked for the operator's image", "etcdops:third", made, 3)
		})
	}
}

// TestRollWaitsForTheHooksBound: while the hook's bound on clusters rolling at once holds a
// cluster back, a roll it needs does not begin (no pod is recreated, no snapshot is taken for
// it) and the decisions say why, while a scale-out goes on; once let go, it rolls.
func TestRollWaitsForTheHooksBound(t *testing.T) {
	w := newSimWorld(t, 3, true)
	w.cluster.Spec.Backup = simBackupSpec("@daily")
	w.run(200)
	made, backups := w.podSeq, len(w.backups)
	w.rollWait = "4 of 4 clusters roll (etcd-a/one, etcd-a/two, etcd-b/three, etcd-b/four)"
	w.cluster.Spec.EtcdOptions = []string{"--snapshot-count=5000"}
	w.cluster.Generation++
	var d Decision
	for range 30 {
		d = w.step()
		if !d.Rolls {
			t.Fatalf("a roll is due, the decision says none: %v", d.Action)
		}
	}
	if d.Action.Type != Wait || !strings.Contains(d.Action.Reason, "waiting for the hook's bound on clusters rolling at once: "+w.rollWait) {
		t.Fatalf("held back by the hook, decided %v %q", d.Action.Type, d.Action.Reason)
	}
	if w.podSeq != made || len(w.backups) != backups {
		t.Fatalf("held back by the hook: %d pods created, %d snapshots taken\n%s", w.podSeq-made, len(w.backups)-backups, w.describe())
	}
	w.rollWait = ""
	w.run(300)
	w.checkTools("let go", simConfig.ToolImage, made, 3)
	if len(w.backups) == backups {
		t.Fatalf("the roll began without its snapshot\n%s", w.describe())
	}
	if d := w.step(); d.Rolls {
		t.Fatalf("rolled, the decision still says a roll is due: %v", d.Action)
	}
}
