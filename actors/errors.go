package actors

import (
	"errors"
	"fmt"
	"time"
)

// Kind classifies an error the way spec/errors.md does; the gateway maps each kind
// to one status and code.
type Kind int

const (
	KindInternal    Kind = iota // a bug (500)
	KindBadRequest              // malformed input (400)
	KindNotFound                // no such slot, message, alarm (404)
	KindInvalid                 // well-formed but refused (422)
	KindTooLarge                // over a size limit (413)
	KindOverloaded              // past an admission limit (429)
	KindUnavailable             // shutting down, storage failed, owner unreachable (503)
	KindConflict                // the state forbids it: a lease not held, leases off (409)
)

// Sentinels for errors.Is: every *Error matches the sentinel of its kind.
var (
	ErrBadRequest  = &Error{Kind: KindBadRequest, Msg: "bad request"}
	ErrNotFound    = &Error{Kind: KindNotFound, Msg: "not found"}
	ErrInvalid     = &Error{Kind: KindInvalid, Msg: "invalid"}
	ErrTooLarge    = &Error{Kind: KindTooLarge, Msg: "too large"}
	ErrOverloaded  = &Error{Kind: KindOverloaded, Msg: "overloaded"}
	ErrUnavailable = &Error{Kind: KindUnavailable, Msg: "unavailable"}
	// ErrLogTruncated matches an *OffsetTruncatedError (the retained log) and a
	// *LogTruncatedError (an object's change log).
	ErrLogTruncated = errors.New("actors: log truncated")
)

// CodeNotServed marks an unavailable error that refused a request before the
// object saw it, because this node does not serve the object's partition (now):
// a cluster node retries it where the partition lives.
const CodeNotServed = "partition_not_served"

// NotServed reports whether err refused a request before its object saw it,
// because this node does not serve the object's partition.
func NotServed(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind == KindUnavailable && e.Code == CodeNotServed
}

// Error is a user-facing error: Msg is safe to show to a client.
type Error struct {
	Kind Kind
	Msg  string
	// RetryAfter is set on overloaded and unavailable errors when known.
	RetryAfter time.Duration
	// Code is the stable error code of a conflict ("lease_not_held", ...).
	Code string
	// cause is kept for logs and errors.Is; it never reaches a client.
	cause error
}

func (e *Error) Error() string { return "actors: " + e.Msg }

// Unwrap returns the internal cause, if any.
func (e *Error) Unwrap() error { return e.cause }

// Is matches the sentinel of the same kind.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	switch t {
	case ErrBadRequest, ErrNotFound, ErrInvalid, ErrTooLarge, ErrOverloaded, ErrUnavailable:
		return t.Kind == e.Kind
	case ErrLeaseNotHeld, ErrLeasesDisabled, ErrAlarmLimit, ErrOverBudget:
		return t.Kind == e.Kind && t.Code == e.Code
	}
	return false
}

func newErr(k Kind, format string, a ...any) *Error {
	return &Error{Kind: k, Msg: fmt.Sprintf(format, a...)}
}

func invalidf(format string, a ...any) *Error    { return newErr(KindInvalid, format, a...) }
func badRequestf(format string, a ...any) *Error { return newErr(KindBadRequest, format, a...) }
func tooLargef(format string, a ...any) *Error   { return newErr(KindTooLarge, format, a...) }
func notFoundf(format string, a ...any) *Error   { return newErr(KindNotFound, format, a...) }

// unavailable wraps an internal cause into a 503 whose message names no internals.
func unavailable(msg string, cause error) *Error {
	return &Error{Kind: KindUnavailable, Msg: msg, cause: cause}
}

// TimedOut is a request's error when its caller stopped waiting for the
// object's reply (cause: why, such as the context's error): a write's outcome
// is then unknown.
func TimedOut(cause error) *Error {
	return unavailable("the request timed out; a write's outcome is unknown", cause)
}

// LogTruncatedError says that entries after After were compacted away: the oldest
// entry still held is Oldest.
type LogTruncatedError struct {
	After  uint64
	Oldest uint64
	// Newest is the object's newest log_id; After above it is a log_id the
	// object never issued (ResumeAfter).
	Newest uint64
}

// Is makes errors.Is(err, ErrLogTruncated) hold.
func (e *LogTruncatedError) Is(target error) bool { return target == ErrLogTruncated }

func (e *LogTruncatedError) Error() string {
	if e.After > e.Newest {
		return fmt.Sprintf("actors: change log truncated: log_id %d was never issued (the newest is %d; the object may have lost its state), the oldest held is %d", e.After, e.Newest, e.Oldest)
	}
	return fmt.Sprintf("actors: change log truncated: entries after %d were compacted, the oldest held is %d", e.After, e.Oldest)
}

// KindOf returns the Kind of an *Error in err's chain, or KindInternal.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindInternal
}
