package persistence

import (
	"errors"
	"fmt"
	"time"
)

// The committer: turns queued writes into log records, one sync per batch,
// and completes their tickets in order.

func (p *Pipeline) commitLoop() {
	defer p.done.Done()
	defer close(p.completions)
	defer p.applies.close()
	defer close(p.releaseCh)
	for {
		p.mu.Lock()
		for len(p.queue) == 0 && p.rsync == 0 && !p.closing {
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
		batch, rbatch := p.takeLocked() // the completion goroutine owns them from here
		closing := p.closing
		p.mu.Unlock()

		if len(batch) > 0 || len(rbatch) > 0 {
			p.commitBatch(batch, rbatch)
		}
		p.commitMu.Unlock()
		if closing && len(batch) == 0 && len(rbatch) == 0 {
			return
		}
	}
}

// takeLocked takes everything queued for a commit. p.mu is held.
func (p *Pipeline) takeLocked() ([]*Write, []*raftJob) {
	batch, rbatch := p.queue, p.rqueue
	p.queue, p.rqueue, p.rsync, p.queuedBytes = nil, nil, 0, 0
	return batch, rbatch
}

// completion is one batch for the completion goroutine: its writes, then its
// raft jobs, complete in order.
type completion struct {
	writes []*Write
	raft   []*raftJob
}

// commitBatch commits batch in as few transactions as the size budget allows and
// hands every write to the completion goroutine in order. The raft jobs ride in
// the last record (their entries go to Badger only once committed, so they do
// not count against a transaction's budget).
func (p *Pipeline) commitBatch(batch []*Write, rbatch []*raftJob) {
	limit := p.cfg.MaxWriteBytes
	start := 0
	size := 0
	for i, w := range batch {
		s := w.size
		if i > start && size+s > p.cfg.MaxCommitBytes {
			p.commitRun(batch[start:i], nil)
			start, size = i, 0
		}
		if s > limit {
			w.fail(fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, s, limit))
		}
		size += s
	}
	p.commitRun(batch[start:], rbatch)
	if len(rbatch) > 0 {
		p.completing.Add(1)
		p.completions <- completion{writes: batch, raft: rbatch}
		return
	}
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
	p.completions <- completion{writes: batch}
}

// inlineCompletion is the largest batch the committer completes itself.
const inlineCompletion = 1

// commitRun commits run as one record in the write-ahead log, synced once, setting
// err on each write that fails. The applier goroutine then applies the same changes
// to Badger at the record's sequence number, off the acknowledgement's path.
func (p *Pipeline) commitRun(run []*Write, rjobs []*raftJob) {
	p.mu.Lock()
	failErr := p.failErr
	p.mu.Unlock()
	payload := p.payload[:0]
	var live []*Write
	// Every write in live is counted in its chain's inLog until the record
	// ended: after committed moved past it, or after it failed (Chain.WaitLanded).
	defer func() {
		for _, w := range live {
			if w.Chain != nil {
				w.Chain.leaveLog()
			}
		}
	}()
	for _, w := range run {
		if w.err != nil {
			w.fail(w.err) // too large, or refused by submit: later writes of its chain fail too
			continue
		}
		if w.Chain != nil {
			w.Chain.enterLog() // before logs looks at whether it is retired
		}
		if !p.logs(w, failErr) {
			if w.Chain != nil {
				w.Chain.leaveLog()
			}
			continue
		}
		payload = appendWrite(payload, w)
		live = append(live, w)
	}
	var rlive []*raftJob
	if len(rjobs) > 0 {
		payload, rlive = p.encodeRaft(payload, rjobs, failErr)
	}
	p.payload = payload[:0]
	if len(live) == 0 && (len(rlive) == 0 || len(payload) == 0) {
		// Nothing to log (raft jobs that carry nothing but their order:
		// everything before them is durable). No empty record either: a zero
		// length is the log's end marker.
		return
	}
	if h := p.cfg.Hooks; h != nil && h.BeforeCommit != nil {
		h.BeforeCommit(len(live))
	}
	if plantedCommitDelay > 0 {
		time.Sleep(plantedCommitDelay) // the planted bug only: see plantedbug_off.go
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
		if p.unavailable.Swap(&unavailableAt{err: err, at: time.Now()}) == nil {
			p.cfg.Logger.Warn("refusing writes: the write-ahead log cannot start or zero a segment", "err", err)
		}
		for _, w := range live {
			w.fail(err)
		}
		for _, j := range rlive {
			j.err = err
		}
		return
	}
	if err != nil {
		p.fatal(fmt.Errorf("commit of %d writes: %w", len(live), err))
		for _, w := range live {
			w.fail(p.Failed())
		}
		for _, j := range rlive {
			j.err = p.Failed()
		}
		return
	}
	if len(rlive) > 0 {
		p.indexCommitted(rlive, p.db.wal.lastSeg, p.db.wal.lastPayloadAt)
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

// logs reports whether w goes into the record being built; if not, w has its
// outcome (failed), or is a barrier, which completes after the writes before
// it. failErr is the pipeline's failure, if any.
func (p *Pipeline) logs(w *Write, failErr error) bool {
	if w.Chain != nil {
		if err := w.Chain.Failed(); err != nil {
			w.err = err // a retired chain's error is not its failure: no w.fail
			return false
		}
	}
	if failErr != nil {
		w.fail(failErr)
		return false
	}
	if w.barrier() {
		return false // nothing to write
	}
	if p.cfg.Fence != nil {
		if err := p.cfg.Fence(w.Partition, w.Epoch); err != nil {
			w.fail(err)
			return false
		}
	}
	return true
}

// Unavailable returns why the last commit could not reach the write-ahead log
// although the log is sound (no descriptor or no space for a new segment), or
// nil. Writes fail with an error wrapping ErrUnavailable meanwhile; each new
// commit tries again, and the first that succeeds clears it. It answers nil
// once unavailableFor passed since that failure, so that a readiness probe
// lets writes come again and find out: nothing else tries the log.
//
// While Badger refuses the durable writes it is handed for a missing resource,
// it answers that (until Badger takes them again).
func (p *Pipeline) Unavailable() error {
	if u := p.applyUnavailable.Load(); u != nil {
		return u.err
	}
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

func (p *Pipeline) completeLoop() {
	defer p.done.Done()
	for c := range p.completions {
		p.complete(c.writes)
		completeRaft(c.raft)
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
