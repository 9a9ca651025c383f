package replication

import (
	"errors"
	"fmt"
)

var (
	// ErrNotWritten: the proposal is definitely not in the group's log and
	// never will be (raft dropped it, or another leader's entry took its
	// index). A caller may retry it without an idempotency key.
	ErrNotWritten = errors.New("replication: proposal not written")
	// ErrOutcomeUnknown: the proposal may or may not commit; the caller
	// stopped waiting (its context ended) or the engine closed first.
	ErrOutcomeUnknown = errors.New("replication: proposal outcome unknown")
	// ErrClosed: the engine is closed (or not started).
	ErrClosed = errors.New("replication: engine closed")
	// ErrUnknownGroup: this node hosts no replica of the group.
	ErrUnknownGroup = errors.New("replication: unknown group")
	// ErrGroupExists: AddGroup for a group this engine already hosts.
	ErrGroupExists = errors.New("replication: group already exists")
	// ErrGroupFailed: raft stopped the group (it panicked: a broken
	// invariant, e.g. a log that lost entries it had acknowledged). The
	// group does nothing more on this node until it is restarted.
	ErrGroupFailed = errors.New("replication: group failed")
	// ErrBadEntry: an entry's payload does not carry our header.
	ErrBadEntry = errors.New("replication: malformed entry")
)

// NotLeaderError is returned by Propose on a replica that does not lead the
// group. Leader is the node this replica believes leads (0 when it knows
// none), Term its current term. It unwraps to ErrNotWritten: nothing was
// proposed.
type NotLeaderError struct {
	Group  GroupID
	Leader NodeID
	Term   uint64
}

func (e *NotLeaderError) Error() string {
	if e.Leader == 0 {
		return fmt.Sprintf("replication: group %d: not the leader (leader unknown, term %d)", e.Group, e.Term)
	}
	return fmt.Sprintf("replication: group %d: not the leader (leader is node %d, term %d)", e.Group, e.Leader, e.Term)
}

// Unwrap makes errors.Is(err, ErrNotWritten) hold.
func (e *NotLeaderError) Unwrap() error { return ErrNotWritten }
