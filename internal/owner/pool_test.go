package owner

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestPool_ReusesIdleWorkers: functions run one after another reuse one
// worker; at most maxIdle wait; Close ends the idle ones and Go refuses after.
func TestPool_ReusesIdleWorkers(t *testing.T) {
	g := New(nil)
	p := NewPool(g, 2)
	done := make(chan struct{})
	for range 10 {
		if !p.Go(func() { done <- struct{}{} }) {
			t.Fatal("refused before Close")
		}
		<-done
		waitFor(t, func() bool { return p.Idle() == 1 })
	}
	if n := g.Running(); n != 1 {
		t.Fatalf("%d workers for 10 functions run one after another, want 1", n)
	}
	// Five at once: five workers, then two stay idle.
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range 5 {
		wg.Add(1)
		p.Go(func() { defer wg.Done(); <-release })
	}
	waitFor(t, func() bool { return g.Running() == 5 && p.Idle() == 0 })
	close(release)
	wg.Wait()
	waitFor(t, func() bool { return g.Running() == 2 && p.Idle() == 2 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if p.Go(func() { t.Error("ran after Close") }) {
		t.Fatal("Go reported true after Close")
	}
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}
