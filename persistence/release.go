package persistence

import (
	"cmp"
	"slices"
	"time"
)

// The releaser: gives up log segments whose records Badger holds in synced
// tables.

// releaseLoop gives up log segments that Badger has flushed, at most once a
// second, after commits. It runs on its own goroutine because a release syncs
// files and a directory: on the committer, or on a writer's goroutine in
// Help, those syncs would hold commitMu and every commit behind them.
func (p *Pipeline) releaseLoop() {
	defer p.done.Done()
	for range p.releaseCh {
		var flushed uint64
		if p.db.replicated {
			var err error
			if flushed, err = p.releasableReplicated(); err != nil {
				p.cfg.Logger.Warn("could not release write-ahead log segments", "err", err)
			}
		} else {
			flushed = p.db.releasable(p.batchFirst)
		}
		if testReleaseUnflushed {
			flushed = p.applied.Load()
		}
		if p.db.wal.segments() >= 2 {
			if err := p.db.wal.release(flushed, p.db.vlog.syncValueLog); err != nil {
				p.cfg.Logger.Warn("could not release write-ahead log segments", "err", err)
			}
		}
		if !p.db.replicated {
			p.forgetBatches(flushed)
		}
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
