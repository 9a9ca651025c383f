package persistence

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/pipehook"
)

// collect exports prefix since a version into a map (nil value: deleted).
func collect(t *testing.T, db *DB, prefix []byte, since uint64) (map[string][]byte, uint64) {
	t.Helper()
	out := map[string][]byte{}
	top, err := db.Export(context.Background(), prefix, since, func(c Change) error {
		if c.Deleted {
			if c.Value != nil {
				t.Fatalf("deletion of %q carries a value", c.Key)
			}
			out[string(c.Key)] = nil
		} else {
			out[string(c.Key)] = c.Value
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out, top
}

func TestExport_CopyThenChangesWithDeletions(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's Close
	p := startPipeline(t, db, PipelineConfig{})
	ctx := context.Background()
	pre := PartitionPrefix(3)
	key := func(s string) string { return string(pre) + s }
	for _, w := range []*Write{set(key("a"), "1"), set(key("b"), "1"), set(key("c"), "1"), set("other", "x")} {
		if err := p.Submit(w).Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	since := p.Committed()
	release := p.HoldVersions(since)
	defer release()
	p.WaitApplied(context.Background())
	full, top := collect(t, db, pre, 0)
	// "other", outside the prefix, came last, at since. The applier may have
	// merged its record with c's (both at since then), so the newest version
	// under the prefix is c's record's or since.
	if len(full) != 3 || string(full[key("a")]) != "1" || top != since-1 && top != since {
		t.Fatalf("full copy = %q (top %d, committed %d)", full, top, since)
	}
	// Changes after since: b changes, c goes, d comes; a stays out.
	for _, w := range []*Write{set(key("b"), "2"), {Deletes: [][]byte{[]byte(key("c"))}}, set(key("d"), "1"), set(key("b"), "3")} {
		if err := p.Submit(w).Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	p.WaitApplied(context.Background())
	delta, _ := collect(t, db, pre, since)
	want := map[string]string{key("b"): "3", key("d"): "1"}
	if len(delta) != 3 || delta[key("c")] != nil {
		t.Fatalf("delta = %q", delta)
	}
	if _, ok := delta[key("c")]; !ok {
		t.Fatalf("delta lacks the deletion of c: %q", delta)
	}
	for k, v := range want {
		if string(delta[k]) != v {
			t.Fatalf("delta[%q] = %q, want %q", k, delta[k], v)
		}
	}
	// A full copy leaves deletions out.
	if full, _ := collect(t, db, pre, 0); len(full) != 3 || full[key("c")] != nil && len(full[key("c")]) > 0 {
		t.Fatalf("full copy after changes = %q", full)
	} else if _, ok := full[key("c")]; ok {
		t.Fatalf("full copy holds the deleted c")
	}
	if ok, _ := db.HasPrefix(ctx, PartitionPrefix(4)); ok {
		t.Fatal("HasPrefix of an empty partition")
	}
	if ok, _ := db.HasPrefix(ctx, pre); !ok {
		t.Fatal("HasPrefix of a partition with data")
	}
}

func TestPipeline_BarrierWaitsForEarlierWritesAndFenceHolds(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's Close
	var epoch atomic.Uint64
	epoch.Store(1)
	hook, held, open := holdFirstCommit()
	p := startPipeline(t, db, PipelineConfig{
		Fence: func(_ uint32, e uint64) error {
			if e != epoch.Load() {
				return errors.New("fenced")
			}
			return nil
		},
		Hooks: &pipehook.Hooks{BeforeCommit: hook},
	})
	t.Cleanup(open) // before the pipeline's Close (registered earlier), even on a failure
	ctx := context.Background()
	first := p.Submit(&Write{Epoch: 1, Sets: []KV{{Key: []byte("a"), Value: []byte("1")}}})
	<-held // the first commit passed the fence and is held before its sync
	late := p.Submit(&Write{Epoch: 1, Sets: []KV{{Key: []byte("b"), Value: []byte("1")}}})
	epoch.Store(2) // the partition moves on: late must not commit
	done := make(chan error, 1)
	go func() { done <- p.Barrier(ctx) }()
	select {
	case <-done:
		t.Fatal("the barrier passed a write still on its way to disk")
	default:
	}
	open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !first.Done() || first.Err() != nil {
		t.Fatalf("first: done=%v err=%v", first.Done(), first.Err())
	}
	if !late.Done() || late.Err() == nil {
		t.Fatalf("late write after the fence moved: done=%v err=%v", late.Done(), late.Err())
	}
}

func TestPipeline_AckFenceWithholdsTheAcknowledgement(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's Close
	var lapsed atomic.Bool
	p := startPipeline(t, db, PipelineConfig{
		AckFence: func(uint32, uint64) error {
			if lapsed.Load() {
				return errors.New("lease lapsed")
			}
			return nil
		},
	})
	ctx := context.Background()
	if err := p.Submit(set("a", "1")).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	lapsed.Store(true)
	if err := p.Submit(set("b", "1")).Wait(ctx); err == nil {
		t.Fatal("a write was acknowledged after the ack fence refused")
	}
	// The write itself is durable (its outcome was unknown to the writer).
	p.WaitApplied(context.Background())
	if _, found, _ := db.Get(ctx, []byte("b")); !found {
		t.Fatal("the unacknowledged write is not on disk")
	}
}

// A record the committer built before a chain was retired holds the chain's
// write, which becomes durable after the retirement. The actors' host makes
// the next activation of the object wait for it (Chain.WaitLanded, then
// WaitApplied) before its first read; without that wait it reads the object
// without the write and builds on a stale state (session 34: a slot's value
// went back while its log_id went forward). WaitApplied alone returns at
// once here: the record is not committed yet, so its target is below it.
func TestChain_WaitLandedWaitsForATakenWrite(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() }) // after the pipeline's Close
	hook, held, open := holdFirstCommit()
	p := startPipeline(t, db, PipelineConfig{Hooks: &pipehook.Hooks{BeforeCommit: hook}})
	t.Cleanup(open) // before the pipeline's Close (registered earlier), even on a failure
	chain := &Chain{}
	w := &Write{Chain: chain, Sets: []KV{{Key: []byte("a"), Value: []byte("1")}}}
	tk := p.Submit(w)
	<-held // the log took the write: its record is held before its sync
	chain.Retire(errors.New("the activation left the routing table"))
	if chain.Landed() {
		t.Fatal("the chain counts no write in the log while its record is held")
	}
	done := make(chan error, 1)
	go func() {
		if err := chain.WaitLanded(context.Background()); err != nil {
			done <- err
			return
		}
		done <- p.WaitApplied(context.Background())
	}()
	select {
	case err := <-done:
		t.Fatalf("the wait returned (%v) while the retired chain's write was not durable", err)
	case <-time.After(200 * time.Millisecond):
	}
	open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !tk.Done() || tk.Err() != nil || !w.ticket.applied.Load() {
		t.Fatalf("after the wait the write is done=%v err=%v applied=%v: it must be in Badger",
			tk.Done(), tk.Err(), w.ticket.applied.Load())
	}
	if _, found, _ := db.Get(context.Background(), []byte("a")); !found {
		t.Fatal("the retired chain's durable write is not in Badger after the wait")
	}
}

// A chain retired before the committer looks at its write: the write is
// left out of the log, and nothing is counted, so a waiter does not wait
// (nor for a record that failed: leaveLog runs on every path).
func TestChain_WaitLandedIsAtOnceForAWriteLeftOut(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() })
	var fenced atomic.Bool
	p := startPipeline(t, db, PipelineConfig{Fence: func(uint32, uint64) error {
		if fenced.Load() {
			return errors.New("fenced")
		}
		return nil
	}})
	ctx := context.Background()
	retired := &Chain{}
	retired.Retire(errors.New("gone"))
	if err := p.Submit(&Write{Chain: retired, Sets: []KV{{Key: []byte("r"), Value: []byte("1")}}}).Wait(ctx); err == nil {
		t.Fatal("a retired chain's write was acknowledged")
	}
	fenced.Store(true)
	refused := &Chain{}
	if err := p.Submit(&Write{Chain: refused, Sets: []KV{{Key: []byte("f"), Value: []byte("1")}}}).Wait(ctx); err == nil {
		t.Fatal("a fenced write was acknowledged")
	}
	fenced.Store(false)
	ok := &Chain{}
	if err := p.Submit(&Write{Chain: ok, Sets: []KV{{Key: []byte("o"), Value: []byte("1")}}}).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*Chain{"retired": retired, "fenced": refused, "committed": ok} {
		if !c.Landed() {
			t.Errorf("the %s chain still counts a write in the log after its record ended", name)
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := c.WaitLanded(wctx); err != nil {
			t.Errorf("WaitLanded on the %s chain: %v", name, err)
		}
		cancel()
	}
	if _, found, _ := db.Get(ctx, []byte("r")); found {
		t.Fatal("the retired chain's write reached Badger")
	}
}

// holdFirstCommit returns a BeforeCommit hook that holds the pipeline's first
// commit before its sync, a channel that receives once it is held, and open,
// which lets it go on (once; later calls do nothing). A test registers open
// as a cleanup after starting the pipeline, so that it runs before the
// pipeline's Close even when the test fails while the commit is held.
func holdFirstCommit() (hook func(int), held <-chan struct{}, open func()) {
	hold := make(chan struct{})
	heldCh := make(chan struct{}, 1)
	var once sync.Once
	hook = func(int) {
		select {
		case heldCh <- struct{}{}:
			<-hold
		default:
		}
	}
	return hook, heldCh, func() { once.Do(func() { close(hold) }) }
}
