package replication

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/persistence"
)

// Proposer is a replicated node's commit pipeline for its actors (design
// 1.1): what *persistence.Pipeline is on a single node, with each write
// proposed to its partition's raft group (GroupID = Write.Partition) instead
// of logged locally. It takes the same *persistence.Write and hands back its
// *persistence.Ticket:
//
//   - The ticket completes once the write's entry is committed (durable on a
//     majority; Engine.ProposeCommitted), the output gate of a single node's
//     durable write, and it is marked applied once this replica applied it
//     (Badger holds it then; the activation's overlay serves the write's
//     reads until then, as on a single node). An activation reads Badger
//     only after WaitPartition, which waits for every entry to apply.
//   - Write.Epoch is the raft term the write belongs to (the activation took
//     it when it started; the cluster serves a partition only in the term its
//     replica leads): a write handed to raft in another term, or on a replica
//     that does not lead, fails with ErrNotWritten and is never in the log.
//   - Write.Chain keeps its meaning: once a write of a chain fails, the later
//     ones fail too, and none of them is handed to raft after the failure
//     (Engine.ProposeAsync's guard runs on the group's worker, in proposal
//     order; a chain is one activation's, so one group's). Nor is a write of
//     a retired chain: the actors' host retires an activation's chain as it
//     takes it out of its routing table, before a next activation exists, so
//     the next one's WaitPartition entry is behind every write of the old
//     one that raft will ever hold.
//   - Writes are not batched here: the engine puts every proposal a worker
//     pass finds into one MsgProp, and the persistence committer every
//     group's appends into one record and one sync.
type Proposer struct {
	e    *Engine
	pipe *persistence.Pipeline // the node's: its failure is the node's storage failure
	// applied counts writes applied, a change detector for the actors'
	// overlays (AppliedSeq).
	applied atomic.Uint64
}

// NewProposer returns the Proposer of engine e, whose groups store through
// pipe (the persistence pipeline under its WALPipeline).
func NewProposer(e *Engine, pipe *persistence.Pipeline) *Proposer {
	return &Proposer{e: e, pipe: pipe}
}

// Queue proposes w to group w.Partition in term w.Epoch and returns its
// ticket; it never waits.
func (p *Proposer) Queue(w *persistence.Write) *persistence.Ticket {
	t := w.Ticket()
	payload := persistence.AppendChanges(nil, w)
	var guard func() error
	if c := w.Chain; c != nil {
		guard = func() error {
			if err := c.Retired(); err != nil {
				return fmt.Errorf("its writer was retired: %w", err)
			}
			if err := c.Failed(); err != nil {
				return fmt.Errorf("an earlier write of its chain failed: %w", err)
			}
			return nil
		}
	}
	// The ticket resolves once: at commit (committed), or with the failure
	// of a proposal that never committed. Both callbacks run on the group's
	// worker, one after the other, never at once.
	resolved := false
	committed := func(Result) {
		if !resolved {
			resolved = true
			t.Resolve(nil) // the reply leaves: durable on a majority
		}
	}
	p.e.ProposeCommitted(GroupID(w.Partition), w.Epoch, payload, guard, committed, func(_ Result, err error) {
		if PlantedRaftBug && err == errPlantedAck { // plantedraftbug_on.go; compiled out otherwise
			committed(Result{}) // the leader's own append alone: the bug
			return
		}
		if err != nil {
			if w.Chain != nil {
				w.Chain.Fail(err)
			}
			if !resolved {
				resolved = true
				t.Resolve(err)
			}
			// Committed but not applied here (this replica stopped leading,
			// or closed): the ticket stays unapplied, and the activation
			// that holds it in its overlay is dropped with the epoch.
			return
		}
		t.MarkApplied()
		p.applied.Add(1)
		committed(Result{})
	})
	return t
}

// Submit is Queue: proposals never wait for a kick.
func (p *Proposer) Submit(w *persistence.Write) *persistence.Ticket { return p.Queue(w) }

// Kick, Help and KickStale do nothing: the engine's scheduler takes a
// proposal as soon as it is queued.
func (p *Proposer) Kick()                          {}
func (p *Proposer) Help()                          {}
func (p *Proposer) KickStale(_ time.Duration) bool { return false }

// WaitApplied is WaitPartition for every group this replica leads (the
// node's alarm scheduler and queue depth read what they serve).
func (p *Proposer) WaitApplied(ctx context.Context) error {
	for _, g := range p.e.Groups() {
		if st, err := p.e.Status(g); err != nil || !st.IsLeader {
			continue
		}
		var nl *NotLeaderError
		if err := p.WaitPartition(ctx, uint32(g)); err != nil && !errors.As(err, &nl) {
			return err
		}
	}
	return nil
}

// WaitPartition waits until this replica of group part has applied every
// entry in its log when the call was made (every write of an earlier
// activation, committed or not yet): it proposes an empty entry and waits
// for it to apply, which raft does only after everything before it. It
// fails on a replica that does not lead part (*NotLeaderError).
func (p *Proposer) WaitPartition(ctx context.Context, part uint32) error {
	if err := p.pipe.Failed(); err != nil {
		return err
	}
	for {
		_, err := p.e.Propose(ctx, GroupID(part), nil)
		var nl *NotLeaderError
		if err == nil || errors.As(err, &nl) || !errors.Is(err, ErrNotWritten) || ctx.Err() != nil {
			return err
		}
		// Not written, yet leading (raft dropped it, or a leader change
		// came and went): the barrier was not passed; try again shortly.
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", err, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// AppliedSeq changes whenever a write was applied (the actors' overlays
// look again).
func (p *Proposer) AppliedSeq() uint64 { return p.applied.Load() }

// Failed returns the node's storage failure (the persistence pipeline's), or
// nil.
func (p *Proposer) Failed() error { return p.pipe.Failed() }
