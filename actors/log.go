package actors

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/holdfast/holdfast/persistence"
)

// The retained log (spec/log.md) is a behaviour of the object actor, in the
// object's keyspace under persistence.BehaviourLog:
//
//	'm'                     meta: next offset, hot offset, oldest offset, hot bytes, last appendedAt
//	'r' | offset (u64 BE)   a hot record: version, appendedAt, deduplication key, body
//	'd' | dedup key         the offset of the hot record with that key
//	'c' | consumer          the consumer's cursor (u64 BE)
//
// Hot records are the contiguous offsets [hot, next). The meta and the cursors
// stay in memory while the object is active; records and the deduplication index
// are read from storage. Every append, commit and trim pass is one durable commit.
const (
	logMeta   byte = 'm'
	logRecord byte = 'r'
	logDedup  byte = 'd'
	logCursor byte = 'c'
)

const (
	logMetaVersion   byte = 1
	logRecordVersion byte = 1
	generatedKeyTag       = "gen:" // generated deduplication keys start with it
)

type logState struct {
	ks       persistence.Keyspace
	next     uint64 // the next offset to assign
	hot      uint64 // the lowest hot offset
	oldest   uint64 // the lowest readable offset (cold segments included)
	hotBytes int64  // payload bytes of the hot records
	lastAt   int64  // appendedAt of the newest record: appendedAt never goes back
	cursors  map[string]uint64
}

// readBack: records and the deduplication index are read from storage after they
// are written; the meta and the cursors live in memory.
func (l *logState) readBack(key []byte) bool {
	n := len(l.ks.Prefix())
	return len(key) > n && (key[n] == logRecord || key[n] == logDedup)
}

func (l *logState) metaValue() []byte {
	b := make([]byte, 0, 41)
	b = append(b, logMetaVersion)
	b = binary.BigEndian.AppendUint64(b, l.next)
	b = binary.BigEndian.AppendUint64(b, l.hot)
	b = binary.BigEndian.AppendUint64(b, l.oldest)
	b = binary.BigEndian.AppendUint64(b, uint64(l.hotBytes))
	return binary.BigEndian.AppendUint64(b, uint64(l.lastAt))
}

func (o *object) logLoad() (*logState, error) {
	if o.log != nil {
		return o.log, nil
	}
	l := &logState{ks: persistence.NewKeyspace(o.part, o.act.id, persistence.BehaviourLog), cursors: map[string]uint64{}}
	meta, found, err := o.st.get(o.bg(), l.ks.Key(logMeta, nil))
	if err != nil {
		return nil, unavailable("cannot load the log", err)
	}
	if found {
		if len(meta) != 41 || meta[0] != logMetaVersion {
			return nil, &Error{Kind: KindInternal, Msg: "internal error", cause: fmt.Errorf("log meta of %d bytes, version %d", len(meta), meta[0])}
		}
		l.next = binary.BigEndian.Uint64(meta[1:])
		l.hot = binary.BigEndian.Uint64(meta[9:])
		l.oldest = binary.BigEndian.Uint64(meta[17:])
		l.hotBytes = int64(binary.BigEndian.Uint64(meta[25:]))
		l.lastAt = int64(binary.BigEndian.Uint64(meta[33:]))
	}
	prefix := l.ks.Key(logCursor, nil)
	err = o.st.scan(o.bg(), prefix, nil, nil, func(key, value []byte) (bool, error) {
		if len(value) != 8 {
			return false, fmt.Errorf("cursor of %d bytes", len(value))
		}
		l.cursors[string(key[len(prefix):])] = binary.BigEndian.Uint64(value)
		return true, nil
	})
	if err != nil {
		return nil, unavailable("cannot load the log", err)
	}
	o.log = l
	return l, nil
}

func (o *object) maxBatch() int {
	if n := o.opts.Log.MaxBatchSize; n > 0 {
		return n
	}
	return DefaultMaxBatchSize
}

// encodeRecord is version | appendedAt (u64 BE) | uvarint key length | key | body.
func encodeRecord(at int64, key string, body []byte) []byte {
	b := make([]byte, 0, 1+8+binary.MaxVarintLen64+len(key)+len(body))
	b = append(b, logRecordVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(at))
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	return append(b, body...)
}

func decodeRecord(offset uint64, v []byte) (LogRecord, error) {
	if len(v) < 10 || v[0] != logRecordVersion {
		return LogRecord{}, fmt.Errorf("log record %d: bad encoding", offset)
	}
	at := int64(binary.BigEndian.Uint64(v[1:]))
	n, used := binary.Uvarint(v[9:])
	rest := v[9+max(used, 0):]
	if used <= 0 || uint64(len(rest)) < n {
		return LogRecord{}, fmt.Errorf("log record %d: bad key length", offset)
	}
	return LogRecord{
		Offset:           offset,
		AppendedAt:       at,
		DeduplicationKey: string(rest[:n]),
		Body:             append(json.RawMessage(nil), rest[n:]...),
	}, nil
}

func generatedKey() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return generatedKeyTag + hex.EncodeToString(b[:])
}

func (o *object) logAppend(m LogAppend) (any, error) {
	// Definite rejections first: nothing is written and no offset is consumed.
	switch {
	case len(m.Records) == 0:
		return nil, invalidf("an append needs at least one record")
	case len(m.Records) > o.maxBatch():
		return nil, invalidf("%d records, at most %d per append (maxBatchSize)", len(m.Records), o.maxBatch())
	}
	for i, r := range m.Records {
		switch {
		case len(r.Body) == 0:
			return nil, badRequestf("record %d has no body", i)
		case len(r.Body) > MaxRecordBody:
			return nil, tooLargef("record %d: the body is %d bytes, at most %d", i, len(r.Body), MaxRecordBody)
		case !json.Valid(r.Body):
			return nil, badRequestf("record %d: the body is not JSON", i)
		case r.DeduplicationKey != nil && *r.DeduplicationKey == "":
			return nil, invalidf("record %d: an empty deduplicationKey", i)
		case r.DeduplicationKey != nil && len(*r.DeduplicationKey) > MaxDedupKey:
			return nil, invalidf("record %d: the deduplicationKey is %d bytes, at most %d", i, len(*r.DeduplicationKey), MaxDedupKey)
		}
	}
	l, err := o.logLoad()
	if err != nil {
		return nil, err
	}
	now := o.h.now().UnixMilli()
	at := max(now, l.lastAt)
	offsets := make([]uint64, len(m.Records))
	inBatch := map[string]uint64{}
	w := &persistence.Write{}
	next, bytes := l.next, l.hotBytes
	for i, r := range m.Records {
		var key string
		if r.DeduplicationKey != nil {
			key = *r.DeduplicationKey
			if off, ok := inBatch[key]; ok {
				offsets[i] = off
				continue
			}
			v, found, err := o.st.get(o.bg(), l.ks.KeyString(logDedup, key))
			if err != nil {
				return nil, unavailable("cannot read the deduplication index", err)
			}
			if found && len(v) == 8 {
				offsets[i] = binary.BigEndian.Uint64(v)
				inBatch[key] = offsets[i]
				continue
			}
		} else {
			key = generatedKey()
		}
		off := next
		next++
		offsets[i] = off
		inBatch[key] = off
		w.Sets = append(w.Sets,
			persistence.KV{Key: l.ks.KeyUint64(logRecord, off), Value: encodeRecord(at, key, r.Body)},
			persistence.KV{Key: l.ks.KeyString(logDedup, key), Value: binary.BigEndian.AppendUint64(nil, off)},
		)
		bytes += int64(len(r.Body))
	}
	if next == l.next {
		return &LogAppended{Offsets: offsets}, nil // every record was a duplicate
	}
	l.next, l.hotBytes, l.lastAt = next, bytes, at
	w.Sets = append(w.Sets, persistence.KV{Key: l.ks.Key(logMeta, nil), Value: l.metaValue()})
	o.submit(w, l.readBack)
	return &LogAppended{Offsets: offsets}, nil
}

func (o *object) logRead(m LogRead) (any, error) {
	limit := m.Limit
	switch {
	case limit < 0:
		return nil, badRequestf("limit must be at least 1")
	case limit == 0 || limit > o.maxBatch():
		limit = o.maxBatch()
	}
	l, err := o.logLoad()
	if err != nil {
		return nil, err
	}
	if m.From < l.oldest {
		return nil, &OffsetTruncatedError{Requested: m.From, Oldest: l.oldest}
	}
	page := &RecordPage{Records: []LogRecord{}}
	if m.From >= l.next {
		page.NextOffset = m.From
		return page, nil
	}
	if m.From < l.hot {
		// Cold reads come with the cold store; until then nothing is below hot.
		return nil, &OffsetTruncatedError{Requested: m.From, Oldest: l.hot}
	}
	end := min(l.next, m.From+uint64(limit))
	prefix := l.ks.Key(logRecord, nil)
	err = o.st.scan(o.bg(), prefix, l.ks.KeyUint64(logRecord, m.From), l.ks.KeyUint64(logRecord, end), func(key, value []byte) (bool, error) {
		rec, err := decodeRecord(binary.BigEndian.Uint64(key[len(prefix):]), value)
		if err != nil {
			return false, err
		}
		page.Records = append(page.Records, rec)
		return true, nil
	})
	if err != nil {
		return nil, unavailable("cannot read the log", err)
	}
	if n := len(page.Records); n > 0 {
		page.NextOffset = page.Records[n-1].Offset + 1
	} else {
		page.NextOffset = max(m.From, l.next)
	}
	if l.next > page.NextOffset {
		page.Lag = l.next - page.NextOffset
	}
	return page, nil
}

func (o *object) logBounds() (any, error) {
	l, err := o.logLoad()
	if err != nil {
		return nil, err
	}
	return &LogBounds{OldestOffset: l.oldest, HotOffset: l.hot, NextOffset: l.next}, nil
}

func checkConsumer(name string) error {
	switch {
	case name == "" || len(name) > MaxConsumerName:
		return badRequestf("consumer names are 1 to %d bytes", MaxConsumerName)
	case strings.Contains(name, "/"):
		return badRequestf("consumer names must not contain '/'")
	case !utf8.ValidString(name):
		return badRequestf("consumer names must be UTF-8")
	}
	return nil
}

func (o *object) logCommit(m LogCommit) (any, error) {
	if err := checkConsumer(m.Consumer); err != nil {
		return nil, err
	}
	l, err := o.logLoad()
	if err != nil {
		return nil, err
	}
	if m.Offset > l.next {
		return nil, invalidf("offset %d is beyond the log's next offset %d", m.Offset, l.next)
	}
	cur, found := l.cursors[m.Consumer]
	if found && m.Offset <= cur {
		return &LogCursor{Offset: cur}, nil
	}
	l.cursors[m.Consumer] = m.Offset
	o.submit(&persistence.Write{Sets: []persistence.KV{{
		Key: l.ks.KeyString(logCursor, m.Consumer), Value: binary.BigEndian.AppendUint64(nil, m.Offset),
	}}}, l.readBack)
	return &LogCursor{Offset: m.Offset}, nil
}

func (o *object) logCursorGet(m LogCursorGet) (any, error) {
	if err := checkConsumer(m.Consumer); err != nil {
		return nil, err
	}
	l, err := o.logLoad()
	if err != nil {
		return nil, err
	}
	cur, found := l.cursors[m.Consumer]
	if !found {
		return nil, notFoundf("consumer %q has no cursor", m.Consumer)
	}
	return &LogCursor{Offset: cur}, nil
}

func (o *object) logCursors() (any, error) {
	l, err := o.logLoad()
	if err != nil {
		return nil, err
	}
	out := make(map[string]uint64, len(l.cursors))
	for k, v := range l.cursors {
		out[k] = v
	}
	return &LogCursors{Cursors: out}, nil
}

func (o *object) logLoadGet() (any, error) {
	l, err := o.logLoad()
	if err != nil {
		return nil, err
	}
	if len(l.cursors) == 0 {
		return &LogLoad{}, nil
	}
	low := ^uint64(0)
	for _, c := range l.cursors {
		low = min(low, c)
	}
	return &LogLoad{Backlog: l.next - min(low, l.next)}, nil
}

// logTrim enforces the retention oldest first, in passes of at most MaxBatchSize
// records, each one durable commit. It ignores cursors.
func (o *object) logTrim() (any, error) {
	l, err := o.logLoad()
	if err != nil {
		return nil, err
	}
	opts := o.opts.Log
	if opts.MaxAge <= 0 && opts.MaxRecords <= 0 && opts.MaxBytes <= 0 {
		return &LogTrimmed{}, nil
	}
	cutoff := int64(-1) // records appended before it are too old
	if opts.MaxAge > 0 {
		cutoff = o.h.now().Add(-opts.MaxAge).UnixMilli()
	}
	expired := func(count uint64, bytes int64, at int64) bool {
		return (opts.MaxRecords > 0 && count > uint64(opts.MaxRecords)) ||
			(opts.MaxBytes > 0 && bytes > opts.MaxBytes) ||
			at < cutoff
	}
	var removed uint64
	prefix := l.ks.Key(logRecord, nil)
	for l.hot < l.next {
		end := min(l.next, l.hot+uint64(o.maxBatch()))
		w := &persistence.Write{}
		hot, bytes := l.hot, l.hotBytes
		err := o.st.scan(o.bg(), prefix, l.ks.KeyUint64(logRecord, l.hot), l.ks.KeyUint64(logRecord, end), func(key, value []byte) (bool, error) {
			rec, err := decodeRecord(binary.BigEndian.Uint64(key[len(prefix):]), value)
			if err != nil {
				return false, err
			}
			if !expired(l.next-hot, bytes, rec.AppendedAt) {
				return false, nil
			}
			w.Deletes = append(w.Deletes, append([]byte(nil), key...), l.ks.KeyString(logDedup, rec.DeduplicationKey))
			bytes -= int64(len(rec.Body))
			hot = rec.Offset + 1
			return true, nil
		})
		if err != nil {
			return nil, unavailable("cannot read the log", err)
		}
		if hot == l.hot {
			break
		}
		removed += hot - l.hot
		l.hot, l.hotBytes = hot, bytes
		l.oldest = max(l.oldest, hot) // without cold storage, trimmed records are gone
		w.Sets = append(w.Sets, persistence.KV{Key: l.ks.Key(logMeta, nil), Value: l.metaValue()})
		o.submit(w, l.readBack)
		if hot < end {
			break // the pass stopped at a record the retention keeps
		}
	}
	return &LogTrimmed{Removed: removed}, nil
}
