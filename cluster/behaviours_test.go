package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/persistence"
)

// keyOwnedBy returns a key of type typ whose partition node owns now.
func keyOwnedBy(t *testing.T, n *Node, typ, owner string) actors.ObjectID {
	t.Helper()
	for i := 0; i < 10000; i++ {
		id := actors.ObjectID{App: "app_t", Type: typ, Key: fmt.Sprintf("o%d", i)}
		if n.member.view.part(persistence.Partition(id, testPartitions)).Owner == owner {
			return id
		}
	}
	t.Fatalf("no key owned by %s", owner)
	return actors.ObjectID{}
}

// TestCluster_AlarmsAndQueuesFollowAHandoff: an alarm set on one node fires on
// the node its object moved to; a queue message delivered (in flight) before
// the move is delivered again by the new owner at once, not after its
// visibility timeout.
func TestCluster_AlarmsAndQueuesFollowAHandoff(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start("a")
	b := tc.start("b")
	tc.waitStable(30 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	alarmed := keyOwnedBy(t, b, "jobs", "a")
	due := time.Now().Add(4 * time.Second).UnixMilli()
	if _, err := b.Request(ctx, alarmed, actors.AlarmSet{Name: "wake", At: due,
		Action: json.RawMessage(`{"kind":"enqueue","topic":"fired","payload":{"n":1}}`)}); err != nil {
		t.Fatalf("set alarm: %v", err)
	}
	queued := keyOwnedBy(t, b, "work", "a")
	if _, err := b.Request(ctx, queued, actors.QueueEnqueue{Messages: []actors.QueueMessageIn{{ID: "m1", Payload: json.RawMessage(`"hello"`)}}}); err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	v, err := b.Request(ctx, queued, actors.QueueReceive{Visibility: time.Minute})
	if err != nil || len(v.(*actors.QueueReceived).Messages) != 1 {
		t.Fatalf("receive before the move: %v %v", v, err)
	}
	// Each node's queue depth counts the queues of the partitions it serves.
	depth := func(n *Node) actors.QueueDepth {
		t.Helper()
		d, err := n.host.QueueDepth(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if da, db := depth(a), depth(b); da != (actors.QueueDepth{Queues: 1, Processing: 1}) || db != (actors.QueueDepth{}) {
		t.Fatalf("queue depth before the move: a %+v, b %+v", da, db)
	}

	tc.leave("a") // every partition of a moves to b
	start := time.Now()
	// The in-flight delivery comes back at once on the new owner.
	var got *actors.QueueReceived
	for time.Since(start) < 20*time.Second {
		v, err := b.Request(ctx, queued, actors.QueueReceive{})
		if err != nil {
			t.Fatalf("receive after the move: %v", err)
		}
		if got = v.(*actors.QueueReceived); len(got.Messages) == 1 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(got.Messages) != 1 || got.Messages[0].ID != "m1" || got.Messages[0].Attempt != 2 {
		t.Fatalf("after the move: %+v", got)
	}
	if d := depth(b); d.Processing != 1 || d.Queues < 1 {
		t.Fatalf("queue depth on b after the move: %+v", d)
	}
	// The alarm fires on b, at its time, and enqueues its message.
	for {
		v, err := b.Request(ctx, alarmed, actors.QueueReceive{Topic: "fired"})
		if err != nil {
			t.Fatalf("receive the alarm's message: %v", err)
		}
		if msgs := v.(*actors.QueueReceived).Messages; len(msgs) == 1 {
			if now := time.Now().UnixMilli(); now < due {
				t.Fatalf("the alarm fired %d ms early", due-now)
			}
			break
		}
		if time.Now().UnixMilli() > due+15000 {
			t.Fatal("the alarm did not fire on the node its object moved to")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
