package persistence

// testReleaseSkipsSync plants a bug for the power-cut test
// (TestDB_PowerCutLosesNoAcknowledgedWrite) to catch: when set, wal.release
// gives up log segments without syncing Badger's value log and directory
// first. Only the test's child process sets it; it is false in every build.
var testReleaseSkipsSync bool

// unlessPlanted calls sync, unless testReleaseSkipsSync plants the bug.
func unlessPlanted(sync func() error) error {
	if testReleaseSkipsSync {
		return nil
	}
	return sync()
}
