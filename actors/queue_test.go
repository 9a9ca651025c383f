package actors

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/persistence"
)

type queueNode struct {
	*testNode
	q     *Queue
	clock atomic.Int64 // unix ms the host sees
}

func startQueueNode(t testing.TB, dir string, opts QueueOptions) *queueNode {
	t.Helper()
	qn := &queueNode{}
	qn.clock.Store(time.Unix(1_800_000_000, 0).UnixMilli())
	n := startNode(t, dir, nodeOpts{
		cfg: Config{TypeOptions: func(string) TypeOptions { o := DefaultTypeOptions(); o.Queue = opts; return o }},
		now: func() time.Time { return time.UnixMilli(qn.clock.Load()) },
	})
	n.host.jitter = func() float64 { return 0 } // backoffs are exact
	qn.testNode = n
	qn.q = NewQueue(n.host, ObjectID{App: "app_t", Type: "jobs", Key: "q"})
	return qn
}

func (n *queueNode) advance(d time.Duration) { n.clock.Add(d.Milliseconds()) }

func (n *queueNode) enqueue(t *testing.T, msgs ...QueueMessageIn) []string {
	t.Helper()
	ids, err := n.q.Enqueue(context.Background(), msgs...)
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	return ids
}

func (n *queueNode) receive(t *testing.T, m QueueReceive) []QueueDelivery {
	t.Helper()
	got, err := n.q.Receive(context.Background(), m)
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	return got
}

func (n *queueNode) stats(t *testing.T) QueueStats {
	t.Helper()
	s, err := n.q.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return *s
}

func msg(id string, n int) QueueMessageIn {
	return QueueMessageIn{ID: id, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))}
}

func ids(ds []QueueDelivery) string {
	s := ""
	for i, d := range ds {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf("%s#%d", d.ID, d.Attempt)
	}
	return s
}

func TestQueue_EnqueueReceiveAck(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), QueueOptions{})
	got := n.enqueue(t, msg("a", 1), QueueMessageIn{Topic: "orders", Payload: json.RawMessage(`"x"`)})
	if got[0] != "a" || len(got[1]) != 32 {
		t.Fatalf("ids %q: want the client's and a generated one", got)
	}
	if s := n.stats(t); s != (QueueStats{Pending: 2}) {
		t.Fatalf("stats %+v", s)
	}
	ds := n.receive(t, QueueReceive{Max: 10})
	if len(ds) != 2 || ds[0].ID != "a" || string(ds[0].Payload) != `{"n":1}` || ds[0].Topic != "default" || ds[1].Topic != "orders" || ds[0].Attempt != 1 || ds[0].Receipt == "" {
		t.Fatalf("received %+v", ds)
	}
	if s := n.stats(t); s != (QueueStats{Processing: 2}) {
		t.Fatalf("stats %+v", s)
	}
	acked, err := n.q.Ack(context.Background(), ds[0].Receipt, ds[1].Receipt, ds[0].Receipt, "garbage")
	if err != nil || acked.Acked != 2 || acked.NotHeld != 2 {
		t.Fatalf("ack %+v %v: want 2 acked, the repeated and the unknown receipt not held", acked, err)
	}
	if s := n.stats(t); s != (QueueStats{Complete: 2}) {
		t.Fatalf("stats %+v", s)
	}
	m, err := n.q.Message(context.Background(), "a")
	if err != nil || m.Targets["default"].State != StateComplete || m.Targets["default"].Attempts != 1 {
		t.Fatalf("message %+v %v", m, err)
	}
	if len(n.receive(t, QueueReceive{Max: 10})) != 0 {
		t.Fatal("a completed message was delivered again")
	}
}

func TestQueue_DedupOnRetry(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), QueueOptions{})
	n.enqueue(t, msg("a", 1))
	// A retry after a lost reply, a duplicate inside one batch, and a new id.
	if got := n.enqueue(t, msg("a", 2), msg("b", 3), msg("b", 4)); fmt.Sprint(got) != "[a b b]" {
		t.Fatalf("ids %v", got)
	}
	if s := n.stats(t); s.Pending != 2 {
		t.Fatalf("stats %+v: the duplicates were written", s)
	}
	ds := n.receive(t, QueueReceive{Max: 10})
	if len(ds) != 2 || string(ds[0].Payload) != `{"n":1}` || string(ds[1].Payload) != `{"n":3}` {
		t.Fatalf("received %+v: want the first payload of each id", ds)
	}
	// Still deduplicated once complete.
	if _, err := n.q.Ack(context.Background(), ds[0].Receipt); err != nil {
		t.Fatal(err)
	}
	n.enqueue(t, msg("a", 5))
	if s := n.stats(t); s.Pending != 0 || s.Complete != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestQueue_DelayedDeliveryNeverEarly(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), QueueOptions{})
	now := n.clock.Load()
	n.enqueue(t, QueueMessageIn{ID: "at", Payload: json.RawMessage(`1`), DeliverAt: now + 5000},
		QueueMessageIn{ID: "delay", Payload: json.RawMessage(`2`), Delay: 3 * time.Second})
	if s := n.stats(t); s != (QueueStats{Delayed: 2}) {
		t.Fatalf("stats %+v", s)
	}
	for _, step := range []struct {
		by   time.Duration
		want string
	}{{2999 * time.Millisecond, ""}, {time.Millisecond, "delay#1"}, {1999 * time.Millisecond, ""}, {time.Millisecond, "at#1"}} {
		n.advance(step.by)
		if got := ids(n.receive(t, QueueReceive{Max: 10})); got != step.want {
			t.Fatalf("at +%dms: received %q, want %q", n.clock.Load()-now, got, step.want)
		}
	}
}

func TestQueue_FirstAttemptsInOrderBeforeRetries(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), QueueOptions{Backoff: Backoff{Initial: time.Second}})
	n.enqueue(t, msg("r", 0))
	r := n.receive(t, QueueReceive{})
	if _, err := n.q.Nack(context.Background(), QueueNack{Receipt: r[0].Receipt}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		n.enqueue(t, msg(fmt.Sprintf("m%d", i), i))
		n.advance(time.Millisecond)
	}
	n.advance(2 * time.Second) // the retry is due too
	if got := ids(n.receive(t, QueueReceive{Max: 10})); got != "m1#1,m2#1,m3#1,r#2" {
		t.Fatalf("received %q", got)
	}
}

func TestQueue_TargetsSettleIndependently(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), QueueOptions{Targets: []string{"email", "audit"}, MaxAttempts: 1})
	n.enqueue(t, msg("a", 1))
	e := n.receive(t, QueueReceive{Target: "email"})
	a := n.receive(t, QueueReceive{Target: "audit"})
	if len(e) != 1 || len(a) != 1 {
		t.Fatalf("email %v audit %v", e, a)
	}
	if _, err := n.q.Ack(context.Background(), e[0].Receipt); err != nil {
		t.Fatal(err)
	}
	if s, err := n.q.Nack(context.Background(), QueueNack{Receipt: a[0].Receipt, Error: "smtp down"}); err != nil || s.State != StateFailed {
		t.Fatalf("nack %+v %v", s, err)
	}
	m, err := n.q.Message(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	if m.Targets["email"].State != StateComplete || m.Targets["audit"] != (QueuePair{State: StateFailed, Attempts: 1, LastError: "smtp down", Reason: "exhausted"}) {
		t.Fatalf("pairs %+v", m.Targets)
	}
	if s := n.stats(t); s != (QueueStats{Complete: 1, Failed: 1}) {
		t.Fatalf("stats %+v", s)
	}
	if _, err := n.q.Receive(context.Background(), QueueReceive{Target: "sms"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown target: %v", err)
	}
}

func TestQueue_VisibilityExpiryCountsAnAttemptAndFencesTheOldReceipt(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), QueueOptions{VisibilityTimeout: 10 * time.Second, Backoff: Backoff{Initial: time.Second}})
	n.enqueue(t, msg("a", 1))
	first := n.receive(t, QueueReceive{})
	n.advance(10 * time.Second)
	// Past its deadline the receipt no longer holds, even before a receive
	// notices the expiry.
	if _, err := n.q.Nack(context.Background(), QueueNack{Receipt: first[0].Receipt}); !errors.Is(err, ErrReceiptNotHeld) {
		t.Fatalf("nack after the deadline: %v", err)
	}
	if got := n.receive(t, QueueReceive{}); len(got) != 0 {
		t.Fatalf("redelivered before the backoff: %v", ids(got))
	}
	m, _ := n.q.Message(context.Background(), "a")
	if p := m.Targets["default"]; p.State != StatePending || p.Attempts != 1 || p.LastError != "visibility timeout passed" || p.NextAttemptAt != n.clock.Load()+1000 {
		t.Fatalf("after expiry %+v", p)
	}
	n.advance(time.Second)
	second := n.receive(t, QueueReceive{})
	if ids(second) != "a#2" || second[0].Receipt == first[0].Receipt {
		t.Fatalf("redelivery %+v", second)
	}
	for _, settle := range []func() error{
		func() error { a, err := n.q.Ack(context.Background(), first[0].Receipt); _ = a; return err },
		func() error {
			_, err := n.q.Dead(context.Background(), QueueDead{Receipt: first[0].Receipt})
			return err
		},
	} {
		if err := settle(); err != nil && !errors.Is(err, ErrReceiptNotHeld) {
			t.Fatal(err)
		}
	}
	if a, _ := n.q.Ack(context.Background(), first[0].Receipt); a.Acked != 0 {
		t.Fatal("the stale receipt acked")
	}
	if a, _ := n.q.Ack(context.Background(), second[0].Receipt); a.Acked != 1 {
		t.Fatal("the current receipt did not ack")
	}
}

func TestQueue_BackoffGrowsToMaxAttemptsThenDeadLetters(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), QueueOptions{MaxAttempts: 4, Backoff: Backoff{Initial: time.Second, Multiplier: 3, Max: 5 * time.Second}})
	n.enqueue(t, msg("a", 1))
	for attempt, wait := range []time.Duration{time.Second, 3 * time.Second, 5 * time.Second} {
		d := n.receive(t, QueueReceive{})
		if ids(d) != fmt.Sprintf("a#%d", attempt+1) {
			t.Fatalf("attempt %d: %v", attempt+1, ids(d))
		}
		s, err := n.q.Nack(context.Background(), QueueNack{Receipt: d[0].Receipt, Error: fmt.Sprint("boom ", attempt+1)})
		if err != nil || s.State != StatePending {
			t.Fatalf("nack %+v %v", s, err)
		}
		n.advance(wait - time.Millisecond)
		if got := n.receive(t, QueueReceive{}); len(got) != 0 {
			t.Fatalf("after attempt %d: redelivered %v before %v", attempt+1, ids(got), wait)
		}
		n.advance(time.Millisecond)
	}
	d := n.receive(t, QueueReceive{})
	// A nack asking for more than the backoff waits that long.
	s, err := n.q.Nack(context.Background(), QueueNack{Receipt: d[0].Receipt, Error: "boom 4", Delay: time.Hour})
	if err != nil || s.State != StateFailed {
		t.Fatalf("the last attempt: %+v %v", s, err)
	}
	m, _ := n.q.Message(context.Background(), "a")
	if p := m.Targets["default"]; p != (QueuePair{State: StateFailed, Attempts: 4, LastError: "boom 4", Reason: "exhausted"}) {
		t.Fatalf("dead letter %+v", p)
	}
}

func TestQueue_NackDelayAndExplicitDeadLetter(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), QueueOptions{})
	n.enqueue(t, msg("a", 1), msg("b", 2))
	d := n.receive(t, QueueReceive{Max: 2})
	if _, err := n.q.Nack(context.Background(), QueueNack{Receipt: d[0].Receipt, Delay: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if s, err := n.q.Dead(context.Background(), QueueDead{Receipt: d[1].Receipt, Reason: "bad payload"}); err != nil || s.State != StateFailed {
		t.Fatalf("dead %+v %v", s, err)
	}
	m, _ := n.q.Message(context.Background(), "b")
	if p := m.Targets["default"]; p != (QueuePair{State: StateFailed, Attempts: 1, LastError: "bad payload", Reason: "rejected"}) {
		t.Fatalf("rejected %+v", p)
	}
	m, _ = n.q.Message(context.Background(), "a")
	if p := m.Targets["default"]; p.NextAttemptAt != n.clock.Load()+60_000 {
		t.Fatalf("nack with a delay: %+v", p)
	}
	if s := n.stats(t); s != (QueueStats{Delayed: 1, Failed: 1}) {
		t.Fatalf("stats %+v", s)
	}
}

func TestQueue_TopicFilter(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), QueueOptions{})
	n.enqueue(t, QueueMessageIn{ID: "o1", Topic: "orders", Payload: json.RawMessage(`1`)}, QueueMessageIn{ID: "p1", Topic: "payments", Payload: json.RawMessage(`2`)},
		QueueMessageIn{ID: "o2", Topic: "orders", Payload: json.RawMessage(`3`)})
	if got := ids(n.receive(t, QueueReceive{Topic: "payments", Max: 10})); got != "p1#1" {
		t.Fatalf("payments: %q", got)
	}
	if got := ids(n.receive(t, QueueReceive{Max: 10})); got != "o1#1,o2#1" {
		t.Fatalf("the rest: %q", got)
	}
}

func TestQueue_MaxPendingRefusesAndWritesNothing(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), QueueOptions{MaxPending: 3, Targets: []string{"x", "y"}})
	n.enqueue(t, msg("a", 1)) // two pairs
	_, err := n.q.Enqueue(context.Background(), msg("b", 2))
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindOverloaded || e.RetryAfter <= 0 {
		t.Fatalf("past maxPending: %v", err)
	}
	if _, err := n.q.Message(context.Background(), "b"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the refused message was written: %v", err)
	}
	// A retry of a message already held is not refused: it writes nothing.
	if got := n.enqueue(t, msg("a", 3)); got[0] != "a" {
		t.Fatal(got)
	}
	n.receive(t, QueueReceive{Target: "x"})
	n.enqueue(t, msg("c", 4)) // 1 + 2 pending: at the bound
}

func TestQueue_BadInputs(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), QueueOptions{})
	ctx := context.Background()
	for name, msgs := range map[string][]QueueMessageIn{
		"no payload":       {{ID: "a"}},
		"invalid JSON":     {{ID: "a", Payload: json.RawMessage(`{`)}},
		"id not UTF-8":     {{ID: "a\xff", Payload: json.RawMessage(`1`)}},
		"negative delay":   {{ID: "a", Payload: json.RawMessage(`1`), Delay: -time.Second}},
		"one bad in batch": {{ID: "ok", Payload: json.RawMessage(`1`)}, {ID: "a", Payload: json.RawMessage(`{`)}},
	} {
		if _, err := n.q.Enqueue(ctx, msgs...); !errors.Is(err, ErrBadRequest) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Well-formed, refused (spec/errors.md).
	for name, msgs := range map[string][]QueueMessageIn{
		"no messages":   nil,
		"long id":       {{ID: string(make([]byte, 129)), Payload: json.RawMessage(`1`)}},
		"control in id": {{ID: "a\nb", Payload: json.RawMessage(`1`)}},
	} {
		if _, err := n.q.Enqueue(ctx, msgs...); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	big := QueueMessageIn{ID: "big", Payload: json.RawMessage(`"` + strings.Repeat("x", 1<<20) + `"`)}
	if _, err := n.q.Enqueue(ctx, big); !errors.Is(err, ErrTooLarge) {
		t.Errorf("a payload over 1 MiB: %v", err)
	}
	if s := n.stats(t); s != (QueueStats{}) {
		t.Fatalf("a refused batch wrote something: %+v", s)
	}
	if _, err := n.q.Receive(ctx, QueueReceive{Max: -1}); !errors.Is(err, ErrBadRequest) {
		t.Errorf("max -1: %v", err)
	}
	if _, err := n.q.Ack(ctx); !errors.Is(err, ErrBadRequest) {
		t.Errorf("ack of nothing: %v", err)
	}
	if _, err := n.q.Message(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown message: %v", err)
	}
}

// Messages and the states of their pairs survive a restart: an acked enqueue
// and a settlement are durable. A delivery in flight at the stop is put back
// when the node starts, without waiting for a consumer (spec/queue.md, Replay).
func TestQueue_SurvivesARestartAndReplays(t *testing.T) {
	dir := t.TempDir()
	n := startQueueNode(t, dir, QueueOptions{})
	n.enqueue(t, msg("a", 1), msg("b", 2), msg("c", 3), QueueMessageIn{ID: "later", Payload: json.RawMessage(`4`), Delay: time.Hour})
	d := n.receive(t, QueueReceive{Max: 2})
	if _, err := n.q.Ack(context.Background(), d[0].Receipt); err != nil {
		t.Fatal(err)
	}
	if got := queueIndexEntries(t, n.testNode); got != 1 {
		t.Fatalf("%d objects in the index of queues with deliveries in flight, want 1", got)
	}
	clock := n.clock.Load()
	n.stop()
	n = startQueueNode(t, dir, QueueOptions{})
	n.clock.Store(clock)
	sum := waitReplay(t, n.testNode, "app_t")
	if sum.Recovered != 2 || sum.Delayed != 1 || len(sum.Errors) != 0 {
		t.Fatalf("replay summary %+v: want b (put back) and c due, later delayed", sum)
	}
	// Another app's credentials see only its own queues (issue 26).
	if other := waitReplay(t, n.testNode, "app_other"); other.Recovered != 0 || other.Delayed != 0 || len(other.Errors) != 0 {
		t.Fatalf("another app's replay summary %+v: want nothing of app_t's", other)
	}
	if got := queueIndexEntries(t, n.testNode); got != 0 {
		t.Fatalf("%d objects in the index after the replay", got)
	}
	m, err := n.q.Message(context.Background(), "b")
	if p := m.Targets["default"]; err != nil || p.State != StatePending || p.Attempts != 1 || p.LastError != "the node stopped during the delivery" {
		t.Fatalf("b after restart: %+v %v", p, err)
	}
	if m, err := n.q.Message(context.Background(), "a"); err != nil || m.Targets["default"].State != StateComplete || string(m.Payload) != `{"n":1}` {
		t.Fatalf("a after restart: %+v %v", m, err)
	}
	// The receipt from before the restart holds no more.
	if a, err := n.q.Ack(context.Background(), d[1].Receipt); err != nil || a.NotHeld != 1 {
		t.Fatalf("a receipt from before the restart: %+v %v", a, err)
	}
	if got := ids(n.receive(t, QueueReceive{Max: 10})); got != "c#1,b#2" {
		t.Fatalf("received %q", got)
	}
	// Deduplication holds across the restart.
	n.enqueue(t, msg("a", 9), msg("c", 9))
	if s := n.stats(t); s.Complete != 1 || s.Pending != 0 || s.Processing != 2 {
		t.Fatalf("stats %+v", s)
	}
}

// A delivery in flight at the stop whose attempts are spent goes to the dead
// letters at the replay.
func TestQueue_ReplayExhausts(t *testing.T) {
	dir := t.TempDir()
	n := startQueueNode(t, dir, QueueOptions{MaxAttempts: 1})
	n.enqueue(t, msg("a", 1))
	n.receive(t, QueueReceive{})
	n.stop()
	n = startQueueNode(t, dir, QueueOptions{MaxAttempts: 1})
	waitReplay(t, n.testNode, "app_t")
	m, _ := n.q.Message(context.Background(), "a")
	if p := m.Targets["default"]; p.State != StateFailed || p.Reason != "exhausted" {
		t.Fatalf("after replay %+v", p)
	}
}

// A node that stopped with nothing in flight replays nothing; an object the
// node handed deliveries to in this run keeps them when it is passivated and
// activated again.
func TestQueue_ReplayKeepsThisRunsDeliveries(t *testing.T) {
	n := startNode(t, t.TempDir(), nodeOpts{cfg: Config{IdleTimeout: 50 * time.Millisecond}})
	if sum := waitReplay(t, n, "app_t"); sum.Recovered != 0 || sum.Delayed != 0 {
		t.Fatalf("replay of an empty node %+v", sum)
	}
	q := NewQueue(n.host, ObjectID{App: "app_t", Type: "jobs", Key: "q"})
	if _, err := q.Enqueue(context.Background(), msg("a", 1)); err != nil {
		t.Fatal(err)
	}
	d, err := q.Receive(context.Background(), QueueReceive{})
	if err != nil || len(d) != 1 {
		t.Fatalf("receive %v %v", d, err)
	}
	waitFor(t, "the object to passivate", func() bool { return n.host.Active() == 0 })
	if a, err := q.Ack(context.Background(), d[0].Receipt); err != nil || a.Acked != 1 {
		t.Fatalf("ack after a reactivation: %+v %v", a, err)
	}
}

func TestQueue_ReplayTopicsMakesBackoffsDue(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), QueueOptions{})
	n.enqueue(t, QueueMessageIn{ID: "o", Topic: "orders", Payload: json.RawMessage(`1`)}, QueueMessageIn{ID: "p", Topic: "pay", Payload: json.RawMessage(`2`)},
		QueueMessageIn{ID: "late", Topic: "orders", Payload: json.RawMessage(`3`), Delay: time.Hour})
	for _, d := range n.receive(t, QueueReceive{Max: 2}) {
		if _, err := n.q.Nack(context.Background(), QueueNack{Receipt: d.Receipt, Delay: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	sum, err := request[*ReplaySummary](context.Background(), n.host, n.q.id, QueueReplay{Topics: []string{"orders"}})
	if err != nil || sum.Recovered != 1 || sum.Delayed != 1 {
		t.Fatalf("replay of orders: %+v %v: want o due, late (a first attempt) still delayed", sum, err)
	}
	if got := ids(n.receive(t, QueueReceive{Max: 10})); got != "o#2" {
		t.Fatalf("received %q", got)
	}
}

func queueIndexEntries(t *testing.T, n *testNode) int {
	t.Helper()
	count := 0
	n.pipe.WaitApplied(context.Background()) // what is durable is in Badger
	for p := range uint32(n.db.Partitions()) {
		prefix := persistence.PartitionIndexPrefix(p, indexQueues)
		if err := n.db.Scan(context.Background(), prefix, nil, nil, func(_, _ []byte) (bool, error) { count++; return true, nil }); err != nil {
			t.Fatal(err)
		}
	}
	return count
}

func waitReplay(t *testing.T, n *testNode, app string) ReplaySummary {
	t.Helper()
	var sum ReplaySummary
	waitFor(t, "the start replay", func() bool {
		var done bool
		sum, done = n.host.ReplaySummary(app)
		return done
	})
	return sum
}

func TestQueue_DeadLettersListRedriveDelete(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), QueueOptions{Targets: []string{"email", "audit"}, MaxAttempts: 1})
	ctx := context.Background()
	n.enqueue(t, QueueMessageIn{ID: "a", Topic: "x", Payload: json.RawMessage(`1`)}, QueueMessageIn{ID: "b", Topic: "y", Payload: json.RawMessage(`2`)})
	for _, target := range []string{"email", "audit"} {
		for _, d := range n.receive(t, QueueReceive{Target: target, Max: 2}) {
			if target == "audit" && d.ID == "b" {
				if _, err := n.q.Ack(ctx, d.Receipt); err != nil {
					t.Fatal(err)
				}
				continue
			}
			n.advance(time.Millisecond)
			if _, err := n.q.Nack(ctx, QueueNack{Receipt: d.Receipt, Error: "down " + target}); err != nil {
				t.Fatal(err)
			}
		}
	}
	all, err := n.q.DeadLetters(ctx, QueueDeadLettersGet{})
	if err != nil || len(all) != 3 {
		t.Fatalf("dead letters %+v %v", all, err)
	}
	// Per target, oldest first.
	if all[0].Target != "email" || all[0].ID != "a" || all[1].ID != "b" || all[2].Target != "audit" || all[2].ID != "a" ||
		all[0].Reason != "exhausted" || all[0].LastError != "down email" || all[0].Attempts != 1 || string(all[0].Payload) != "1" || all[0].FailedAt == 0 {
		t.Fatalf("dead letters %+v", all)
	}
	if got, _ := n.q.DeadLetters(ctx, QueueDeadLettersGet{Topic: "y"}); len(got) != 1 || got[0].ID != "b" {
		t.Fatalf("topic y: %+v", got)
	}
	if got, _ := n.q.DeadLetters(ctx, QueueDeadLettersGet{Target: "audit", Limit: 5}); len(got) != 1 || got[0].ID != "a" {
		t.Fatalf("target audit: %+v", got)
	}
	if got, _ := n.q.DeadLetters(ctx, QueueDeadLettersGet{Limit: 1}); len(got) != 1 {
		t.Fatalf("limit 1: %+v", got)
	}

	// Redrive a: both its dead letters, with a fresh budget.
	if r, err := n.q.Redrive(ctx, "a"); err != nil || r != 2 {
		t.Fatalf("redrive a: %d %v", r, err)
	}
	if got := ids(n.receive(t, QueueReceive{Target: "audit"})); got != "a#1" {
		t.Fatalf("the redriven message: %q", got)
	}
	if s := n.stats(t); s != (QueueStats{Pending: 1, Processing: 1, Complete: 1, Failed: 1}) {
		t.Fatalf("stats %+v", s)
	}

	// Delete b's dead letter: audit had completed it, so the message stays.
	if err := n.q.DeleteDeadLetter(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if err := n.q.DeleteDeadLetter(ctx, "b"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a second delete: %v", err)
	}
	m, err := n.q.Message(ctx, "b")
	if err != nil || len(m.Targets) != 1 || m.Targets["audit"].State != StateComplete {
		t.Fatalf("b after the delete: %+v %v", m, err)
	}
	if s := n.stats(t); s.Failed != 0 {
		t.Fatalf("stats %+v", s)
	}
	if _, err := n.q.DeadLetters(ctx, QueueDeadLettersGet{Target: "sms"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown target: %v", err)
	}
}

// Deleting the only dead letter of a message deletes the message: its id can
// be enqueued again.
func TestQueue_DeletingTheLastDeadLetterForgetsTheID(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), QueueOptions{MaxAttempts: 1})
	ctx := context.Background()
	n.enqueue(t, msg("a", 1))
	d := n.receive(t, QueueReceive{})
	if _, err := n.q.Dead(ctx, QueueDead{Receipt: d[0].Receipt}); err != nil {
		t.Fatal(err)
	}
	if err := n.q.DeleteDeadLetter(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.q.Message(ctx, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the message after its last dead letter went: %v", err)
	}
	n.enqueue(t, msg("a", 2))
	if got := n.receive(t, QueueReceive{}); len(got) != 1 || string(got[0].Payload) != `{"n":2}` {
		t.Fatalf("re-enqueued: %+v", got)
	}
}

// kick makes the alarm scheduler look at the (test) clock again.
func (n *queueNode) kick() { n.host.Scheduler().Kick() }

// queueKeys counts the keys of the queue's keyspace in Badger.
func queueKeys(t *testing.T, n *testNode, id ObjectID) int {
	t.Helper()
	n.pipe.WaitApplied(context.Background())
	ks := persistence.NewKeyspace(persistence.Partition(id, n.db.Partitions()), id, behaviourQueue)
	c := 0
	if err := n.db.Scan(context.Background(), ks.Prefix(), nil, nil, func(_, _ []byte) (bool, error) { c++; return true, nil }); err != nil {
		t.Fatal(err)
	}
	return c
}

// Complete pairs stay (deduplicated) for completedRetention, then go with
// their message; dead letters go after deadLetterRetention; what is left on
// disk is what is retained.
func TestQueue_Compaction(t *testing.T) {
	n := startQueueNode(t, t.TempDir(), QueueOptions{Targets: []string{"a", "b"}, MaxAttempts: 1,
		CompletedRetention: time.Hour, DeadLetterRetention: 2 * time.Hour})
	ctx := context.Background()
	var in []QueueMessageIn
	for i := range 300 {
		in = append(in, msg(fmt.Sprintf("m%d", i), i))
	}
	n.enqueue(t, in...)
	n.enqueue(t, msg("kept", 1)) // stays pending on b
	for _, target := range []string{"a", "b"} {
		ds := n.receive(t, QueueReceive{Target: target, Max: 1000, Visibility: 100 * time.Hour})
		var rs []string
		for _, d := range ds {
			if d.ID == "kept" && target == "b" {
				continue // left processing: its message stays
			}
			if d.ID == "m0" && target == "b" {
				if _, err := n.q.Dead(ctx, QueueDead{Receipt: d.Receipt, Reason: "bad"}); err != nil {
					t.Fatal(err)
				}
				continue
			}
			rs = append(rs, d.Receipt)
		}
		if a, err := n.q.Ack(ctx, rs...); err != nil || a.NotHeld != 0 {
			t.Fatalf("ack %+v %v", a, err)
		}
	}
	before := queueKeys(t, n.testNode, n.q.id)

	// Within the retention, ids stay deduplicated.
	n.advance(59 * time.Minute)
	n.kick()
	n.enqueue(t, msg("m5", 99))
	if m, err := n.q.Message(ctx, "m5"); err != nil || string(m.Payload) != `{"n":5}` {
		t.Fatalf("m5 within its retention: %+v %v", m, err)
	}
	// Past it, the complete pairs and their messages go.
	n.advance(2 * time.Minute)
	n.kick()
	waitFor(t, "the compaction of complete pairs", func() bool { s := n.stats(t); return s.Complete == 0 })
	if _, err := n.q.Message(ctx, "m5"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("m5 after its retention: %v", err)
	}
	// m0 keeps its message for its dead letter on b; kept keeps its message.
	if m, err := n.q.Message(ctx, "m0"); err != nil || len(m.Targets) != 1 || m.Targets["b"].State != StateFailed {
		t.Fatalf("m0 with a dead letter: %+v %v", m, err)
	}
	n.advance(time.Hour)
	n.kick()
	waitFor(t, "the compaction of dead letters", func() bool { s := n.stats(t); return s.Failed == 0 })
	if _, err := n.q.Message(ctx, "m0"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("m0 after its dead letter's retention: %v", err)
	}
	after := queueKeys(t, n.testNode, n.q.id)
	// Left: the meta, and kept's message, its pair on b and that pair's entry
	// in the processing index (its pair on a was complete and went).
	if after != 4 || before < 1000 {
		t.Fatalf("queue keys: %d before compaction, %d after", before, after)
	}
	// An id compacted away is new again.
	n.enqueue(t, msg("m5", 7))
	if m, err := n.q.Message(ctx, "m5"); err != nil || string(m.Payload) != `{"n":7}` {
		t.Fatalf("m5 enqueued again: %+v %v", m, err)
	}
}
