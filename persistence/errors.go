package persistence

import "errors"

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
