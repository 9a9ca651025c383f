package actors

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Messages of the retained log behaviour (spec/log.md). Every object, of any
// type, owns one log; its options come from the object's type (LogOptions).

// LogOptions are a type's log settings (spec/config.md, types.<name>.log).
type LogOptions struct {
	// MaxBatchSize bounds an append, a read page and a trim pass; zero means 100.
	MaxBatchSize int
	// Retention: zero is no limit. MaxBytes counts the payload bytes held hot and
	// is at most MaxLogBytes.
	MaxAge     time.Duration
	MaxRecords int64
	MaxBytes   int64
	// TrimEvery is the period of the automatic trim (durable alarms).
	TrimEvery time.Duration
	// Cold: trimmed records go to the node's cold store and stay readable.
	Cold bool
	// Leases, when set, turns the lease API on (spec/log.md, "Leases").
	Leases *LeaseOptions
	// OnPoison, if set, is called (in the object's turn; it must not block) when a
	// range is moved to a consumer's dead letters.
	OnPoison func(id ObjectID, consumer string, first, last uint64, attempts int)
}

// Limits of the log.
const (
	DefaultMaxBatchSize = 100
	MaxLogBytes         = 1 << 30 // the largest MaxBytes
	MaxRecordBody       = 1 << 20 // bytes of one record's body
	MaxDedupKey         = 1024    // bytes of a deduplication key
	MaxConsumerName     = 256     // bytes of a consumer name
)

// LogInput is one record to append. A nil DeduplicationKey gets a generated one;
// an empty one is refused.
type LogInput struct {
	Body             json.RawMessage `json:"body"`
	DeduplicationKey *string         `json:"deduplicationKey,omitempty"`
}

// LogAppend appends 1 to MaxBatchSize records atomically. Reply: *LogAppended.
type LogAppend struct {
	Records []LogInput
	// Validated says that every body is known to be valid JSON already (the
	// gateway decoded the request), so the object does not check them again.
	Validated bool
}

// LogAppended is the reply to LogAppend: one offset per input record, in order.
type LogAppended struct {
	Offsets []uint64 `json:"offsets"`
}

// LogRecord is one record of the log.
type LogRecord struct {
	Offset           uint64          `json:"offset"`
	Body             json.RawMessage `json:"body"`
	DeduplicationKey string          `json:"deduplicationKey"`
	AppendedAt       int64           `json:"appendedAt"` // unix milliseconds
}

// LogRead reads up to Limit records from offset From. Limit 0 means the type's
// MaxBatchSize, which also caps it. Reply: *RecordPage, or an *OffsetTruncatedError.
type LogRead struct {
	From  uint64
	Limit int
}

// RecordPage is a page of records.
type RecordPage struct {
	Records    []LogRecord `json:"records"`
	NextOffset uint64      `json:"nextOffset"`
	Lag        uint64      `json:"lag"`
}

// LogBoundsGet asks for the log's bounds. Reply: *LogBounds.
type LogBoundsGet struct{}

// LogBounds are the log's offsets: the oldest readable, the lowest still hot, and
// the next to be assigned. An empty log is {0, 0, 0}.
type LogBounds struct {
	OldestOffset uint64 `json:"oldestOffset"`
	HotOffset    uint64 `json:"hotOffset"`
	NextOffset   uint64 `json:"nextOffset"`
}

// LogCommit moves a consumer's cursor forward to Offset (an equal or lower offset
// is ignored). Reply: *LogCursor with the cursor after the commit.
type LogCommit struct {
	Consumer string
	Offset   uint64
}

// LogCursorGet reads one consumer's cursor. Reply: *LogCursor, or ErrNotFound.
type LogCursorGet struct{ Consumer string }

// LogCursor is a consumer's cursor.
type LogCursor struct {
	Offset uint64 `json:"offset"`
}

// LogCursorsGet reads every cursor. Reply: *LogCursors.
type LogCursorsGet struct{}

// LogCursors are every consumer's cursor, by name.
type LogCursors struct {
	Cursors map[string]uint64 `json:"cursors"`
}

// LogLoadGet asks for the log's load. Reply: *LogLoad.
type LogLoadGet struct{}

// LogLoad is the backlog behind the slowest committed cursor (0 with none).
type LogLoad struct {
	Backlog uint64 `json:"backlog"`
}

// LogTrim enforces the type's retention, oldest first. Reply: *LogTrimmed.
type LogTrim struct{}

// LogForgetCold drops the cold segment index entries that end before Before (a
// segment that straddles it is kept); the store keeps the objects. Reply:
// *LogForgotten.
type LogForgetCold struct{ Before uint64 }

// LogForgotten is the reply to LogForgetCold.
type LogForgotten struct {
	Forgotten int `json:"forgotten"`
}

// LogTrimmed is the reply to LogTrim.
type LogTrimmed struct {
	Removed uint64 `json:"removed"`
}

// OffsetTruncatedError says that the log no longer holds Requested: the oldest
// readable offset is Oldest. errors.Is(err, ErrLogTruncated) holds.
type OffsetTruncatedError struct {
	Requested uint64
	Oldest    uint64
}

func (e *OffsetTruncatedError) Error() string {
	return fmt.Sprintf("actors: log truncated: offset %d is gone, the oldest readable is %d", e.Requested, e.Oldest)
}

// Is makes errors.Is(err, ErrLogTruncated) hold.
func (e *OffsetTruncatedError) Is(target error) bool { return target == ErrLogTruncated }

// Log is the Go API of an object's retained log, over any Requester.
type Log struct {
	r  Requester
	id ObjectID
}

// NewLog returns the log API of object id.
func NewLog(r Requester, id ObjectID) *Log { return &Log{r: r, id: id} }

func logAsk[T any](ctx context.Context, l *Log, msg any) (T, error) {
	return request[T](ctx, l.r, l.id, msg)
}

// Append appends records atomically and returns their offsets in input order.
func (l *Log) Append(ctx context.Context, records ...LogInput) ([]uint64, error) {
	r, err := logAsk[*LogAppended](ctx, l, LogAppend{Records: records})
	if err != nil {
		return nil, err
	}
	return r.Offsets, nil
}

// Read reads up to limit records from offset from (0: the type's MaxBatchSize).
func (l *Log) Read(ctx context.Context, from uint64, limit int) (*RecordPage, error) {
	return logAsk[*RecordPage](ctx, l, LogRead{From: from, Limit: limit})
}

// Bounds returns the log's bounds.
func (l *Log) Bounds(ctx context.Context) (*LogBounds, error) {
	return logAsk[*LogBounds](ctx, l, LogBoundsGet{})
}

// Commit moves consumer's cursor forward to offset and returns the cursor.
func (l *Log) Commit(ctx context.Context, consumer string, offset uint64) (uint64, error) {
	r, err := logAsk[*LogCursor](ctx, l, LogCommit{Consumer: consumer, Offset: offset})
	if err != nil {
		return 0, err
	}
	return r.Offset, nil
}

// Cursor returns consumer's cursor; found is false if it never committed.
func (l *Log) Cursor(ctx context.Context, consumer string) (offset uint64, found bool, err error) {
	r, err := logAsk[*LogCursor](ctx, l, LogCursorGet{Consumer: consumer})
	if err != nil {
		if KindOf(err) == KindNotFound {
			return 0, false, nil
		}
		return 0, false, err
	}
	return r.Offset, true, nil
}

// Cursors returns every consumer's cursor.
func (l *Log) Cursors(ctx context.Context) (map[string]uint64, error) {
	r, err := logAsk[*LogCursors](ctx, l, LogCursorsGet{})
	if err != nil {
		return nil, err
	}
	return r.Cursors, nil
}

// Load returns the backlog behind the slowest committed cursor.
func (l *Log) Load(ctx context.Context) (uint64, error) {
	r, err := logAsk[*LogLoad](ctx, l, LogLoadGet{})
	if err != nil {
		return 0, err
	}
	return r.Backlog, nil
}

// Trim enforces the retention and returns how many hot records it removed.
func (l *Log) Trim(ctx context.Context) (uint64, error) {
	r, err := logAsk[*LogTrimmed](ctx, l, LogTrim{})
	if err != nil {
		return 0, err
	}
	return r.Removed, nil
}

// Key returns a deduplication key for LogInput.
func Key(s string) *string { return &s }

// Lease claims a range for consumer (limit 0: MaxBatchSize); nil when nothing
// is available now.
func (l *Log) Lease(ctx context.Context, consumer string, limit int) (*Lease, error) {
	reply, err := l.r.Request(ctx, l.id, LogLease{Consumer: consumer, Limit: limit})
	if err != nil || reply == nil {
		return nil, err
	}
	lease, ok := reply.(*Lease)
	if !ok {
		return nil, fmt.Errorf("actors: unexpected reply %T", reply)
	}
	return lease, nil
}

// Ack settles consumer's range batchID and returns the cursor when it moved.
func (l *Log) Ack(ctx context.Context, consumer, batchID string) (*uint64, error) {
	r, err := logAsk[*AckResult](ctx, l, LogAck{Consumer: consumer, BatchID: batchID})
	if err != nil {
		return nil, err
	}
	return r.Cursor, nil
}

// Nack makes consumer's range batchID redeliverable at once.
func (l *Log) Nack(ctx context.Context, consumer, batchID string) error {
	_, err := l.r.Request(ctx, l.id, LogNack{Consumer: consumer, BatchID: batchID})
	return err
}

// Leases lists consumer's ranges.
func (l *Log) Leases(ctx context.Context, consumer string) ([]LeaseInfo, error) {
	r, err := logAsk[*LeaseList](ctx, l, LogLeasesGet{Consumer: consumer})
	if err != nil {
		return nil, err
	}
	return r.Leases, nil
}

// DeadLetters lists consumer's dead letters.
func (l *Log) DeadLetters(ctx context.Context, consumer string) ([]DeadLetter, error) {
	r, err := logAsk[*DeadLetters](ctx, l, LogDeadLettersGet{Consumer: consumer})
	if err != nil {
		return nil, err
	}
	return r.DeadLetters, nil
}
