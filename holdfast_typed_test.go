package holdfast_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/holdfast/holdfast"
)

type add struct{ By int64 }

// adder is a user type whose handler answers int64 sums (and a string to
// anything else, so that a caller expecting int64 can be wrong).
var adder = holdfast.TypeSpec{Name: "adder", Handle: func(c *holdfast.Context, msg any) (any, error) {
	if m, ok := msg.(add); ok {
		return 40 + m.By, nil
	}
	return fmt.Sprintf("%T", msg), nil
}}

// Get and Call return Go types: a slot decoded, a handler's reply asserted,
// each with an error that names what did not match.
func TestTyped_GetAndCall(t *testing.T) {
	rt, err := holdfast.Open(holdfast.Options{DataDir: t.TempDir(), Types: []holdfast.TypeSpec{adder}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(context.Background())
	ctx := context.Background()
	obj := rt.Object("app", "order", "o1")
	if _, err := obj.Set(ctx, "items", []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := obj.Set(ctx, "n", 3); err != nil {
		t.Fatal(err)
	}
	if items, err := holdfast.Get[[]string](ctx, obj, "items"); err != nil || len(items) != 2 || items[1] != "b" {
		t.Fatalf("Get[[]string]: %v %v", items, err)
	}
	if n, err := holdfast.Get[int](ctx, obj, "n"); err != nil || n != 3 {
		t.Fatalf("Get[int]: %v %v", n, err)
	}
	if _, err := holdfast.Get[string](ctx, obj, "n"); err == nil || !strings.Contains(err.Error(), `slot "n" of app/order/o1 holds 3, not a string`) {
		t.Fatalf("Get[string] of a number: %v", err)
	}
	if _, err := holdfast.Get[int](ctx, obj, "missing"); !errors.Is(err, holdfast.ErrNotFound) {
		t.Fatalf("Get of a missing slot: %v", err)
	}
	if sum, err := holdfast.Call[int64](ctx, rt, "app", "adder", "a1", add{By: 2}); err != nil || sum != 42 {
		t.Fatalf("Call[int64]: %v %v", sum, err)
	}
	if _, err := holdfast.Call[int64](ctx, rt, "app", "adder", "a1", "hello"); err == nil || !strings.Contains(err.Error(), "answered string to string, not the int64") {
		t.Fatalf("Call[int64] of a reply of another type: %v", err)
	}
}

// Open leaves GOMAXPROCS alone unless asked, and says nothing at INFO when
// the program gave it no logger.
func TestOpen_QuietAndLeavesGOMAXPROCSAlone(t *testing.T) {
	var logged bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer slog.SetDefault(prev)
	procs := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(procs)

	rt, err := holdfast.Open(holdfast.Options{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Object("app", "order", "o1").Set(context.Background(), "n", 1); err != nil {
		t.Fatal(err)
	}
	if err := rt.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := runtime.GOMAXPROCS(0); got != procs {
		t.Fatalf("Open changed GOMAXPROCS from %d to %d", procs, got)
	}
	if strings.Contains(logged.String(), "level=INFO") || strings.Contains(logged.String(), "level=DEBUG") {
		t.Fatalf("Open logged below WARN on the default logger:\n%s", logged.String())
	}
	if os.Getenv("GOMAXPROCS") != "" {
		return // TuneGOMAXPROCS respects the variable
	}
	rt, err = holdfast.Open(holdfast.Options{DataDir: t.TempDir(), TuneGOMAXPROCS: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(context.Background())
	if got := runtime.GOMAXPROCS(0); got <= procs {
		t.Fatalf("TuneGOMAXPROCS left GOMAXPROCS at %d", got)
	}
}

type note struct {
	Text string
	Tags []string
}

// noter's handler saves and loads Go values in its storage, and reports
// what Load and Save say about bad values.
var noter = holdfast.TypeSpec{Name: "noter", Handle: func(c *holdfast.Context, msg any) (any, error) {
	switch m := msg.(type) {
	case note:
		before, err := holdfast.Load[note](c, "note")
		if err != nil {
			return nil, err
		}
		return before, holdfast.Save(c, "note", m)
	case string: // "raw": a value Load cannot decode; "chan": one Save cannot encode
		if m == "raw" {
			if err := c.Put("note", []byte("not json")); err != nil {
				return nil, err
			}
			_, err := holdfast.Load[note](c, "note")
			return nil, err
		}
		return nil, holdfast.Save(c, "note", make(chan int))
	}
	return nil, nil
}}

// Load and Save keep a user type's state as Go values: Load of nothing is
// the zero value, a saved value comes back whole after the turn committed,
// and a value that is not JSON of the type, or cannot be encoded, is an
// error that names the key.
func TestTyped_LoadAndSave(t *testing.T) {
	rt, err := holdfast.Open(holdfast.Options{DataDir: t.TempDir(), Types: []holdfast.TypeSpec{noter}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(context.Background())
	ctx := context.Background()
	first := note{Text: "a", Tags: []string{"x", "y"}}
	if before, err := holdfast.Call[note](ctx, rt, "app", "noter", "n1", first); err != nil || before.Text != "" || before.Tags != nil {
		t.Fatalf("first Load: %+v %v, want the zero note", before, err)
	}
	if before, err := holdfast.Call[note](ctx, rt, "app", "noter", "n1", note{Text: "b"}); err != nil || before.Text != "a" || len(before.Tags) != 2 || before.Tags[1] != "y" {
		t.Fatalf("Load after Save: %+v %v, want %+v", before, err, first)
	}
	if _, err := rt.Request(ctx, "app", "noter", "n2", "raw"); err == nil || !strings.Contains(err.Error(), `storage key "note"`) {
		t.Fatalf("Load of a value that is not JSON: %v", err)
	}
	if _, err := rt.Request(ctx, "app", "noter", "n3", "chan"); err == nil || !strings.Contains(err.Error(), `storage key "note": encode a chan int`) {
		t.Fatalf("Save of a channel: %v", err)
	}
}
