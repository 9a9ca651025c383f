package main

import (
	"context"
	"errors"
	"testing"

	"github.com/holdfast/holdfast"
)

func TestCounter(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	rt, err := holdfast.Open(holdfast.Options{DataDir: dir, Types: []holdfast.TypeSpec{Counter}})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := run(ctx, rt, "c", 8, 50); err != nil || v != 400 {
		t.Fatalf("run: %d %v, want 400", v, err)
	}
	if _, err := rt.Request(ctx, "app_example", "counter", "c", Reset{Expect: 1}); !errors.Is(err, ErrConflict) {
		t.Fatalf("reset with a stale value: %v", err)
	}
	if err := rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// The count survives a restart.
	rt, err = holdfast.Open(holdfast.Options{DataDir: dir, Types: []holdfast.TypeSpec{Counter}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	if v, err := rt.Request(ctx, "app_example", "counter", "c", Reset{Expect: 400}); err != nil || v.(int64) != 0 {
		t.Fatalf("reset: %v %v", v, err)
	}
}
