/*
 * SPDX-License-Identifier: Apache-2.0
 */

package badger

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Tests of the Holdfast patches 1 and 3 (HOLDFAST-PATCHES.md). They record
// the syncs in order; a power-cut test in Holdfast (persistence/powercut_test.go)
// shows what they are for.

// syncEvent is a sync seen by syncRecorder: of the directory (with the tables
// it then listed), of a value-log file (fid), or of the MANIFEST (with the
// tables the directory then listed).
type syncEvent struct {
	what   string // "dir", "vlog", "manifest"
	fid    uint32
	tables []string
}

type syncRecorder struct {
	dir    string
	mu     sync.Mutex
	events []syncEvent
}

// recordHoldfastSyncs replaces the syncs of the patches, and the MANIFEST's,
// with ones that record and then sync, until the test ends.
func recordHoldfastSyncs(t *testing.T, dir string) *syncRecorder {
	t.Helper()
	r := &syncRecorder{dir: dir}
	oldDir, oldFile, oldManifest := holdfastSyncDir, holdfastSyncFile, syncFunc
	t.Cleanup(func() { holdfastSyncDir, holdfastSyncFile, syncFunc = oldDir, oldFile, oldManifest })
	holdfastSyncDir = func(d string) error {
		r.add(syncEvent{what: "dir", tables: r.tables()})
		return oldDir(d)
	}
	holdfastSyncFile = func(lf *logFile) error {
		r.add(syncEvent{what: "vlog", fid: lf.fid})
		return oldFile(lf)
	}
	syncFunc = func(f *os.File) error {
		r.add(syncEvent{what: "manifest", tables: r.tables()})
		return oldManifest(f)
	}
	return r
}

func (r *syncRecorder) add(e syncEvent) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *syncRecorder) take() []syncEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.events
	r.events = nil
	return e
}

// tables lists the table files in the directory.
func (r *syncRecorder) tables() []string {
	m, _ := filepath.Glob(filepath.Join(r.dir, "*"+fileSuffix))
	for i := range m {
		m[i] = filepath.Base(m[i])
	}
	slices.Sort(m)
	return m
}

const fileSuffix = ".sst"

func holdfastTestOptions(dir string) Options {
	return DefaultOptions(dir).
		WithSyncWrites(false).
		WithValueThreshold(1 << 10). // the test values go to the value log
		WithValueLogFileSize(1 << 20).
		WithLoggingLevel(WARNING)
}

func holdfastWrite(t *testing.T, db *DB, n int, size int) {
	t.Helper()
	for i := range n {
		err := db.Update(func(txn *Txn) error {
			return txn.Set(fmt.Appendf(nil, "key-%03d", i), bytes.Repeat([]byte{byte(i)}, size))
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// checkNamedAfterSyncs checks that before each MANIFEST sync that names a
// new table, since the MANIFEST sync before it, the directory was synced
// listing that table (PATCH 1) and value-log file curFid, the one written now,
// was synced (PATCH 3). It returns how many new tables it checked.
func checkNamedAfterSyncs(t *testing.T, events []syncEvent, curFid uint32) int {
	t.Helper()
	seen := map[string]bool{} // tables a MANIFEST sync listed already
	checked := 0
	from := 0 // the events since the previous MANIFEST sync
	for i, e := range events {
		if e.what != "manifest" {
			continue
		}
		since := events[from:i]
		from = i + 1
		for _, tbl := range e.tables {
			if seen[tbl] {
				continue
			}
			seen[tbl] = true
			checked++
			if !slices.ContainsFunc(since, func(p syncEvent) bool { return p.what == "dir" && slices.Contains(p.tables, tbl) }) {
				t.Errorf("the MANIFEST was synced naming %s before the directory was synced with it", tbl)
			}
			if !slices.ContainsFunc(since, func(p syncEvent) bool { return p.what == "vlog" && p.fid == curFid }) {
				t.Errorf("the MANIFEST was synced naming %s before value-log file %d was synced", tbl, curFid)
			}
		}
	}
	return checked
}

// A memtable flush makes the table's directory entry and the value log it
// points into durable before the MANIFEST names the table (patches 1 and 3).
func TestHoldfast_FlushSyncsTheDirectoryAndValueLogBeforeTheManifest(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(holdfastTestOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	holdfastWrite(t, db, 8, 64<<10) // 512 KiB in the value log, one file
	db.vlog.filesLock.RLock()
	cur := db.vlog.maxFid
	db.vlog.filesLock.RUnlock()
	r := recordHoldfastSyncs(t, dir)
	if err := db.Close(); err != nil { // flushes the memtable to a table
		t.Fatal(err)
	}
	events := r.take()
	if n := checkNamedAfterSyncs(t, events, cur); n == 0 {
		t.Fatalf("no table was named by the MANIFEST at Close (syncs: %+v)", events)
	}
}

// A value-log file Badger leaves for a new one is synced (patch 3), whatever
// SyncWrites says; and so is the last file of the previous run at open.
func TestHoldfast_LeftValueLogFilesAreSynced(t *testing.T) {
	dir := t.TempDir()
	r := recordHoldfastSyncs(t, dir)
	db, err := Open(holdfastTestOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	holdfastWrite(t, db, 6, 600<<10) // a new file every second value
	db.vlog.filesLock.RLock()
	first, last := db.vlog.sortedFids()[0], db.vlog.maxFid
	db.vlog.filesLock.RUnlock()
	if last-first < 2 {
		t.Fatalf("value-log files %d..%d: want rotations", first, last)
	}
	synced := map[uint32]bool{}
	for _, e := range r.take() {
		if e.what == "vlog" {
			synced[e.fid] = true
		}
	}
	for fid := first; fid < last; fid++ {
		if !synced[fid] {
			t.Errorf("value-log file %d was left for a newer one unsynced", fid)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	r.take()
	db, err = Open(holdfastTestOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if !slices.ContainsFunc(r.take(), func(e syncEvent) bool { return e.what == "vlog" && e.fid == last }) {
		t.Errorf("open did not sync value-log file %d, the last of the previous run", last)
	}
}

// errorLogger records Badger's error messages.
type errorLogger struct {
	mu     sync.Mutex
	errors []string
}

func (l *errorLogger) Errorf(f string, a ...any) {
	l.mu.Lock()
	l.errors = append(l.errors, fmt.Sprintf(f, a...))
	l.mu.Unlock()
}
func (l *errorLogger) Warningf(string, ...any) {}
func (l *errorLogger) Infof(string, ...any)    {}
func (l *errorLogger) Debugf(string, ...any)   {}

// Memtables replayed from their logs at open are flushed only once the value
// log is open, so their flush syncs it (patch 3) rather than failing or
// racing vlog.open; and the directory and value log are synced before the
// MANIFEST names their tables.
func TestHoldfast_ReplayedMemtablesFlushAfterTheValueLogOpens(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(holdfastTestOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	holdfastWrite(t, db, 8, 64<<10)
	// A crash: copy the files as they are now (the memtable only in its log).
	crashed := t.TempDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == lockFile {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(crashed, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	r := recordHoldfastSyncs(t, crashed)
	logger := &errorLogger{}
	db, err = Open(holdfastTestOptions(crashed).WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	err = db.View(func(txn *Txn) error {
		for i := range 8 {
			item, err := txn.Get(fmt.Appendf(nil, "key-%03d", i))
			if err != nil {
				return err
			}
			v, err := item.ValueCopy(nil)
			if err != nil {
				return err
			}
			if !bytes.Equal(v, bytes.Repeat([]byte{byte(i)}, 64<<10)) {
				return fmt.Errorf("key-%03d: wrong value", i)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	logger.mu.Lock()
	defer logger.mu.Unlock()
	for _, e := range logger.errors {
		if strings.Contains(e, "flushing memtable") {
			t.Errorf("Badger logged: %s", e)
		}
	}
	if !slices.ContainsFunc(r.take(), func(e syncEvent) bool { return e.what == "dir" }) {
		t.Error("the replayed memtable's flush synced no directory")
	}
}
