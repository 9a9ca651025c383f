package owner

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestGroup_CloseCancelsAndWaits(t *testing.T) {
	g := New(nil)
	started := make(chan struct{})
	returned := make(chan struct{})
	if !g.Go(func(ctx context.Context) {
		close(started)
		<-ctx.Done()
		time.Sleep(20 * time.Millisecond) // Close must wait for this too
		close(returned)
	}) {
		t.Fatal("Go refused before Stop")
	}
	<-started
	if n := g.Running(); n != 1 {
		t.Fatalf("Running() = %d, want 1", n)
	}
	if err := g.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-returned:
	default:
		t.Fatal("Close returned before the goroutine did")
	}
	if n := g.Running(); n != 0 {
		t.Fatalf("Running() = %d after Close", n)
	}
}

func TestGroup_GoAfterStopRefuses(t *testing.T) {
	g := New(nil)
	g.Stop()
	if g.Go(func(context.Context) { t.Error("ran after Stop") }) {
		t.Fatal("Go started a goroutine after Stop")
	}
	if g.Context().Err() == nil {
		t.Fatal("the context did not end with Stop")
	}
	if err := g.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestGroup_WaitBoundedByContext(t *testing.T) {
	g := New(nil)
	release := make(chan struct{})
	g.Go(func(context.Context) { <-release }) // ignores its context
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := g.Close(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Close with an ended ctx = %v, want context.Canceled", err)
	}
	close(release)
	if err := g.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestGroup_WaitSeesEveryGoroutine(t *testing.T) {
	g := New(nil)
	var done [8]chan struct{}
	for i := range done {
		done[i] = make(chan struct{})
		g.Go(func(ctx context.Context) {
			<-ctx.Done()
			close(done[i])
		})
	}
	if err := g.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range done {
		select {
		case <-done[i]:
		default:
			t.Fatalf("goroutine %d had not returned when Close did", i)
		}
	}
}

func TestGroup_ParentEndsContext(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	g := New(parent)
	cancel()
	if g.Context().Err() == nil {
		t.Fatal("the group's context outlived its parent")
	}
}
