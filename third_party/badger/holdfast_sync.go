/*
 * SPDX-License-Identifier: Apache-2.0
 */

package badger

import (
	"errors"

	"github.com/dgraph-io/badger/v4/y"
)

// This file is Holdfast's (see HOLDFAST-PATCHES.md): what must be durable
// before the MANIFEST names a new table, when Badger runs with
// SyncWrites=false.

// errValueLogNotOpen is syncBeforeNamingTable's error when a table would be
// named before the value log is open. Open hands memtables to the flusher only
// after vlog.open, so it is never expected.
var errValueLogNotOpen = errors.New("badger: a table was built before the value log was open")

// syncBeforeNamingTable makes durable what a table just created (and not yet
// named by the MANIFEST) needs after a power cut:
//
//   - HOLDFAST PATCH 3: the value-log bytes its value pointers point into. The
//     files Badger left are synced when it leaves them (doneWriting, and
//     vlog.open for the last file of the previous run); the file written now is
//     synced here. Every pointer in the table was written to the value log
//     before its entry reached the memtable, so before the flush began.
//   - HOLDFAST PATCH 1: the table's directory entry (table.CreateTable syncs the
//     file's data, not the directory), and the value-log files' entries when
//     they are in another directory. Without it the MANIFEST can survive a power
//     cut naming a table that does not ("file does not exist for table N").
//
// The MANIFEST's own sync (manifestFile.addChanges) comes after.
func (db *DB) syncBeforeNamingTable() error {
	if db.opt.InMemory {
		return nil
	}
	if !db.vlogOpen.Load() {
		return errValueLogNotOpen
	}
	if err := db.vlog.syncCurrentFile(); err != nil {
		return err
	}
	if err := holdfastSyncDir(db.opt.Dir); err != nil {
		return y.Wrapf(err, "while syncing directory %s", db.opt.Dir)
	}
	if db.opt.ValueDir != db.opt.Dir {
		if err := holdfastSyncDir(db.opt.ValueDir); err != nil {
			return y.Wrapf(err, "while syncing directory %s", db.opt.ValueDir)
		}
	}
	return nil
}

// syncCurrentFile syncs the value-log file being written (HOLDFAST PATCH 3),
// whatever SyncWrites says. It syncs through the file descriptor, not the
// mapping as valueLog.sync does: the write path may grow and remap the current
// file (valueLog.write) without its lock, beside this call, and the bytes
// written through a shared mapping are the file's page cache, which fsync
// writes out (on Linux msync(MS_SYNC) is the same fsync of the range).
func (vlog *valueLog) syncCurrentFile() error {
	vlog.filesLock.RLock()
	curlf := vlog.filesMap[vlog.maxFid]
	if curlf == nil { // no value-log file yet: nothing can point into one
		vlog.filesLock.RUnlock()
		return nil
	}
	// The file lock keeps the descriptor open (it is closed under the write
	// lock); taken before filesLock is let go, as valueLog.sync does.
	curlf.lock.RLock()
	vlog.filesLock.RUnlock()
	err := holdfastSyncFile(curlf)
	curlf.lock.RUnlock()
	if err != nil {
		return y.Wrapf(err, "while syncing value log file %s", curlf.path)
	}
	return nil
}

// holdfastSyncDir and holdfastSyncFile are the syncs of the Holdfast patches
// (syncBeforeNamingTable; holdfastSyncFile also in doneWriting and vlog.open);
// tests replace them to see what is synced, and in which order with the
// MANIFEST's sync (syncFunc). holdfastSyncFile syncs through the descriptor:
// see syncCurrentFile.
var (
	holdfastSyncDir  = syncDir
	holdfastSyncFile = func(lf *logFile) error { return lf.Fd.Sync() }
)
