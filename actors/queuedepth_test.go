package actors

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/holdfast/holdfast/persistence"
)

// isActive says whether id has an activation on h now.
func isActive(h *Host, id ObjectID) bool {
	s := h.shard(id)
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, ok := s.m[id]
	return ok
}

func (n *queueNode) depth(t *testing.T) QueueDepth {
	t.Helper()
	d, err := n.host.QueueDepth(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestQueueDepth_AddsUpEveryQueue: the node-wide depth is the sum of every
// queue's counts, by state, including queues that are not active (after a
// restart nothing is), and an object that never used its queue is not one.
func TestQueueDepth_AddsUpEveryQueue(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	n := startQueueNode(t, dir, QueueOptions{})
	if d := n.depth(t); d != (QueueDepth{}) {
		t.Fatalf("a fresh node: %+v", d)
	}
	q2 := NewQueue(n.host, ObjectID{App: "app_t", Type: "jobs", Key: "q2"})
	if _, err := n.kv("jobs", "kv-only").Set(ctx, "s", []byte(`1`)); err != nil {
		t.Fatal(err)
	}
	n.enqueue(t, msg("a", 1), msg("b", 2), msg("c", 3), msg("d", 4))
	if _, err := q2.Enqueue(ctx, msg("x", 1), msg("y", 2)); err != nil {
		t.Fatal(err)
	}
	got := n.receive(t, QueueReceive{Max: 3})
	if len(got) != 3 {
		t.Fatalf("received %s", ids(got))
	}
	if _, err := n.q.Ack(ctx, got[0].Receipt); err != nil {
		t.Fatal(err)
	}
	if _, err := n.q.Dead(ctx, QueueDead{Receipt: got[1].Receipt, Reason: "bad"}); err != nil {
		t.Fatal(err)
	}
	want := QueueDepth{Queues: 2, Pending: 1 + 2, Processing: 1, Complete: 1, Failed: 1}
	if d := n.depth(t); d != want {
		t.Fatalf("depth %+v, want %+v", d, want)
	}
	n.stop()

	n = startQueueNode(t, dir, QueueOptions{})
	// The delivery in flight before the restart is replayed to pending.
	waitReplay(t, n.testNode, "app_t")
	// The replay wakes q (it had a delivery in flight), so q may be active;
	// q2 had none and is not, yet it must be counted.
	if isActive(n.host, q2.id) {
		t.Fatal("q2 is active after the restart: the test no longer shows that inactive queues are counted")
	}
	if a := n.host.Active(); a > 1 {
		t.Fatalf("%d objects active after the restart, want at most q", a)
	}
	if d, want := n.depth(t), (QueueDepth{Queues: 2, Pending: 4, Complete: 1, Failed: 1}); d != want {
		t.Fatalf("after the restart: depth %+v, want %+v", d, want)
	}
}

// TestQueueDepth_ServedPartitionsOnly: a node counts the queues of the
// partitions it serves, not the others its disk still holds.
func TestQueueDepth_ServedPartitionsOnly(t *testing.T) {
	dir := t.TempDir()
	n := startQueueNode(t, dir, QueueOptions{})
	n.enqueue(t, msg("a", 1), msg("b", 2))
	if d := n.depth(t); d.Queues != 1 || d.Pending != 2 {
		t.Fatalf("depth %+v", d)
	}
	part := persistence.Partition(n.q.id, n.db.Partitions())
	// The replay at start reads the served partitions on its own goroutine
	// (CI's race run caught this write racing with it).
	waitReplay(t, n.testNode, "app_t")
	n.host.cfg.Partitions = func() []uint32 { return []uint32{part + 1} }
	if d := n.depth(t); d != (QueueDepth{}) {
		t.Fatalf("with its partition not served: depth %+v", d)
	}
}

// TestQueueDepth_ListsAQueueAgainOnUse: a queue whose entry in the list of
// queue objects is missing (data written before the list existed) is counted
// again once an activation changes it.
func TestQueueDepth_ListsAQueueAgainOnUse(t *testing.T) {
	dir := t.TempDir()
	n := startQueueNode(t, dir, QueueOptions{})
	n.enqueue(t, msg("a", 1))
	part := persistence.Partition(n.q.id, n.db.Partitions())
	if err := n.pipe.Submit(&persistence.Write{Partition: part, Epoch: 1, Deletes: [][]byte{queueObjectKey(part, n.q.id)}}).Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := n.depth(t); d != (QueueDepth{}) {
		t.Fatalf("with its entry deleted: depth %+v", d)
	}
	n.stop()
	n = startQueueNode(t, dir, QueueOptions{})
	n.enqueue(t, msg("b", 2))
	if d := n.depth(t); d.Queues != 1 || d.Pending != 2 {
		t.Fatalf("after the next enqueue: depth %+v", d)
	}
}

// BenchmarkQueueDepth_10000Queues is the cost of one scrape of the queue depth
// on a node with 10,000 queues (none active).
func BenchmarkQueueDepth_10000Queues(b *testing.B) {
	n := startQueueNode(b, b.TempDir(), QueueOptions{})
	ctx := context.Background()
	const queues = 10000
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < queues; i += 16 {
				q := NewQueue(n.host, ObjectID{App: "app_t", Type: "jobs", Key: fmt.Sprintf("q%d", i)})
				if _, err := q.Enqueue(ctx, msg("a", i)); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ResetTimer()
	for b.Loop() {
		d, err := n.host.QueueDepth(ctx)
		if err != nil || d.Queues != queues {
			b.Fatalf("%+v %v", d, err)
		}
	}
}
