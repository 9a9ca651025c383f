package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/persistence"
)

// collector is a live feed subscriber that keeps what it got.
type collector struct {
	mu      sync.Mutex
	events  []actors.Event
	lost    error
	gotLost chan struct{}
}

func newCollector() *collector { return &collector{gotLost: make(chan struct{})} }

func (c *collector) Deliver(ev actors.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lost != nil {
		panic("Deliver after Lost")
	}
	c.events = append(c.events, ev)
}

func (c *collector) Lost(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lost = err
	close(c.gotLost)
}

// count returns how many events of kind the subscriber got.
func (c *collector) count(kind actors.EventKind) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, ev := range c.events {
		if ev.Kind == kind {
			n++
		}
	}
	return n
}

// logIDs returns the log_ids of the live changes received, and the snapshot's.
func (c *collector) logIDs(t *testing.T) (snapshot uint64, live []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ev := range c.events {
		var body struct {
			LogID uint64 `json:"log_id"`
		}
		switch ev.Kind {
		case actors.EventSnapshot:
			if err := json.Unmarshal(ev.Payload, &body); err != nil {
				t.Fatal(err)
			}
			snapshot = body.LogID
		case actors.EventLive:
			if err := json.Unmarshal(ev.Payload, &body); err != nil {
				t.Fatal(err)
			}
			live = append(live, body.LogID)
		}
	}
	return snapshot, live
}

func TestCluster_LiveFeedAcrossNodesFollowsTheObject(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start("a")
	tc.start("b")
	c := tc.start("c")
	tc.waitStable(30 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// An object owned by b, watched from a, written through c.
	var key string
	for i := 0; ; i++ {
		key = fmt.Sprintf("feed%d", i)
		p := persistence.Partition(actors.ObjectID{App: "app_t", Type: "kv", Key: key}, testPartitions)
		if a.member.view.part(p).Owner == "b" {
			break
		}
	}
	id := actors.ObjectID{App: "app_t", Type: "kv", Key: key}
	// base is the log_id before the object's first: a floor of its
	// partition's epoch (issue 26, actors/logfloor.go), 0 at epoch 1.
	var base uint64
	for i := range 3 {
		r, err := tc.set(ctx, c, key, "v", i)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			base = r.LogID - 1
		}
	}
	sub := newCollector()
	v, err := a.Request(ctx, id, actors.KVSubscribe{Sub: sub})
	if err != nil {
		t.Fatalf("subscribe across nodes: %v", err)
	}
	if s := v.(*actors.Subscribed); s.LogID != base+3 {
		t.Fatalf("subscribed at %d, want %d", s.LogID, base+3)
	}
	for i := range 20 {
		if _, err := tc.set(ctx, c, key, "v", 100+i); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { _, live := sub.logIDs(t); return len(live) == 20 })
	snap, live := sub.logIDs(t)
	if snap != base+3 || live[0] != base+4 || live[19] != base+23 {
		t.Fatalf("snapshot %d, live %v", snap, live)
	}
	for i := 1; i < len(live); i++ {
		if live[i] != live[i-1]+1 {
			t.Fatalf("live log_ids not contiguous: %v", live)
		}
	}
	// The object's partition leaves b: the subscription is lost, and a new one
	// resuming after the last log_id misses nothing.
	tc.leave("b")
	select {
	case <-sub.gotLost:
	case <-time.After(30 * time.Second):
		t.Fatal("the subscription was not lost when its object moved")
	}
	if actors.KindOf(sub.lost) != actors.KindUnavailable {
		t.Fatalf("lost with %v", sub.lost)
	}
	tc.waitStable(60 * time.Second)
	if _, err := tc.set(ctx, c, key, "v", 200); err != nil { // log_id 24, while nobody watches
		t.Fatal(err)
	}
	again := newCollector()
	after := base + 23
	if _, err := a.Request(ctx, id, actors.KVSubscribe{Sub: again, After: &after}); err != nil {
		t.Fatalf("subscribe again: %v", err)
	}
	if _, err := tc.set(ctx, c, key, "v", 201); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, live := again.logIDs(t); return len(live) == 1 })
	if replayed := again.count(actors.EventReplay); replayed != 1 {
		t.Fatalf("replay after 23 gave %d items, want the one change of log_id 24", replayed)
	}
	// Unsubscribed, it gets nothing more.
	if _, err := a.Request(ctx, id, actors.KVUnsubscribe{Sub: again}); err != nil {
		t.Fatal(err)
	}
	if _, err := tc.set(ctx, c, key, "v", 202); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if _, live := again.logIDs(t); len(live) != 1 {
		t.Fatalf("events after unsubscribe: %v", live)
	}
	if _, err := a.Request(ctx, id, actors.KVSubscribe{Sub: again}); err != nil && !errors.Is(err, actors.ErrBadRequest) {
		t.Fatalf("subscribe a third time: %v", err)
	}
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCluster_LostFeedEventsEndTheSubscription: a one-way message of a live feed
// between nodes is lost on the way (as when a connection breaks and comes back).
// The subscriber is told Lost, and never sees the feed skip a log_id: at the
// next event when one follows, by the owner's check when none does. The owner's
// stand-in goes too, and a subscription resuming after the last log_id received
// gets the missed change.
func TestCluster_LostFeedEventsEndTheSubscription(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start("a")
	b := tc.start("b")
	tc.waitStable(30 * time.Second)
	key := keysOwnedBy(t, a, "b", 1)[0]
	id := actors.ObjectID{App: "app_t", Type: "kv", Key: key}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var dropping sync.Mutex
	dropNext := 0 // messages of events to drop
	drop := func(req *wireRequest) bool {
		dropping.Lock()
		defer dropping.Unlock()
		if req.Op == opFeed && req.Feed != nil && len(req.Feed.Events) > 0 && dropNext > 0 {
			dropNext--
			return true
		}
		return false
	}
	b.member.tr.dropSend.Store(&drop)
	setDrop := func(n int) { dropping.Lock(); dropNext = n; dropping.Unlock() }
	// n is the object's newest log_id: it starts after a floor of its
	// partition's epoch (issue 26, actors/logfloor.go), 0 at epoch 1.
	n := 0
	write := func() {
		t.Helper()
		r, err := tc.set(ctx, a, key, "v", n+1)
		if err != nil {
			t.Fatal(err)
		}
		n = int(r.LogID)
	}

	for _, tail := range []bool{false, true} {
		sub := newCollector()
		after := uint64(n)
		if _, err := a.Request(ctx, id, actors.KVSubscribe{Sub: sub, After: &after}); err != nil {
			t.Fatal(err)
		}
		write()
		write()
		waitFor(t, func() bool { _, live := sub.logIDs(t); return len(live) == 2 })
		setDrop(1)
		write() // its event is lost
		if !tail {
			write() // the next one shows the gap
		}
		start := time.Now()
		select {
		case <-sub.gotLost:
		case <-time.After(10 * time.Second):
			_, live := sub.logIDs(t)
			t.Fatalf("tail %v: a lost event went unnoticed; the subscriber got %v", tail, live)
		}
		if actors.KindOf(sub.lost) != actors.KindUnavailable {
			t.Fatalf("lost with %v", sub.lost)
		}
		_, live := sub.logIDs(t)
		if len(live) != 2 || live[0] != uint64(n-3+boolInt(tail)) || live[1] != live[0]+1 {
			t.Fatalf("tail %v: the subscriber got %v before Lost, want the two log_ids before the lost one", tail, live)
		}
		t.Logf("tail %v: the gap was noticed after %v", tail, time.Since(start))
		waitFor(t, func() bool {
			b.member.subs.mu.Lock()
			defer b.member.subs.mu.Unlock()
			return len(b.member.subs.in) == 0
		})
		// Resuming after the last log_id received replays what was missed.
		again := newCollector()
		last := live[1]
		if _, err := a.Request(ctx, id, actors.KVSubscribe{Sub: again, After: &last}); err != nil {
			t.Fatal(err)
		}
		want := uint64(n) - last
		// The join, the replays and the snapshot come in that order, over the
		// feed in one or more messages: wait for the snapshot, the last.
		waitFor(t, func() bool { return again.count(actors.EventSnapshot) == 1 })
		if replays := again.count(actors.EventReplay); uint64(replays) != want {
			t.Fatalf("tail %v: %d changes replayed, want %d", tail, replays, want)
		}
		if _, err := a.Request(ctx, id, actors.KVUnsubscribe{Sub: again}); err != nil {
			t.Fatal(err)
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestCluster_ARemoteSubscriptionTheOwnerForgotIsLost: the owner dropped its
// stand-in (its Lost message was lost on the way). The subscriber's node asks
// the owner which subscriptions it holds and tells the subscriber Lost; a
// subscription the owner holds is left alone.
func TestCluster_ARemoteSubscriptionTheOwnerForgotIsLost(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start("a")
	b := tc.start("b")
	tc.waitStable(30 * time.Second)
	keys := keysOwnedBy(t, a, "b", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	forgotten, kept := newCollector(), newCollector()
	for i, sub := range []*collector{forgotten, kept} {
		if _, err := a.Request(ctx, actors.ObjectID{App: "app_t", Type: "kv", Key: keys[i]}, actors.KVSubscribe{Sub: sub}); err != nil {
			t.Fatal(err)
		}
	}
	// b forgets the first subscription without a word to a.
	b.member.subs.mu.Lock()
	var gone *remoteSub
	for k, rs := range b.member.subs.in {
		if rs.obj.Key == keys[0] {
			gone = rs
			delete(b.member.subs.in, k)
		}
	}
	b.member.subs.mu.Unlock()
	if gone == nil {
		t.Fatal("b holds no stand-in for the first subscription")
	}
	gone.once.Do(func() {}) // its Lost is never sent
	if _, err := b.Request(ctx, gone.obj, actors.KVUnsubscribe{Sub: gone}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	select {
	case <-forgotten.gotLost:
	case <-time.After(3 * subsCheckEvery):
		t.Fatal("a subscription its owner forgot was never lost")
	}
	if actors.KindOf(forgotten.lost) != actors.KindUnavailable {
		t.Fatalf("lost with %v", forgotten.lost)
	}
	t.Logf("noticed after %v", time.Since(start))
	// The other one was checked too (the same round), and lives on.
	time.Sleep(subsCheckEvery + time.Second)
	select {
	case <-kept.gotLost:
		t.Fatalf("a subscription its owner holds was lost: %v", kept.lost)
	default:
	}
	if _, err := tc.set(ctx, a, keys[1], "v", 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, live := kept.logIDs(t); return len(live) == 1 })
}
