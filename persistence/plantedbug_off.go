//go:build !plantedbug

package persistence

import "time"

// plantedCommitDelay is zero in every real build. With the plantedbug tag the
// actors reply before their writes are durable, and the committer waits this
// long before it writes each record, so that a kill -9 at any moment of the
// torture test finds acknowledged writes not yet in the log: without the wait
// the record reaches the page cache within microseconds of the reply, and a
// 10 s run with four kills caught the bug only now and then (two CI runs of
// TestTorture_PassesAndCatchesAPlantedBug passed the buggy binary).
const plantedCommitDelay time.Duration = 0
