/*
 * SPDX-License-Identifier: Apache-2.0
 */

package badger

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Tests of HOLDFAST PATCH 5 (HOLDFAST-PATCHES.md): NoMemTableLog.

func memFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), memFileExt) {
			out = append(out, e.Name())
		}
	}
	return out
}

func holdfastMemOptions(dir string) Options {
	return DefaultOptions(dir).WithMemTableSize(1 << 20).WithValueThreshold(1 << 10).WithLogger(nil).WithNumMemtables(2)
}

func writeKeys(t *testing.T, db *DB, from, to int) {
	t.Helper()
	for i := from; i < to; i += 100 {
		txn := db.NewTransactionAt(uint64(i+1), true)
		for j := i; j < min(i+100, to); j++ {
			require.NoError(t, txn.Set([]byte(fmt.Sprintf("key-%06d", j)), []byte(fmt.Sprintf("value-%06d-%s", j, strings.Repeat("x", 200)))))
		}
		require.NoError(t, txn.CommitAt(uint64(i+1), nil))
	}
}

func readKeys(t *testing.T, db *DB, from, to int) {
	t.Helper()
	txn := db.NewTransactionAt(1<<62, false)
	defer txn.Discard()
	for j := from; j < to; j++ {
		item, err := txn.Get([]byte(fmt.Sprintf("key-%06d", j)))
		require.NoError(t, err, "key %d", j)
		v, err := item.ValueCopy(nil)
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(string(v), fmt.Sprintf("value-%06d-", j)))
	}
}

// TestHoldfast_NoMemTableLogWritesNoMemFiles: with NoMemTableLog, memtables
// fill, rotate and flush without a .mem file ever being written, every key
// stays readable, and Close flushes the last memtable so that a reopened
// database holds every key. Without the option the same writes leave a .mem
// file (the control).
func TestHoldfast_NoMemTableLogWritesNoMemFiles(t *testing.T) {
	for _, noLog := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoMemTableLog=%v", noLog), func(t *testing.T) {
			dir := t.TempDir()
			db, err := OpenManaged(holdfastMemOptions(dir).WithNoMemTableLog(noLog))
			require.NoError(t, err)
			writeKeys(t, db, 0, 20000) // about 5 MiB: several memtables of 1 MiB
			if noLog {
				require.Empty(t, memFiles(t, dir))
			} else {
				require.NotEmpty(t, memFiles(t, dir))
			}
			readKeys(t, db, 0, 20000)
			require.NotEmpty(t, db.Tables(), "the memtables were never flushed")
			require.NoError(t, db.Close())

			db, err = OpenManaged(holdfastMemOptions(dir).WithNoMemTableLog(noLog))
			require.NoError(t, err)
			readKeys(t, db, 0, 20000)
			require.NoError(t, db.Close())
		})
	}
}

// TestHoldfast_NoMemTableLogReplaysAnEarlierRunsLogs: .mem files left by a run
// without the option (a crash: the files are copied aside before Close) are
// replayed by an open with it, and removed once flushed.
func TestHoldfast_NoMemTableLogReplaysAnEarlierRunsLogs(t *testing.T) {
	dir := t.TempDir()
	db, err := OpenManaged(holdfastMemOptions(dir))
	require.NoError(t, err)
	writeKeys(t, db, 0, 1000) // in the first memtable only
	crashed := t.TempDir()
	copyCrashed(t, dir, crashed)
	require.NoError(t, db.Close())
	require.NotEmpty(t, memFiles(t, crashed))

	db, err = OpenManaged(holdfastMemOptions(crashed).WithNoMemTableLog(true))
	require.NoError(t, err)
	readKeys(t, db, 0, 1000)
	writeKeys(t, db, 1000, 20000)
	readKeys(t, db, 0, 20000)
	require.NoError(t, db.Close())
	require.Empty(t, memFiles(t, crashed), "the earlier run's memtable log was not removed once flushed")
}

// TestHoldfast_NoMemTableLogRefusesSyncWrites: SyncWrites syncs the memtable
// log, which the option drops.
func TestHoldfast_NoMemTableLogRefusesSyncWrites(t *testing.T) {
	_, err := OpenManaged(holdfastMemOptions(t.TempDir()).WithNoMemTableLog(true).WithSyncWrites(true))
	require.ErrorContains(t, err, "NoMemTableLog")
}

// copyCrashed copies the regular files of src into dst, as a crash would leave
// them (the page cache survives a process crash).
func copyCrashed(t *testing.T, src, dst string) {
	t.Helper()
	entries, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range entries {
		if !e.Type().IsRegular() || e.Name() == lockFile {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644))
	}
}
