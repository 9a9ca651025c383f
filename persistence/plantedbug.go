package persistence

// Test knobs of the package, set only by its tests.

// testReleaseSkipsSync plants a bug for the power-cut test to find: the log
// releases segments without syncing what Badger holds of them first. Only tests
// set it.
var testReleaseSkipsSync bool

// testApplyFault, if set, is called before each attempt of the applier to
// write a batch into Badger; an error fails the attempt as Badger's would.
// Only tests set it.
var testApplyFault func() error
