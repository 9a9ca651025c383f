package actors

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pushNode is a node with one type, "jobs", whose queue has push handlers.
func pushNode(t *testing.T, dir string, opts QueueOptions, handlers ...QueueHandler) (*testNode, *Queue) {
	t.Helper()
	n := startNode(t, dir, nodeOpts{
		cfg:   Config{TypeOptions: func(string) TypeOptions { o := DefaultTypeOptions(); o.Queue = opts; return o }},
		types: []TypeSpec{{Name: "jobs", Queue: handlers}},
	})
	return n, NewQueue(n.host, ObjectID{App: "app_t", Type: "jobs", Key: "q"})
}

func waitPair(t *testing.T, q *Queue, id, target, state string) QueuePair {
	t.Helper()
	var p QueuePair
	waitFor(t, fmt.Sprintf("%s of %s to be %s", target, id, state), func() bool {
		m, err := q.Message(context.Background(), id)
		if err != nil {
			return false
		}
		p = m.Targets[target]
		return p.State == state
	})
	return p
}

func TestPush_AckRetryDeadErrorPanic(t *testing.T) {
	var mu sync.Mutex
	calls := map[string]int{} // id#attempt -> calls
	handle := func(ctx context.Context, m QueueDelivery) (QueueResult, error) {
		mu.Lock()
		calls[fmt.Sprintf("%s#%d", m.ID, m.Attempt)]++
		mu.Unlock()
		switch {
		case m.ID == "ack":
			return QueueResult{}, nil
		case m.ID == "retry" && m.Attempt == 1:
			return QueueResult{Action: QueueRetryAction, Delay: 50 * time.Millisecond, Reason: "later"}, nil
		case m.ID == "retry":
			return QueueResult{}, nil
		case m.ID == "dead":
			return QueueResult{Action: QueueDeadLetterAction, Reason: "poison"}, nil
		case m.ID == "error":
			return QueueResult{}, errors.New("downstream is down")
		case m.ID == "panic":
			panic("boom")
		}
		return QueueResult{}, nil
	}
	opts := QueueOptions{MaxAttempts: 2, Backoff: Backoff{Initial: 20 * time.Millisecond}, Concurrency: 4}
	_, q := pushNode(t, t.TempDir(), opts, QueueHandler{Handle: handle})
	for _, id := range []string{"ack", "retry", "dead", "error", "panic"} {
		if _, err := q.Enqueue(context.Background(), msg(id, 1)); err != nil {
			t.Fatal(err)
		}
	}
	waitPair(t, q, "ack", "default", StateComplete)
	if p := waitPair(t, q, "retry", "default", StateComplete); p.Attempts != 2 {
		t.Fatalf("retry: %+v", p)
	}
	if p := waitPair(t, q, "dead", "default", StateFailed); p.Reason != "rejected" || p.LastError != "poison" || p.Attempts != 1 {
		t.Fatalf("dead: %+v", p)
	}
	if p := waitPair(t, q, "error", "default", StateFailed); p.Reason != "exhausted" || p.LastError != "downstream is down" || p.Attempts != 2 {
		t.Fatalf("error: %+v", p)
	}
	if p := waitPair(t, q, "panic", "default", StateFailed); p.Reason != "exhausted" || p.LastError != "panic: boom" || p.Attempts != 2 {
		t.Fatalf("panic: %+v", p)
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]int{"ack#1": 1, "retry#1": 1, "retry#2": 1, "dead#1": 1, "error#1": 1, "error#2": 1, "panic#1": 1, "panic#2": 1}
	if fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Fatalf("handler calls %v, want each delivery once: %v", calls, want)
	}
}

// A handler that outlives the visibility deadline: the delivery expires (an
// attempt), is pushed again, and the late result is fenced.
func TestPush_TimeoutCountsAnAttemptAndTheLateResultIsFenced(t *testing.T) {
	var attempts atomic.Int32
	release := make(chan struct{})
	handle := func(ctx context.Context, m QueueDelivery) (QueueResult, error) {
		attempts.Add(1)
		if m.Attempt == 1 {
			<-ctx.Done() // the deadline passes
			<-release
			return QueueResult{Action: QueueDeadLetterAction, Reason: "late"}, nil // fenced: too late
		}
		return QueueResult{}, nil
	}
	_, q := pushNode(t, t.TempDir(), QueueOptions{VisibilityTimeout: 100 * time.Millisecond, Backoff: Backoff{Initial: 10 * time.Millisecond}, Concurrency: 2},
		QueueHandler{Handle: handle})
	if _, err := q.Enqueue(context.Background(), msg("a", 1)); err != nil {
		t.Fatal(err)
	}
	p := waitPair(t, q, "a", "default", StateComplete)
	close(release)
	if p.Attempts != 2 || p.LastError != "visibility timeout passed" {
		t.Fatalf("after the timeout: %+v", p)
	}
	time.Sleep(50 * time.Millisecond) // the late result arrives
	if p := waitPair(t, q, "a", "default", StateComplete); p.Attempts != 2 {
		t.Fatalf("the late result changed the pair: %+v", p)
	}
}

// With concurrency 1, one message at a time, in enqueue order; with 4, never
// more than 4 at once.
func TestPush_Concurrency(t *testing.T) {
	for _, c := range []int{1, 4} {
		var mu sync.Mutex
		var order []string
		var now, peak atomic.Int32
		handle := func(ctx context.Context, m QueueDelivery) (QueueResult, error) {
			cur := now.Add(1)
			for {
				p := peak.Load()
				if cur <= p || peak.CompareAndSwap(p, cur) {
					break
				}
			}
			time.Sleep(2 * time.Millisecond)
			mu.Lock()
			order = append(order, m.ID)
			mu.Unlock()
			now.Add(-1)
			return QueueResult{}, nil
		}
		_, q := pushNode(t, t.TempDir(), QueueOptions{Concurrency: c}, QueueHandler{Topic: "orders", Handle: handle})
		var in []QueueMessageIn
		for i := range 40 {
			in = append(in, QueueMessageIn{ID: fmt.Sprintf("m%02d", i), Topic: "orders", Payload: json.RawMessage(`1`)})
		}
		// A topic without a handler stays for pull consumers.
		in = append(in, QueueMessageIn{ID: "other", Topic: "audit", Payload: json.RawMessage(`1`)})
		if _, err := q.Enqueue(context.Background(), in...); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "every message pushed", func() bool { mu.Lock(); defer mu.Unlock(); return len(order) == 40 })
		if c == 1 {
			for i, id := range order {
				if id != fmt.Sprintf("m%02d", i) {
					t.Fatalf("concurrency 1: order %v", order)
				}
			}
		}
		if p := peak.Load(); p > int32(c) || (c > 1 && p < 2) {
			t.Fatalf("concurrency %d: %d at once", c, p)
		}
		if m, _ := q.Message(context.Background(), "other"); m.Targets["default"].State != StatePending {
			t.Fatalf("a message of a topic without a handler: %+v", m.Targets)
		}
	}
}

// Pushes resume after a restart: a message pending (delayed) when the node
// stopped and one in a handler when it was killed are both pushed by the next
// run, without anyone touching the object.
func TestPush_ResumesAfterARestart(t *testing.T) {
	dir := t.TempDir()
	block := make(chan struct{})
	n, q := pushNode(t, dir, QueueOptions{}, QueueHandler{Handle: func(ctx context.Context, m QueueDelivery) (QueueResult, error) {
		select {
		case <-block:
		case <-ctx.Done():
		}
		return QueueResult{}, errors.New("stopped")
	}})
	if _, err := q.Enqueue(context.Background(), msg("now", 1), QueueMessageIn{ID: "later", Payload: json.RawMessage(`2`), Delay: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	waitPair(t, q, "now", "default", StateProcessing)
	close(block)
	n.stop()

	var got sync.Map
	_, q = pushNode(t, dir, QueueOptions{}, QueueHandler{Handle: func(ctx context.Context, m QueueDelivery) (QueueResult, error) {
		got.Store(m.ID, m.Attempt)
		return QueueResult{}, nil
	}})
	waitPair(t, q, "later", "default", StateComplete)
	waitPair(t, q, "now", "default", StateComplete)
	if a, _ := got.Load("later"); a != 1 {
		t.Fatalf("later pushed as attempt %v", a)
	}
}

// The alarm action enqueue puts one message in the queue, in the commit that
// settles the alarm; a full queue makes it a failed attempt, retried.
func TestAlarmEnqueueAction(t *testing.T) {
	n := startNode(t, t.TempDir(), nodeOpts{cfg: Config{TypeOptions: func(string) TypeOptions {
		o := DefaultTypeOptions()
		o.Queue.MaxPending = 1
		return o
	}}})
	ctx := context.Background()
	id := ObjectID{App: "app_t", Type: "jobs", Key: "q"}
	q, al := NewQueue(n.host, id), NewAlarms(n.host, id)
	if _, err := al.Set(ctx, "remind", time.Now(), json.RawMessage(`{"kind":"enqueue","topic":"mail","payload":{"to":"ann"}}`)); err != nil {
		t.Fatal(err)
	}
	var got []QueueDelivery
	waitFor(t, "the enqueued message", func() bool {
		var err error
		got, err = q.Receive(ctx, QueueReceive{})
		return err == nil && len(got) == 1
	})
	if got[0].Topic != "mail" || string(got[0].Payload) != `{"to":"ann"}` || len(got[0].ID) != len("alarm-")+32 {
		t.Fatalf("enqueued %+v", got[0])
	}
	waitFor(t, "the alarm settled", func() bool {
		_, err := al.Get(ctx, "remind")
		return errors.Is(err, ErrNotFound)
	})
	// Full: one pending message already.
	if _, err := q.Enqueue(ctx, msg("x", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := al.Set(ctx, "again", time.Now(), json.RawMessage(`{"kind":"enqueue","payload":2}`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a failed attempt", func() bool {
		info, err := al.Get(ctx, "again")
		return err == nil && info.Attempt == 1 && strings.Contains(info.LastError, "enqueue")
	})
	if s, _ := q.Stats(ctx); s.Pending != 1 || s.Processing != 1 {
		t.Fatalf("stats %+v: the refused enqueue wrote something", s)
	}
}
