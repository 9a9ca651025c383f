package persistence

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/dgraph-io/badger/v4"
)

// Badger's value log. Badger keeps a value of valueThreshold (64 KiB) or
// more out of its LSM tree, in value-log files (NNNNNN.vlog) that the tree
// points into: a large slot value, the change-log entry of a large
// transaction, the block of a large log append. Badger does not sync those
// files (SyncWrites is off: the write-ahead log is the durability point), and
// it reclaims none of their space by itself. Two things follow.
//
// Before the write-ahead log gives up records, every value-log file that they
// may point into must be synced. Upstream Badger (v4.9.6) synced a file it
// filled and left only at Close, and its DB.Sync syncs only the file it writes
// now; the fork in third_party/badger syncs a file when Badger leaves it, and
// the current one and the directory before its MANIFEST names a table
// (HOLDFAST PATCHES 1 and 3). syncValueLog, which the release calls, syncs
// every file and the directory once more: a second line, which the power-cut
// test found redundant since those patches.
//
// The space of values deleted, overwritten or trimmed comes back only through
// Badger's value-log GC (RunValueLogGC). It copies a file's live values into
// the current file, through Badger's unsynced write path, points the tree at
// the copies, and deletes the old file at once: a power loss after that delete
// would lose values whose only synced copy was in it. collectValueLog makes it
// safe. It holds an iterator open while the GC runs, which makes Badger defer
// the delete (Badger deletes a rewritten file only once no iterator is open);
// then it has Badger's memtables, which hold the tree's new pointers, flushed
// to tables; only then does it close the iterator and let the old file go.
// (That deferral is Badger's, v4.9.6: valueLog.rewrite and
// decrIteratorCount. TestValueLog_GCKeepsRewrittenFilesUntilItsCopiesAreSynced
// fails if an upgrade changes it.) Badger finds the garbage of a file in its
// compactions (discard statistics), so space comes back as the tree is
// compacted, not at once; Pipeline.gcLoop sees that compactions happen.
//
// Why a flush, and not a sync of the memtable logs (NNNNN.mem) that hold the
// new pointers, as this did before: a pointer must never be durable before the
// value it points to. A flush keeps that order: Badger syncs the value log,
// copies included, before its MANIFEST names the new table (third_party/badger,
// HOLDFAST PATCH 3). Two syncs of separate files cannot: the memtable logs
// synced first, then the value log, a power cut between them (the value-log
// sync writes back megabytes of mapped pages, tens of milliseconds) left
// durable memtable logs pointing past the durable end of the current value-log
// file, which Badger replays at open; the value log first, then the memtable
// logs, and the applier's writes between the two are durable pointers to
// unsynced values. Either way a read failed after the cut, even with the
// write-ahead log holding the record: Badger reads the newest version, and a
// merged batch's version (the applier's) is newer than the record's own (the
// replay's). The power-cut test found it. So Holdfast never syncs Badger's
// memtable logs: what they hold is in the write-ahead log or in tables.

// valueThreshold is the size from which Badger keeps a value in its value
// log rather than in its tree. Badger's default is 1 MiB, its largest: a
// value just under it then went through the memtables, every table built from
// them and every compaction. In the overload run (bench/overload, 80 writers
// of 512 KiB-1 MiB values), Badger's table building took 464 MB of a 1 GB
// heap and the node's RSS passed its memory budget; a small pointer in the
// tree costs none of that.
const valueThreshold = 64 << 10

// valueLogFileSize is the size at which Badger starts a new value-log file,
// and so the unit in which the GC gives space back. Badger's default is 1 GiB.
const valueLogFileSize = 128 << 20

// valueLogDiscardRatio is the share of a value-log file that must be garbage
// before the GC rewrites it: the rewrite costs the live rest.
const valueLogDiscardRatio = 0.5

// valueLog syncs Badger's value-log and memtable-log files, in Badger's
// directory.
type valueLog struct {
	dir string
	mu  sync.Mutex
	// syncedBelow: every value-log file with a lower number was synced after
	// Badger had left it for a newer one, and Badger no longer writes to it.
	syncedBelow uint64
	// fsync syncs a file or directory; tests replace it to see what is synced.
	fsync func(path string) error
	// pins are iterators left open after a failed sync, so that Badger never
	// deletes the value-log files a GC rewrote (collectValueLog).
	pins []*badger.Iterator
}

func newValueLog(dir string) *valueLog {
	return &valueLog{dir: dir, fsync: syncPath}
}

// numbered is a file named NNN.ext in Badger's directory.
type numbered struct {
	id   uint64
	path string
}

// numberedFiles returns the files in dir named NNN.ext, in order.
func numberedFiles(dir, ext string) ([]numbered, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []numbered
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ext)
		if !ok {
			continue
		}
		if id, err := strconv.ParseUint(name, 10, 64); err == nil {
			out = append(out, numbered{id, filepath.Join(dir, e.Name())})
		}
	}
	slices.SortFunc(out, func(a, b numbered) int { return cmp.Compare(a.id, b.id) })
	return out, nil
}

// syncFiles syncs the files NNN.ext numbered from and up; a file gone
// meanwhile is skipped (Badger deleted it: see collectValueLog). It returns the
// highest number it saw, or from.
func (v *valueLog) syncFiles(ext string, from uint64) (uint64, error) {
	files, err := numberedFiles(v.dir, ext)
	if err != nil {
		return 0, fmt.Errorf("list the %s files: %w", ext, err)
	}
	top := from
	for _, f := range files {
		if f.id < from {
			continue
		}
		top = f.id
		if err := v.fsync(f.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, err
		}
	}
	return top, nil
}

// newest returns the number of the newest value-log file, or 0.
func (v *valueLog) newest() (uint64, error) {
	files, err := numberedFiles(v.dir, ".vlog")
	if err != nil || len(files) == 0 {
		return 0, err
	}
	return files[len(files)-1].id, nil
}

// ValueLogBytes returns the disk space of Badger's value-log files: where
// values of 1 MiB and more are (see the top of valuelog.go).
func (db *DB) ValueLogBytes() (int64, error) {
	files, err := numberedFiles(db.vlog.dir, ".vlog")
	if err != nil {
		return 0, err
	}
	var n int64
	for _, f := range files {
		fi, err := os.Stat(f.path)
		if err != nil {
			continue // deleted meanwhile
		}
		// The file Badger writes now is sized for its mapping, mostly holes:
		// count the blocks it takes.
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		} else {
			n += fi.Size()
		}
	}
	return n, nil
}

// syncValueLog syncs every value-log file Badger may have written since the
// last call, the one it writes now included, then the directory. It is what
// the write-ahead log needs before it releases records: Badger's tables are
// synced by Badger, and their large values are here. It syncs each file by its
// path, not through Badger's DB.Sync: that one msyncs Badger's mapping of the
// current file, which fails (ENOMEM, and the race detector sees it) when a
// write grows that mapping at the same moment; and it syncs Badger's current
// memtable log too, which the release does not need and which took 100–140 ms
// on the commits' path at 93,000 writes/s.
func (v *valueLog) syncValueLog() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	top, err := v.syncFiles(".vlog", v.syncedBelow)
	if err != nil {
		return err
	}
	if err := v.fsync(v.dir); err != nil {
		return err
	}
	// The newest file may still be written: the next call syncs it again.
	v.syncedBelow = top
	return nil
}

// collectValueLog runs Badger's value-log GC until it finds no file worth
// rewriting, or has rewritten maxFiles, and returns how many it rewrote. The
// rewritten files are deleted only once the pointers to their live values'
// copies are in tables, through flush, which must flush every memtable of
// Badger's (Pipeline.flushMemtables), and Badger synced the copies before
// naming those tables (see the top of this file). When flush fails, the old
// files are kept for good and the error is errRewriteSync (the node's end: the
// pipeline fails), or errGCStopped, returned as is, when the pipeline closes
// first (Badger's Close flushes the memtables then). One goroutine at a time
// calls it: the pipeline's gcLoop, or a test.
func (db *DB) collectValueLog(maxFiles int, flush func() error) (int, error) {
	txn := db.bdb.NewTransactionAt(math.MaxUint64, false)
	// While an iterator is open, Badger keeps every file its GC rewrites.
	pin := txn.NewIterator(badger.IteratorOptions{})
	n := 0
	var err error
	for n < maxFiles {
		// No lock against the applier: Badger's GC and its writes used to
		// race on a memtable's newest version (v4.9.6), and a mutex here
		// made every applier batch wait for a whole GC run; the fork in
		// third_party/badger makes it atomic (HOLDFAST PATCH 2).
		err = db.bdb.RunValueLogGC(valueLogDiscardRatio)
		if err != nil {
			break
		}
		n++
	}
	if errors.Is(err, badger.ErrNoRewrite) || errors.Is(err, badger.ErrRejected) {
		err = nil
	}
	if n > 0 {
		// The copies are written (RunValueLogGC returns once its writes are
		// in Badger's memtables); the flush makes them and their pointers
		// durable, in that order.
		if ferr := flush(); ferr != nil {
			db.vlog.pins = append(db.vlog.pins, pin) // never closed: the rewritten files stay
			if errors.Is(ferr, errGCStopped) {
				return n, ferr
			}
			return n, fmt.Errorf("%w: %v", errRewriteSync, ferr)
		}
	}
	pin.Close()
	txn.Discard()
	if err != nil {
		return n, fmt.Errorf("value log GC: %w", err)
	}
	return n, nil
}

// errRewriteSync is collectValueLog's error when it could not make durable
// what the GC rewrote.
var errRewriteSync = errors.New("could not make durable the values the value-log GC rewrote")

// errGCStopped is Pipeline.flushMemtables's error when the pipeline closes
// before the applier took the flush.
var errGCStopped = errors.New("the pipeline closed before the value-log GC's flush")

// flushMemtables has the applier flush Badger's memtables, every one
// (Pipeline.flushBadger: Badger refuses writes while it flushes, so only its
// writer may), and waits for it; errGCStopped if the pipeline closes first.
// It runs on the GC loop.
func (p *Pipeline) flushMemtables() error {
	reply := make(chan error, 1)
	select {
	case p.flushes <- reply:
	case <-p.stopGC:
		return errGCStopped
	}
	return <-reply
}

// removeEmptyLogs removes the empty value-log and memtable-log files in
// Badger's directory dir, before Badger opens it. Badger truncates such a file
// to nothing before it removes it (ristretto's MmapFile.Delete), and creates
// one before it gives it a size, so a crash in between leaves an empty file;
// and Badger (v4.9.6) then refuses to open ("Create a new file"). An empty
// file holds nothing, so it can go. (TestValueLog_KilledDuringGCLosesNoAcknowledgedValue
// met one: the value-log GC deletes files often.)
func removeEmptyLogs(dir string, log *slog.Logger) error {
	removed := 0
	for _, ext := range []string{".vlog", ".mem"} {
		files, err := numberedFiles(dir, ext)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // a new database
			}
			return err
		}
		for _, f := range files {
			st, err := os.Stat(f.path)
			if err != nil || st.Size() != 0 {
				continue
			}
			if err := os.Remove(f.path); err != nil {
				return err
			}
			log.Warn("removed an empty file a crash left in Badger's directory", "file", f.path)
			removed++
		}
	}
	if removed == 0 {
		return nil
	}
	return syncPath(dir)
}
