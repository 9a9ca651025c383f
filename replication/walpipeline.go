package replication

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/holdfast/holdfast/internal/owner"
	"github.com/holdfast/holdfast/persistence"
	"github.com/holdfast/holdfast/replication/internal/testknobs"
)

func init() {
	testknobs.TruncateApplied = func(w any) { w.(*WALPipeline).truncateApplied.Store(true) }
}

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
// first index - 1, with the configuration the log records there) and
// applies again every committed entry the log holds
// (persistence/replicated.go says why that is safe and needed).
//
// Truncation: once Badger holds a replica's entries up to F in synced tables
// (persistence.Pipeline.RaftFlushed) and the replica has applied at least
// KeepEntries beyond F, its log is truncated to start at F+1, with F's
// configuration. So a restart applies again at most what Badger had not
// flushed plus about KeepEntries, and a follower up to KeepEntries behind
// catches up from the log; one further behind needs a snapshot, which comes
// with design step 6 (until then it waits).
//
// The log's budget: a replica that stops applying (an idle group) would keep
// its last entries, and the segments that hold them, for ever, while the
// other groups fill the log. Once a second, when the log holds more than
// MaxLogSegments segments, the pipeline flushes Badger and truncates every
// replica that keeps the oldest segment to just above what Badger flushed,
// whatever KeepEntries says (the design's WAL budget, 1.7). It flushes also
// when no replica keeps the oldest segment: then Badger's memtable does (the
// releaser frees only what Badger holds in tables), and a memtable larger
// than the budget would let the log grow to its size.
//
// Conf change entries change the configuration each apply records (and so
// the restart point's); the engine applies them to raft. Snapshots
// (walsnapshot.go) are captured from Badger at the applied index and
// streamed by the transport (the pipeline is its SnapshotSource and
// SnapshotSink); a snapshot that arrives without staged data fails the group
// (Err).
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
	cs      map[GroupID]*raftpb.ConfState // conf, unmarshalled
	applied map[GroupID]uint64
	first   map[GroupID]uint64                       // the log's first index, as this pipeline last set it
	mark    map[GroupID]persistence.RaftAppliedState // maybeTruncate's next point
	// Snapshots (walsnapshot.go): each group's prepared snapshots (the last
	// is the current one), whether one is being captured, the applied index
	// from which a capture is exact, a received snapshot no append took
	// yet, and the index of an installed snapshot the log still names
	// (until a truncation at or above it).
	snaps      map[GroupID][]*prepSnap
	preparing  map[GroupID]bool
	safe       map[GroupID]uint64
	staged     map[GroupID]persistence.RaftSnapshotRef
	installed  map[GroupID]uint64
	nextSnapID uint64
	readers    sync.WaitGroup // open snapshot readers: Close waits for them
	cfg        WALConfig
	owner      *owner.Group // the budget sweeper
	err        error        // the first job the pipeline could not do
	stopped    bool

	// truncateApplied is the planted truncation bug (testknobs.TruncateApplied).
	truncateApplied atomic.Bool
}

var _ Pipeline = (*WALPipeline)(nil)

// WALConfig configures a WALPipeline; zero fields take DefaultWALConfig's.
type WALConfig struct {
	// KeepEntries is how many applied entries a replica's log keeps beyond
	// what Badger flushed, for followers that lag. Each costs the log's index
	// about 56 bytes: 2,000 entries x 256 replicas is about 28 MiB.
	KeepEntries uint64
	// MaxLogSegments is the log's budget, in segments (see WALPipeline).
	// Default 64: 4 GiB at the default 64 MiB segments.
	MaxLogSegments int
	// BudgetEvery is how often the budget is checked. Default 1 s.
	BudgetEvery time.Duration
	// Observe, if not nil, is called for every entry once Badger holds it, in
	// log order per group (again for the entries a restart applies again).
	Observe func(g GroupID, ent *raftpb.Entry)
	// OnSnapshot, if not nil, is called once Badger holds a snapshot the
	// replica of g installed (its index, term and configuration); entries
	// after it follow through Observe.
	OnSnapshot func(g GroupID, index, term uint64, cs *raftpb.ConfState)
	// SnapshotChunk is the size of a snapshot's chunks. Default 1 MiB.
	SnapshotChunk int
	// SnapshotReuse is how long a captured snapshot is given to followers
	// that need one (while the configuration is unchanged) before a new
	// one is captured, and how long an unused one is kept. Default 30 s.
	SnapshotReuse time.Duration
	// Logger: default slog.Default().
	Logger *slog.Logger
}

// The point a bootstrapped log starts after (Bootstrap).
const bootIndex, bootTerm = 1, 1

// DefaultWALConfig returns the defaults.
func DefaultWALConfig() WALConfig {
	return WALConfig{KeepEntries: 2000, MaxLogSegments: 64, BudgetEvery: time.Second, SnapshotChunk: 1 << 20, SnapshotReuse: 30 * time.Second}
}

// NewWALPipeline returns a pipeline over db's write-ahead log through p (a
// started persistence pipeline over db, which must be replicated), and
// starts its budget sweeper (Close stops it).
func NewWALPipeline(db *persistence.DB, p *persistence.Pipeline, cfg WALConfig) *WALPipeline {
	d := DefaultWALConfig()
	cfg.KeepEntries = cmp.Or(cfg.KeepEntries, d.KeepEntries)
	cfg.MaxLogSegments = cmp.Or(cfg.MaxLogSegments, d.MaxLogSegments)
	cfg.BudgetEvery = cmp.Or(cfg.BudgetEvery, d.BudgetEvery)
	cfg.SnapshotChunk = cmp.Or(cfg.SnapshotChunk, d.SnapshotChunk)
	cfg.SnapshotReuse = cmp.Or(cfg.SnapshotReuse, d.SnapshotReuse)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	w := &WALPipeline{
		p: p, db: db, observe: cfg.Observe, log: cfg.Logger, cfg: cfg,
		synced:  map[GroupID][2]uint64{},
		replica: map[GroupID]ReplicaID{},
		conf:    map[GroupID][]byte{},
		cs:      map[GroupID]*raftpb.ConfState{},
		applied: map[GroupID]uint64{},
		first:   map[GroupID]uint64{},
		mark:    map[GroupID]persistence.RaftAppliedState{},
		owner:   owner.New(nil),

		snaps:     map[GroupID][]*prepSnap{},
		preparing: map[GroupID]bool{},
		safe:      map[GroupID]uint64{},
		staged:    map[GroupID]persistence.RaftSnapshotRef{},
		installed: map[GroupID]uint64{},
	}
	w.owner.Go(w.budgetLoop)
	return w
}

// budgetLoop enforces the log's budget (see WALPipeline) every BudgetEvery.
func (w *WALPipeline) budgetLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.BudgetEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.snapshotChores()
		pinners, segments := w.db.RaftPinners()
		if segments <= w.cfg.MaxLogSegments {
			continue
		}
		if err := w.p.Flush(); err != nil {
			if !errors.Is(err, persistence.ErrClosed) {
				w.log.Warn("could not flush Badger for the log's budget", "err", err)
			}
			continue
		}
		for _, k := range pinners {
			g, r := GroupID(k[0]), ReplicaID(k[1])
			w.mu.Lock()
			ours := w.replica[g] == r
			w.mu.Unlock()
			if ours {
				w.truncate(g, r)
			}
		}
	}
}

// Bootstrap starts the log of a new group's replica with cs as its
// configuration (the founding voters), durably, before Storage is asked for
// it: the log starts after index 1 of term 1, as after a snapshot there, so
// that a replica that joins later (empty, not bootstrapped) is always sent a
// snapshot first and never applies the log from index 1 under an empty
// configuration (the design's risk 7).
func (w *WALPipeline) Bootstrap(ctx context.Context, g GroupID, replica ReplicaID, cs *raftpb.ConfState) error {
	b, err := proto.Marshal(cs)
	if err != nil {
		return fmt.Errorf("replication: group %d: %w", g, err)
	}
	s := w.db.RaftStorage(uint64(g), uint64(replica), nil)
	if last, _ := s.LastIndex(); last > 0 {
		return fmt.Errorf("replication: group %d replica %d: bootstrap of a log that holds entries (up to %d)", g, replica, last)
	}
	done := make(chan error, 1)
	w.p.TruncateRaft(uint64(g), uint64(replica), bootIndex+1, bootTerm, b, func(err error) { done <- err })
	if err := w.p.Barrier(ctx); err != nil { // a truncation rides along: make a record
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Storage returns group g's raft.Storage for replica, and the applied index
// to start it from: one below the log's first index, so that raft hands
// every committed entry the log holds to Apply again. The configuration is
// the one the log records as of that index (Bootstrap, truncations); a
// replica that has none starts with an empty one. The HardState's commit is
// raised to the applied index: a commit-only HardState need not be durable,
// so a crash can lose it while the entries it committed were applied and
// their log truncated.
func (w *WALPipeline) Storage(g GroupID, replica ReplicaID) (raft.Storage, uint64, error) {
	if !w.db.Replicated() {
		return nil, 0, fmt.Errorf("replication: group %d: the database is not replicated (persistence.Config.Replicated)", g)
	}
	s := w.db.RaftStorage(uint64(g), uint64(replica), nil)
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	applied := first - 1
	hs, conf, err := s.InitialState()
	if err != nil {
		return nil, 0, err
	}
	cs, err := proto.Marshal(conf)
	if err != nil {
		return nil, 0, fmt.Errorf("replication: group %d: %w", g, err)
	}
	w.mu.Lock()
	w.synced[g] = [2]uint64{hs.GetTerm(), hs.GetVote()}
	w.replica[g], w.conf[g], w.cs[g], w.applied[g], w.first[g] = replica, cs, conf, applied, first
	// Badger may hold entries up to the log's last index applied before a
	// restart: a snapshot's capture is exact once they are applied again.
	w.safe[g] = last
	w.mu.Unlock()
	if hs.GetCommit() >= applied {
		return walStorage{s, w, g}, applied, nil
	}
	return walStorage{raisedCommit{s, applied}, w, g}, applied, nil
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
	a := persistence.RaftAppend{Group: uint64(job.Group), Replica: m.GetFrom(), Entries: m.GetEntries()}
	var installing func()
	if !raft.IsEmptySnap(m.GetSnapshot()) {
		var err error
		if installing, err = w.appendSnapshot(job, &a); err != nil {
			// The job is never done, and the group waits (as after a
			// crash) until restarted.
			w.fail(err)
			return
		}
	}
	sync := len(m.GetEntries()) > 0 || len(m.GetResponses()) > 0 || installing != nil
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
		if installing != nil {
			installing()
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
	w.mu.Lock()
	cs, conf := w.cs[job.Group], w.conf[job.Group]
	w.mu.Unlock()
	var changes [][]byte
	confChanged := false
	for _, ent := range ents {
		if ent.GetType() != raftpb.EntryNormal {
			// The configuration after it goes to Badger's batch with the
			// entries, and from there (RaftFlushed) into the truncation
			// that may make it the replica's restart point.
			next, err := NextConfState(cs, ent)
			if err != nil {
				w.fail(fmt.Errorf("replication: group %d: conf change at entry %d: %w", job.Group, ent.GetIndex(), err))
				return
			}
			cs, confChanged = next, true
			continue
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
	if confChanged {
		b, err := proto.Marshal(cs)
		if err != nil {
			w.fail(fmt.Errorf("replication: group %d: %w", job.Group, err))
			return
		}
		conf = b
	}
	last := ents[len(ents)-1]
	w.mu.Lock()
	w.cs[job.Group], w.conf[job.Group] = cs, conf
	replica, stopped := w.replica[job.Group], w.stopped
	w.mu.Unlock()
	if stopped {
		return
	}
	w.p.ApplyRaft(persistence.RaftApply{
		Group: uint64(job.Group), Replica: uint64(replica),
		State:   persistence.RaftAppliedState{Index: last.GetIndex(), Term: last.GetTerm(), ConfState: conf},
		Changes: changes,
		Waited:  job.Waited,
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
				w.maybeTruncate(job.Group, replica, last.GetIndex(), last.GetTerm())
				job.Done()
			}
		},
	})
}

// maybeTruncate truncates g's log to start after what Badger flushed, once
// the replica applied KeepEntries beyond it (see WALPipeline). Called after
// an apply, on the persistence applier's goroutine: it only queues.
//
// The point is a flushed state the replica saw earlier (mark): flushes come
// often, and the newest flushed state is seldom KeepEntries behind the
// applied index, but an older one stays flushed, and is once the replica
// applied KeepEntries beyond it.
func (w *WALPipeline) maybeTruncate(g GroupID, replica ReplicaID, applied, appliedTerm uint64) {
	f, ok := w.p.RaftFlushed(uint64(g), uint64(replica))
	if !ok {
		return
	}
	w.mu.Lock()
	if m, has := w.mark[g]; has && m.Index >= w.first[g] {
		f = m // older, still flushed, not used yet
	} else {
		w.mark[g] = f
	}
	w.mu.Unlock()
	if applied < f.Index+w.cfg.KeepEntries {
		return
	}
	if w.truncateApplied.Load() {
		// Planted: gives up entries Badger may hold only in memtables.
		f.Index, f.Term = applied, appliedTerm
	}
	w.truncateTo(g, replica, f)
}

// truncate truncates g's log to start just above what Badger flushed, if
// that is above where it starts. It only queues.
func (w *WALPipeline) truncate(g GroupID, replica ReplicaID) {
	if f, ok := w.p.RaftFlushed(uint64(g), uint64(replica)); ok {
		w.truncateTo(g, replica, f)
	}
}

// truncateTo truncates g's log to start after f.Index, with f's term and
// configuration as of that index, if that is above where it starts.
//
// A snapshot being captured or streamed keeps the entries after its index
// (walsnapshot.go). A truncation at or above an installed snapshot's index
// (Badger flushed it) is made even when it does not move the first index:
// it tells the log that the snapshot need not be installed again.
func (w *WALPipeline) truncateTo(g GroupID, replica ReplicaID, f persistence.RaftAppliedState) {
	w.mu.Lock()
	lo, has, capturing := w.protectLocked(g)
	if capturing {
		w.mu.Unlock()
		return
	}
	if has && f.Index > lo.Index {
		f = lo // Badger flushed f, and so lo below it
	}
	inst, pending := w.installed[g]
	clears := pending && f.Index >= inst
	if f.Index+1 <= w.first[g] && !(clears && f.Index+1 == w.first[g]) {
		w.mu.Unlock()
		return
	}
	w.first[g] = f.Index + 1
	if clears {
		delete(w.installed, g)
	}
	w.mu.Unlock()
	w.p.TruncateRaft(uint64(g), uint64(replica), f.Index+1, f.Term, f.ConfState, func(err error) {
		if err != nil && !errors.Is(err, persistence.ErrClosed) {
			w.fail(fmt.Errorf("replication: group %d: truncate the log to %d: %w", g, f.Index+1, err))
		}
	})
}

// snapshotChores releases the snapshots nobody reads any more and tells
// the log which installed snapshots Badger flushed (budget loop).
func (w *WALPipeline) snapshotChores() {
	w.mu.Lock()
	for g := range w.snaps {
		w.releaseSnapsLocked(g)
	}
	var flushedCheck []GroupID
	for g := range w.installed {
		flushedCheck = append(flushedCheck, g)
	}
	w.mu.Unlock()
	for _, g := range flushedCheck {
		w.mu.Lock()
		replica := w.replica[g]
		w.mu.Unlock()
		w.truncate(g, replica)
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

// Close stops handing jobs on (the Done of applies still in the persistence
// pipeline is not called any more), stops the budget sweeper, waits for the
// open snapshot readers (close the transport first) and releases the
// snapshots' holds. It does not close the persistence pipeline.
func (w *WALPipeline) Close() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	_ = w.owner.Close(context.Background())
	// A reader reads Badger: it must end before the database closes (the
	// transport closes its streams' readers when it closes).
	w.readers.Wait()
	w.mu.Lock()
	for g := range w.snaps {
		w.releaseSnapsLocked(g) // readers still open release theirs on Close
	}
	w.mu.Unlock()
}
