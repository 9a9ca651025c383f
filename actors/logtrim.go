package actors

import (
	"fmt"

	"github.com/holdfast/holdfast/persistence"
)

// Retention and trimming of the retained log (log.go): which hot records a
// trim removes, in runs, and moves to the cold store when there is one.
// retention returns whether the hot record at offset hot, with cumHot payload
// bytes before it, appended at `at`, is past the type's retention.

func (o *object) retention(l *logState) func(hot, cumHot uint64, at int64) bool {
	opts := o.opts.Log
	cutoff := int64(-1) // records appended before it are too old
	if opts.MaxAge > 0 {
		cutoff = o.h.now().Add(-opts.MaxAge).UnixMilli()
	}
	return func(hot, cumHot uint64, at int64) bool {
		return (opts.MaxRecords > 0 && l.next-hot > uint64(opts.MaxRecords)) ||
			(opts.MaxBytes > 0 && int64(l.cumNext-cumHot) > opts.MaxBytes) ||
			at < cutoff
	}
}

// trimRun is one trim pass: the hot records [first, end) it takes, and the write
// that removes them from the hot window (their blocks, what is left of a block
// the run ends in, their index entries).
type trimRun struct {
	first, end uint64
	bytes      uint64      // their payload bytes
	recs       []segRecord // the records, when asked for (a cold flush)
	w          *persistence.Write
}

// nextRun takes the next pass from hot in one scan: the records past the
// retention, at most MaxBatchSize of them, or, when upTo > hot, exactly
// [hot, upTo) (a pending cold flush).
func (o *object) nextRun(l *logState, upTo uint64, keep bool) (*trimRun, error) {
	run := &trimRun{first: l.hot, end: l.hot, w: &persistence.Write{}}
	if l.hot >= l.next {
		return run, nil
	}
	expired := o.retention(l)
	budget := uint64(o.maxBatch())
	take := func(at int64) bool {
		if upTo > l.hot {
			return run.end < upTo
		}
		return run.end-run.first < budget && expired(run.end, l.cumHot+run.bytes, at)
	}
	w := run.w
	err := o.scanBlocks(l, l.hot, func(b *block) bool {
		i := 0 // blocks start at hot
		for ; i < len(b.recs) && take(b.at); i++ {
			r := b.recs[i]
			if r.flags&recordGenerated == 0 {
				w.Deletes = append(w.Deletes, l.ks.KeyString(logDedup, r.key))
			}
			if keep {
				run.recs = append(run.recs, segRecord{at: b.at, flags: r.flags, key: r.key, body: r.body})
			}
			run.end++
			run.bytes += uint64(len(r.body))
		}
		if i == 0 {
			return false // the run ended before this block
		}
		w.Deletes = append(w.Deletes, l.ks.KeyUint64(logBlock, b.first))
		if i < len(b.recs) { // it ended inside this block: keep the rest
			rest := &block{first: run.end, at: b.at, cumEnd: b.cumEnd, recs: b.recs[i:]}
			w.Sets = append(w.Sets, persistence.KV{Key: l.ks.KeyUint64(logBlock, rest.first), Value: encodeBlock(rest)})
			return false
		}
		return true
	})
	if err != nil {
		return nil, unavailable("cannot read the log", err)
	}
	if upTo > l.hot && run.end != upTo {
		return nil, &Error{Kind: KindInternal, Msg: "internal error", cause: fmt.Errorf("pending run [%d, %d) found %d records", l.hot, upTo, run.end-l.hot)}
	}
	return run, nil
}

// trimDone receives the outcome of a trim, in the object's turn.
type trimDone func(*LogTrimmed, error)

// logTrim enforces the retention oldest first, in passes of at most MaxBatchSize
// records, each one durable commit. It ignores cursors. Without cold storage the
// trimmed records are gone; with it, see coldTrim.
func (o *object) logTrim() (any, error) {
	env := o.deferReply()
	o.trim(func(t *LogTrimmed, err error) {
		if err != nil {
			o.respond(env, nil, err)
			return
		}
		o.respond(env, t, nil)
	})
	return nil, nil
}

// trim runs a trim and calls done with its outcome: at once, or from a later turn
// when the log keeps trimmed records in cold storage.
func (o *object) trim(done trimDone) {
	l, err := o.logLoad()
	if err != nil {
		done(nil, err)
		return
	}
	opts := o.opts.Log
	if opts.MaxAge <= 0 && opts.MaxRecords <= 0 && opts.MaxBytes <= 0 && l.pendEnd <= l.pendFirst {
		done(&LogTrimmed{}, nil)
		return
	}
	if opts.Cold {
		o.coldTrim(l, done)
		return
	}
	var removed uint64
	for {
		run, err := o.nextRun(l, 0, false)
		if err != nil {
			done(nil, err)
			return
		}
		n := run.end - run.first
		if n == 0 {
			break
		}
		removed += n
		l.hot, l.cumHot = run.end, l.cumHot+run.bytes
		l.oldest = max(l.oldest, l.hot) // without cold storage, trimmed records are gone
		run.w.Sets = append(run.w.Sets, persistence.KV{Key: l.ks.Key(logMeta, nil), Value: l.metaValue()})
		o.submit(run.w, l.readBack)
		if n < uint64(o.maxBatch()) {
			break // the pass stopped at a record the retention keeps
		}
	}
	done(&LogTrimmed{Removed: removed}, nil)
}
