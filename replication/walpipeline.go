package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/internal/owner"
	"github.com/holdfast/holdfast/persistence"
)

// WALPipeline is the Pipeline over persistence's write-ahead log (design
// step 2): appends are raft jobs of the persistence committer, which logs
// every queued job of every group in one record with one sync, makes the
// entries readable through the group's persistence.RaftStorage, then calls
// Done in queue order.
//
// Applying is step 2a's stand-in: one goroutine applies jobs in order by
// calling ApplyFunc per entry, then Done, and keeps each group's applied
// index in memory (AppliedIndex). Step 2b moves it into Badger, at the
// applier's own versions, with the group's applied state.
type WALPipeline struct {
	p     *persistence.Pipeline
	db    *persistence.DB
	apply func(g GroupID, ent *raftpb.Entry)
	log   *slog.Logger

	mu sync.Mutex // guards everything below
	// synced is each group's term and vote as last handed to the committer:
	// an append that changes neither, and carries no entries and no
	// responses, need not be durable (raft's MustSync) and rides along.
	synced  map[GroupID][2]uint64
	applyQ  []Job
	applied map[GroupID]uint64
	err     error // the first append the committer refused
	stopped bool

	applyCh chan struct{} // cap 1
	owner   *owner.Group
}

var _ Pipeline = (*WALPipeline)(nil)

// NewWALPipeline returns a pipeline over db's write-ahead log through p (a
// started persistence pipeline over db). apply is called for every
// committed entry, in log order per group; nil only counts them applied.
// applied gives the groups' applied indexes to start from (nil: none).
func NewWALPipeline(db *persistence.DB, p *persistence.Pipeline, apply func(g GroupID, ent *raftpb.Entry), applied map[GroupID]uint64, log *slog.Logger) *WALPipeline {
	if log == nil {
		log = slog.Default()
	}
	w := &WALPipeline{
		p: p, db: db, apply: apply, log: log,
		synced:  map[GroupID][2]uint64{},
		applied: map[GroupID]uint64{},
		applyCh: make(chan struct{}, 1),
		owner:   owner.New(nil),
	}
	for g, i := range applied {
		w.applied[g] = i
	}
	w.owner.Go(w.applyLoop)
	return w
}

// Storage returns group g's raft.Storage for replica, and the applied index
// to start it from. The HardState's commit is raised to the applied index:
// a commit-only HardState need not be durable, so a crash can lose it while
// the entries it committed were applied.
func (w *WALPipeline) Storage(g GroupID, replica ReplicaID, confState func() *raftpb.ConfState) (raft.Storage, uint64, error) {
	s := w.db.RaftStorage(uint64(g), uint64(replica), confState)
	w.mu.Lock()
	applied := w.applied[g]
	w.mu.Unlock()
	last, _ := s.LastIndex()
	if applied > last {
		return nil, 0, fmt.Errorf("replication: group %d: applied index %d above the durable log (last index %d)", g, applied, last)
	}
	hs, _, _ := s.InitialState()
	w.mu.Lock()
	w.synced[g] = [2]uint64{hs.GetTerm(), hs.GetVote()}
	w.mu.Unlock()
	if hs.GetCommit() >= applied {
		return s, applied, nil
	}
	return raisedCommit{s, applied}, applied, nil
}

// raisedCommit is a Storage whose HardState commits at least commit.
type raisedCommit struct {
	raft.Storage
	commit uint64
}

func (r raisedCommit) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	hs, cs, err := r.Storage.InitialState()
	if err == nil && hs.GetCommit() < r.commit {
		hs = &raftpb.HardState{Term: new(hs.GetTerm()), Vote: new(hs.GetVote()), Commit: new(r.commit)}
	}
	return hs, cs, err
}

// Append implements Pipeline.
func (w *WALPipeline) Append(job Job) {
	m := job.Msg
	if !raft.IsEmptySnap(m.GetSnapshot()) {
		// Snapshots come with design step 6; the job is never done, and the
		// group waits (as after a crash) until restarted.
		w.fail(fmt.Errorf("replication: group %d: snapshots are not supported by the WAL pipeline yet", job.Group))
		return
	}
	a := persistence.RaftAppend{Group: uint64(job.Group), Replica: m.GetFrom(), Entries: m.GetEntries()}
	sync := len(m.GetEntries()) > 0 || len(m.GetResponses()) > 0
	w.mu.Lock()
	if m.Term != nil { // Term, Vote and Commit are set together or not at all
		a.HardState = &raftpb.HardState{Term: new(m.GetTerm()), Vote: new(m.GetVote()), Commit: new(m.GetCommit())}
		tv := [2]uint64{m.GetTerm(), m.GetVote()}
		if w.synced[job.Group] != tv {
			sync = true
			w.synced[job.Group] = tv
		}
	}
	w.mu.Unlock()
	a.Sync = sync
	a.Done = func(err error) {
		switch {
		case errors.Is(err, persistence.ErrClosed):
			return // a node stopping: never durable, never done (the seam's contract)
		case err != nil:
			w.fail(fmt.Errorf("replication: group %d: append: %w", job.Group, err))
			return
		}
		job.Done()
	}
	w.p.AppendRaft(a)
}

// Apply implements Pipeline.
func (w *WALPipeline) Apply(job Job) {
	w.mu.Lock()
	if !w.stopped {
		w.applyQ = append(w.applyQ, job)
	}
	w.mu.Unlock()
	select {
	case w.applyCh <- struct{}{}:
	default:
	}
}

func (w *WALPipeline) applyLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.applyCh:
		}
		w.mu.Lock()
		batch := w.applyQ
		w.applyQ = nil
		w.mu.Unlock()
		for _, j := range batch {
			if ctx.Err() != nil {
				return
			}
			for _, ent := range j.Msg.GetEntries() {
				if w.apply != nil {
					w.apply(j.Group, ent)
				}
				w.mu.Lock()
				w.applied[j.Group] = ent.GetIndex()
				w.mu.Unlock()
			}
			j.Done()
		}
	}
}

func (w *WALPipeline) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
		w.log.Error("raft append failed; the group waits until restarted", "err", err)
	}
	w.mu.Unlock()
}

// Err returns the first append the committer refused, or nil.
func (w *WALPipeline) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// AppliedIndex returns the applied index of every group.
func (w *WALPipeline) AppliedIndex() map[GroupID]uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[GroupID]uint64, len(w.applied))
	for g, i := range w.applied {
		out[g] = i
	}
	return out
}

// Close stops the apply goroutine: jobs not applied yet are dropped (their
// Done never runs). It does not close the persistence pipeline.
func (w *WALPipeline) Close() {
	w.mu.Lock()
	w.stopped = true
	w.applyQ = nil
	w.mu.Unlock()
	_ = w.owner.Close(context.Background())
}
