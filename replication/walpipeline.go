package replication

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/holdfast/holdfast/persistence"
)

// WALPipeline is the Pipeline over persistence's write-ahead log (design
// step 2): appends are raft jobs of the persistence committer, which logs
// every queued job of every group in one record with one sync, makes the
// entries readable through the group's persistence.RaftStorage, then calls
// Done in queue order. Applies go to the persistence applier
// (Pipeline.ApplyRaft): a normal entry's payload (after its Header) is the
// changes persistence.AppendChanges encoded, written into Badger at the
// applier's own versions, merged with whatever else waits for Badger.
//
// The database must be replicated (persistence.Config.Replicated). Badger
// keeps no raft state: a replica restarts from the start of its log (its
// first index - 1) and applies again every committed entry the log holds
// (persistence/replicated.go says why that is safe and needed). Truncating a
// replica's log, up to persistence.Pipeline.RaftFlushed + 1, comes with the
// snapshots that let a laggard catch up past it (design step 6). Conf change
// entries and snapshots are refused for now: the group fails (Err) and waits.
type WALPipeline struct {
	p       *persistence.Pipeline
	db      *persistence.DB
	observe func(g GroupID, ent *raftpb.Entry)
	log     *slog.Logger

	mu sync.Mutex // guards everything below
	// synced is each group's term and vote as last handed to the committer:
	// an append that changes neither, and carries no entries and no
	// responses, need not be durable (raft's MustSync) and rides along.
	synced map[GroupID][2]uint64
	// replica and conf are each group's local replica and its configuration
	// (a marshalled raftpb.ConfState), from Storage.
	replica map[GroupID]ReplicaID
	conf    map[GroupID][]byte
	applied map[GroupID]uint64
	err     error // the first job the pipeline could not do
	stopped bool
}

var _ Pipeline = (*WALPipeline)(nil)

// NewWALPipeline returns a pipeline over db's write-ahead log through p (a
// started persistence pipeline over db, which must be replicated). observe,
// if not nil, is called for every entry once Badger holds it, in log order
// per group (again for the entries a restart applies again).
func NewWALPipeline(db *persistence.DB, p *persistence.Pipeline, observe func(g GroupID, ent *raftpb.Entry), log *slog.Logger) *WALPipeline {
	if log == nil {
		log = slog.Default()
	}
	return &WALPipeline{
		p: p, db: db, observe: observe, log: log,
		synced:  map[GroupID][2]uint64{},
		replica: map[GroupID]ReplicaID{},
		conf:    map[GroupID][]byte{},
		applied: map[GroupID]uint64{},
	}
}

// Storage returns group g's raft.Storage for replica, and the applied index
// to start it from: one below the log's first index, so that raft hands
// every committed entry the log holds to Apply again. confState gives the
// group's configuration (fixed until conf changes are supported here). The
// HardState's commit is raised to the applied index: a commit-only
// HardState need not be durable, so a crash can lose it while the entries it
// committed were applied and their log truncated.
func (w *WALPipeline) Storage(g GroupID, replica ReplicaID, confState func() *raftpb.ConfState) (raft.Storage, uint64, error) {
	if !w.db.Replicated() {
		return nil, 0, fmt.Errorf("replication: group %d: the database is not replicated (persistence.Config.Replicated)", g)
	}
	s := w.db.RaftStorage(uint64(g), uint64(replica), confState)
	first, _ := s.FirstIndex()
	applied := first - 1
	var cs []byte
	if confState != nil {
		var err error
		if cs, err = proto.Marshal(confState()); err != nil {
			return nil, 0, fmt.Errorf("replication: group %d: %w", g, err)
		}
	}
	hs, _, _ := s.InitialState()
	w.mu.Lock()
	w.synced[g] = [2]uint64{hs.GetTerm(), hs.GetVote()}
	w.replica[g], w.conf[g], w.applied[g] = replica, cs, applied
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

// Apply implements Pipeline: the job's entries go to the persistence
// applier as one RaftApply; Done once Badger holds them.
func (w *WALPipeline) Apply(job Job) {
	ents := job.Msg.GetEntries()
	if len(ents) == 0 {
		job.Done()
		return
	}
	var changes [][]byte
	for _, ent := range ents {
		if ent.GetType() != raftpb.EntryNormal {
			w.fail(fmt.Errorf("replication: group %d: entry %d: conf changes are not supported by the WAL pipeline yet", job.Group, ent.GetIndex()))
			return
		}
		_, payload, ok, err := DecodeEntry(ent.GetData())
		if err != nil {
			w.fail(fmt.Errorf("replication: group %d: entry %d: %w", job.Group, ent.GetIndex(), err))
			return
		}
		if ok && len(payload) > 0 {
			changes = append(changes, payload)
		}
	}
	last := ents[len(ents)-1]
	w.mu.Lock()
	replica, conf, stopped := w.replica[job.Group], w.conf[job.Group], w.stopped
	w.mu.Unlock()
	if stopped {
		return
	}
	w.p.ApplyRaft(persistence.RaftApply{
		Group: uint64(job.Group), Replica: uint64(replica),
		State:   persistence.RaftAppliedState{Index: last.GetIndex(), Term: last.GetTerm(), ConfState: conf},
		Changes: changes,
		Done: func(err error) {
			switch {
			case errors.Is(err, persistence.ErrClosed):
				return // a node stopping: the restart applies them again
			case err != nil:
				w.fail(fmt.Errorf("replication: group %d: apply up to entry %d: %w", job.Group, last.GetIndex(), err))
				return
			}
			if w.observe != nil {
				for _, ent := range ents {
					w.observe(job.Group, ent)
				}
			}
			w.mu.Lock()
			w.applied[job.Group] = last.GetIndex()
			stopped := w.stopped
			w.mu.Unlock()
			if !stopped {
				job.Done()
			}
		},
	})
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

// Close stops handing jobs on: the Done of applies still in the persistence
// pipeline is not called any more. It does not close the persistence
// pipeline.
func (w *WALPipeline) Close() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
}
