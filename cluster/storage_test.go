package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/internal/storetune"
)

// TestNode_StorageTuning: Config.Storage reaches the database and the
// pipeline: Badger's memtable log is sized from MemTableSize, log segments
// fill at SegmentSize, and the value-log
// GC loop runs at ValueLogGCEvery (with the default minute, it would not have
// flushed Badger's memtables for the value log within the test's deadline).
func TestNode_StorageTuning(t *testing.T) {
	dir := t.TempDir()
	const memTable = 8 << 20 // the smallest power of two Badger takes: its batch (15%) must hold a 1 MiB value
	n, err := Start(Config{DataDir: dir, Partitions: 4, Types: []actors.TypeSpec{{
		Name: "big",
		Handle: func(c *actors.Context, msg any) (any, error) {
			return nil, c.Put("v", make([]byte, actors.MaxStorageValueBytes))
		},
	}}, Storage: &storetune.Config{MemTableSize: memTable, SegmentSize: 2 << 20, ValueLogFileSize: 1 << 20, ValueLogGCEvery: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	badgerDir := filepath.Join(dir, "badger")
	if got := n.db.BadgerMemTableSize(); got != memTable {
		t.Fatalf("Badger's memtables are %d bytes, want %d", got, memTable)
	}
	// Values of 1 MiB go to the value log, one file each at 1 MiB files: once
	// two files are there, the GC loop has the applier flush the memtables,
	// which makes a table.
	ctx := context.Background()
	for i := range 4 {
		if _, err := n.Request(ctx, actors.ObjectID{App: "app_c", Type: "big", Key: "k"}, i); err != nil {
			t.Fatal(err)
		}
	}
	// Four records of 1 MiB do not fit in one log segment of 2 MiB (they would
	// in the default 64 MiB): the log is on its third segment at least.
	segs, _ := filepath.Glob(filepath.Join(dir, "wal", "*.wal"))
	if len(segs) == 0 || filepath.Base(segs[len(segs)-1]) < "0000000000000003.wal" {
		t.Fatalf("log segments %v: want the third segment or a later one", segs)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		entries, err := os.ReadDir(badgerDir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".sst") {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no memtable flushed within 20s: the value-log GC loop did not run at ValueLogGCEvery (files: %v)", entries)
		}
	}
}

// TestStorageForBudget: Badger's memory follows a small budget down, within
// its bounds, and keeps its defaults for a large one.
func TestStorageForBudget(t *testing.T) {
	for _, c := range []struct{ budget, memtable, cache int64 }{
		{512 << 20, 16 << 20, 32 << 20},
		{1 << 30, 32 << 20, 64 << 20},
		{64 << 20, 16 << 20, 16 << 20},
		{4 << 30, 128 << 20, 256 << 20},
		{64 << 30, 128 << 20, 256 << 20},
	} {
		m, b := storageForBudget(c.budget)
		if m != c.memtable || b != c.cache {
			t.Errorf("budget %d MiB: memtable %d MiB, cache %d MiB; want %d and %d", c.budget>>20, m>>20, b>>20, c.memtable>>20, c.cache>>20)
		}
	}
}
