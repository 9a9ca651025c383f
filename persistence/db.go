package persistence

import (
	"bytes"
	"container/heap"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"

	"github.com/dgraph-io/badger/v4"

	"github.com/holdfast/holdfast/internal/durable"
)

// Config configures the node's database.
type Config struct {
	// Dir holds the database: Badger in Dir/badger, the write-ahead log in Dir/wal.
	// Created if missing.
	Dir string
	// Partitions is the number of partitions. It is fixed when Dir is created;
	// zero means "what Dir holds", or DefaultPartitions for a new Dir.
	Partitions int
	// MemTableSize is Badger's memtable size in bytes; one commit holds at most 15%
	// of it. Zero means 128 MiB, enough for the largest write the API accepts.
	MemTableSize int64
	// SegmentSize is the size of a write-ahead log segment. Zero means 64 MiB.
	SegmentSize int64
	// ValueLogFileSize is the size of one of Badger's value-log files, which
	// hold values of 1 MiB and more (see valuelog.go). Zero means 128 MiB; at
	// least 1 MiB. Badger refuses a value larger than this, and a refused apply
	// fails the pipeline, so keep it above PipelineConfig.MaxWriteBytes (the
	// API's largest value is 8 MiB).
	ValueLogFileSize int64
	// BlockCacheSize is the bytes of Badger's block cache. Zero means 256 MiB
	// (Badger's default).
	BlockCacheSize int64
	// Logger receives Badger's messages. Nil means slog.Default().
	Logger *slog.Logger
	// Replicated opens the database of a node whose partitions are raft
	// groups (replicated.go): Badger versions come from the applier's own
	// counter. Fixed when Dir is created; Open refuses the other mode with
	// ErrModeMismatch.
	Replicated bool
}

// DefaultPartitions is the partition count of a new data directory.
const DefaultPartitions = 256

// MaxPartitions is the largest partition count (partitions are 16-bit in keys).
const MaxPartitions = 1 << 16

// DB is the node's database: Badger, opened in managed mode so that every commit's
// version is its sequence number in the write-ahead log, and the log itself. Reads
// see every commit the pipeline applied.
type DB struct {
	bdb        *badger.DB
	wal        *wal
	vlog       *valueLog
	log        *slog.Logger
	partitions int
	lastSeq    uint64 // the highest version in Badger or the log at Open
	closed     bool
	// keepLog is set by Pipeline.Close when Badger did not get every durable
	// record: Close then keeps the log for the next Open to replay.
	keepLog bool
	// raft is the raft logs the write-ahead log holds (raftlog.go); empty on
	// a single node. A node holding one keeps its log on a clean close.
	raft *raftIndex
	// replicated is the mode (replicated.go). version is replicated mode's
	// newest Badger version: set by Open, then owned by the applier.
	replicated bool
	version    uint64
	dir        string // the data directory (staged snapshots live in dir/snap)
}

// Open opens or creates the database in cfg.Dir and replays the write-ahead log
// into Badger, so that every commit acknowledged before a crash is readable.
func Open(cfg Config) (*DB, error) { return open(cfg, false) }

// open is Open; acceptMissingStart lets the log start beyond what Badger holds
// (RepairWAL, on an operator's explicit word).
func open(cfg Config, acceptMissingStart bool) (*DB, error) {
	if cfg.Partitions < 0 || cfg.Partitions > MaxPartitions {
		return nil, fmt.Errorf("persistence: partitions %d out of range 1..%d", cfg.Partitions, MaxPartitions)
	}
	if cfg.MemTableSize == 0 {
		cfg.MemTableSize = 128 << 20
	}
	if cfg.SegmentSize == 0 {
		cfg.SegmentSize = 64 << 20
	}
	if cfg.ValueLogFileSize == 0 {
		cfg.ValueLogFileSize = valueLogFileSize
	}
	if cfg.BlockCacheSize == 0 {
		cfg.BlockCacheSize = 256 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// Every directory made here is synced into its parent: a power cut soon
	// after the first start must not take the data directory, and every write
	// acknowledged into it, with it.
	if err := checkMode(cfg.Dir, cfg.Replicated); err != nil {
		return nil, err
	}
	if err := durable.MkdirAll(filepath.Join(cfg.Dir, "badger"), 0o755); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	// Badger does not sync: the write-ahead log is the durability point, and a log
	// segment is released only once Badger flushed its records to synced tables.
	// (Badger's own SyncWrites costs two msyncs per commit.) So Badger's
	// memtables keep no log of their own (HOLDFAST PATCH 5, NoMemTableLog): what
	// a crash takes from them, the replay below puts back from the write-ahead
	// log, which holds every record from the oldest one Badger's tables may lack.
	// With a .mem file per memtable every key was also copied there and written
	// back to disk by the kernel. Without it (docs/benchmarks.md, session 29):
	// 1,000 objects write 822 disk bytes per write instead of 1,217, at 1.06x
	// the writes per second; three replicas 3.4 KB instead of 5.6 KB at 1.13x;
	// and an open after a crash replays the log alone (1.0 s instead of 3.1 s
	// with a full memtable).
	opts := badger.DefaultOptions(filepath.Join(cfg.Dir, "badger")).
		WithSyncWrites(false).
		WithNoMemTableLog(true).
		WithDetectConflicts(false).
		WithMemTableSize(cfg.MemTableSize).
		WithNumMemtables(3).
		WithValueThreshold(valueThreshold).
		WithBlockCacheSize(cfg.BlockCacheSize).
		WithValueLogFileSize(cfg.ValueLogFileSize).
		WithLogger(badgerLogger{cfg.Logger.With("component", "badger")})
	if err := removeEmptyLogs(opts.Dir, cfg.Logger); err != nil {
		return nil, fmt.Errorf("open badger in %s: %w", cfg.Dir, err)
	}
	bdb, err := badger.OpenManaged(opts)
	if err != nil {
		return nil, fmt.Errorf("open badger in %s: %w", cfg.Dir, err)
	}
	db := &DB{bdb: bdb, vlog: newValueLog(opts.Dir), log: cfg.Logger, raft: newRaftIndex(), replicated: cfg.Replicated, dir: cfg.Dir}
	wb := bdb.NewManagedWriteBatch()
	replayed := 0
	floor := bdb.MaxVersion()
	var localApplied uint64
	if db.replicated {
		// The floor is the last record Badger took, and every replayed
		// record gets the next version of the counter (replicated.go).
		if localApplied, err = readLocalApplied(bdb); err != nil {
			_ = bdb.Close()
			return nil, err
		}
		floor, db.version = localApplied, bdb.MaxVersion()
	}
	if acceptMissingStart {
		floor = math.MaxUint64 - 1
	}
	var rr raftReplay
	w, last, err := openWALAt(filepath.Join(cfg.Dir, "wal"), cfg.SegmentSize, cfg.Logger, floor, func(seq uint64, at recordPlace, payload []byte) error {
		replayed++
		version := seq
		if db.replicated {
			db.version++
			version = db.version
		}
		return decodeRecord(payload,
			func(k, v []byte) error { return wb.SetEntryAt(badger.NewEntry(k, v), version) },
			func(k []byte) error { return wb.DeleteAt(k, version) },
			func(d *raftDecoder, op byte) error { return rr.change(db.raft, d, op, at) })
	})
	if err == nil && db.replicated && replayed > 0 {
		db.version++
		err = wb.SetEntryAt(badger.NewEntry(localAppliedKey, binary.AppendUvarint(nil, last)), db.version)
	}
	if err == nil {
		if re := db.raft.finishReplay(); re != nil {
			w.closeAll()
			err = &CorruptionError{File: w.dir, Reason: re.Error() + "; the log cannot give that replica its entries back",
				Group: re.key.group, Replica: re.key.replica, Index: re.index, missingStart: true}
		}
	}
	if err == nil {
		err = wb.Flush()
	} else {
		wb.Cancel()
	}
	if err == nil && db.replicated {
		// After the records: a snapshot's keys are partition keys, which
		// no local record writes (replicated.go).
		if err = db.reinstallSnapshots(); err != nil {
			w.closeAll()
		}
	}
	if err != nil {
		_ = bdb.Close()
		var ce *CorruptionError
		if errors.As(err, &ce) {
			return nil, err
		}
		return nil, fmt.Errorf("replay the write-ahead log: %w", err)
	}
	if replayed > 0 {
		cfg.Logger.Info("replayed the write-ahead log", "records", replayed, "last_seq", last)
	}
	db.wal = w
	w.raft, db.raft.w = db.raft, w
	db.lastSeq = max(last, bdb.MaxVersion())
	if db.replicated {
		db.lastSeq = max(last, localApplied)
	}
	if err := db.fixPartitions(cfg.Partitions); err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

func (db *DB) fixPartitions(want int) error {
	key := metaKey("partitions")
	v, found, err := db.Get(context.Background(), key)
	if err != nil {
		return fmt.Errorf("read partitions record: %w", err)
	}
	if found {
		if len(v) != 4 {
			return fmt.Errorf("persistence: bad partitions record of %d bytes", len(v))
		}
		stored := int(binary.BigEndian.Uint32(v))
		if want != 0 && want != stored {
			return fmt.Errorf("%w: the data directory has %d, the configuration says %d", ErrPartitionsMismatch, stored, want)
		}
		db.partitions = stored
		return nil
	}
	if want == 0 {
		want = DefaultPartitions
	}
	db.partitions = want
	// Written before the pipeline starts, through the log like any commit:
	// Badger syncs nothing of its own.
	return db.commitDirect(&Write{Sets: []KV{{Key: key, Value: binary.BigEndian.AppendUint32(nil, uint32(want))}}})
}

// commitDirect commits w through the log and applies it to Badger, on the
// caller's goroutine, before the pipeline starts.
func (db *DB) commitDirect(w *Write) error {
	seq := db.lastSeq + 1
	if err := db.wal.commit(seq, appendWrite(nil, w)); err != nil {
		return err
	}
	db.lastSeq = seq
	version := seq
	txn := db.bdb.NewTransactionAt(math.MaxUint64, true)
	defer txn.Discard()
	if db.replicated {
		db.version++
		version = db.version
		if err := txn.Set(localAppliedKey, binary.AppendUvarint(nil, seq)); err != nil {
			return err
		}
	}
	for _, kv := range w.Sets {
		if err := txn.Set(kv.Key, kv.Value); err != nil {
			return err
		}
	}
	for _, k := range w.Deletes {
		if err := txn.Delete(k); err != nil {
			return err
		}
	}
	return txn.CommitAt(version, nil)
}

// Partitions returns the partition count fixed for this data directory.
func (db *DB) Partitions() int { return db.partitions }

// Close closes the database. Close the Pipeline first. A clean close flushes
// Badger's memtables to synced tables, after which the log holds nothing Badger
// lacks and is removed, unless it holds raft logs (their tails and HardStates
// live only there) or Badger lacks durable records: then it is kept for the
// next Open to replay.
func (db *DB) Close() error {
	if db.closed {
		return nil
	}
	db.closed = true
	if db.keepLog || db.raft.hasState() {
		// A replica's log tail (appended, acknowledged to its leader, maybe
		// not yet committed) and HardState live only in the log.
		err := db.bdb.Close()
		db.wal.closeAll()
		if err != nil {
			return fmt.Errorf("close badger: %w", err)
		}
		return nil
	}
	err := db.bdb.Sync()
	if cerr := db.bdb.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		db.wal.closeAll()
		return fmt.Errorf("close badger: %w", err)
	}
	return db.wal.removeAll()
}

// Get returns a copy of the value at key, or found=false.
func (db *DB) Get(ctx context.Context, key []byte) (value []byte, found bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	err = db.bdb.View(func(txn *badger.Txn) error {
		item, err := txn.Get(key)
		if err != nil {
			return err
		}
		value, err = item.ValueCopy(nil)
		return err
	})
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("get: %w", err)
	}
	return value, true, nil
}

// Scan calls fn for each key in [start, end) under prefix, in key order, until fn
// returns false. A nil start means the prefix itself; a nil end means the end of the
// prefix. key and value are valid only during the call.
func (db *DB) Scan(ctx context.Context, prefix, start, end []byte, fn func(key, value []byte) (bool, error)) error {
	if start == nil {
		start = prefix
	}
	// With an end, the iterator yields every version, deletions included, so
	// that the scan stops at end even when the range holds only deletions:
	// Badger skips deleted keys inside Seek and Next, and without our bound it
	// would walk every deletion after the range (a queue's acked deliveries).
	allVersions := end != nil
	return db.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: false, AllVersions: allVersions})
		defer it.Close()
		var last []byte // the key whose newest version was seen (allVersions)
		for it.Seek(start); it.ValidForPrefix(prefix); it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			item := it.Item()
			k := item.Key()
			if end != nil && string(k) >= string(end) {
				return nil
			}
			if allVersions {
				if last != nil && bytes.Equal(k, last) {
					continue // an older version
				}
				last = append(last[:0], k...)
				if item.IsDeletedOrExpired() {
					continue
				}
			}
			var more bool
			err := item.Value(func(v []byte) error {
				var err error
				more, err = fn(k, v)
				return err
			})
			if err != nil {
				return err
			}
			if !more {
				return nil
			}
		}
		return nil
	})
}

// ScanReverse calls fn for each key under prefix at or below start, in descending
// key order, until fn returns false. key and value are valid only during the call.
func (db *DB) ScanReverse(ctx context.Context, prefix, start []byte, fn func(key, value []byte) (bool, error)) error {
	return db.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, Reverse: true})
		defer it.Close()
		for it.Seek(start); it.ValidForPrefix(prefix); it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			item := it.Item()
			var more bool
			err := item.Value(func(v []byte) error {
				var err error
				more, err = fn(item.Key(), v)
				return err
			})
			if err != nil || !more {
				return err
			}
		}
		return nil
	})
}

// Ends returns the first and the last key under prefix (copies), or found=false
// when there is none.
func (db *DB) Ends(ctx context.Context, prefix []byte) (first, last []byte, found bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, false, err
	}
	err = db.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		it.Seek(prefix)
		if !it.ValidForPrefix(prefix) {
			it.Close()
			return nil
		}
		first = it.Item().KeyCopy(nil)
		it.Close()
		rit := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, Reverse: true})
		defer rit.Close()
		end := append(append([]byte(nil), prefix...), 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF)
		rit.Seek(end)
		if !rit.ValidForPrefix(prefix) {
			return fmt.Errorf("persistence: %q has a first key but no last key", prefix)
		}
		last = rit.Item().KeyCopy(nil)
		found = true
		return nil
	})
	return first, last, found, err
}

// releasable is the newest sequence number whose record, and every one before
// it, Badger holds in its tables: once Badger is synced, the log no longer
// needs them. first maps a version to the first record of the batch the
// applier wrote at it.
//
// Let v be the newest version in Badger's tables. The applier writes a batch
// of records first..v at the one version v (merged records share it), and may
// hand it to Badger in several write requests (a KVLoader splits a large
// batch), which can land in two memtables: the first flushed, the second not
// yet. So v proves only that part of its batch is in a table. Every record
// before the batch went to Badger in earlier requests, into that memtable or
// older ones, and Badger flushes memtables in order: those are all in tables.
// So the answer is first(v)-1. (Counting v-1, as this did before, released
// the rest of a merged batch from the log while it was only in a memtable.)
func (db *DB) releasable(first func(version uint64) uint64) uint64 {
	if v := db.newestTableVersion(); v > 0 {
		return first(v) - 1
	}
	return 0
}

// BadgerMemTableSize is the size of Badger's memtables, as opened.
func (db *DB) BadgerMemTableSize() int64 { return db.bdb.Opts().MemTableSize }

// newestTableVersion is the highest version in Badger's tables.
func (db *DB) newestTableVersion() uint64 {
	var v uint64
	for _, t := range db.bdb.Tables() {
		v = max(v, t.MaxVersion)
	}
	return v
}

// badgerLogger routes Badger's log through slog. Badger's info messages are
// routine (compactions, flushes) and go to debug.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) Errorf(f string, a ...any)   { b.l.Error(trimNL(fmt.Sprintf(f, a...))) }
func (b badgerLogger) Warningf(f string, a ...any) { b.l.Warn(trimNL(fmt.Sprintf(f, a...))) }
func (b badgerLogger) Infof(f string, a ...any)    { b.Debugf(f, a...) }

// Debugf formats only when debug is on: Badger calls it on every write.
func (b badgerLogger) Debugf(f string, a ...any) {
	if b.l.Enabled(context.Background(), slog.LevelDebug) {
		b.l.Debug(trimNL(fmt.Sprintf(f, a...)))
	}
}

func trimNL(s string) string {
	for len(s) > 0 && s[len(s)-1] == '\n' {
		s = s[:len(s)-1]
	}
	return s
}

// Range is one key range of ScanMerged: the keys in [Start, End) under Prefix. A
// nil Start means Prefix itself; a nil End means the end of Prefix.
type Range struct {
	Prefix, Start, End []byte
}

// ScanMerged scans several ranges whose prefixes have the same length as one
// sequence, ordered by the part of each key after its prefix (ties in range
// order): for example one time index per partition, read in time order across
// partitions. fn receives the index of the key's range; key and value are valid
// only during the call. It stops when fn returns false.
func (db *DB) ScanMerged(ctx context.Context, ranges []Range, fn func(i int, key, value []byte) (bool, error)) error {
	return db.bdb.View(func(txn *badger.Txn) error {
		h := make(mergeHeap, 0, len(ranges))
		defer func() {
			for _, c := range h {
				c.it.Close()
			}
		}()
		for i, r := range ranges {
			start := r.Start
			if start == nil {
				start = r.Prefix
			}
			it := txn.NewIterator(badger.IteratorOptions{Prefix: r.Prefix, PrefetchValues: false})
			it.Seek(start)
			c := &mergeCursor{it: it, r: r, i: i}
			if !c.valid() {
				it.Close()
				continue
			}
			h = append(h, c)
		}
		heap.Init(&h)
		for len(h) > 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			c := h[0]
			item := c.it.Item()
			var more bool
			err := item.Value(func(v []byte) error {
				var err error
				more, err = fn(c.i, item.Key(), v)
				return err
			})
			if err != nil || !more {
				return err
			}
			c.it.Next()
			if c.valid() {
				heap.Fix(&h, 0)
			} else {
				c.it.Close()
				heap.Pop(&h)
			}
		}
		return nil
	})
}

type mergeCursor struct {
	it *badger.Iterator
	r  Range
	i  int
}

func (c *mergeCursor) valid() bool {
	if !c.it.ValidForPrefix(c.r.Prefix) {
		return false
	}
	return c.r.End == nil || bytes.Compare(c.it.Item().Key(), c.r.End) < 0
}

func (c *mergeCursor) suffix() []byte { return c.it.Item().Key()[len(c.r.Prefix):] }

type mergeHeap []*mergeCursor

func (h mergeHeap) Len() int { return len(h) }
func (h mergeHeap) Less(a, b int) bool {
	if c := bytes.Compare(h[a].suffix(), h[b].suffix()); c != 0 {
		return c < 0
	}
	return h[a].i < h[b].i
}
func (h mergeHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *mergeHeap) Push(x any)   { *h = append(*h, x.(*mergeCursor)) }
func (h *mergeHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}
