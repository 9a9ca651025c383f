package actors

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/holdfast/holdfast/cold"
	"github.com/holdfast/holdfast/persistence"
)

// Cold segments (spec/log.md, "Retention and cold storage").
//
// A trim pass of a type with cold storage flushes its run before deleting it:
//  1. the run [first, end) is fixed durably in the log's meta (the pending flush);
//  2. off the object's turn, once that is durable, one segment holding the run is
//     created in the cold store under a key derived from the object and first,
//     refusing to overwrite;
//  3. back in the object's turn, one commit records the segment in the index and
//     deletes the hot records.
//
// A crash or a store failure between 1 and 3 leaves every record hot; the next
// trim rebuilds the pending run's segment, byte for byte the same, so the
// refuse-to-overwrite create either writes it or finds it already there.
//
// The segment index lives in the log's keyspace: 's' | first offset (u64 BE) ->
// version | end (u64 BE) | size (u64 BE) | store key.

const (
	logSegment byte = 's'

	segmentMagic      = "HFSEG"
	segmentVersion    = 1
	segIndexVersion   = 1
	segmentHeaderSize = len(segmentMagic) + 1 + 8 + 4
)

var segCRC = crc32.MakeTable(crc32.Castagnoli)

// segRecord is one record of a segment.
type segRecord struct {
	at    int64
	flags byte
	key   string
	body  []byte
}

// encodeSegment is magic | version | first (u64 BE) | count (u32 BE), then per
// record appendedAt (u64 BE) | flags | uvarint key length | key | uvarint body
// length | body, then the CRC-32C of everything before it.
func encodeSegment(first uint64, recs []segRecord) []byte {
	n := segmentHeaderSize + 4
	for _, r := range recs {
		n += 9 + 2*binary.MaxVarintLen64 + len(r.key) + len(r.body)
	}
	b := make([]byte, 0, n)
	b = append(b, segmentMagic...)
	b = append(b, segmentVersion)
	b = binary.BigEndian.AppendUint64(b, first)
	b = binary.BigEndian.AppendUint32(b, uint32(len(recs)))
	for _, r := range recs {
		b = binary.BigEndian.AppendUint64(b, uint64(r.at))
		b = append(b, r.flags)
		b = binary.AppendUvarint(b, uint64(len(r.key)))
		b = append(b, r.key...)
		b = binary.AppendUvarint(b, uint64(len(r.body)))
		b = append(b, r.body...)
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, segCRC))
}

var errBadSegment = errors.New("the segment is damaged")

// decodeSegment checks and decodes a segment that should start at first.
func decodeSegment(first uint64, b []byte) ([]LogRecord, error) {
	if len(b) < segmentHeaderSize+4 || string(b[:len(segmentMagic)]) != segmentMagic || b[len(segmentMagic)] != segmentVersion {
		return nil, errBadSegment
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, segCRC) != sum {
		return nil, errBadSegment
	}
	p := body[len(segmentMagic)+1:]
	if binary.BigEndian.Uint64(p) != first {
		return nil, errBadSegment
	}
	count := binary.BigEndian.Uint32(p[8:])
	p = p[12:]
	next := func() ([]byte, bool) {
		n, used := binary.Uvarint(p)
		if used <= 0 || uint64(len(p)-used) < n {
			return nil, false
		}
		out := p[used : used+int(n)]
		p = p[used+int(n):]
		return out, true
	}
	recs := make([]LogRecord, 0, count)
	for i := uint32(0); i < count; i++ {
		if len(p) < 9 {
			return nil, errBadSegment
		}
		at := int64(binary.BigEndian.Uint64(p))
		p = p[9:] // appendedAt and flags
		key, ok := next()
		bodyBytes, ok2 := next()
		if !ok || !ok2 {
			return nil, errBadSegment
		}
		recs = append(recs, LogRecord{Offset: first + uint64(i), AppendedAt: at, DeduplicationKey: string(key), Body: append([]byte(nil), bodyBytes...)})
	}
	if len(p) != 0 {
		return nil, errBadSegment
	}
	return recs, nil
}

// segmentKey is the store key of the object's segment that starts at first:
// log/<app>/<type>/<key>/<first, 20 digits>, names in unpadded base64url, long
// ones cut into path segments (cold.LogSegmentKey). The index records the key
// a segment was written under, and reads use that.
func segmentKey(id ObjectID, first uint64) string {
	return cold.LogSegmentKey(id.App, id.Type, id.Key, first)
}

// segEntry is one segment index entry.
type segEntry struct {
	first, end uint64
	size       uint64
	key        string
}

func (e segEntry) value() []byte {
	b := make([]byte, 0, 17+len(e.key))
	b = append(b, segIndexVersion)
	b = binary.BigEndian.AppendUint64(b, e.end)
	b = binary.BigEndian.AppendUint64(b, e.size)
	return append(b, e.key...)
}

func decodeSegEntry(first uint64, v []byte) (segEntry, error) {
	if len(v) < 17 || v[0] != segIndexVersion {
		return segEntry{}, fmt.Errorf("segment index entry %d: bad encoding", first)
	}
	return segEntry{first: first, end: binary.BigEndian.Uint64(v[1:]), size: binary.BigEndian.Uint64(v[9:]), key: string(v[17:])}, nil
}

// flushState is the trim in progress on a cold log: whom to tell when it is done,
// the trims waiting behind it, and what it removed so far.
type flushState struct {
	done    trimDone
	waiting []trimDone
	removed uint64
	// run is the pass being flushed: [first, end) and what the commit must do.
	first, end uint64
	bytes      uint64
	w          *persistence.Write // the hot deletions, prepared with the run
	seg        segEntry
}

// flushDone is the cold store's answer for the pass in flight, sent to the object.
type flushDone struct{ err error }

// coldTrim starts (or queues) a trim of a cold log; done runs in a later turn.
func (o *object) coldTrim(l *logState, done trimDone) {
	if o.flush != nil {
		o.flush.waiting = append(o.flush.waiting, done)
		return
	}
	o.flush = &flushState{done: done}
	o.flushNext(l)
}

// flushNext starts the next pass of the trim in progress, or replies to it.
func (o *object) flushNext(l *logState) {
	f := o.flush
	if o.h.cfg.Cold == nil {
		o.flushFinish(l, unavailable("the log's type keeps trimmed records in cold storage, and this node has no cold store", nil))
		return
	}
	// A pending run (fixed by a flush that did not finish) is written first, as it
	// was fixed; it always starts at hot, unless trims without cold storage (the
	// type's setting changed) removed it since.
	upTo := uint64(0)
	if l.pendFirst == l.hot && l.pendEnd > l.pendFirst {
		upTo = l.pendEnd
	}
	run, err := o.nextRun(l, upTo, true)
	if err != nil {
		o.flushFinish(l, err)
		return
	}
	if run.end == run.first {
		o.flushFinish(l, nil)
		return
	}
	first, end, recs := run.first, run.end, run.recs
	data := encodeSegment(first, recs)
	key := segmentKey(o.act.id, first)
	f.first, f.end, f.bytes, f.w = first, end, run.bytes, run.w
	f.seg = segEntry{first: first, end: end, size: uint64(len(data)), key: key}
	// Step 1: fix the run durably (unless a crashed flush already did).
	if l.pendFirst != first || l.pendEnd != end {
		l.pendFirst, l.pendEnd = first, end
		o.submit(&persistence.Write{Sets: []persistence.KV{{Key: l.ks.Key(logMeta, nil), Value: l.metaValue()}}}, l.readBack)
	}
	// Step 2, off the turn: after the run is durable, create the segment, on a
	// goroutine of h.bg (owners.go).
	t, store, timeout, h, act := o.last, o.h.cfg.Cold, o.h.cfg.ColdTimeout, o.h, o.act
	if !h.bg.Go(func(ctx context.Context) {
		var err error
		if t != nil {
			err = t.Wait(ctx)
		}
		if err == nil {
			cctx, cancel := context.WithTimeout(ctx, timeout)
			err = store.Create(cctx, key, data)
			cancel()
			if errors.Is(err, cold.ErrExists) {
				err = fmt.Errorf("segment %s exists with other content", key)
			}
		}
		h.send(act, flushDone{err: err}, false)
	}) {
		o.onFlushDone(flushDone{err: errClosing()})
	}
}

// onFlushDone runs step 3 of the pass in flight, then the next pass.
func (o *object) onFlushDone(m flushDone) {
	f, l := o.flush, o.log
	if f == nil || l == nil {
		return
	}
	if m.err != nil {
		o.h.log.Warn("cold flush failed; the records stay hot", "object", o.act.id.String(), "first", f.first, "end", f.end, "err", m.err)
		o.flushFinish(l, unavailable("the cold store could not take the trimmed records; they stay hot", m.err))
		return
	}
	w := f.w
	w.Sets = append(w.Sets, persistence.KV{Key: l.ks.KeyUint64(logSegment, f.first), Value: f.seg.value()})
	l.hot, l.cumHot = f.end, l.cumHot+f.bytes
	l.pendFirst, l.pendEnd = 0, 0
	w.Sets = append(w.Sets, persistence.KV{Key: l.ks.Key(logMeta, nil), Value: l.metaValue()})
	o.submit(w, l.readBack)
	f.removed += f.end - f.first
	o.flushNext(l)
}

// flushFinish replies to the trim in progress and starts the next one waiting.
func (o *object) flushFinish(l *logState, err error) {
	f := o.flush
	o.flush = nil
	if err != nil {
		f.done(nil, err)
	} else {
		f.done(&LogTrimmed{Removed: f.removed}, nil)
	}
	if len(f.waiting) > 0 {
		o.flush = &flushState{done: f.waiting[0], waiting: f.waiting[1:]}
		o.flushNext(l)
	}
}

// coldRead serves a read below the hot window from the segment holding from,
// off the object's turn; the page stops at the segment's end.
func (o *object) coldRead(l *logState, m LogRead, limit int) (any, error) {
	prefix := l.ks.Key(logSegment, nil)
	k, v, found, err := o.st.floor(o.bg(), prefix, l.ks.KeyUint64(logSegment, m.From))
	if err != nil {
		return nil, unavailable("cannot read the segment index", err)
	}
	var e segEntry
	if found {
		if e, err = decodeSegEntry(binary.BigEndian.Uint64(k[len(prefix):]), v); err != nil {
			return nil, unavailable("cannot read the segment index", err)
		}
	}
	if !found || m.From >= e.end {
		// Nothing holds it (forgotten, or trimmed without cold storage).
		return nil, &OffsetTruncatedError{Requested: m.From, Oldest: o.nextReadable(l, m.From)}
	}
	if o.h.cfg.Cold == nil {
		return nil, unavailable("this node has no cold store", nil)
	}
	t, store, timeout, next := o.last, o.h.cfg.Cold, o.h.cfg.ColdTimeout, l.next
	// On a goroutine of h.bg (owners.go); the request stays in flight, so
	// Close waits for its reply before it cancels the read.
	env := o.deferReply()
	if !o.h.bg.Go(func(ctx context.Context) {
		page, err := readSegment(ctx, store, timeout, e, m.From, limit, next)
		finish := func(cerr error) { env.finish(page, err, cerr) }
		if t == nil {
			finish(nil)
			return
		}
		t.OnDone(finish)
	}) {
		o.deferred = false // handle replies after all
		return nil, errClosing()
	}
	return nil, nil
}

func readSegment(ctx context.Context, store cold.Store, timeout time.Duration, e segEntry, from uint64, limit int, next uint64) (*RecordPage, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	data, err := store.Get(ctx, e.key)
	if errors.Is(err, cold.ErrNotFound) {
		return nil, &OffsetTruncatedError{Requested: from, Oldest: e.end}
	}
	if err != nil {
		return nil, unavailable("the cold store did not answer", err)
	}
	recs, err := decodeSegment(e.first, data)
	if err != nil || uint64(len(recs)) != e.end-e.first {
		return nil, &OffsetTruncatedError{Requested: from, Oldest: e.end}
	}
	page := &RecordPage{Records: recs[from-e.first : min(uint64(len(recs)), from-e.first+uint64(limit))]}
	page.NextOffset = page.Records[len(page.Records)-1].Offset + 1
	if next > page.NextOffset {
		page.Lag = next - page.NextOffset
	}
	return page, nil
}

// nextReadable is the lowest readable offset above from: the next segment's
// first offset, or hot.
func (o *object) nextReadable(l *logState, from uint64) uint64 {
	prefix := l.ks.Key(logSegment, nil)
	out := l.hot
	_ = o.st.scan(o.bg(), prefix, l.ks.KeyUint64(logSegment, from+1), nil, func(key, _ []byte) (bool, error) {
		out = min(out, binary.BigEndian.Uint64(key[len(prefix):]))
		return false, nil
	})
	return out
}

// logForgetCold drops the index entries of segments that end at or before before.
func (o *object) logForgetCold(m LogForgetCold) (any, error) {
	l, err := o.logLoad()
	if err != nil {
		return nil, err
	}
	prefix := l.ks.Key(logSegment, nil)
	w := &persistence.Write{}
	n := 0
	oldest := l.hot
	err = o.st.scan(o.bg(), prefix, nil, nil, func(key, value []byte) (bool, error) {
		e, err := decodeSegEntry(binary.BigEndian.Uint64(key[len(prefix):]), value)
		if err != nil {
			return false, err
		}
		if e.end <= m.Before {
			w.Deletes = append(w.Deletes, append([]byte(nil), key...))
			n++
			return true, nil
		}
		oldest = min(oldest, e.first)
		return false, nil
	})
	if err != nil {
		return nil, unavailable("cannot read the segment index", err)
	}
	if n == 0 {
		return &LogForgotten{}, nil
	}
	l.oldest = oldest
	w.Sets = append(w.Sets, persistence.KV{Key: l.ks.Key(logMeta, nil), Value: l.metaValue()})
	o.submit(w, l.readBack)
	return &LogForgotten{Forgotten: n}, nil
}
