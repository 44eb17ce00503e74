package harness

import (
	"context"
	"fmt"
	"slices"
	"strings"
	gosync "sync"

	"etcdops.dev/etcdops/sync"
)

// Crashes are the step boundaries at which the harness crashes something, every time a
// step reaches one: not a random sample.
type Crashes struct {
	// LoseAnswers throws away the first answer that decides each step, as when it is lost
	// to a timeout: Metacontroller applies nothing and syncs again.
	LoseAnswers bool
	// KillJobs kills each member Job's first attempt whose etcd call succeeded, before it
	// reports: its pod fails and the Job controller runs the Job again.
	KillJobs bool
	// RestartHook restarts the hook after each applied answer that decided a step, before
	// the next sync.
	RestartHook bool
}

// Steps are the planner's actions that scale and roll a running cluster, as status names
// them. Every action that changes something has the boundaries of Crashes wherever it occurs:
// these, Bootstrap, and the maintenance steps.
var Steps = []string{
	sync.AddLearner.String(), sync.PromoteLearner.String(), sync.RemoveMember.String(),
	sync.MoveLeader.String(), sync.ReplacePod.String(), sync.ScaleStatefulSet.String(),
}

// Bootstrap is the step that creates a cluster.
var Bootstrap = sync.Bootstrap.String()

// quiet are the actions that change nothing: there is no step to crash.
var quiet = []string{sync.Steady.String(), sync.Wait.String(), sync.Hold.String()}

// JobVerbs are the subcommands of the member Jobs that scale and roll a cluster; every member
// Job can be killed after its etcd call.
var JobVerbs = []string{"add-learner", "promote", "remove", "move-leader"}

// Names of the boundaries, as CrashesSoFar counts them: "<boundary> <step or verb>".
const (
	BoundaryLostAnswer  = "lost answer"
	BoundaryKilledJob   = "killed Job"
	BoundaryHookRestart = "hook restart"
)

// crasher holds what Crashes did so far.
type crasher struct {
	mu   gosync.Mutex
	on   Crashes
	hits map[string]int
	// lastAnswer and lastRestart are the steps of the last answer and of the last restart:
	// a step is crashed once where it is first decided, then allowed through.
	lastAnswer  string
	lastRestart string
	killed      map[string]bool // member tool command lines already killed once
}

// CrashAt makes the harness crash at the given boundaries from now on; the zero value stops
// it.
func (e *Env) CrashAt(c Crashes) {
	e.crash.mu.Lock()
	defer e.crash.mu.Unlock()
	e.crash.on = c
	e.crash.lastAnswer, e.crash.lastRestart = "", ""
}

// CrashesSoFar counts the crashes by boundary and step.
func (e *Env) CrashesSoFar() map[string]int {
	e.crash.mu.Lock()
	defer e.crash.mu.Unlock()
	out := map[string]int{}
	for k, n := range e.crash.hits {
		out[k] = n
	}
	return out
}

// stepOf names the step an answer decides, or "" when it changes nothing.
func stepOf(a Answer) string {
	act := a.Status.Action
	if act == nil || slices.Contains(quiet, act.Type) {
		return ""
	}
	return act.Type + " " + act.Member
}

// loseAnswer reports whether to throw the answer away.
func (c *crasher) loseAnswer(a Answer) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	step := stepOf(a)
	first := step != "" && step != c.lastAnswer
	c.lastAnswer = step
	if !c.on.LoseAnswers || !first {
		return false
	}
	c.hits[BoundaryLostAnswer+" "+a.Status.Action.Type]++
	return true
}

// restartHook reports whether to restart the hook after an applied answer.
func (c *crasher) restartHook(rec SyncRecord) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	step := stepOf(rec.Answer)
	if !c.on.RestartHook || !rec.Applied || step == "" || step == c.lastRestart {
		return false
	}
	c.lastRestart = step
	c.hits[BoundaryHookRestart+" "+rec.Answer.Status.Action.Type]++
	return true
}

// killJob wraps the member tool: a Job's first attempt that succeeded is reported as killed
// instead, its change made in etcd and its output lost.
func (c *crasher) killJob(member func(context.Context, []string) (string, error)) func(context.Context, []string) (string, error) {
	return func(ctx context.Context, args []string) (string, error) {
		out, err := member(ctx, args)
		if err != nil || len(args) == 0 {
			return out, err
		}
		line := strings.Join(args, " ")
		c.mu.Lock()
		defer c.mu.Unlock()
		if !c.on.KillJobs || c.killed[line] {
			return out, err
		}
		c.killed[line] = true
		c.hits[BoundaryKilledJob+" "+args[0]]++
		return "", killedJob{out}
	}
}

// killedJob is the error of a Job attempt killed after its etcd call; out is what the
// member tool had printed.
type killedJob struct{ out string }

func (k killedJob) Error() string {
	return fmt.Sprintf("killed after its etcd call, before it reported %q", k.out)
}
