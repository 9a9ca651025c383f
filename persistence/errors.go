package persistence

import (
	"errors"
	"syscall"
)

var (
	// ErrClosed is returned for writes submitted after Close began.
	ErrClosed = errors.New("persistence: pipeline closed")
	// ErrFailed is returned for every write after a commit failed; the node must restart.
	ErrFailed = errors.New("persistence: storage failed, restart required")
	// ErrTooLarge is returned for a single write over PipelineConfig.MaxWriteBytes.
	ErrTooLarge = errors.New("persistence: write too large for one commit")
	// ErrPartitionsMismatch is returned by Open when the configured partition count
	// differs from the one fixed when the data directory was created.
	ErrPartitionsMismatch = errors.New("persistence: partition count differs from the data directory's")
)

// ErrUnavailable is matched by the error of a write the storage refused for
// now, without writing anything: the write-ahead log could not start a new
// segment (no file descriptor, no disk space), or Badger is too far behind the
// log. It is not the node's end; the same write may succeed later.
var ErrUnavailable = errors.New("persistence: storage temporarily unavailable")

// unavailableError wraps the cause of a refusal so that it matches
// ErrUnavailable and still says what happened.
type unavailableError struct{ cause error }

func (e *unavailableError) Error() string {
	return "storage temporarily unavailable: " + e.cause.Error()
}
func (e *unavailableError) Unwrap() []error { return []error{ErrUnavailable, e.cause} }

func unavailableErr(cause error) error { return &unavailableError{cause: cause} }

// transient reports whether err is a missing resource that may come back on
// its own or by an operator's hand: file descriptors, disk space or quota,
// memory. The applier retries those for as long as it takes.
func transient(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOSPC, syscall.EDQUOT, syscall.ENOMEM, syscall.EAGAIN} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
