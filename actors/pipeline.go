package actors

import (
	"context"
	"time"

	"github.com/holdfast/holdfast/persistence"
)

// Pipeline is what the objects need of the node's commit pipeline: a single
// node's *persistence.Pipeline (writes logged locally, group-committed), or
// a replicated node's replication.Proposer (writes proposed to their
// partition's raft group). Both take a *persistence.Write and hand back its
// *persistence.Ticket, completed once the write is durable (replicated: on a
// majority) and marked applied once Badger shows it.
type Pipeline interface {
	// Queue submits w without waking the committer (Kick or Help does).
	Queue(w *persistence.Write) *persistence.Ticket
	// Kick wakes the committer; Help commits on the caller's goroutine when
	// the committer is idle; KickStale commits writes queued longer than age
	// and reports whether there were any.
	Kick()
	Help()
	KickStale(age time.Duration) bool
	// WaitPartition waits until Badger shows every write of partition p
	// acknowledged (replicated: proposed) before the call; WaitApplied the
	// same for every partition this node serves.
	WaitPartition(ctx context.Context, p uint32) error
	WaitApplied(ctx context.Context) error
	// AppliedSeq changes whenever Badger shows more writes (the overlays look
	// again).
	AppliedSeq() uint64
	// Failed returns the node's storage failure, or nil.
	Failed() error
}

var _ Pipeline = (*persistence.Pipeline)(nil)
