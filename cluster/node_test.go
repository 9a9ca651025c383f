package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/persistence"
)

func TestNode_RoutesFencesAndCloses(t *testing.T) {
	dir := t.TempDir()
	n, err := Start(Config{DataDir: dir, Partitions: 16})
	if err != nil {
		t.Fatal(err)
	}
	if !n.Ready() || n.Partitions() != 16 {
		t.Fatalf("ready=%v partitions=%d", n.Ready(), n.Partitions())
	}
	ctx := context.Background()
	id := actors.ObjectID{App: "app_c", Type: "t", Key: "k"}
	kv := actors.NewKV(n, id)
	if r, err := kv.Set(ctx, "a", 1); err != nil || r.LogID != 1 {
		t.Fatalf("set: %+v %v", r, err)
	}
	// A bad name is refused before routing.
	if _, err := n.Request(ctx, actors.ObjectID{App: "app_c", Type: "a:b", Key: "k"}, actors.KVGet{}); !errors.Is(err, actors.ErrBadRequest) {
		t.Fatalf("bad type: %v", err)
	}
	// A partition this node does not own (epoch 0) is neither routed nor committed.
	p := persistence.Partition(id, n.Partitions())
	n.table.epochs[p].Store(0)
	if _, err := kv.Get(ctx); !errors.Is(err, actors.ErrUnavailable) {
		t.Fatalf("request to an unowned partition: %v", err)
	}
	if err := n.table.fence(p, 1); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("fence of an unowned partition: %v", err)
	}
	n.table.epochs[p].Store(2)
	if err := n.table.fence(p, 1); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("fence of a stale epoch: %v", err)
	}
	if err := n.table.fence(p, 2); err != nil {
		t.Fatalf("fence of the current epoch: %v", err)
	}
	// The activation made at epoch 1 runs no more: it retires and hands the
	// request, unrun, to a fresh activation at epoch 2, whose write the fence
	// takes (the stale one's would be refused: ErrNotOwner).
	if r, err := kv.Set(ctx, "b", 2); err != nil || r.LogID != 2 {
		t.Fatalf("a write after the epoch moved on: %+v %v", r, err)
	}
	if st, err := kv.Get(ctx); err != nil || st.LogID != 2 || string(st.State["a"]) != "1" || string(st.State["b"]) != "2" {
		t.Fatalf("after the epoch moved on: %+v %v", st, err)
	}
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := n.Close(closeCtx); err != nil {
		t.Fatal(err)
	}
	if n.Ready() {
		t.Fatal("ready after Close")
	}
	n, err = Start(Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(ctx)
	if st, err := actors.NewKV(n, id).Get(ctx); err != nil || string(st.State["a"]) != "1" {
		t.Fatalf("after restart: %+v %v", st, err)
	}
}
