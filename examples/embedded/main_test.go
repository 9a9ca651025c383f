package main

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// TestTrial: the alarm ends ann's trial after a restart (its state and log say
// so, and the alarm is gone); bob's upgrade cancelled his alarm.
func TestTrial(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	ann, bob, err := run(ctx, dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ann.Plan != "pro" || ann.State != "expired" || !slices.Equal(ann.History, []string{"started pro", "expired"}) {
		t.Fatalf("ann: %+v", ann)
	}
	if bob.State != "paid" || !slices.Equal(bob.History, []string{"started pro", "upgraded"}) {
		t.Fatalf("bob: %+v", bob)
	}
	rt, err := open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	for _, key := range []string{"ann", "bob"} {
		if list, err := rt.Alarms(app, "trial", key).List(ctx); err != nil || len(list) != 0 {
			t.Fatalf("%s's alarms after the run: %+v %v", key, list, err)
		}
		if _, err := rt.Request(ctx, app, "trial", key, Upgrade{}); !errors.Is(err, ErrNotTrial) {
			t.Fatalf("upgrade %s after the trial: %v, want ErrNotTrial", key, err)
		}
	}
}
