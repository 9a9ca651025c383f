package persistence

// Test knobs of the package, set only by its tests; false or nil in every
// program.

// testReleaseSkipsSync plants a bug for the power-cut test
// (TestDB_PowerCutLosesNoAcknowledgedWrite) to catch: when set, wal.release
// gives up log segments without syncing Badger's value log and directory
// first. Only the test's child process sets it.
var testReleaseSkipsSync bool

// testApplyFault, if set, is called before each attempt of the applier to
// write a batch into Badger; an error fails the attempt as Badger's would.
var testApplyFault func() error
