package persistence

import (
	"context"
	"sync"
	"sync/atomic"
)

// Writes and their tickets: what a writer hands the pipeline, and how it
// learns the outcome.

// KV is one key set to one value.
type KV struct {
	Key, Value []byte
	// Of, when above zero, says that Value is a part of an earlier Set of the
	// same Write: Sets[Of-1].Value[At:At+len(Value)] (a KV slot and the
	// change-log entry that holds its value). The write-ahead log then stores
	// those bytes once. Logging checks it and stores Value whole when it does
	// not hold.
	Of, At int
}

// Write is one atomic change of one actor: every Set and Delete of it is in the
// same log record, so a crash keeps all of them or none.
type Write struct {
	// Partition and Epoch tag the write with its partition's ownership; the
	// pipeline's Fence refuses a write whose epoch is no longer current.
	Partition uint32
	Epoch     uint64
	Sets      []KV
	Deletes   [][]byte
	// Chain, if set, links the writes of one actor activation: once one of them
	// fails, every later write of the chain fails too, so that nothing built on a
	// lost write ever reaches disk; once the chain is retired (its activation
	// left the host's routing table), none of its writes not yet taken into
	// the log ever is.
	Chain *Chain

	err    error // set by the goroutine committing it, before completion
	size   int   // estimate(), set by submit
	ticket Ticket
}

// Ticket reports the outcome of one submitted Write.
type Ticket struct {
	done    atomic.Bool
	applied atomic.Bool
	mu      sync.Mutex
	err     error
	first   Waiter   // the first waiter, kept inline: most writes have one
	waiters []Waiter // the rest, in OnDone's order
	ch      chan struct{}
}

// Waiter is told a write's outcome (see Ticket.Notify).
type Waiter interface {
	// WriteDone gets nil once the write is durable, else why it is lost. It must
	// not block.
	WriteDone(err error)
}

// waiterFunc is a func(error) as a Waiter.
type waiterFunc func(error)

func (f waiterFunc) WriteDone(err error) { f(err) }

// Done reports whether the write's outcome is known: durable (Err is nil) or failed.
func (t *Ticket) Done() bool { return t.done.Load() }

// Applied reports whether the write is visible to DB reads, or failed. A durable
// write becomes visible shortly after it is acknowledged: Badger applies it off
// the acknowledgement's path.
func (t *Ticket) Applied() bool { return t.applied.Load() }

// Err returns the write's error: nil when it is durable. Valid once Done.
func (t *Ticket) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// OnDone calls f with the outcome once it is known: at once, in the caller's
// goroutine, if it already is; otherwise on a pipeline goroutine, after the write's
// sync, in the order OnDone and Notify were called. f must not block.
func (t *Ticket) OnDone(f func(error)) { t.Notify(waiterFunc(f)) }

// Notify is OnDone for a Waiter: a caller that already holds what the outcome
// concerns (a request's envelope) passes itself instead of allocating closures.
func (t *Ticket) Notify(w Waiter) {
	t.mu.Lock()
	if t.done.Load() {
		err := t.err
		t.mu.Unlock()
		w.WriteDone(err)
		return
	}
	if t.first == nil {
		t.first = w
	} else {
		t.waiters = append(t.waiters, w)
	}
	t.mu.Unlock()
}

// Wait blocks until the outcome is known or ctx ends.
func (t *Ticket) Wait(ctx context.Context) error {
	t.mu.Lock()
	if t.done.Load() {
		t.mu.Unlock()
		return t.Err()
	}
	if t.ch == nil {
		t.ch = make(chan struct{})
	}
	ch := t.ch
	t.mu.Unlock()
	select {
	case <-ch:
		return t.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (t *Ticket) complete(err error) {
	if err != nil {
		t.applied.Store(true)
	}
	t.mu.Lock()
	t.err = err
	t.done.Store(true)
	first, waiters := t.first, t.waiters
	t.first, t.waiters = nil, nil
	if t.ch != nil {
		close(t.ch)
	}
	t.mu.Unlock()
	if first != nil {
		first.WriteDone(err)
	}
	for _, w := range waiters {
		w.WriteDone(err)
	}
}

// Chain links the writes of one writer; see Write.Chain. Only the goroutine
// holding the pipeline's commitMu touches err (another pipeline's, such as
// replication.Proposer, serializes its own access: Failed and Fail); Retire
// may come from any goroutine.
type Chain struct {
	err error
	// retired is the error Retire gave: the chain's writes that the log did
	// not take yet fail with it.
	retired atomic.Pointer[error]
	// inLog counts the chain's writes the committer took into a record that
	// has not ended yet (enterLog, leaveLog): Pipeline's committer counts a
	// write before it looks at retired, and uncounts it once the record is
	// committed or failed. Retire stores retired before Landed or WaitLanded
	// loads inLog, so for each write one of the two sides sees the other (Go's
	// atomics are sequentially consistent): either the committer sees the
	// chain retired and leaves the write out, or the waiter sees it counted
	// and waits until its record ended (TestChain_WaitLandedWaitsForATakenWrite).
	inLog atomic.Int32
	// waited is set once WaitLanded had to wait; only then does the
	// committer take mu when inLog reaches zero.
	waited atomic.Bool
	mu     sync.Mutex
	landed chan struct{} // closed when inLog reaches zero; guarded by mu
}

// enterLog counts w's chain's write as taken into a record; the committer
// calls it before it looks at whether the chain is retired.
func (c *Chain) enterLog() { c.inLog.Add(1) }

// leaveLog uncounts a write enterLog counted, once the record that held it
// ended (committed, with the pipeline's committed sequence number past it,
// or failed), or once the committer left it out.
func (c *Chain) leaveLog() {
	if c.inLog.Add(-1) != 0 || !c.waited.Load() {
		return
	}
	c.mu.Lock()
	if c.landed != nil {
		close(c.landed)
		c.landed = nil
	}
	c.mu.Unlock()
}

// Landed reports whether none of the chain's writes is in a record of the
// log that has not ended.
func (c *Chain) Landed() bool { return c.inLog.Load() == 0 }

// WaitLanded waits until none of the chain's writes is in a record of the
// log that has not ended. Called after Retire, it waits for every write of
// the chain that will ever be in the log: the actors' host makes the next
// activation of an object wait for its retired predecessor's chain this way
// before its first read (then Pipeline.WaitApplied, whose target the record
// is under by then), since a write the committer took just before the
// retirement becomes durable after it. Only Pipeline counts writes: for
// another pipeline (replication.Proposer) it returns at once.
func (c *Chain) WaitLanded(ctx context.Context) error {
	for c.inLog.Load() != 0 {
		c.waited.Store(true)
		c.mu.Lock()
		if c.inLog.Load() == 0 {
			c.mu.Unlock()
			return nil
		}
		if c.landed == nil {
			c.landed = make(chan struct{})
		}
		ch := c.landed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Failed returns the error of the chain's first failed write, else the error
// it was retired with, or nil. For a pipeline other than Pipeline
// (replication.Proposer).
func (c *Chain) Failed() error {
	if c.err != nil {
		return c.err
	}
	return c.Retired()
}

// Fail records err as the chain's failure unless it has one. For a pipeline
// other than Pipeline (replication.Proposer).
func (c *Chain) Fail(err error) {
	if c.err == nil {
		c.err = err
	}
}

// Retire refuses, with err, every write of the chain that the log has not
// taken when a pipeline next looks (Pipeline's committer as it builds a
// record; replication.Proposer as the group's worker hands a proposal to
// raft). Any goroutine; the first err stays. The actors' host retires an
// activation's chain as it takes it out of its routing table: a write the
// activation submits after that never lands, and the next activation waits
// for the ones the log took before (WaitLanded) before its first read.
func (c *Chain) Retire(err error) { c.retired.CompareAndSwap(nil, &err) }

// Retired returns the error Retire gave, or nil.
func (c *Chain) Retired() error {
	if p := c.retired.Load(); p != nil {
		return *p
	}
	return nil
}

// Ticket returns w's ticket, for a pipeline other than Pipeline
// (replication.Proposer), which settles it with Resolve and MarkApplied.
func (w *Write) Ticket() *Ticket { return &w.ticket }

// Resolve completes t: nil once its write is durable, else why it is lost
// (which also counts it applied: nothing will show it). Once only, and never
// on the ticket of a write a Pipeline took.
func (t *Ticket) Resolve(err error) { t.complete(err) }

// MarkApplied records that the database shows t's write (Applied). Never on
// the ticket of a write a Pipeline took.
func (t *Ticket) MarkApplied() { t.applied.Store(true) }

// fail records w's failure on its chain.
func (w *Write) fail(err error) {
	w.err = err
	if w.Chain != nil && w.Chain.err == nil {
		w.Chain.err = err
	}
}

// estimate over-approximates the bytes w takes in the log and in Badger.
func (w *Write) estimate() int {
	n := 0
	for _, kv := range w.Sets {
		n += len(kv.Key) + len(kv.Value) + 32
	}
	for _, k := range w.Deletes {
		n += len(k) + 32
	}
	return n
}

// barrier reports whether w changes nothing: it only marks a point in the
// pipeline's order (see Barrier).
func (w *Write) barrier() bool { return len(w.Sets) == 0 && len(w.Deletes) == 0 }
