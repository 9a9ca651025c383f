package actors

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

// TestKV_LogIDsGoOnAfterDataLoss models `forget-node --accept-data-loss`: an
// object whose stored state is gone starts again on an empty store, in a
// partition whose data was given up. Its log_ids go on above every log_id the old copy issued
// (single node numbering stays 1, 2, 3), and a client resuming after an old
// log_id gets log_truncated, never an empty page.
func TestKV_LogIDsGoOnAfterDataLoss(t *testing.T) {
	ctx := context.Background()
	old := startNode(t, t.TempDir(), nodeOpts{})
	o := old.kv("kv", "k")
	var last uint64
	for i := 1; i <= 3; i++ {
		r, err := o.Set(ctx, "s", i)
		if err != nil {
			t.Fatal(err)
		}
		if r.LogID != uint64(i) {
			t.Fatalf("write %d on a single node: log_id %d, want %d", i, r.LogID, i)
		}
		last = r.LogID
	}

	// The data was lost six times; another node serves the partition.
	lost := startNode(t, t.TempDir(), nodeOpts{cfg: Config{DataLosses: func(uint32) uint64 { return 6 }}})
	o = lost.kv("kv", "k")
	if page, err := o.Log(ctx, 0, 10); err != nil || len(page.Items) != 0 {
		t.Fatalf("log of the empty object: %v %v", page, err)
	}
	var lt *LogTruncatedError
	if _, err := o.Log(ctx, last, 10); !errors.As(err, &lt) || lt.After != last {
		t.Fatalf("log after %d of an object that never wrote: %v, want log truncated", last, err)
	}
	r, err := o.Set(ctx, "s", "again")
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(6)<<32 + 1; r.LogID != want {
		t.Fatalf("first write after six losses: log_id %d, want %d", r.LogID, want)
	}
	if _, err := o.Log(ctx, last, 10); !errors.As(err, &lt) || lt.After != last || lt.Oldest != r.LogID {
		t.Fatalf("log after the old log_id %d: %v, want log truncated with oldest %d", last, err, r.LogID)
	}
	// "From the beginning" still reads the whole new log.
	page, err := o.Log(ctx, 0, 10)
	if err != nil || len(page.Items) != 1 || page.Items[0].LogID != r.LogID {
		t.Fatalf("log after 0: %+v %v", page, err)
	}
	// A subscriber resuming after the old log_id is told, then gets the snapshot.
	sub := &recorder{}
	subscribe(t, lost, o, sub, &last)
	waitFor(t, "the subscriber's events", func() bool { return len(sub.log()) >= 3 })
	got := sub.log()
	if got[1] != `log_truncated {"after_log_id":3,"oldest_log_id":25769803777}` {
		t.Fatalf("subscribe after %d: %q", last, got)
	}

	// The floor was stored with the write: a restart goes on from it.
	if r, err := o.Set(ctx, "s", "more"); err != nil || r.LogID != uint64(6)<<32+2 {
		t.Fatalf("second write: %+v %v", r, err)
	}
}

// TestKV_ReadLogAfterNewestIsTruncated: a log_id above an object's newest was
// never issued by it: 410, as for one compacted away.
func TestKV_ReadLogAfterNewestIsTruncated(t *testing.T) {
	ctx := context.Background()
	n := startNode(t, t.TempDir(), nodeOpts{})
	o := n.kv("kv", "k")
	for i := 1; i <= 3; i++ {
		if _, err := o.Set(ctx, "s", i); err != nil {
			t.Fatal(err)
		}
	}
	if page, err := o.Log(ctx, 3, 10); err != nil || len(page.Items) != 0 {
		t.Fatalf("log after the newest: %v %v, want an empty page", page, err)
	}
	var lt *LogTruncatedError
	if _, err := o.Log(ctx, 4, 10); !errors.As(err, &lt) || lt.After != 4 || lt.Oldest != 1 || lt.Newest != 3 {
		t.Fatalf("log after 4 of an object at 3: %v, want log truncated", err)
	}
}

func TestResumeAfter(t *testing.T) {
	for _, c := range []struct {
		after, oldest, newest uint64
		want                  uint64
		truncated             bool
	}{
		{0, 1, 0, 0, false},                       // a new object
		{0, 1, 5, 0, false},                       // nothing compacted
		{5, 1, 5, 5, false},                       // at the newest
		{6, 1, 5, 0, true},                        // above it
		{0, 4, 9, 0, true},                        // compacted
		{3, 4, 9, 3, false},                       // just inside
		{2, 4, 9, 0, true},                        // just outside
		{0, 1<<32 + 1, 1<<32 + 5, 1 << 32, false}, // from the beginning, above a floor
		{7, 1<<32 + 1, 1<<32 + 5, 0, true},        // an old copy's log_id
	} {
		got, err := ResumeAfter(c.after, c.oldest, c.newest)
		if (err != nil) != c.truncated || got != c.want {
			t.Errorf("ResumeAfter(%d, %d, %d) = %d, %v", c.after, c.oldest, c.newest, got, err)
		}
	}
	if logFloor(0) != 0 || logFloor(1) != 1<<32 || logFloor(2) != 2<<32 || logFloor(1<<40) >= 1<<53 {
		t.Error("logFloor")
	}
}

// TestKV_LogIDsJumpAfterARecovery models `recover-partition
// --accept-data-loss`: the object keeps its stored state (the surviving
// replica's), but the lost replicas may have issued log_ids above its newest.
// Its next write jumps above the floor the recovery raised, its change log
// starts again there, and a reader resuming from a log_id before the jump
// gets log_truncated.
func TestKV_LogIDsJumpAfterARecovery(t *testing.T) {
	ctx := context.Background()
	var losses atomic.Uint64
	n := startNode(t, t.TempDir(), nodeOpts{cfg: Config{DataLosses: func(uint32) uint64 { return losses.Load() }}})
	o := n.kv("kv", "k")
	for i := 1; i <= 3; i++ {
		if r, err := o.Set(ctx, "s", i); err != nil || r.LogID != uint64(i) {
			t.Fatalf("write %d: %+v %v", i, r, err)
		}
	}
	losses.Store(1) // the partition was recovered from this copy
	if page, err := o.Log(ctx, 3, 10); err != nil || len(page.Items) != 0 {
		t.Fatalf("log after the newest before the next write: %v %v", page, err)
	}
	r, err := o.Set(ctx, "s", "after")
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(1)<<32 + 1; r.LogID != want {
		t.Fatalf("first write after the recovery: log_id %d, want %d", r.LogID, want)
	}
	var lt *LogTruncatedError
	for _, after := range []uint64{2, 3, 5} { // held, newest, and one only a lost replica issued
		if _, err := o.Log(ctx, after, 10); !errors.As(err, &lt) || lt.Oldest != r.LogID {
			t.Fatalf("log after %d: %v, want log truncated with oldest %d", after, err, r.LogID)
		}
	}
	page, err := o.Log(ctx, 0, 10)
	if err != nil || len(page.Items) != 1 || page.Items[0].LogID != r.LogID {
		t.Fatalf("log from the beginning after the jump: %+v %v, want the one new entry", page, err)
	}
	if r2, err := o.Set(ctx, "s", "more"); err != nil || r2.LogID != r.LogID+1 {
		t.Fatalf("second write after the recovery: %+v %v, want log_id %d", r2, err, r.LogID+1)
	}
	if st, err := o.Get(ctx); err != nil || string(st.State["s"]) != `"more"` || st.LogID != r.LogID+1 {
		t.Fatalf("the object: %+v %v", st, err)
	}
}
