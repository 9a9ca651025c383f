package actors

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// Issue 26, point 6: the backoff of an attempt whose visibility deadline passed
// counts from the deadline (as SQS makes a message visible when its timeout
// ends), not from whenever a receive happened to notice the expiry.

// TestQueue_ExpiryBackoffCountsFromTheDeadline: a message received with a 300 ms
// visibility and never acked is expired by a receive 900 ms later (nothing is due
// yet); a receive at deadline + backoff gets it.
func TestQueue_ExpiryBackoffCountsFromTheDeadline(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), QueueOptions{Backoff: Backoff{Initial: time.Second}})
	n.enqueue(t, msg("a", 1))
	start := n.clock.Load()
	first := n.receive(t, QueueReceive{Visibility: 300 * time.Millisecond})
	if ids(first) != "a#1" {
		t.Fatalf("first receive: %v", ids(first))
	}
	deadline := start + 300
	n.advance(900 * time.Millisecond)
	if got := n.receive(t, QueueReceive{}); len(got) != 0 {
		t.Fatalf("at +900ms (deadline + 600ms, the backoff is 1s): redelivered %v", ids(got))
	}
	m, err := n.q.Message(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	if p := m.Targets["default"]; p.State != StatePending || p.Attempts != 1 || p.NextAttemptAt != deadline+1000 {
		t.Fatalf("after the expiry at +900ms: %+v, want pending, due at deadline + 1s (%d), not at +900ms + 1s", p, deadline+1000)
	}
	n.clock.Store(deadline + 1000 - 1)
	if got := n.receive(t, QueueReceive{}); len(got) != 0 {
		t.Fatalf("1 ms before deadline + backoff: redelivered %v", ids(got))
	}
	n.clock.Store(deadline + 1000)
	if got := n.receive(t, QueueReceive{}); ids(got) != "a#2" {
		t.Fatalf("at deadline + backoff: received %q, want a#2", ids(got))
	}
}

// TestQueue_ExpiryNoticedAfterTheBackoffIsDueAtOnce: an expiry noticed after
// deadline + backoff makes the message due at once, so that the receive that
// noticed it gets it (a due time in the past would be skipped by the index's
// low-water mark, queueState.from).
func TestQueue_ExpiryNoticedAfterTheBackoffIsDueAtOnce(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), QueueOptions{Backoff: Backoff{Initial: time.Second}})
	n.enqueue(t, msg("a", 1), msg("b", 2))
	if got := n.receive(t, QueueReceive{Max: 2, Visibility: 300 * time.Millisecond}); ids(got) != "a#1,b#1" {
		t.Fatalf("first receive: %v", ids(got))
	}
	n.advance(5 * time.Second)
	n.enqueue(t, msg("c", 3))
	if got := n.receive(t, QueueReceive{Max: 1}); ids(got) != "c#1" {
		t.Fatalf("first attempts go first: %v", ids(got))
	}
	if got := n.receive(t, QueueReceive{Max: 3}); ids(got) != "a#2,b#2" {
		t.Fatalf("long after deadline + backoff: received %q, want a#2,b#2", ids(got))
	}
}

// TestPush_ExpiryRedeliversAtDeadlinePlusBackoff: a push handler that overruns
// its visibility; the expiry is noticed late (the clock jumped past the
// deadline), and the wake-up alarm for the redelivery is armed for deadline +
// backoff, the time the pair is due. Concurrency 2: the overrunning handler
// still holds one slot.
func TestPush_ExpiryRedeliversAtDeadlinePlusBackoff(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Unix(1_800_000_000, 0).UnixMilli())
	release := make(chan struct{})
	defer close(release)
	var attempts atomic.Int32
	handle := func(ctx context.Context, m QueueDelivery) (QueueResult, error) {
		attempts.Store(int32(m.Attempt))
		if m.Attempt == 1 {
			select { // overruns: it answers after the deadline, or never
			case <-release:
			case <-ctx.Done():
			}
			return QueueResult{}, nil
		}
		return QueueResult{}, nil
	}
	opts := QueueOptions{VisibilityTimeout: time.Hour, Backoff: Backoff{Initial: 10 * time.Second}, Concurrency: 2}
	n := startNode(t, t.TempDir(), nodeOpts{
		cfg:   Config{TypeOptions: func(string) TypeOptions { o := DefaultTypeOptions(); o.Queue = opts; return o }},
		types: []TypeSpec{{Name: "jobs", Queue: []QueueHandler{{Handle: handle}}}},
		now:   func() time.Time { return time.UnixMilli(clock.Load()) },
		setup: func(h *Host) { h.jitter = func() float64 { return 0 } },
	})
	q := NewQueue(n.host, ObjectID{App: "app_t", Type: "jobs", Key: "q"})
	start := clock.Load()
	if _, err := q.Enqueue(context.Background(), msg("a", 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first attempt", func() bool { return attempts.Load() == 1 })
	deadline := start + time.Hour.Milliseconds()
	// The alarm fires late: the expiry is noticed 5 s after the deadline.
	clock.Store(deadline + 5000)
	n.host.Scheduler().Kick()
	p := waitPair(t, q, "a", "default", StatePending)
	if p.Attempts != 1 || p.NextAttemptAt != deadline+10_000 {
		t.Fatalf("after the expiry: %+v, want due at deadline + 10s (%d)", p, deadline+10_000)
	}
	// The wake-up alarm is armed for that time: at it, the pair is pushed again.
	clock.Store(deadline + 10_000)
	waitFor(t, "the second attempt at deadline + backoff", func() bool {
		n.host.Scheduler().Kick()
		return attempts.Load() == 2
	})
	waitPair(t, q, "a", "default", StateComplete)
}
