package actors

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/pipehook"
	"github.com/holdfast/holdfast/persistence"
)

// activationOf returns the activation of id in the host's routing table, or nil.
func activationOf(h *Host, id ObjectID) *activation {
	s := h.shard(id)
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.m[id]
}

// startHeldApplierNode starts a node whose applier, while held is set, waits
// before each record until open is called (once; a cleanup calls it before the
// node stops, so that a failed test cannot leave the applier held).
func startHeldApplierNode(t *testing.T) (n *testNode, held *atomic.Bool, open func()) {
	held = new(atomic.Bool)
	release := make(chan struct{})
	var once sync.Once
	open = func() { once.Do(func() { close(release) }) }
	hooks := &pipehook.Hooks{BeforeApply: func(uint64) {
		if held.Load() {
			<-release
		}
	}}
	n = startNode(t, t.TempDir(), nodeOpts{pipe: persistence.PipelineConfig{Hooks: hooks}})
	t.Cleanup(open) // cleanups run last first: before the node's stop
	return n, held, open
}

// An activation the host dropped runs none of the requests already in its
// mailbox, even when its partition is served again at once under the same
// epoch (a replicated node's leader lease lapses and comes back within one
// raft term): it hands them, unrun, to the fresh activation, and their
// callers hear nothing of it. Otherwise two activations of one object write
// at once on one node, each from its own state: two increments are answered
// with the same value, and one of them is lost (a CI run of
// TestReplicated_ProcessesDownPastReplaceAfter saw it).
//
// The applier is held so that both activations wait in their first turn (an
// acknowledged write is not in Badger yet) with requests queued behind them.
func TestHost_ADroppedActivationServesNothingMore(t *testing.T) {
	n, held, open := startHeldApplierNode(t)
	ctx := context.Background()
	held.Store(true)
	if _, err := n.kv("other", "y").Increment(ctx, "n", 1); err != nil {
		t.Fatal(err) // acknowledged once durable; its apply waits
	}

	id := ObjectID{App: "app_t", Type: "counter", Key: "x"}
	x := n.kv("counter", "x")
	var mu sync.Mutex
	var values []string
	var wg sync.WaitGroup
	increments := func(k int) {
		for range k {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := x.Increment(ctx, "n", 1)
				if err != nil {
					t.Errorf("an increment: %v (the dropped activation's requests go to the fresh one unrun: the caller hears nothing of it)", err)
					return
				}
				mu.Lock()
				values = append(values, string(r.Value))
				mu.Unlock()
			}()
		}
	}
	inflight := func(a **activation, want int64) func() bool {
		return func() bool {
			*a = activationOf(n.host, id)
			return *a != nil && (*a).inflight.Load() == want
		}
	}

	var first, second *activation
	increments(5)
	waitFor(t, "five requests at the first activation", inflight(&first, 5))
	n.host.DropPartition(persistence.Partition(id, n.db.Partitions()))
	increments(5)
	waitFor(t, "five requests at a second activation", func() bool { return inflight(&second, 5)() && second != first })
	held.Store(false)
	open()
	wg.Wait()

	sort.Slice(values, func(i, j int) bool {
		return len(values[i]) < len(values[j]) || len(values[i]) == len(values[j]) && values[i] < values[j]
	})
	want := []string{"1", "2", "3", "4", "5", "6", "7", "8", "9", "10"}
	if len(values) != len(want) {
		t.Fatalf("answers %v, want one each of %v", values, want)
	}
	for i := range want {
		if values[i] != want[i] {
			t.Fatalf("answers %v, want one each of %v: two activations wrote at once", values, want)
		}
	}
	st, err := x.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(st.State["n"]); got != "10" {
		t.Fatalf("n = %s after 10 acknowledged increments", got)
	}
}

// An activation serves only under the epoch its first request was admitted
// under. When its partition stops being served between the admission and the
// activation's start, it refuses its requests (not served: the router asks
// again), and never serves under "no epoch" (0), whose writes a replicated
// node's raft would take in whatever term its replica leads, and whose reads
// no lease covers.
func TestHost_AnActivationStartedAfterItsPartitionLapsedServesNothing(t *testing.T) {
	var armed, lapsed atomic.Bool
	epoch := func(uint32) uint64 {
		if armed.CompareAndSwap(true, false) {
			lapsed.Store(true) // the admission's look is the last one that sees it served
			return 3
		}
		if lapsed.Load() {
			return 0
		}
		return 3
	}
	n := startNode(t, t.TempDir(), nodeOpts{cfg: Config{Epoch: epoch}})
	ctx := context.Background()
	x := n.kv("counter", "x")
	armed.Store(true)
	if r, err := x.Increment(ctx, "n", 1); !NotServed(err) {
		t.Fatalf("an increment admitted just before its partition lapsed: %+v, %v; want it refused as not served", r, err)
	}
	lapsed.Store(false)
	r, err := x.Increment(ctx, "n", 1)
	if err != nil || string(r.Value) != "1" {
		t.Fatalf("the increment once served again: %+v, %v; want n = 1", r, err)
	}
}

// A retired activation hands its requests over without running the next
// activation's first turn on its own goroutine. That turn waits until Badger
// shows the partition's acknowledged writes, and the goroutine that posted to
// the retired activation may be one that must not wait: the cluster
// transport's connection reader runs requests of ready objects itself.
func TestHost_AHandOverDoesNotRunTheNextFirstTurnOnTheCaller(t *testing.T) {
	n, held, open := startHeldApplierNode(t)
	ctx := context.Background()
	id := ObjectID{App: "app_t", Type: "counter", Key: "x"}
	x := n.kv("counter", "x")
	if _, err := x.Increment(ctx, "n", 1); err != nil {
		t.Fatal(err) // the first activation is past its first turn
	}
	if err := n.pipe.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	held.Store(true)
	if _, err := n.kv("other", "y").Increment(ctx, "n", 1); err != nil {
		t.Fatal(err) // acknowledged; its apply waits: a new activation's first turn waits too
	}
	a, err := n.host.acquire(id) // a request counted at the first activation
	if err != nil {
		t.Fatal(err)
	}
	n.host.DropPartition(persistence.Partition(id, n.db.Partitions()))
	reply := make(chan result, 1)
	env := &envelope{msg: &KVWrite{Route: RouteIncrement, Ops: []Op{{Op: "increment", Key: "n"}}}, act: a,
		done: func(v any, err error) { reply <- result{v, err} }}
	posted := make(chan struct{})
	go func() {
		n.host.send(a, env, false) // the retired activation's turn runs here
		close(posted)
	}()
	select {
	case <-posted:
	case <-time.After(5 * time.Second):
		t.Fatal("posting to the retired activation waited for the next activation's first turn")
	}
	held.Store(false)
	open()
	select {
	case r := <-reply:
		if r.err != nil || string(r.val.(*WriteResult).Value) != "2" {
			t.Fatalf("the handed-over increment: %+v, %v; want n = 2", r.val, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handed-over increment was never answered")
	}
}

// startNodeWithFirstTurnsHeld starts a node whose applier is held behind one
// acknowledged write: a fresh activation's first turn waits for it
// (WaitPartition) until open.
func startNodeWithFirstTurnsHeld(t *testing.T) (*testNode, func()) {
	n, held, release := startHeldApplierNode(t)
	held.Store(true)
	if _, err := n.kv("other", "y").Increment(context.Background(), "n", 1); err != nil {
		t.Fatal(err) // acknowledged once durable; its apply waits
	}
	return n, func() { held.Store(false); release() }
}

// incrementPoster returns count answer channels and post(i), which sends
// increment i of id's slot "n" without waiting; its answer goes to answers[i].
func incrementPoster(n *testNode, id ObjectID, count int) (answers []chan result, post func(i int)) {
	answers = make([]chan result, count)
	post = func(i int) {
		answers[i] = make(chan result, 1)
		n.host.RequestAsync(id, &KVWrite{Route: RouteIncrement, Ops: []Op{{Op: "increment", Key: "n"}}},
			func(v any, err error) { answers[i] <- result{v, err} })
	}
	return answers, post
}

// requireAnsweredInOrder waits for every answer of incrementPoster and fails
// unless each succeeded and the increments ran in posting order (1, 2, ...).
func requireAnsweredInOrder(t *testing.T, answers []chan result) {
	t.Helper()
	var got []string
	for i := range answers {
		select {
		case r := <-answers[i]:
			if r.err != nil {
				t.Fatalf("request %d: %v", i, r.err)
			}
			got = append(got, string(r.val.(*WriteResult).Value))
		case <-time.After(10 * time.Second):
			t.Fatalf("request %d was never answered", i)
		}
	}
	for i, v := range got {
		if v != fmt.Sprint(i+1) {
			t.Fatalf("the increments in posting order were answered %v: they ran out of order", got)
		}
	}
}

// requireNoneDraining fails if a retired activation of id is still draining:
// once every request was answered, each must have settled.
func requireNoneDraining(t *testing.T, h *Host, id ObjectID) {
	t.Helper()
	s := h.shard(id)
	s.mu.RLock()
	left := len(s.draining)
	s.mu.RUnlock()
	if left != 0 {
		t.Fatalf("%d retired activations still draining after every request was answered", left)
	}
}

// Requests one sender posts to one object run in the order it posted them,
// even when the object's activation is retired between two of the posts (a
// batch posts an object's operations one after another: spec/batch.md, "in
// the order they appear"), and when the next activation is retired too before
// it ran anything. The retired activations' unrun requests go to the
// activation now ahead of the ones posted to it directly; before, the next
// activation ran its own first and the handed-over ones after them.
func TestHost_RequestsKeepTheirOrderAcrossRetiredActivations(t *testing.T) {
	n, open := startNodeWithFirstTurnsHeld(t)
	id := ObjectID{App: "app_t", Type: "counter", Key: "x"}
	const activations, each = 3, 5
	answers, post := incrementPoster(n, id, activations*each)
	var seen []*activation
	fresh := func() bool {
		a := activationOf(n.host, id)
		if a == nil || a.inflight.Load() != 1 {
			return false
		}
		for _, b := range seen {
			if a == b {
				return false
			}
		}
		seen = append(seen, a)
		return true
	}
	for k := range activations {
		if k > 0 {
			n.host.DropPartition(persistence.Partition(id, n.db.Partitions()))
		}
		// A fresh activation's first turn runs on its poster and waits for
		// the applier (the first), or its requests wait for the retired
		// ones' (the later); the next four queue behind it.
		go post(k * each)
		waitFor(t, fmt.Sprintf("activation %d", k+1), fresh)
		for i := k*each + 1; i < (k+1)*each; i++ {
			post(i)
		}
	}
	open()
	requireAnsweredInOrder(t, answers)
	requireNoneDraining(t, n.host, id)
	if a := activationOf(n.host, id); a == nil || a.gated.Load() {
		t.Fatalf("the activation now is %v, gated: its requests go to the mailbox again once the retired ones ran", a)
	}
}

// A retired activation hands its requests over one turn at a time. When the
// activation it handed the first ones to is retired in turn before it has
// handed the rest, the rest must still run after the first ones: they follow
// the chain of activations (A to B to C), never past B to C directly, where
// they would run before what B still holds. (Found by the stress test below
// under -race in CI: a sender's request 1 ran after its requests 2 to 296.)
func TestHost_HandOversFollowTheChainOfRetiredActivations(t *testing.T) {
	n, open := startNodeWithFirstTurnsHeld(t)
	id := ObjectID{App: "app_t", Type: "counter", Key: "x"}
	p := persistence.Partition(id, n.db.Partitions())
	const count = 5
	answers, post := incrementPoster(n, id, count)
	// A's first turn runs on its poster and waits for the applier; the other
	// requests queue in A's mailbox behind it.
	go post(0)
	waitFor(t, "the first activation", func() bool {
		a := activationOf(n.host, id)
		return a != nil && a.inflight.Load() == 1
	})
	for i := 1; i < count; i++ {
		post(i)
	}
	n.host.DropPartition(p) // A retires: its requests go to B when it runs
	var once sync.Once
	testHandedOver = func() {
		// Right after A handed its first request to B: B retires too, before
		// A hands over the others.
		once.Do(func() { n.host.DropPartition(p) })
	}
	t.Cleanup(func() { testHandedOver = nil })
	open()
	requireAnsweredInOrder(t, answers)
	requireNoneDraining(t, n.host, id)
}

// Several senders each post a stream of increments to one object without
// waiting, while the object's partition is dropped and taken up again over
// and over (the epoch unchanged, as a lease that lapses and comes back): every
// sender's increments run in its posting order (its slot's values and the
// object's log_ids rise in that order), none runs twice, and none is lost. A
// request refused after maxResends hand-overs did not run, and is allowed.
func TestHost_SendersKeepTheirOrderWhileTheObjectIsDroppedOverAndOver(t *testing.T) {
	n := startNode(t, t.TempDir(), nodeOpts{})
	id := ObjectID{App: "app_t", Type: "counter", Key: "x"}
	p := persistence.Partition(id, n.db.Partitions())
	const senders, each = 4, 300
	type answer struct {
		value string
		logID uint64
		err   error
	}
	answers := make([][]chan answer, senders)
	var posting sync.WaitGroup
	for s := range senders {
		answers[s] = make([]chan answer, each)
		posting.Go(func() {
			slot := fmt.Sprintf("s%d", s)
			for i := range each {
				ch := make(chan answer, 1)
				answers[s][i] = ch
				n.host.RequestAsync(id, &KVWrite{Route: RouteIncrement, Ops: []Op{{Op: "increment", Key: slot}}},
					func(v any, err error) {
						if err != nil {
							ch <- answer{err: err}
							return
						}
						r := v.(*WriteResult)
						ch <- answer{value: string(r.Value), logID: r.LogID}
					})
			}
		})
	}
	const drops = 20
	var dropping sync.WaitGroup
	dropping.Go(func() {
		for range drops {
			time.Sleep(time.Millisecond)
			n.host.DropPartition(p)
		}
	})
	posting.Wait()
	dropping.Wait()
	refused := 0
	for s := range senders {
		last, lastLog := 0, uint64(0)
		for i := range each {
			var a answer
			select {
			case a = <-answers[s][i]:
			case <-time.After(20 * time.Second):
				t.Fatalf("sender %d's request %d was never answered", s, i)
			}
			if a.err != nil {
				if !NotServed(a.err) {
					t.Fatalf("sender %d's request %d: %v", s, i, a.err)
				}
				refused++
				continue
			}
			if a.value != fmt.Sprint(last+1) || a.logID <= lastLog {
				t.Fatalf("sender %d's request %d answered n = %s at log_id %d after n = %d at log_id %d: out of order, run twice or lost",
					s, i, a.value, a.logID, last, lastLog)
			}
			last, lastLog = last+1, a.logID
		}
	}
	t.Logf("%d drops, %d of %d requests refused after %d hand-overs", drops, refused, senders*each, maxResends)
}

// A write the committer took into a record just before its activation was
// retired becomes durable after the retirement. The next activation's first
// read waits for it (persistence.Chain.WaitLanded, through the shard's
// landing map), so its increment builds on it. Before (session 34's stale
// read), the first read looked only at the writes committed by then, missed
// the held one, and the next increment answered n = 1 a second time.
func TestHost_TheNextActivationReadsAWriteTheLogTookBeforeTheRetirement(t *testing.T) {
	hd := newHold(t)
	n := startNode(t, t.TempDir(), nodeOpts{pipe: persistence.PipelineConfig{Hooks: &pipehook.Hooks{BeforeCommit: hd.before}}})
	id := ObjectID{App: "app_t", Type: "counter", Key: "x"}
	p := persistence.Partition(id, n.db.Partitions())
	answers, post := incrementPoster(n, id, 2)
	post(0)
	waitFor(t, "the first write to be held in its commit", func() bool { return hd.inHold.Load() == 1 })
	n.host.DropPartition(p) // retires the activation after the log took its write
	// A next activation: its first turn (on the poster's goroutine) reads the
	// object, then increments.
	go post(1)
	waitFor(t, "the next activation", func() bool {
		a := activationOf(n.host, id)
		return a != nil && a.landing != nil
	})
	hd.open()
	requireAnsweredInOrder(t, answers)
	requireNoneDraining(t, n.host, id)
	st, err := NewKV(n.host, id).Get(context.Background())
	if err != nil || string(st.State["n"]) != "2" {
		t.Fatalf("after two increments the object reads %+v (%v), want n = 2", st, err)
	}
}
