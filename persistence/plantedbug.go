package persistence

// Test knobs of the package, set only by its tests; false or nil in every
// program.

// testReleaseUnflushed plants a bug for the power-cut test
// (TestDB_PowerCutCatchesAReleaseOfUnflushedRecords) to catch: when set, the
// releaser gives up log segments once Badger applied their records, not once it
// flushed them to synced tables. Only the test's child process sets it.
var testReleaseUnflushed bool

// testApplyFault, if set, is called before each attempt of the applier to
// write a batch into Badger; an error fails the attempt as Badger's would.
var testApplyFault func() error

// testOnSetDiscard, if set, is called with every discard version set in
// Badger, just before it is set.
var testOnSetDiscard func(v uint64)
