package persistence

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Badger's value-log GC and its writes must be free of data races, so that the
// GC need not stop the applier (HOLDFAST PATCH 2 in third_party/badger: a
// memtable's newest version, which valueLog.rewrite reads through
// DB.MaxVersion while the write path updates it). Run under -race, this test
// fails on an unpatched Badger with "race detected". It writes and collects
// through Badger directly, as the applier and the GC loop do, with no lock
// between them.
func TestBadgerFork_ValueLogGCRacesNoWrite(t *testing.T) {
	dir := t.TempDir()
	// Opened like Open opens it, with small memtables (the smallest that takes
	// a 1 MiB value's write: the small values fill one in a few commits, so
	// flushes and compactions, which find the value log's garbage, come often)
	// and 1 MiB value-log files (one big value each, so an overwrite makes a
	// whole file garbage).
	db, err := Open(Config{Dir: dir, MemTableSize: 8 << 20, ValueLogFileSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	bdb := db.bdb

	const (
		bigKeys   = 3
		maxWrites = 300 // bounds the test: 300 MiB through the value log at most
		wantGCs   = 10  // enough rewrites, each concurrent with writes
	)
	var (
		stop     atomic.Bool
		rewrites atomic.Int64
		writes   atomic.Int64
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
	)
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
		stop.Store(true)
	}
	deadline := time.Now().Add(60 * time.Second)

	// The writer: managed commits at increasing versions, each an overwrite of
	// one of a few 1 MiB values (in the value log) and a few small values (in
	// the tree, so memtables fill). Each commit lets compactions drop the
	// versions below it, so that they find the overwritten values.
	version := db.lastSeq
	wg.Add(1)
	go func() {
		defer wg.Done()
		small := bytes.Repeat([]byte{'s'}, valueThreshold-1024) // in the tree
		for i := 0; i < maxWrites && !stop.Load() && time.Now().Before(deadline); i++ {
			version++
			txn := bdb.NewTransactionAt(math.MaxUint64, true)
			err := txn.Set(fmt.Appendf(nil, "big-%d", i%bigKeys), bigVersion(uint64(i)))
			for j := 0; err == nil && j < 16; j++ {
				err = txn.Set(fmt.Appendf(nil, "small-%d", j), small)
			}
			if err == nil {
				err = txn.CommitAt(version, nil)
			} else {
				txn.Discard()
			}
			if err != nil {
				fail(fmt.Errorf("write %d: %w", i, err))
				return
			}
			bdb.SetDiscardTs(version)
			writes.Add(1)
		}
		stop.Store(true)
	}()

	// The collector: Badger's value-log GC in a loop, beside the writes.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			err := bdb.RunValueLogGC(valueLogDiscardRatio)
			switch {
			case err == nil:
				if rewrites.Add(1) >= wantGCs {
					stop.Store(true)
				}
			case errors.Is(err, badger.ErrNoRewrite), errors.Is(err, badger.ErrRejected):
				time.Sleep(5 * time.Millisecond) // nothing worth rewriting yet
			default:
				fail(fmt.Errorf("value log GC: %w", err))
				return
			}
		}
	}()
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	// Without a rewrite, the GC never read the writes' versions: the test
	// would prove nothing.
	if n := rewrites.Load(); n == 0 {
		t.Fatalf("the value-log GC rewrote no file in %d writes", writes.Load())
	}
	t.Logf("%d value-log GC rewrites beside %d writes", rewrites.Load(), writes.Load())

	// Every big value reads back as its newest version, whole.
	for k := range bigKeys {
		key := fmt.Appendf(nil, "big-%d", k)
		v, found, err := db.Get(t.Context(), key)
		if err != nil || !found {
			t.Fatalf("%s: found=%v err=%v", key, found, err)
		}
		n := int64(k)
		for n+bigKeys < writes.Load() {
			n += bigKeys
		}
		if want := bigVersion(uint64(n)); !bytes.Equal(v, want) {
			t.Errorf("%s: %d bytes starting %x; want version %d", key, len(v), v[:min(len(v), 9)], n)
		}
	}
}
