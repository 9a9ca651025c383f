package holdfast

import (
	"context"
	"testing"
	"time"
)

func next(t *testing.T, f *Feed) FeedEvent {
	t.Helper()
	select {
	case ev, ok := <-f.C:
		if !ok {
			t.Fatalf("the feed closed: %v", f.Err())
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event for 10s")
	}
	return FeedEvent{}
}

// Watch hands out the snapshot, then each change once, in order; a reader
// that falls behind the feed's buffer gets the changes it missed replayed,
// none skipped or repeated; Close closes C.
func TestWatch_FollowsAnObject(t *testing.T) {
	old := feedBuffer
	feedBuffer = 5
	defer func() { feedBuffer = old }()
	rt, err := Open(Options{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(context.Background())
	ctx := context.Background()
	obj := rt.Object("app", "order", "o1")
	first, err := obj.Set(ctx, "n", 0)
	if err != nil {
		t.Fatal(err)
	}
	f, err := rt.Watch(ctx, "app", "order", "o1")
	if err != nil {
		t.Fatal(err)
	}
	if ev := next(t, f); ev.Name != "snapshot" || ev.LogID != first.LogID {
		t.Fatalf("first event %+v, want the snapshot at %d", ev, first.LogID)
	}
	r, err := obj.Patch(ctx, []PatchEntry{{Slot: "a", Value: 1}, {Slot: "b", Value: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if ev := next(t, f); ev.Name != "batch" || ev.LogID != r.LogID {
		t.Fatalf("after a patch: %+v", ev)
	}
	// 20 increments while nobody reads: more than the buffer holds.
	var lastID uint64
	for range 20 {
		r, err := obj.Increment(ctx, "n", 1)
		if err != nil {
			t.Fatal(err)
		}
		lastID = r.LogID
	}
	want, rejoins := r.LogID+1, 0
	for want <= lastID {
		ev := next(t, f)
		if ev.Name == "snapshot" {
			rejoins++ // a rejoin's snapshot, at the log_id the replay reached
			continue
		}
		if ev.Name != "change" || ev.LogID != want {
			t.Fatalf("got %+v, want the change at log_id %d", ev, want)
		}
		want++
	}
	// A rejoin's snapshot follows its replay: the last one comes after it.
	select {
	case ev := <-f.C:
		if ev.Name != "snapshot" || ev.LogID != lastID {
			t.Fatalf("after the replay: %+v, want a snapshot at %d", ev, lastID)
		}
		rejoins++
	case <-time.After(time.Second):
	}
	if rejoins == 0 {
		t.Fatal("the feed never fell behind its buffer: the test did not test the rejoin")
	}
	f.Close()
	if _, ok := <-f.C; ok {
		t.Fatal("C is open after Close")
	}
}
