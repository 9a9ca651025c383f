package owner

import (
	"context"
	"sync/atomic"
)

// Pool runs functions on goroutines it reuses, all owned by one Group. A
// function is handed to a worker that is idle, or else to a new one; a worker
// that finished waits for the next function unless MaxIdle others already
// wait, and ends when the group stops.
//
// Why: a new goroutine starts on a small stack and copies it every time it
// doubles. The gateway's batch route runs each object's operations on its own
// goroutine, and an object's turn runs on the sender's goroutine (the actors'
// synchronous dispatch), tens of KiB deep: with a new goroutine per object per
// batch, runtime.newstack and copystack took 19% of the server's CPU
// (bench/ holdfast-http/batch-increments-16x100). An idle worker keeps its
// grown stack (until a GC shrinks it).
type Pool struct {
	g       *Group
	work    chan func() // unbuffered: a send succeeds only into an idle worker
	idle    atomic.Int32
	maxIdle int32
}

// NewPool returns a pool whose workers g owns; at most maxIdle wait idle.
func NewPool(g *Group, maxIdle int) *Pool {
	return &Pool{g: g, work: make(chan func()), maxIdle: int32(max(maxIdle, 0))}
}

// Go runs fn on a worker and reports true, or reports false once the group
// stopped (fn does not run).
func (p *Pool) Go(fn func()) bool {
	select {
	case p.work <- fn:
		return true
	default:
	}
	return p.g.Go(func(ctx context.Context) { p.run(ctx, fn) })
}

// Idle returns the number of workers waiting for a function.
func (p *Pool) Idle() int { return int(p.idle.Load()) }

func (p *Pool) run(ctx context.Context, fn func()) {
	for {
		fn()
		if p.idle.Add(1) > p.maxIdle {
			p.idle.Add(-1)
			return
		}
		select {
		case fn = <-p.work:
			p.idle.Add(-1)
		case <-ctx.Done():
			p.idle.Add(-1)
			return
		}
	}
}
