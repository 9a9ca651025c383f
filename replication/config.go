package replication

import (
	"fmt"
	"log/slog"
	"runtime"
	"time"
)

// Config configures an Engine. Zero fields take the defaults of
// DefaultConfig; New validates the result.
type Config struct {
	// Node is this engine's node id. Required (non-zero).
	Node NodeID
	// Workers is the size of the scheduler's worker pool. Default
	// 2 x GOMAXPROCS, at least 4.
	Workers int
	// TickInterval is raft's logical clock. Default 100 ms.
	TickInterval time.Duration
	// ElectionTick is the election timeout in ticks. Default 10. Must be
	// more than HeartbeatTick.
	ElectionTick int
	// HeartbeatTick is the leader's heartbeat interval in ticks. Default 1.
	HeartbeatTick int
	// MaxQueuedTicks caps the ticks a group accumulates while it waits for a
	// worker, so that a stalled node does not burst through elections when
	// it resumes (ticks are never early, see the design's section 3). Default 3.
	MaxQueuedTicks int
	// MaxSizePerMsg bounds the entries of one MsgApp, bytes. Default 1 MiB.
	MaxSizePerMsg uint64
	// MaxInflightMsgs bounds MsgApps in flight per follower. Default 64.
	MaxInflightMsgs int
	// MaxInflightBytes bounds bytes in flight per follower. Default 8 MiB.
	MaxInflightBytes uint64
	// MaxUncommittedEntriesSize bounds a leader's uncommitted tail, bytes;
	// past it proposals are refused with ErrNotWritten. Default 32 MiB.
	MaxUncommittedEntriesSize uint64
	// MaxCommittedSizePerReady bounds one apply job, bytes. Default 4 MiB.
	MaxCommittedSizePerReady uint64
	// Logger receives the engine's logs (and raft's, raft's Info as Debug).
	// Default slog.Default().
	Logger *slog.Logger
}

// DefaultConfig returns the defaults (Node is left zero: the caller sets it).
func DefaultConfig() Config {
	return Config{
		Workers:                   max(4, 2*runtime.GOMAXPROCS(0)),
		TickInterval:              100 * time.Millisecond,
		ElectionTick:              10,
		HeartbeatTick:             1,
		MaxQueuedTicks:            3,
		MaxSizePerMsg:             1 << 20,
		MaxInflightMsgs:           64,
		MaxInflightBytes:          8 << 20,
		MaxUncommittedEntriesSize: 32 << 20,
		MaxCommittedSizePerReady:  4 << 20,
	}
}

// withDefaults fills zero fields and validates.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	if c.Workers == 0 {
		c.Workers = d.Workers
	}
	if c.TickInterval == 0 {
		c.TickInterval = d.TickInterval
	}
	if c.ElectionTick == 0 {
		c.ElectionTick = d.ElectionTick
	}
	if c.HeartbeatTick == 0 {
		c.HeartbeatTick = d.HeartbeatTick
	}
	if c.MaxQueuedTicks == 0 {
		c.MaxQueuedTicks = d.MaxQueuedTicks
	}
	if c.MaxSizePerMsg == 0 {
		c.MaxSizePerMsg = d.MaxSizePerMsg
	}
	if c.MaxInflightMsgs == 0 {
		c.MaxInflightMsgs = d.MaxInflightMsgs
	}
	if c.MaxInflightBytes == 0 {
		c.MaxInflightBytes = d.MaxInflightBytes
	}
	if c.MaxUncommittedEntriesSize == 0 {
		c.MaxUncommittedEntriesSize = d.MaxUncommittedEntriesSize
	}
	if c.MaxCommittedSizePerReady == 0 {
		c.MaxCommittedSizePerReady = d.MaxCommittedSizePerReady
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.Node == 0:
		return c, fmt.Errorf("replication: config: Node must be set (non-zero)")
	case c.Workers < 1:
		return c, fmt.Errorf("replication: config: Workers %d: want at least 1", c.Workers)
	case c.TickInterval < 0:
		return c, fmt.Errorf("replication: config: TickInterval %v: want positive", c.TickInterval)
	case c.HeartbeatTick < 1 || c.ElectionTick <= c.HeartbeatTick:
		return c, fmt.Errorf("replication: config: ElectionTick %d must exceed HeartbeatTick %d (at least 1)", c.ElectionTick, c.HeartbeatTick)
	case c.MaxQueuedTicks < 1:
		return c, fmt.Errorf("replication: config: MaxQueuedTicks %d: want at least 1", c.MaxQueuedTicks)
	case c.MaxInflightMsgs < 1:
		return c, fmt.Errorf("replication: config: MaxInflightMsgs %d: want at least 1", c.MaxInflightMsgs)
	}
	return c, nil
}
