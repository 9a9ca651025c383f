package persistence

import (
	"errors"
	"math"
	"time"
)

// The value-log GC loop: reclaims Badger's value-log files (see valuelog.go).

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
	version := p.applied.Load()
	if p.db.replicated {
		version = p.db.version // the applier's goroutine owns it: this runs there
	}
	if err := txn.CommitAt(version, nil); err != nil {
		return err
	}
	return p.db.bdb.DropPrefix(key)
}

// maxGCFiles bounds the value-log files one GC round rewrites.
const maxGCFiles = 8
