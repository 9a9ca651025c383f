package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"

	"go.etcd.io/raft/v3"

	"github.com/holdfast/holdfast/replication/internal/testknobs"
)

// ErrReadNotConfirmed: a ReadIndex was not confirmed by a quorum (this
// replica lost leadership first, its context ended, the engine closed). The
// caller observed nothing and may retry, on whoever leads now.
var ErrReadNotConfirmed = errors.New("replication: read not confirmed")

func init() {
	testknobs.StaleReads = func(e any) { e.(*Engine).staleReads.Store(true) }
}

// Read states (readReq.state).
const (
	readQueued    int32 = iota // in the group's buffer
	readTaken                  // the worker took it (issued, or failed)
	readAbandoned              // the caller gave up before the worker took it
)

// readReq is one ReadIndex call waiting for its outcome.
//
// It is in exactly one place at a time: the group's buffer (g.reads), the
// worker's unconfirmed map (g.readPending, keyed by its request context), or
// the worker's confirmed list (g.readWaiting, until applied reaches its
// index); it leaves that place when it finishes, so it finishes once.
type readReq struct {
	state atomic.Int32
	done  chan readOutcome // buffered 1: finish never blocks

	// Worker-owned, once taken.
	key   string // the request context given to RawNode.ReadIndex
	term  uint64 // the leader's term when it was issued
	index uint64 // the confirmed read index
}

type readOutcome struct {
	index uint64
	err   error
}

func (r *readReq) finish(index uint64, err error) { r.done <- readOutcome{index, err} }

// ReadIndex makes a linearizable read of group id possible on this replica,
// which must lead it: it returns once a quorum has confirmed that this
// replica still led when the read was issued (raft's ReadIndex, ReadOnlySafe:
// a heartbeat round) AND this replica has applied at least the returned
// index, the leader's commit index at the read. The caller may then read its
// state machine: it holds every write acknowledged before ReadIndex was
// called. A new leader confirms no read before it has committed an entry of
// its own term (raft holds them until then).
//
// On a replica that does not lead it returns a *NotLeaderError at once. A
// read that this replica cannot confirm (it lost leadership first, ctx ended,
// Close) fails with ErrReadNotConfirmed: never a success. ErrUnknownGroup,
// ErrClosed, ErrGroupFailed as named.
func (e *Engine) ReadIndex(ctx context.Context, id GroupID) (uint64, error) {
	if e.closed.Load() {
		return 0, ErrClosed
	}
	g := e.group(id)
	if g == nil {
		return 0, fmt.Errorf("%w: %d", ErrUnknownGroup, id)
	}
	if f := g.stFailed.Load(); f != nil {
		return 0, *f
	}
	if raft.StateType(g.stRole.Load()) != raft.StateLeader {
		return 0, g.notLeader()
	}
	r := &readReq{done: make(chan readOutcome, 1)}
	g.mu.Lock()
	g.reads = append(g.reads, r)
	g.mu.Unlock()
	e.sched.enqueue(g, flagPropose)
	if e.closed.Load() && r.state.CompareAndSwap(readQueued, readAbandoned) {
		return 0, fmt.Errorf("%w: %w", ErrReadNotConfirmed, ErrClosed) // Close may have drained the buffer before we queued
	}
	select {
	case o := <-r.done:
		return o.index, o.err
	case <-ctx.Done():
		// A read has no effect: giving up is always safe. The worker drops
		// an abandoned read it has not taken yet; one it took finishes into
		// the buffered channel, unread.
		r.state.CompareAndSwap(readQueued, readAbandoned)
		return 0, fmt.Errorf("%w: group %d: %w", ErrReadNotConfirmed, id, ctx.Err())
	}
}

// takeReads empties the read buffer (worker only).
func (g *group) takeReads() []*readReq {
	g.mu.Lock()
	reads := g.reads
	g.reads = nil
	g.mu.Unlock()
	return reads
}

// issueReads hands buffered reads to raft (worker only, after Step and
// propose: raft's own state, not the last Ready's, decides whether we lead).
func (e *Engine) issueReads(g *group, reads []*readReq) {
	st := g.rn.BasicStatus()
	for _, r := range reads {
		if !r.state.CompareAndSwap(readQueued, readTaken) {
			continue // abandoned by its caller
		}
		if st.RaftState != raft.StateLeader {
			r.finish(0, g.notLeader())
			continue
		}
		r.term = st.HardState.GetTerm()
		if e.staleReads.Load() {
			// The planted bug: no quorum round, so a deposed leader that
			// does not know it yet answers from its stale log.
			g.confirmRead(r, st.HardState.GetCommit())
			continue
		}
		var key [16]byte
		binary.LittleEndian.PutUint64(key[:8], e.incarnation)
		binary.LittleEndian.PutUint64(key[8:], e.seq.Add(1))
		r.key = string(key[:])
		g.readPending[r.key] = r
		g.rn.ReadIndex(key[:])
	}
}

// readStates settles unconfirmed reads against a Ready (worker only, after
// the Ready's SoftState and HardState were taken into g.role and g.term).
//
// A replica that no longer leads, or leads in a later term, fails its
// unconfirmed reads: raft dropped their rounds (it resets its read-only
// state on every role change), and a read is only confirmed by a quorum
// that acknowledged this replica as leader of the term it was issued in. A
// read state for a context we no longer wait for (failed that way, or
// forwarded to a leader and answered late) is ignored.
func (g *group) readStates(states []raft.ReadState) {
	if len(g.readPending) > 0 && g.role != raft.StateLeader {
		g.failPendingReads(fmt.Errorf("%w: group %d: replica %d stopped leading (term %d) before a quorum confirmed the read", ErrReadNotConfirmed, g.id, g.replica, g.term))
	}
	for _, rs := range states {
		r := g.readPending[string(rs.RequestCtx)]
		if r == nil {
			continue
		}
		delete(g.readPending, r.key)
		if r.term != g.term || g.role != raft.StateLeader {
			r.finish(0, fmt.Errorf("%w: group %d: replica %d led term %d when the read was issued, term %d when raft confirmed it", ErrReadNotConfirmed, g.id, g.replica, r.term, g.term))
			continue
		}
		g.confirmRead(r, rs.Index)
	}
	if len(g.readPending) > 0 {
		for _, r := range g.readPending {
			if r.term != g.term {
				delete(g.readPending, r.key)
				r.finish(0, fmt.Errorf("%w: group %d: replica %d moved from term %d to %d before a quorum confirmed the read", ErrReadNotConfirmed, g.id, g.replica, r.term, g.term))
			}
		}
	}
}

// confirmRead finishes a confirmed read once this replica has applied its
// index (worker only). A confirmed read stays valid if the replica then loses
// leadership: its index was the leader's commit index at a moment between the
// call and now, so applying up to it is all the read needs.
func (g *group) confirmRead(r *readReq, index uint64) {
	r.index = index
	if g.applied >= index {
		r.finish(index, nil)
		return
	}
	g.readWaiting = append(g.readWaiting, r)
}

// releaseReads finishes the confirmed reads whose index this replica has now
// applied (worker only, after resolveApplied).
func (g *group) releaseReads() {
	if len(g.readWaiting) == 0 {
		return
	}
	kept := g.readWaiting[:0]
	for _, r := range g.readWaiting {
		if r.index <= g.applied {
			r.finish(r.index, nil)
		} else {
			kept = append(kept, r)
		}
	}
	clear(g.readWaiting[len(kept):])
	g.readWaiting = kept
}

// failPendingReads fails every unconfirmed read with err (worker only).
func (g *group) failPendingReads(err error) {
	for k, r := range g.readPending {
		delete(g.readPending, k)
		r.finish(0, err)
	}
}

// failReads fails every read of the group, buffered, unconfirmed or waiting
// for apply (worker, or Close once no worker runs).
func (g *group) failReads(err error) {
	g.failPendingReads(err)
	for _, r := range g.readWaiting {
		r.finish(0, err)
	}
	g.readWaiting = nil
	for _, r := range g.takeReads() {
		if r.state.CompareAndSwap(readQueued, readTaken) {
			r.finish(0, err)
		}
	}
}
