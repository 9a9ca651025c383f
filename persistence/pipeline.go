package persistence

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4/pb"

	"github.com/holdfast/holdfast/internal/pipehook"
)

// PipelineConfig configures a Pipeline.
type PipelineConfig struct {
	// MaxCommitBytes bounds the estimated size of one batched commit. A single write
	// larger than this commits alone. Zero means 8 MiB.
	MaxCommitBytes int
	// MaxWriteBytes bounds one write; a larger one fails with ErrTooLarge. Zero
	// means 64 MiB.
	MaxWriteBytes int
	// Fence, if set, is asked at commit time whether a write tagged with partition
	// and epoch may still commit; a non-nil error fails that write alone.
	Fence func(partition uint32, epoch uint64) error
	// AckFence, if set, is asked again once a write is durable, just before it is
	// acknowledged: a non-nil error turns the acknowledgement into that error (the
	// write is on disk, but its writer is told its outcome is unknown). A cluster
	// node uses it to stop acknowledging when its ownership lease may have lapsed
	// during the sync.
	AckFence func(partition uint32, epoch uint64) error
	// Logger receives commit failures. Nil means slog.Default().
	Logger *slog.Logger
	// Hooks are test hooks; only this module's tests can make them (see
	// internal/pipehook). Nil in every program.
	Hooks *pipehook.Hooks
	// OnCommit, if set, is called on the goroutine committing after each commit
	// that reached disk, with the writes it covered and the time of its log
	// write and sync (metrics).
	OnCommit func(writes int, sync time.Duration)
	// ValueLogGCEvery is how often the pipeline looks for value-log files to
	// reclaim (see valuelog.go). Zero means a minute; negative, never.
	ValueLogGCEvery time.Duration
	// MaxQueuedBytes bounds the estimated bytes of the writes (and raft
	// appends) waiting for the committer; past it, new writes fail with ErrUnavailable (a 503 with
	// retryAfterMs) instead of piling up in memory while the disk is slow. A
	// write alone in the queue is always taken. Zero means 256 MiB.
	MaxQueuedBytes int
	// MaxApplyBacklog bounds the bytes of durable writes that Badger has yet
	// to take; past it, new writes fail with ErrUnavailable (a 503 with
	// retryAfterMs) until Badger catches up. Zero means 256 MiB.
	MaxApplyBacklog int
}

// PipelineStats counts the pipeline's work since Start.
type PipelineStats struct {
	Commits uint64 // Badger transactions committed, each covered by one sync
	Writes  uint64 // writes made durable
	Failed  uint64 // writes failed (fenced, too large, storage failure, closed)
	// ValueLogReclaimed counts the value-log files the value-log GC rewrote
	// and deleted.
	ValueLogReclaimed uint64
}

// Pipeline is the node's group commit: one goroutine turns the writes of every
// actor into as few synced Badger commits as possible.
type Pipeline struct {
	db  *DB
	cfg PipelineConfig

	sorted []applyEntry // the applier's buffer, reused
	kvs    []pb.KV      // the applier's KVLoader entries, reused

	// commitMu is held while a batch commits and completes: by the committer
	// goroutine, or by a writer's goroutine helping while the committer is
	// parked (Help). The committer locks it before mu; Help only tries it
	// while holding mu.
	commitMu sync.Mutex

	mu    sync.Mutex
	queue []*Write
	// rqueue is the raft jobs waiting for the committer (raftappend.go), in
	// their order; rsync counts those that need a commit (the others ride in
	// the next one). Guarded by mu.
	rqueue []*raftJob
	rsync  int
	// queuedBytes estimates the bytes of the writes in queue; guarded by mu.
	queuedBytes int
	closing     bool
	failErr     error // set once a commit failed; guarded by mu
	// stopped is set right after failErr, so that Failed, which every request
	// calls, need not take mu while nothing failed.
	stopped atomic.Bool
	// idle is set while the committer is parked and nobody has woken it;
	// guarded by mu. Only then does a write need a wake-up, or may a writer
	// commit on its own goroutine.
	idle bool
	// queuedAt is when the queue last became non-empty; guarded by mu.
	queuedAt time.Time
	wake     chan struct{}

	completions chan completion
	completing  atomic.Int32 // batches sent to the completion goroutine, not yet completed
	// applies is the committed records the applier has yet to write into
	// Badger. It is unbounded so that a slow Badger never blocks the committer
	// (which holds commitMu, on which every writer's Help tries); the bytes it
	// holds are bounded instead: past MaxApplyBacklog, new writes are refused
	// with ErrUnavailable (submit).
	applies   applyQueue
	hurry     chan struct{} // WaitApplied to the applier: apply what you hold now
	releaseCh chan struct{} // the committer to the releaser: a commit happened
	// unavailable is the last commit that could not start or zero a log
	// segment (nil once one succeeds); see Unavailable.
	unavailable atomic.Pointer[unavailableAt]
	// applyUnavailable is the applier's: set while Badger refuses a batch for
	// a missing resource, nil once it takes one.
	applyUnavailable atomic.Pointer[unavailableAt]
	// batches are the applied batches, oldest first, that a release may still
	// ask about (see DB.releasable); guarded by batchMu.
	batchMu sync.Mutex
	batches []appliedBatch
	// Replicated mode (releasableReplicated): the newest record, and each
	// replica's newest applied state, Badger holds in synced tables; guarded
	// by batchMu.
	flushedSeq     uint64
	flushedApplied map[raftKey]RaftAppliedState
	// lastApplied is each replica's newest applied state the applier wrote
	// since the start (CaptureRaftSnapshot); applier-owned.
	lastApplied map[raftKey]RaftAppliedState
	releaseMu   sync.Mutex // held by releasableReplicated

	// committed and applied are the sequence numbers of the last record made
	// durable and the last one the applier is done with; applyCond signals applied.
	committed, applied atomic.Uint64
	applyMu            sync.Mutex
	applyCond          *sync.Cond
	applyDone          bool // guarded by applyMu: the applier has stopped
	done               sync.WaitGroup
	stopGC             chan struct{}   // closed by Close
	flushes            chan chan error // the GC loop asks the applier to flush Badger's memtables

	commits, writes, failed atomic.Uint64
	reclaimed               atomic.Uint64 // value-log files

	// holdMu makes one owner of Badger's discard version: the applier (as it
	// applies) and HoldVersions (a handoff reading changes above a version)
	// both set it through updateDiscardLocked, under holdMu, so that neither
	// can override the other (a discard version above a live hold would let
	// Badger drop the changes the hold protects).
	holdMu       sync.Mutex
	holds        map[*uint64]struct{}
	discardAbove uint64 // the newest version applied, as of the last update

	// Owned by whoever holds commitMu.
	seq     uint64 // sequence number (Badger version) of the last commit
	payload []byte // reused record buffer
}

// NewPipeline returns a pipeline over db. Start it before submitting writes.
func NewPipeline(db *DB, cfg PipelineConfig) *Pipeline {
	if cfg.MaxCommitBytes <= 0 {
		cfg.MaxCommitBytes = 8 << 20
	}
	if cfg.MaxWriteBytes <= 0 {
		cfg.MaxWriteBytes = 64 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ValueLogGCEvery == 0 {
		cfg.ValueLogGCEvery = time.Minute
	}
	if cfg.MaxQueuedBytes <= 0 {
		cfg.MaxQueuedBytes = 256 << 20
	}
	if cfg.MaxApplyBacklog <= 0 {
		cfg.MaxApplyBacklog = 256 << 20
	}
	p := &Pipeline{
		seq:         db.lastSeq,
		db:          db,
		cfg:         cfg,
		wake:        make(chan struct{}, 1),
		completions: make(chan completion, 64),
		applies:     applyQueue{signal: make(chan struct{}, 1)},
		hurry:       make(chan struct{}, 1),
		releaseCh:   make(chan struct{}, 1),
		stopGC:      make(chan struct{}),
		flushes:     make(chan chan error),
	}
	p.committed.Store(db.lastSeq)
	p.applied.Store(db.lastSeq)
	p.discardAbove = db.lastSeq
	if db.replicated {
		p.discardAbove = db.version
		p.flushedApplied = map[raftKey]RaftAppliedState{}
		p.lastApplied = map[raftKey]RaftAppliedState{}
	}
	p.applyCond = sync.NewCond(&p.applyMu)
	return p
}

// Start starts the committer and completion goroutines.
func (p *Pipeline) Start() {
	p.done.Add(4)
	go p.commitLoop()
	go p.completeLoop()
	go p.applyLoop()
	go p.releaseLoop()
	if p.cfg.ValueLogGCEvery > 0 {
		p.done.Add(1)
		go p.gcLoop()
	}
}

// Close stops accepting writes, commits every write already submitted, completes
// their tickets, and waits for the pipeline's goroutines.
func (p *Pipeline) Close() {
	p.mu.Lock()
	already := p.closing
	p.closing = true
	p.idle = false
	p.mu.Unlock()
	if already {
		return
	}
	close(p.stopGC)
	select {
	case p.wake <- struct{}{}:
	default:
	}
	p.done.Wait()
	if p.applied.Load() < p.committed.Load() {
		p.db.keepLog = true // Badger lacks durable records: the next Open replays them
	}
}

// Stats returns the pipeline's counters.
func (p *Pipeline) Stats() PipelineStats {
	return PipelineStats{Commits: p.commits.Load(), Writes: p.writes.Load(), Failed: p.failed.Load(), ValueLogReclaimed: p.reclaimed.Load()}
}

// Queued returns the number of writes waiting for the committer (not counting
// the ones it is committing).
func (p *Pipeline) Queued() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}

// Submit queues w for the next commit and returns its ticket at once; it never
// waits for disk. w must not be changed or submitted again afterwards.
func (p *Pipeline) Submit(w *Write) *Ticket { return p.submit(w, true) }

// Queue queues w like Submit but does not wake the committer: the caller must
// call Help or Kick soon, once it has nothing more to queue. An object's turn
// queues its writes this way, and the goroutine that ran the turn then commits
// them itself when the committer is idle (one writer at a time: no hand-off to
// the committer and back on the write's path).
func (p *Pipeline) Queue(w *Write) *Ticket { return p.submit(w, false) }

// refusalLocked is why the pipeline takes nothing more (its failure, or
// ErrClosed once closing), or nil. p.mu is held.
func (p *Pipeline) refusalLocked() error {
	if p.failErr != nil {
		return p.failErr
	}
	if p.closing {
		return ErrClosed
	}
	return nil
}

func (p *Pipeline) submit(w *Write, wake bool) *Ticket {
	w.size = w.estimate() // once, outside the lock: the bounds, the batching and the applier use it
	p.mu.Lock()
	if err := p.refusalLocked(); err != nil {
		p.mu.Unlock()
		p.failed.Add(1)
		w.ticket.complete(err)
		return &w.ticket
	}
	// Past a bound, the write is refused, but still queued: it completes in
	// order with the writes around it, and the committer fails the rest of
	// its chain (commitRun), so that no later write of its writer lands.
	size := w.size
	switch backlog := p.applies.bytes.Load(); {
	case w.barrier():
	case backlog > int64(p.cfg.MaxApplyBacklog):
		w.err = unavailableErr(fmt.Errorf("the database is %d MiB behind the write-ahead log (at most %d MiB)",
			backlog>>20, p.cfg.MaxApplyBacklog>>20))
	case p.queuedBytes+size > p.cfg.MaxQueuedBytes && (len(p.queue) > 0 || len(p.rqueue) > 0):
		w.err = unavailableErr(fmt.Errorf("%d MiB of writes wait for the disk (at most %d MiB)",
			p.queuedBytes>>20, p.cfg.MaxQueuedBytes>>20))
	}
	if w.err != nil {
		size = 0 // its data is not written
	}
	if len(p.queue) == 0 {
		p.queuedAt = time.Now()
	}
	p.queue = append(p.queue, w)
	p.queuedBytes += size
	if wake {
		p.wakeLocked()
	}
	p.mu.Unlock()
	return &w.ticket
}

// wakeLocked wakes the committer if it is parked and writes wait. p.mu is held.
func (p *Pipeline) wakeLocked() {
	if !p.idle || (len(p.queue) == 0 && p.rsync == 0) {
		return // the committer looks at the queue again before it parks
	}
	p.idle = false
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Kick wakes the committer for the writes Queue left waiting.
func (p *Pipeline) Kick() {
	p.mu.Lock()
	p.wakeLocked()
	p.mu.Unlock()
}

// KickStale wakes the parked committer if writes have waited longer than age,
// and reports whether it had to. Every Queue is followed by a Kick or a Help
// within a turn, so this is a backstop that finds nothing to do; true means
// a path that queued writes forgot to commit them.
func (p *Pipeline) KickStale(age time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.idle || len(p.queue) == 0 || time.Since(p.queuedAt) < age {
		return false
	}
	p.wakeLocked()
	return true
}

// Help commits the waiting writes on the calling goroutine, synced and
// completed as the committer would, if the committer is parked; otherwise it
// only makes sure the committer will see them (Kick). The caller must be free
// to block for a sync, and must hold no lock a completion callback takes.
//
// Why: a serial writer's write used to go to the committer goroutine and its
// acknowledgement back, two hand-offs between threads. On this project's
// 2-core virtual machine a goroutine woken on the other core costs 8-9 µs (a
// futex wake and an inter-processor interrupt), and a write waited about 20 µs
// in all for them; one writer, one write at a time, was 1.22x faster with
// Help (8 of 8 pairs; docs/benchmarks.md, session 11). Under load the
// committer is never parked, so Help is a Kick and group commit is unchanged.
func (p *Pipeline) Help() {
	p.mu.Lock()
	if !p.idle || len(p.queue) == 0 || p.closing || !p.commitMu.TryLock() {
		p.wakeLocked()
		p.mu.Unlock()
		return
	}
	batch, rbatch := p.takeLocked()
	p.mu.Unlock()
	p.commitBatch(batch, rbatch)
	p.commitMu.Unlock()
	// Writes queued meanwhile woke the committer (Submit) or are their
	// queuers' to kick (Queue).
}

// Barrier waits until every write submitted before the call has its outcome:
// committed and synced, or failed. Writes a fence refuses from now on cannot
// commit afterwards, so a caller that changed what the fence accepts and then
// passes a barrier knows that nothing it no longer accepts will reach disk.
func (p *Pipeline) Barrier(ctx context.Context) error {
	err := p.Submit(&Write{}).Wait(ctx)
	if errors.Is(err, ErrClosed) {
		return nil // closing commits everything submitted before
	}
	return err
}

// Failed returns the storage failure that stopped the pipeline, or nil.
func (p *Pipeline) Failed() error {
	if !p.stopped.Load() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failErr
}

// AppliedSeq returns the sequence number up to which Badger shows every
// commit. Tickets are marked applied before it moves past them.
func (p *Pipeline) AppliedSeq() uint64 { return p.applied.Load() }

// Committed returns the sequence number (Badger version) of the last durable
// commit.
func (p *Pipeline) Committed() uint64 { return p.committed.Load() }
