package actors

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/pipehook"
	"github.com/holdfast/holdfast/persistence"
)

// recorder is a Subscriber that keeps what it is given.
type recorder struct {
	mu     sync.Mutex
	events []Event
	lost   error
}

func (r *recorder) Deliver(ev Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lost != nil {
		panic("Deliver after Lost")
	}
	r.events = append(r.events, ev)
}

func (r *recorder) Lost(err error) {
	r.mu.Lock()
	r.lost = err
	r.mu.Unlock()
}

// log returns "name payload" of every event but EventJoined ("joined").
func (r *recorder) log() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.events))
	for _, ev := range r.events {
		if ev.Kind == EventJoined {
			out = append(out, "joined")
			continue
		}
		out = append(out, ev.Name+" "+string(ev.Payload))
	}
	return out
}

func (r *recorder) lostErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lost
}

func subscribe(t *testing.T, n *testNode, o *KV, sub Subscriber, after *uint64) {
	t.Helper()
	if _, err := n.host.Request(context.Background(), o.ID(), KVSubscribe{Sub: sub, After: after}); err != nil {
		t.Fatal(err)
	}
}

// TestSubscribe_EventsWaitForTheirWriteToBeDurable holds the commit pipeline: a
// subscriber that joins while a write is pending gets a snapshot that includes
// it only once it is durable, and live events wait likewise.
func TestSubscribe_EventsWaitForTheirWriteToBeDurable(t *testing.T) {
	var hold atomic.Bool
	release := make(chan struct{})
	held := make(chan struct{}, 10)
	n := startNode(t, t.TempDir(), nodeOpts{pipe: persistence.PipelineConfig{
		Hooks: &pipehook.Hooks{BeforeCommit: func(int) {
			if hold.Load() {
				held <- struct{}{}
				<-release
			}
		}},
	}})
	ctx := context.Background()
	o := n.kv("f", "x")
	if _, err := o.Set(ctx, "a", 1); err != nil {
		t.Fatal(err)
	}
	early := &recorder{}
	subscribe(t, n, o, early, nil)

	hold.Store(true)
	done := make(chan error, 1)
	go func() { _, err := o.Set(ctx, "a", 2); done <- err }()
	<-held // the write is planned and submitted, not durable
	late := &recorder{}
	subscribed := make(chan error, 1)
	go func() {
		_, err := n.host.Request(ctx, o.ID(), KVSubscribe{Sub: late})
		subscribed <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if got := early.log(); len(got) != 2 {
		t.Fatalf("early subscriber got %v while the write was not durable", got)
	}
	if got := late.log(); len(got) != 0 {
		t.Fatalf("late subscriber got %v while the write it saw was not durable", got)
	}
	hold.Store(false)
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-subscribed; err != nil {
		t.Fatal(err)
	}
	want := []string{"joined", `snapshot {"state":{"a":1},"log_id":1}`, `change {"key":"a","value":2,"previous":1,"log_id":2}`}
	if got := early.log(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("early subscriber\n got %v\nwant %v", got, want)
	}
	want = []string{"joined", `snapshot {"state":{"a":2},"log_id":2}`}
	if got := late.log(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("late subscriber\n got %v\nwant %v", got, want)
	}
}

// TestSubscribe_FailedWriteLosesTheSubscribers: a write that cannot be made
// durable tells every subscriber (they resubscribe), and sends no event for it.
func TestSubscribe_FailedWriteLosesTheSubscribers(t *testing.T) {
	var refuse atomic.Bool
	n := startNode(t, t.TempDir(), nodeOpts{pipe: persistence.PipelineConfig{
		Fence: func(uint32, uint64) error {
			if refuse.Load() {
				return errors.New("refused for the test")
			}
			return nil
		},
	}})
	ctx := context.Background()
	o := n.kv("f", "x")
	if _, err := o.Set(ctx, "a", 1); err != nil {
		t.Fatal(err)
	}
	sub := &recorder{}
	subscribe(t, n, o, sub, nil)
	refuse.Store(true)
	if _, err := o.Set(ctx, "a", 2); err == nil {
		t.Fatal("refused write succeeded")
	}
	refuse.Store(false)
	waitFor(t, "the subscriber to be lost", func() bool { return sub.lostErr() != nil })
	if got := sub.log(); len(got) != 2 {
		t.Fatalf("events %v: the failed write must send none", got)
	}
	// A fresh activation serves a new subscription from disk.
	again := &recorder{}
	after := uint64(0)
	subscribe(t, n, o, again, &after)
	want := []string{"joined", `change {"key":"a","value":1,"log_id":1}`, `snapshot {"state":{"a":1},"log_id":1}`}
	waitFor(t, "the new subscription", func() bool { return len(again.log()) == 3 })
	if got := again.log(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("resubscribed\n got %v\nwant %v", got, want)
	}
}

func TestSubscribe_UnsubscribeAndPassivation(t *testing.T) {
	n := startNode(t, t.TempDir(), nodeOpts{cfg: Config{IdleTimeout: 100 * time.Millisecond}})
	ctx := context.Background()
	o := n.kv("f", "x")
	sub := &recorder{}
	subscribe(t, n, o, sub, nil)
	if _, err := n.host.Request(ctx, o.ID(), KVSubscribe{Sub: sub}); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("second subscribe of one subscriber: %v", err)
	}
	time.Sleep(400 * time.Millisecond)
	if n.host.Active() != 1 {
		t.Fatal("a subscribed object was passivated")
	}
	if _, err := o.Set(ctx, "a", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := n.host.Request(ctx, o.ID(), KVUnsubscribe{Sub: sub}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.host.Request(ctx, o.ID(), KVUnsubscribe{Sub: sub}); err != nil {
		t.Fatalf("unsubscribing twice: %v", err)
	}
	if _, err := o.Set(ctx, "a", 2); err != nil {
		t.Fatal(err)
	}
	want := []string{"joined", `snapshot {"state":{},"log_id":0}`, `change {"key":"a","value":1,"previous":null,"log_id":1}`}
	if got := sub.log(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	waitFor(t, "passivation once unsubscribed", func() bool { return n.host.Active() == 0 })
}

func TestSubscribe_PublishRelaysRunEvents(t *testing.T) {
	n := startNode(t, t.TempDir(), nodeOpts{})
	ctx := context.Background()
	o := n.kv("thread", "t")
	r, err := n.host.Request(ctx, o.ID(), Publish{Name: "run:start"})
	if err != nil || r.(*Published).Subscribers != 0 {
		t.Fatalf("publish without subscribers: %v %v", r, err)
	}
	sub := &recorder{}
	subscribe(t, n, o, sub, nil)
	if _, err := n.host.Request(ctx, o.ID(), Publish{Name: "run:start", Payload: []byte(`{"id":1}`)}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "run:", "start", "run: x", "Run:x", "run:" + strings.Repeat("x", 61)} {
		if _, err := n.host.Request(ctx, o.ID(), Publish{Name: bad}); !errors.Is(err, ErrInvalid) {
			t.Errorf("publish %q: %v, want invalid", bad, err)
		}
	}
	want := []string{"joined", `snapshot {"state":{},"log_id":0}`, `run:start {"id":1}`}
	if got := sub.log(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	st, _ := o.Get(ctx)
	if st.LogID != 0 {
		t.Fatalf("a run event took log_id %d", st.LogID)
	}
}
