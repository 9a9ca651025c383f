package actors

import "context"

// The gate keeps one object's messages in the order they were posted when its
// activation changes under them.
//
// An activation that leaves the routing table (hostShard.remove: dropped,
// broken, passivated) runs nothing more: the requests still in its mailbox go,
// unrun, to the object's activation now (Host.resend). Those requests were
// posted before any request posted to the new activation directly, so they
// must run first: a sender that posts several requests to one object without
// waiting (a batch's operations on one object, spec/batch.md; a connection's
// pipelined requests) sees them run in its order.
//
// So an activation created while a retired one of the same object still has
// requests it has not taken up (unrun > 0, or its own gate still closed)
// starts with its gate closed: messages posted to it directly wait in held,
// requests handed over to it in handed. When the predecessor has taken up its
// last request (settle), the gate opens: a drainer posts handed, then held, to
// the mailbox in order, and messages posted meanwhile queue behind them; once
// both are empty, sends go straight to the mailbox again.
//
// Invariants:
//   - unrun counts the envelopes admitted to an activation (acquire, or a
//     hand-over from its predecessor: Host.successor) that its turns have not
//     finished handling (Receive). After remove, only its predecessor's
//     hand-overs admit to it, and only while its gate is closed (the
//     predecessor has not settled): once the gate is open, unrun only falls.
//     At 0 with the gate open, the activation can hand nothing more over, and
//     it is settled (once).
//   - A retired activation hands its requests to its successor, retired or
//     not, never past it to the activation now: the successor passes them on
//     in its own mailbox's order, behind what it was handed before.
//   - A retired activation that is not settled is in its shard's draining
//     map; the activation created after it for the same object is its succ,
//     and is gated until it settles. Both under the shard's mu.
//   - The drainer runs on an owned goroutine (Host.bg), never on the goroutine
//     that posted: the next activation's first turn waits for its partition's
//     writes to reach Badger (WaitPartition), and the poster may be the
//     cluster transport's connection reader, which must not wait (session 26).
//
// The hot path pays one atomic load per send (gated) and one add per
// envelope handled (unrun).

// gateState is an activation's gate; its fields but gated are under mu.
type gateState struct {
	// handed are requests a retired predecessor handed over (resend); held
	// messages posted to this activation directly while gated. handed go
	// first: they were posted earlier.
	handed, held []any
	// opening says a drainer runs (or is about to).
	opening bool
	// succ is the activation created after this one was retired while it
	// was not settled (under the shard's mu).
	succ *activation
}

// hold queues msg behind a's gate if it is closed or opening, and reports
// whether it did (false: the gate is open; post to the mailbox).
func (h *Host) hold(a *activation, msg any) bool {
	a.gateMu.Lock()
	defer a.gateMu.Unlock()
	if !a.gated.Load() {
		return false
	}
	a.gate.held = append(a.gate.held, msg)
	return true
}

// handOver queues env, handed over by a retired activation, for a. It never
// posts on the caller's goroutine: if a's gate is open (its predecessor
// settled already; not expected, as a handing-over activation is not
// settled), it is closed and opened again at once, so that a drainer posts it.
func (h *Host) handOver(a *activation, env *envelope) {
	a.gateMu.Lock()
	a.gate.handed = append(a.gate.handed, env)
	start := !a.gated.Load()
	if start {
		a.gated.Store(true)
		a.gate.opening = true
	}
	a.gateMu.Unlock()
	if start {
		h.startDrain(a)
	}
}

// openGate opens a's gate: its predecessor settled.
func (h *Host) openGate(a *activation) {
	a.gateMu.Lock()
	if a.gate.opening || !a.gated.Load() {
		a.gateMu.Unlock()
		return
	}
	a.gate.opening = true
	a.gateMu.Unlock()
	h.startDrain(a)
}

func (h *Host) startDrain(a *activation) {
	if !h.bg.Go(func(context.Context) { h.drain(a) }) {
		h.drain(a) // the host is closing: its owned goroutines are stopped
	}
}

// drain posts a's handed, then held, messages to its mailbox in order, then
// opens the gate. The mailbox runs on this goroutine (the synchronized
// dispatcher).
func (h *Host) drain(a *activation) {
	for {
		a.gateMu.Lock()
		var msg any
		switch {
		case len(a.gate.handed) > 0:
			msg, a.gate.handed[0] = a.gate.handed[0], nil
			a.gate.handed = a.gate.handed[1:]
		case len(a.gate.held) > 0:
			msg, a.gate.held[0] = a.gate.held[0], nil
			a.gate.held = a.gate.held[1:]
		default:
			a.gate.handed, a.gate.held, a.gate.opening = nil, nil, false
			a.gated.Store(false)
			a.gateMu.Unlock()
			if a.unrun.Load() == 0 && a.gone.Load() {
				h.settle(a)
			}
			return
		}
		a.gateMu.Unlock()
		h.system.Root.Send(a.pid, msg)
		h.commitQueued(a, false)
	}
}

// ran notes that a's turn finished handling one envelope admitted to it.
func (h *Host) ran(a *activation) {
	if a.unrun.Add(-1) == 0 && a.gone.Load() && !a.gated.Load() {
		h.settle(a)
	}
}

// settle notes that retired activation a will hand nothing more over, and
// opens its successor's gate. Idempotent.
func (h *Host) settle(a *activation) {
	if !a.settled.CompareAndSwap(false, true) {
		return
	}
	s := h.shard(a.id)
	s.mu.Lock()
	if s.draining[a.id] == a {
		delete(s.draining, a.id)
	}
	succ := a.gate.succ
	s.mu.Unlock()
	if succ != nil {
		h.openGate(succ) // not under s.mu: a drain may run turns here
	}
}
