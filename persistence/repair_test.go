package persistence

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// crashedDB writes n records of 200 bytes through a pipeline over small
// segments and leaves the directory as a crash would (Badger closed without
// the log removed); it returns the log's segment paths, oldest first.
func crashedDB(t *testing.T, dir string, n int) []string {
	t.Helper()
	db, err := Open(Config{Dir: dir, SegmentSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	p := NewPipeline(db, PipelineConfig{})
	p.Start()
	for i := 0; i < n; i++ {
		if err := p.Submit(set(fmt.Sprintf("k%03d", i), strings.Repeat("v", 200))).Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	p.Close()
	db.wal.closeAll()
	_ = db.bdb.Close()
	ids, err := (&wal{dir: filepath.Join(dir, "wal")}).segmentIDs()
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, id := range ids {
		paths = append(paths, segmentName(filepath.Join(dir, "wal"), id))
	}
	return paths
}

// TestRepairWAL_ReportsThenCutsAtTheDamage: without the operator's word the
// repair only reports; with it, the log is cut at the damage, the later
// segments are moved aside with a copy of the damaged one, and the database
// opens with every write before the damage.
func TestRepairWAL_ReportsThenCutsAtTheDamage(t *testing.T) {
	dir := t.TempDir()
	segs := crashedDB(t, dir, 60)
	if len(segs) < 4 {
		t.Fatalf("%d segments", len(segs))
	}
	damaged := segs[1]
	flipByte(t, damaged, recordHeader+3) // the first record of the second segment
	if _, err := Open(Config{Dir: dir}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open: %v", err)
	}
	rep, err := RepairWAL(dir, false, nil)
	if err != nil || rep.Damage == nil || rep.Damage.File != damaged || rep.Repaired {
		t.Fatalf("report only: %+v, %v", rep, err)
	}
	if rep.Dropped == 0 || len(rep.DroppedSegments) != len(segs)-2 {
		t.Fatalf("dropped %d records in %d later segments, want some in %d", rep.Dropped, len(rep.DroppedSegments), len(segs)-2)
	}
	if _, err := Open(Config{Dir: dir}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a report changed the log: %v", err)
	}
	rep, err = RepairWAL(dir, true, nil)
	if err != nil || !rep.Repaired {
		t.Fatalf("repair: %+v, %v", rep, err)
	}
	for _, p := range append([]string{damaged}, rep.DroppedSegments...) {
		if _, err := os.Stat(filepath.Join(rep.SavedTo, filepath.Base(p))); err != nil {
			t.Fatalf("no copy of %s: %v", p, err)
		}
	}
	db, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatalf("open after the repair: %v", err)
	}
	// What Badger held stays (here everything: its close flushed it).
	if _, found, err := db.Get(context.Background(), []byte("k000")); err != nil || !found {
		t.Fatalf("k000: found=%v err=%v", found, err)
	}
	if _, err := RepairWAL(dir, true, nil); err == nil {
		t.Fatal("a repair ran beside an open database")
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if rep, err := RepairWAL(dir, false, nil); err != nil || rep.Damage != nil {
		t.Fatalf("a second repair found %+v, %v", rep, err)
	}
}

// TestRepairWAL_ReplaysALogThatStartsBeyondTheDatabase: nothing can be cut
// to get records the database and the log both lack back; the operator's word
// replays the log as it is.
func TestRepairWAL_ReplaysALogThatStartsBeyondTheDatabase(t *testing.T) {
	dir := t.TempDir()
	segs := crashedDB(t, dir, 60)
	// Badger lost its tables (and the first segment is gone): the log starts
	// beyond it.
	if err := os.RemoveAll(filepath.Join(dir, "badger")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(segs[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Config{Dir: dir}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open: %v", err)
	}
	rep, err := RepairWAL(dir, false, nil)
	if err != nil || !rep.MissingFromStart || rep.Repaired {
		t.Fatalf("report: %+v %v", rep, err)
	}
	rep, err = RepairWAL(dir, true, nil)
	if err != nil || !rep.AcceptedMissingFromStart {
		t.Fatalf("repair: %+v %v", rep, err)
	}
	db, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, found, _ := db.Get(context.Background(), []byte("k059")); !found {
		t.Fatal("the log's last write is missing after the replay")
	}
}
