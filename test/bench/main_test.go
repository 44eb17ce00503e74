package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"testing"
	"time"
)

func TestInterleaveAlternatesWhichKindGoesFirstAndSplitsEveryOperation(t *testing.T) {
	var calls []string
	kind := func(name string) func(int) error {
		return func(ops int) error { calls = append(calls, fmt.Sprint(name, ops)); return nil }
	}
	if err := interleave(3, 10, kind("a"), kind("b")); err != nil {
		t.Fatal(err)
	}
	if want := []string{"a3", "b3", "b3", "a3", "a4", "b4"}; !slices.Equal(calls, want) {
		t.Fatalf("blocks %v, want %v", calls, want)
	}
}

func TestInterleaveTurnsWhichOfThreeKindsGoesFirst(t *testing.T) {
	var calls []string
	kind := func(name string) func(int) error {
		return func(ops int) error { calls = append(calls, fmt.Sprint(name, ops)); return nil }
	}
	if err := interleave(3, 9, kind("floor"), kind("calls"), kind("sync")); err != nil {
		t.Fatal(err)
	}
	want := []string{"floor3", "calls3", "sync3", "calls3", "sync3", "floor3", "sync3", "floor3", "calls3"}
	if !slices.Equal(calls, want) {
		t.Fatalf("blocks %v, want %v", calls, want)
	}
}

func TestHandedItsAnswerPutsTheAnsweredStatusInTheParent(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"status":{"phase":"Running","members":3},"children":[{}]}`)
	}))
	defer srv.Close()
	p := poster{client: srv.Client(), url: srv.URL + "/sync"}
	body, err := p.handedItsAnswer([]byte(`{"parent":{"kind":"EtcdCluster","status":{"phase":"Creating"}},"related":{"Pod.v1":{}}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"parent":{"kind":"EtcdCluster","status":{"phase":"Running","members":3}},"related":{"Pod.v1":{}}}`
	if string(body) != want {
		t.Fatalf("body %s, want %s", body, want)
	}
}

func TestInterleaveStopsAtTheFirstError(t *testing.T) {
	failed := errors.New("floor: no answer")
	var b int
	err := interleave(10, 100, func(int) error { return failed }, func(int) error { b++; return nil })
	if !errors.Is(err, failed) || b != 0 {
		t.Fatalf("err %v after %d blocks of b, want %v after none", err, b, failed)
	}
}

func TestLoadLeavesTheLeadInUntimedAndCountsItAsRun(t *testing.T) {
	const slow = 10 * time.Millisecond
	tm := timings{leadIn: 2}
	var seen []int
	// Only the timed calls sleep, so each timed latency is at least slow however loaded
	// the machine is; a lead-in call counted instead would be near zero.
	err := tm.load(1, 3, func(i int) error {
		seen = append(seen, i)
		if i >= 2 {
			time.Sleep(slow)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(seen, []int{0, 1, 2, 3, 4}) || tm.calls != 5 || len(tm.lat) != 3 {
		t.Fatalf("ran %v, %d calls, %d timed; want 0-4, 5 calls, 3 timed", seen, tm.calls, len(tm.lat))
	}
	for _, d := range tm.lat {
		if d < slow {
			t.Fatalf("timed latencies %v include a lead-in call", tm.lat)
		}
	}
}

func TestProcCPUCountsThisProcess(t *testing.T) {
	before := procCPU(os.Getpid())
	// Spin until a clock tick of CPU time shows, however loaded the machine.
	for start := time.Now(); time.Since(start) < 5*time.Second; {
		if procCPU(os.Getpid()) > before {
			return
		}
	}
	t.Fatalf("CPU time still %s after 5s of spinning", before)
}
