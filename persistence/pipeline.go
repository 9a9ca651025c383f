package persistence

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/pb"

	"github.com/holdfast/holdfast/internal/pipehook"
)

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
	// lost write ever reaches disk.
	Chain *Chain

	err    error // set by the goroutine committing it, before completion
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
// holding the pipeline's commitMu touches it.
type Chain struct{ err error }

// fail records w's failure on its chain.
func (w *Write) fail(err error) {
	w.err = err
	if w.Chain != nil && w.Chain.err == nil {
		w.Chain.err = err
	}
}

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

	mu      sync.Mutex
	queue   []*Write
	closing bool
	failErr error // set once a commit failed; guarded by mu
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

	completions chan []*Write
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
	// batches are the applied batches, oldest first, that a release may still
	// ask about (see DB.releasable); guarded by batchMu.
	batchMu sync.Mutex
	batches []appliedBatch

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
	if cfg.MaxApplyBacklog <= 0 {
		cfg.MaxApplyBacklog = 256 << 20
	}
	p := &Pipeline{
		seq:         db.lastSeq,
		db:          db,
		cfg:         cfg,
		wake:        make(chan struct{}, 1),
		completions: make(chan []*Write, 64),
		applies:     applyQueue{signal: make(chan struct{}, 1)},
		hurry:       make(chan struct{}, 1),
		releaseCh:   make(chan struct{}, 1),
		stopGC:      make(chan struct{}),
		flushes:     make(chan chan error),
	}
	p.committed.Store(db.lastSeq)
	p.applied.Store(db.lastSeq)
	p.discardAbove = db.lastSeq
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

// gcLoop reclaims Badger's value-log files every ValueLogGCEvery, until Close.
// A failed sync of what the GC rewrote fails the pipeline, as a failed commit
// does: what Badger's files hold is unknown after it.
//
// The GC can only reclaim garbage that Badger's compactions have found, and
// those compact tables, not memtables. A tree entry for a value in the value log
// is a small pointer, so a node that writes mostly such values fills a
// memtable (128 MiB) only after terabytes, and would never get its space back.
// So when the value log has grown by flushEveryFiles files since Badger last
// flushed its memtables for it, the applier flushes them (Pipeline.flushBadger)
// before the GC runs; Badger's compactions take it from there.
func (p *Pipeline) gcLoop() {
	defer p.done.Done()
	t := time.NewTicker(p.cfg.ValueLogGCEvery)
	defer t.Stop()
	var flushedAt uint64 // the newest value-log file at the last flush
	for {
		select {
		case <-p.stopGC:
			return
		case <-t.C:
		}
		if newest, err := p.db.vlog.newest(); err != nil {
			p.cfg.Logger.Warn("value log GC failed", "err", err)
		} else if newest >= flushedAt+flushEveryFiles {
			reply := make(chan error, 1)
			select {
			case p.flushes <- reply:
			case <-p.stopGC:
				return
			}
			if err := <-reply; err != nil {
				p.cfg.Logger.Warn("could not flush Badger's memtables for the value log GC", "err", err)
			}
			flushedAt = newest
		}
		n, err := p.db.collectValueLog(maxGCFiles, p.flushMemtables)
		if err == nil {
			p.reclaimed.Add(uint64(n))
		}
		switch {
		case errors.Is(err, errGCStopped):
			return
		case errors.Is(err, errRewriteSync):
			p.fatal(err)
			return
		case err != nil:
			p.cfg.Logger.Warn("value log GC failed", "err", err)
		case n > 0:
			p.cfg.Logger.Info("value log GC reclaimed files", "files", n)
		}
	}
}

// flushEveryFiles is how many value-log files Badger may start before the GC
// loop has the applier flush Badger's memtables.
const flushEveryFiles = 2

// flushBadger flushes Badger's memtables to tables. Badger has no call for that
// but DropPrefix, which flushes every memtable before it drops a prefix found
// in them; so it writes a marker key and drops it. DropPrefix refuses writes
// while it runs, so only the applier, Badger's one writer, calls it, between
// two batches. (The value-log GC writes too, but only in collectValueLog, on
// the GC loop, which waits for this.)
func (p *Pipeline) flushBadger() error {
	key := metaKey("flush-marker")
	txn := p.db.bdb.NewTransactionAt(math.MaxUint64, true)
	defer txn.Discard()
	if err := txn.Set(key, nil); err != nil {
		return err
	}
	if err := txn.CommitAt(p.applied.Load(), nil); err != nil {
		return err
	}
	return p.db.bdb.DropPrefix(key)
}

// maxGCFiles bounds the value-log files one GC round rewrites.
const maxGCFiles = 8

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

func (p *Pipeline) submit(w *Write, wake bool) *Ticket {
	p.mu.Lock()
	if p.closing || p.failErr != nil {
		err := ErrClosed
		if p.failErr != nil {
			err = p.failErr
		}
		p.mu.Unlock()
		p.failed.Add(1)
		w.ticket.complete(err)
		return &w.ticket
	}
	if backlog := p.applies.bytes.Load(); backlog > int64(p.cfg.MaxApplyBacklog) && !w.barrier() {
		p.mu.Unlock()
		p.failed.Add(1)
		w.ticket.complete(unavailableErr(fmt.Errorf("the database is %d MiB behind the write-ahead log (at most %d MiB)",
			backlog>>20, p.cfg.MaxApplyBacklog>>20)))
		return &w.ticket
	}
	if len(p.queue) == 0 {
		p.queuedAt = time.Now()
	}
	p.queue = append(p.queue, w)
	if wake {
		p.wakeLocked()
	}
	p.mu.Unlock()
	return &w.ticket
}

// wakeLocked wakes the committer if it is parked and writes wait. p.mu is held.
func (p *Pipeline) wakeLocked() {
	if !p.idle || len(p.queue) == 0 {
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
	batch := p.queue
	p.queue = nil
	p.mu.Unlock()
	p.commitBatch(batch)
	p.commitMu.Unlock()
	// Writes queued meanwhile woke the committer (Submit) or are their
	// queuers' to kick (Queue).
}

func (p *Pipeline) commitLoop() {
	defer p.done.Done()
	defer close(p.completions)
	defer p.applies.close()
	defer close(p.releaseCh)
	for {
		p.mu.Lock()
		for len(p.queue) == 0 && !p.closing {
			p.idle = true
			p.mu.Unlock()
			<-p.wake
			p.mu.Lock()
		}
		p.idle = false
		p.mu.Unlock()
		// A helper may be committing: wait for it, then take what is left,
		// so that batches commit in the order their writes were queued.
		p.commitMu.Lock()
		p.mu.Lock()
		batch := p.queue
		p.queue = nil // the completion goroutine owns batch from here
		closing := p.closing
		p.mu.Unlock()

		if len(batch) > 0 {
			p.commitBatch(batch)
		}
		p.commitMu.Unlock()
		if closing && len(batch) == 0 {
			return
		}
	}
}

// commitBatch commits batch in as few transactions as the size budget allows and
// hands every write to the completion goroutine in order.
func (p *Pipeline) commitBatch(batch []*Write) {
	limit := p.cfg.MaxWriteBytes
	start := 0
	size := 0
	for i, w := range batch {
		s := w.estimate()
		if i > start && size+s > p.cfg.MaxCommitBytes {
			p.commitRun(batch[start:i])
			start, size = i, 0
		}
		if s > limit {
			w.fail(fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, s, limit))
		}
		size += s
	}
	p.commitRun(batch[start:])
	// A lone write (a serial writer) completes right here, saving a goroutine
	// hand-off on the latency path. Larger batches go to the completion goroutine:
	// the next commit starts at once, and the writers it wakes are not queued on
	// the committer's P while the committer sits in its next fdatasync. Inline
	// only when the completion goroutine is idle, so that tickets still complete
	// in submission order.
	if len(batch) <= inlineCompletion && p.completing.Load() == 0 {
		p.complete(batch)
		return
	}
	p.completing.Add(1)
	p.completions <- batch
}

// inlineCompletion is the largest batch the committer completes itself.
const inlineCompletion = 1

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

// commitRun commits run as one record in the write-ahead log, synced once, setting
// err on each write that fails. The applier goroutine then applies the same changes
// to Badger at the record's sequence number, off the acknowledgement's path.
func (p *Pipeline) commitRun(run []*Write) {
	p.mu.Lock()
	failErr := p.failErr
	p.mu.Unlock()
	payload := p.payload[:0]
	var live []*Write
	for _, w := range run {
		if w.err != nil {
			continue
		}
		if w.Chain != nil && w.Chain.err != nil {
			w.err = w.Chain.err
			continue
		}
		if failErr != nil {
			w.fail(failErr)
			continue
		}
		if w.barrier() {
			continue // nothing to write; it completes after the writes before it
		}
		if p.cfg.Fence != nil {
			if err := p.cfg.Fence(w.Partition, w.Epoch); err != nil {
				w.fail(err)
				continue
			}
		}
		payload = appendWrite(payload, w)
		live = append(live, w)
	}
	p.payload = payload[:0]
	if len(live) == 0 {
		return
	}
	if h := p.cfg.Hooks; h != nil && h.BeforeCommit != nil {
		h.BeforeCommit(len(live))
	}
	seq := p.seq + 1
	syncStart := time.Now()
	err := p.db.wal.commit(seq, payload)
	if err == nil && p.cfg.OnCommit != nil {
		p.cfg.OnCommit(len(live), time.Since(syncStart))
	}
	if errors.Is(err, ErrUnavailable) {
		// Nothing was written, and the log can take the next commit: fail
		// these writes alone (the sequence number is used again).
		p.unavailable.Store(&unavailableAt{err: err, at: time.Now()})
		p.cfg.Logger.Warn("refusing writes: the write-ahead log cannot start or zero a segment", "err", err)
		for _, w := range live {
			w.fail(err)
		}
		return
	}
	if err != nil {
		p.fatal(fmt.Errorf("commit of %d writes: %w", len(live), err))
		for _, w := range live {
			w.fail(p.Failed())
		}
		return
	}
	if p.unavailable.Load() != nil {
		p.unavailable.Store(nil)
		p.cfg.Logger.Info("the write-ahead log takes writes again")
	}
	// Badger gets the record once it is durable, so that it never holds a
	// version the log could lose; the applier works on it while the log writes
	// and syncs the next one.
	p.applies.push(applyJob{seq: seq, writes: live})
	p.seq = seq
	p.committed.Store(seq)
	p.commits.Add(1)
	select { // the releaser looks at the log once a second at most
	case p.releaseCh <- struct{}{}:
	default:
	}
}

// Unavailable returns why the last commit could not reach the write-ahead log
// although the log is sound (no descriptor or no space for a new segment), or
// nil. Writes fail with an error wrapping ErrUnavailable meanwhile; each new
// commit tries again, and the first that succeeds clears it. It answers nil
// once unavailableFor passed since that failure, so that a readiness probe
// lets writes come again and find out: nothing else tries the log.
func (p *Pipeline) Unavailable() error {
	if u := p.unavailable.Load(); u != nil && time.Since(u.at) < unavailableFor {
		return u.err
	}
	return nil
}

// unavailableFor is how long Unavailable reports a failed segment start.
const unavailableFor = 10 * time.Second

type unavailableAt struct {
	err error
	at  time.Time
}

// fatal stops the pipeline for good: every later write fails, and the node must
// restart (replaying the log brings Badger back in line with it).
func (p *Pipeline) fatal(err error) {
	err = fmt.Errorf("%w: %v", ErrFailed, err)
	p.mu.Lock()
	if p.failErr == nil {
		p.failErr = err
		p.stopped.Store(true)
		p.mu.Unlock()
		p.cfg.Logger.Error("storage failed; refusing every request until restart", "err", err)
		return
	}
	p.mu.Unlock()
}

// applyJob is one committed record for the applier.
type applyJob struct {
	seq    uint64
	writes []*Write
	size   int // estimate()
}

// applyQueue holds the committed records the applier has not taken yet.
type applyQueue struct {
	mu     sync.Mutex
	jobs   []applyJob
	closed bool
	signal chan struct{} // cap 1: something was pushed, or the queue closed
	bytes  atomic.Int64  // the estimated bytes of the records not yet applied
}

func (q *applyQueue) push(j applyJob) {
	j.size = j.estimate()
	q.bytes.Add(int64(j.size))
	q.mu.Lock()
	q.jobs = append(q.jobs, j)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

func (q *applyQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// take appends to jobs the queued records, oldest first, while their bytes
// stay under limit (at least one), and reports whether the queue is closed
// and empty.
func (q *applyQueue) take(jobs []applyJob, size, limit int) ([]applyJob, int, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for n < len(q.jobs) && (len(jobs) == 0 || size < limit) {
		jobs = append(jobs, q.jobs[n])
		size += q.jobs[n].size
		n++
	}
	rest := copy(q.jobs, q.jobs[n:])
	clear(q.jobs[rest:])
	q.jobs = q.jobs[:rest]
	return jobs, size, q.closed && len(q.jobs) == 0
}

// appliedBatch is one batch the applier wrote into Badger: the records first
// to version, all at version (see DB.releasable).
type appliedBatch struct{ first, version uint64 }

// applyLoop applies committed records to Badger in order and marks their
// tickets applied. When records wait for it (Badger falls behind the log), it
// applies them together, as one batch at the newest one's sequence number
// (applyMergeBytes bounds it): a key written by several of them
// goes to Badger once, with its newest value, so that Badger's work shrinks
// when it is the bottleneck. Reads are always at the newest version, and a
// version is only ever compared with an older mark ("changed after"), which a
// higher version still passes, so nothing can tell the records apart.
//
// When its first record is small (under applySmall), it waits applyWait before
// it takes the records queued behind it: a serial writer's records then reach
// Badger several per batch. Each batch costs several goroutine hand-offs (the
// applier, Badger's writer, its value-size tracker). WaitApplied cuts the wait
// short.
//
// A batch Badger refuses is tried again: for as long as the cause is a
// resource that may come back (descriptors, space, memory; the write-ahead
// log holds the records meanwhile, and overlays serve their reads), or
// applyAttempts times for anything else, after which the pipeline fails.
// Neither the batch's tickets nor the applied mark move until it is in Badger.
func (p *Pipeline) applyLoop() {
	defer p.done.Done()
	var jobs []applyJob
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-p.applies.signal:
		case reply := <-p.flushes:
			reply <- p.flushBadger()
			continue
		}
		for {
			var size int
			var drained bool
			jobs, size, drained = p.applies.take(jobs[:0], 0, 1)
			if len(jobs) == 0 {
				if drained {
					p.finishApplied()
					return
				}
				break
			}
			if size < applySmall {
				timer.Reset(applyWait)
				select {
				case <-timer.C:
				case <-p.hurry:
					timer.Stop()
				}
			}
			jobs, size, _ = p.applies.take(jobs, size, applyMergeBytes)
			if !p.applyJobs(jobs) {
				p.finishApplied()
				return
			}
			p.applies.bytes.Add(-int64(size))
			clear(jobs) // do not keep the writes alive
		}
	}
}

// applyJobs writes jobs into Badger, retrying as applyLoop says, and marks
// them applied. It returns false once the pipeline failed.
func (p *Pipeline) applyJobs(jobs []applyJob) bool {
	first, last := jobs[0].seq, jobs[len(jobs)-1].seq
	if h := p.cfg.Hooks; h != nil && h.BeforeApply != nil {
		for _, j := range jobs {
			h.BeforeApply(j.seq)
		}
	}
	for attempt := 1; ; attempt++ {
		err := p.apply(jobs)
		if err == nil {
			break
		}
		if p.Failed() != nil {
			return false
		}
		if !transient(err) && attempt >= applyAttempts {
			// The records are durable in the log; Badger lags behind it until
			// the node restarts and replays them.
			p.fatal(fmt.Errorf("apply seq %d..%d to badger (%d attempts): %w", first, last, attempt, err))
			return false
		}
		p.cfg.Logger.Warn("could not apply durable writes to Badger; trying again", "seq_from", first, "seq_to", last, "attempt", attempt, "err", err)
		p.unavailable.Store(&unavailableAt{err: unavailableErr(fmt.Errorf("the database cannot take writes: %w", err)), at: time.Now()})
		select {
		case <-time.After(applyBackoff(attempt)):
		case <-p.stopGC:
			// Closing: the log keeps these records (DB.Close sees that
			// Badger lacks some), and the next start replays them.
			return false
		}
	}
	p.batchMu.Lock()
	p.batches = append(p.batches, appliedBatch{first: first, version: last})
	p.batchMu.Unlock()
	p.holdMu.Lock()
	p.discardAbove = last
	p.updateDiscardLocked()
	p.holdMu.Unlock()
	for _, j := range jobs {
		for _, w := range j.writes {
			w.ticket.applied.Store(true)
		}
	}
	p.applyMu.Lock()
	p.applied.Store(last)
	p.applyCond.Broadcast()
	p.applyMu.Unlock()
	return true
}

// applyAttempts is how often the applier tries a batch Badger refuses for a
// reason other than a missing resource.
const applyAttempts = 3

// applyBackoff is the wait before attempt+1: 10 ms, doubling, at most 1 s.
func applyBackoff(attempt int) time.Duration {
	return min(10*time.Millisecond<<min(attempt-1, 7), time.Second)
}

// finishApplied releases every waiter once nothing more will be applied: the
// pipeline closed, or failed (WaitApplied then reports the failure).
func (p *Pipeline) finishApplied() {
	p.applyMu.Lock()
	p.applyDone = true
	p.applyCond.Broadcast()
	p.applyMu.Unlock()
}

// applyWait is how long the applier waits for more records after a first one
// of fewer than applySmall bytes. A record's writer never waits for it: it was
// acknowledged once durable, and the object's overlay serves its reads until
// Badger shows it.
var applyWait = 2 * time.Millisecond // a variable for tests

const applySmall = 64 << 10

// applyMergeBytes bounds the records the applier merges into one batch, far
// below Badger's limit for one write request (15% of a memtable). A variable
// for tests.
var applyMergeBytes = 4 << 20

func (j applyJob) estimate() int {
	n := 0
	for _, w := range j.writes {
		n += w.estimate()
	}
	return n
}

// WaitApplied waits until Badger shows every write acknowledged before the
// call. An object activation calls it before reading its state, so that it
// never misses a write of an earlier activation that is durable but not yet
// applied. It fails when ctx ends first, and when the pipeline stopped before
// Badger got those writes (a failed or closed pipeline): reads of Badger would
// then miss acknowledged writes.
func (p *Pipeline) WaitApplied(ctx context.Context) error {
	target := p.committed.Load()
	if p.applied.Load() >= target {
		return nil
	}
	select { // the applier need not wait for more records
	case p.hurry <- struct{}{}:
	default:
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			p.applyMu.Lock()
			p.applyCond.Broadcast()
			p.applyMu.Unlock()
		})
		defer stop()
	}
	p.applyMu.Lock()
	defer p.applyMu.Unlock()
	for p.applied.Load() < target {
		if p.applyDone {
			if err := p.Failed(); err != nil {
				return err
			}
			return ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		p.applyCond.Wait()
	}
	return nil
}

// apply writes the changes of jobs (records in sequence order) to Badger at
// the last record's sequence number, each key once with its newest value.
//
// A large batch goes to Badger in key order, through its KVLoader, which
// writes the entries as given, without a transaction. Key order is what makes
// it cheap: Badger inserts every key into its memtable's skiplist by a search
// from the top, and keys in order walk almost the same path one after the
// other, through memory the previous search just touched, where a
// transaction's keys come out of a map in random order (measured against
// transactions: 1,000 objects 1.16x the writes per second, single records over
// 1,000 logs 1.06x–1.07x). A small batch goes in one transaction: a KVLoader
// allocates two buffers of Badger's largest request count (1.6 MiB each at
// 128 MiB memtables), which only a large batch repays (a serial writer was
// 0.94x through a KVLoader).
//
// Badger may split a large batch into several of its write requests, and so
// across two memtables: DB.releasable accounts for that. Atomicity across a
// crash comes from the log, not from Badger: every record here is durable in
// the log already, and a restart replays the log over whatever part of it
// Badger kept.
func (p *Pipeline) apply(jobs []applyJob) error {
	if testApplyFault != nil {
		if err := testApplyFault(); err != nil {
			return err
		}
	}
	entries := p.sorted[:0]
	for _, job := range jobs {
		for _, w := range job.writes {
			for _, kv := range w.Sets {
				entries = append(entries, applyEntry{key: kv.Key, value: kv.Value, ord: len(entries)})
			}
			for _, k := range w.Deletes {
				entries = append(entries, applyEntry{key: k, del: true, ord: len(entries)})
			}
		}
	}
	slices.SortFunc(entries, func(a, b applyEntry) int {
		if c := bytes.Compare(a.key, b.key); c != 0 {
			return c
		}
		return cmp.Compare(a.ord, b.ord)
	})
	// Keep the last change of each key.
	n := 0
	for i, e := range entries {
		if i+1 < len(entries) && bytes.Equal(entries[i+1].key, e.key) {
			continue
		}
		entries[n] = e
		n++
	}
	defer func() {
		clear(entries) // do not keep the writes alive
		p.sorted = entries[:0]
	}()
	version := jobs[len(jobs)-1].seq
	if n < applyLoaderEntries {
		err := p.applyTxn(entries[:n], version)
		if !errors.Is(err, badger.ErrTxnTooBig) {
			return err
		}
	}
	return p.applyLoader(entries[:n], version)
}

// applyLoaderEntries is the smallest batch, in keys, that the applier sends
// through a KVLoader rather than a transaction.
const applyLoaderEntries = 1024

// applyTxn writes entries as one Badger transaction at version, or nothing and
// badger.ErrTxnTooBig when they do not fit in one.
func (p *Pipeline) applyTxn(entries []applyEntry, version uint64) error {
	txn := p.db.bdb.NewTransactionAt(math.MaxUint64, true)
	defer txn.Discard()
	for _, e := range entries {
		var err error
		if e.del {
			err = txn.Delete(e.key)
		} else {
			err = txn.Set(e.key, e.value)
		}
		if err != nil {
			return err
		}
	}
	return txn.CommitAt(version, nil)
}

// applyLoader writes entries, in their order, through a KVLoader at version,
// in as many write requests as Badger needs.
func (p *Pipeline) applyLoader(entries []applyEntry, version uint64) error {
	kvs := p.kvs[:0]
	defer func() {
		clear(kvs) // do not keep the writes alive
		p.kvs = kvs[:0]
	}()
	for _, e := range entries {
		var meta []byte
		if e.del {
			meta = badgerDeleteMeta
		}
		kvs = append(kvs, pb.KV{Key: e.key, Value: e.value, Version: version, Meta: meta})
	}
	loader := p.db.bdb.NewKVLoader(4)
	for i := range kvs {
		if err := loader.Set(&kvs[i]); err != nil {
			_ = loader.Finish()
			return err
		}
	}
	return loader.Finish()
}

// applyEntry is one change of a batch the applier sends to Badger; ord is its
// place in the batch, so that the later of two changes of a key wins.
type applyEntry struct {
	key, value []byte
	del        bool
	ord        int
}

// badgerDeleteMeta is the meta byte of a Badger entry that deletes its key
// (badger's bitDelete, part of its on-disk format), which a KVLoader entry
// carries in pb.KV.Meta.
var badgerDeleteMeta = []byte{1}

// releaseLoop gives up log segments that Badger has flushed, at most once a
// second, after commits. It runs on its own goroutine because a release syncs
// files and a directory: on the committer, or on a writer's goroutine in
// Help, those syncs would hold commitMu and every commit behind them.
func (p *Pipeline) releaseLoop() {
	defer p.done.Done()
	for range p.releaseCh {
		flushed := p.db.releasable(p.batchFirst)
		if testReleaseUnflushed {
			flushed = p.applied.Load()
		}
		if p.db.wal.segments() >= 2 {
			if err := p.db.wal.release(flushed, p.db.vlog.syncValueLog); err != nil {
				p.cfg.Logger.Warn("could not release write-ahead log segments", "err", err)
			}
		}
		p.forgetBatches(flushed)
		select {
		case <-time.After(releaseEvery):
		case <-p.stopGC:
		}
	}
}

// releaseEvery is the least time between two releases.
const releaseEvery = time.Second

// batchFirst returns the first record of the applied batch at version, or
// version itself when no batch is known at it (a version the applier did not
// write: the partitions record, a flush marker).
func (p *Pipeline) batchFirst(version uint64) uint64 {
	p.batchMu.Lock()
	defer p.batchMu.Unlock()
	i, found := slices.BinarySearchFunc(p.batches, version, func(b appliedBatch, v uint64) int { return cmp.Compare(b.version, v) })
	if found {
		return p.batches[i].first
	}
	if i < len(p.batches) && p.batches[i].first <= version {
		return p.batches[i].first // inside a batch (cannot happen: tables hold batch versions)
	}
	return version
}

// forgetBatches drops the applied batches wholly at or below seq.
func (p *Pipeline) forgetBatches(seq uint64) {
	p.batchMu.Lock()
	defer p.batchMu.Unlock()
	n := 0
	for n < len(p.batches) && p.batches[n].version <= seq {
		n++
	}
	p.batches = append(p.batches[:0], p.batches[n:]...)
}

func (p *Pipeline) completeLoop() {
	defer p.done.Done()
	for batch := range p.completions {
		p.complete(batch)
		p.completing.Add(-1)
	}
}

func (p *Pipeline) complete(batch []*Write) {
	for _, w := range batch {
		if w.err == nil && p.cfg.AckFence != nil && !w.barrier() {
			if err := p.cfg.AckFence(w.Partition, w.Epoch); err != nil {
				w.err = fmt.Errorf("%w (the write is durable but was not acknowledged)", err)
			}
		}
		if w.err != nil {
			p.failed.Add(1)
		} else {
			p.writes.Add(1)
		}
		w.ticket.complete(w.err)
	}
}

// barrier reports whether w changes nothing: it only marks a point in the
// pipeline's order (see Barrier).
func (w *Write) barrier() bool { return len(w.Sets) == 0 && len(w.Deletes) == 0 }

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

// HoldVersions keeps every version above seq, deletions included, from Badger's
// compaction until release is called: a partition handoff reads the changes made
// after seq, and needs the deletions among them. Holds nest.
func (p *Pipeline) HoldVersions(seq uint64) (release func()) {
	p.holdMu.Lock()
	defer p.holdMu.Unlock()
	if p.holds == nil {
		p.holds = map[*uint64]struct{}{}
	}
	h := new(uint64)
	*h = seq
	p.holds[h] = struct{}{}
	p.updateDiscardLocked()
	return func() {
		p.holdMu.Lock()
		defer p.holdMu.Unlock()
		delete(p.holds, h)
		p.updateDiscardLocked()
	}
}

// updateDiscardLocked sets Badger's discard version, the version at or below
// which it may drop old versions: the newest applied one, or the lowest live
// hold if that is lower. It is the only place that sets it; holdMu is held.
func (p *Pipeline) updateDiscardLocked() {
	v := p.discardAbove
	for h := range p.holds {
		if *h < v {
			v = *h
		}
	}
	p.db.bdb.SetDiscardTs(v)
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
