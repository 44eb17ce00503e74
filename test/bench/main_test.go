package main

import (
	"errors"
	"fmt"
	"slices"
	"testing"
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

func TestInterleaveStopsAtTheFirstError(t *testing.T) {
	failed := errors.New("floor: no answer")
	var b int
	err := interleave(10, 100, func(int) error { return failed }, func(int) error { b++; return nil })
	if !errors.Is(err, failed) || b != 0 {
		t.Fatalf("err %v after %d blocks of b, want %v after none", err, b, failed)
	}
}
