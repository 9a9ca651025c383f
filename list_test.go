package holdfast_test

import (
	"context"
	"slices"
	"testing"

	"github.com/holdfast/holdfast"
)

// counterType keeps its count in its own storage ("n"); a message "reset"
// deletes it.
var counterType = holdfast.TypeSpec{Name: "counter", Handle: func(c *holdfast.Context, msg any) (any, error) {
	if msg == "reset" {
		return nil, c.Delete("n")
	}
	return nil, c.Put("n", []byte("1"))
}}

// Runtime.List and Keys list a user-defined type's objects that hold
// storage (not one whose storage was deleted), and KV objects, page by page.
func TestRuntime_ListAndKeys(t *testing.T) {
	rt, err := holdfast.Open(holdfast.Options{DataDir: t.TempDir(), Types: []holdfast.TypeSpec{counterType}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(context.Background())
	ctx := context.Background()
	for _, k := range []string{"c3", "c1", "c2", "gone"} {
		if _, err := rt.Request(ctx, "app", "counter", k, "add"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rt.Request(ctx, "app", "counter", "gone", "reset"); err != nil {
		t.Fatal(err)
	}
	page, err := rt.List(ctx, holdfast.ListQuery{App: "app", Type: "counter", Kind: holdfast.ListObjects, Limit: 2})
	if err != nil || !slices.Equal(page.Keys, []string{"c1", "c2"}) || page.Next != "c2" {
		t.Fatalf("first page: %+v %v", page, err)
	}
	var all []string
	for k, err := range rt.Keys(ctx, holdfast.ListQuery{App: "app", Type: "counter", Kind: holdfast.ListObjects, Limit: 1}) {
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, k)
	}
	if !slices.Equal(all, []string{"c1", "c2", "c3"}) {
		t.Fatalf("Keys: %q", all)
	}
	if _, err := rt.Object("app", "order", "o1").Set(ctx, "n", 1); err != nil {
		t.Fatal(err)
	}
	for k, err := range rt.Keys(ctx, holdfast.ListQuery{App: "app", Type: "order", Kind: holdfast.ListObjects}) {
		if err != nil || k != "o1" {
			t.Fatalf("Keys of order: %q %v", k, err)
		}
	}
	for _, err := range rt.Keys(ctx, holdfast.ListQuery{App: "app", Type: "a/b", Kind: holdfast.ListObjects}) {
		if err == nil {
			t.Fatal("a type with '/' listed")
		}
	}
}
