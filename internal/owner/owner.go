// Package owner gives goroutines an owner (nats-server's startGoRoutine and
// wait group, with a context): a Group starts goroutines under its context,
// and its Close cancels that context and waits for every one of them.
//
// Invariants: once Stop (or Close) began, Go starts nothing more, so a Wait
// that returned nil after Stop saw the last goroutine of the group return.
// Every method is safe for concurrent use.
package owner

import (
	"context"
	"fmt"
	"sync"
)

// Group owns a set of goroutines. The zero value is not usable: call New.
type Group struct {
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	stopped bool
	n       int           // goroutines running
	idle    chan struct{} // closed while n == 0
}

// New returns a group whose context is a child of parent (nil means
// context.Background()). It starts no goroutine.
func New(parent context.Context) *Group {
	if parent == nil {
		parent = context.Background()
	}
	g := &Group{idle: make(chan struct{})}
	close(g.idle)
	g.ctx, g.cancel = context.WithCancel(parent)
	return g
}

// Context returns the group's context: it ends when Stop or Close runs (or
// the parent ends).
func (g *Group) Context() context.Context { return g.ctx }

// Go starts f on a new goroutine with the group's context, and reports true;
// after Stop it starts nothing and reports false (the caller then does
// whatever f would have done on a cancelled context).
func (g *Group) Go(f func(ctx context.Context)) bool {
	g.mu.Lock()
	if g.stopped {
		g.mu.Unlock()
		return false
	}
	if g.n == 0 {
		g.idle = make(chan struct{})
	}
	g.n++
	g.mu.Unlock()
	go func() {
		defer g.done()
		f(g.ctx)
	}()
	return true
}

func (g *Group) done() {
	g.mu.Lock()
	g.n--
	if g.n == 0 {
		close(g.idle)
	}
	g.mu.Unlock()
}

// Running returns the number of the group's goroutines that have not returned.
func (g *Group) Running() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}

// Stop cancels the group's context and makes Go refuse new goroutines. It does
// not wait.
func (g *Group) Stop() {
	g.mu.Lock()
	g.stopped = true
	g.mu.Unlock()
	g.cancel()
}

// Wait waits until none of the group's goroutines is running, or until ctx
// ends (then its error says how many still run). Before Stop, more may start
// right after it returns.
func (g *Group) Wait(ctx context.Context) error {
	g.mu.Lock()
	idle := g.idle
	g.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%d goroutines still running: %w", g.Running(), ctx.Err())
	}
}

// Close is Stop, then Wait(ctx).
func (g *Group) Close(ctx context.Context) error {
	g.Stop()
	return g.Wait(ctx)
}
