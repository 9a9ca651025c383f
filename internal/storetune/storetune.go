// Package storetune tunes a node's storage below its defaults: smaller Badger
// memtables, write-ahead log segments and value-log files, and a more frequent
// value-log GC, so that a benchmark or a test sees storage maintenance (memtable
// flushes, segment releases, value-log GC) often. It is internal to this
// module, so no program outside it can set holdfast.Options.Storage or
// cluster.Config.Storage: a node's storage sizes are not part of the API.
package storetune

import "time"

// Config overrides the storage defaults; a zero field keeps the default.
type Config struct {
	// MemTableSize is persistence.Config.MemTableSize (bytes).
	MemTableSize int64
	// SegmentSize is persistence.Config.SegmentSize (bytes).
	SegmentSize int64
	// ValueLogFileSize is persistence.Config.ValueLogFileSize (bytes).
	ValueLogFileSize int64
	// ValueLogGCEvery is persistence.PipelineConfig.ValueLogGCEvery.
	ValueLogGCEvery time.Duration
}
