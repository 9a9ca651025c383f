package persistence

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/dgraph-io/badger/v4"
)

// Config configures the node's database.
type Config struct {
	// Dir holds the Badger files. Created if missing.
	Dir string
	// Partitions is the number of partitions. It is fixed when Dir is created;
	// zero means "what Dir holds", or DefaultPartitions for a new Dir.
	Partitions int
	// MemTableSize is Badger's memtable size in bytes; one commit holds at most 15%
	// of it. Zero means 128 MiB, enough for the largest write the API accepts.
	MemTableSize int64
	// Logger receives Badger's messages. Nil means slog.Default().
	Logger *slog.Logger
}

// DefaultPartitions is the partition count of a new data directory.
const DefaultPartitions = 256

// MaxPartitions is the largest partition count (partitions are 16-bit in keys).
const MaxPartitions = 1 << 16

// DB is the node's database.
type DB struct {
	bdb        *badger.DB
	partitions int
}

// Open opens or creates the database in cfg.Dir.
func Open(cfg Config) (*DB, error) {
	if cfg.Partitions < 0 || cfg.Partitions > MaxPartitions {
		return nil, fmt.Errorf("persistence: partitions %d out of range 1..%d", cfg.Partitions, MaxPartitions)
	}
	if cfg.MemTableSize == 0 {
		cfg.MemTableSize = 128 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	// SyncWrites makes each transaction commit sync Badger's WAL (and value log)
	// before it returns; the pipeline relies on that. Never turn it off and sync
	// by hand: at memtable rotation Badger hands the old WAL to the flusher unsynced.
	opts := badger.DefaultOptions(filepath.Clean(cfg.Dir)).
		WithSyncWrites(true).
		WithDetectConflicts(false).
		WithMemTableSize(cfg.MemTableSize).
		WithNumMemtables(3).
		WithLogger(badgerLogger{cfg.Logger.With("component", "badger")})
	bdb, err := badger.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("open badger in %s: %w", cfg.Dir, err)
	}
	db := &DB{bdb: bdb}
	if err := db.fixPartitions(cfg.Partitions); err != nil {
		_ = bdb.Close()
		return nil, err
	}
	return db, nil
}

func (db *DB) fixPartitions(want int) error {
	key := metaKey("partitions")
	var stored int
	err := db.bdb.View(func(txn *badger.Txn) error {
		item, err := txn.Get(key)
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			if len(v) != 4 {
				return fmt.Errorf("persistence: bad partitions record of %d bytes", len(v))
			}
			stored = int(binary.BigEndian.Uint32(v))
			return nil
		})
	})
	switch {
	case err == nil:
		if want != 0 && want != stored {
			return fmt.Errorf("%w: the data directory has %d, the configuration says %d", ErrPartitionsMismatch, stored, want)
		}
		db.partitions = stored
		return nil
	case errors.Is(err, badger.ErrKeyNotFound):
		if want == 0 {
			want = DefaultPartitions
		}
		db.partitions = want
		return db.bdb.Update(func(txn *badger.Txn) error {
			return txn.Set(key, binary.BigEndian.AppendUint32(nil, uint32(want)))
		})
	default:
		return fmt.Errorf("read partitions record: %w", err)
	}
}

// Partitions returns the partition count fixed for this data directory.
func (db *DB) Partitions() int { return db.partitions }

// Close closes the database. Close the Pipeline first.
func (db *DB) Close() error { return db.bdb.Close() }

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
	return db.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: false})
		defer it.Close()
		for it.Seek(start); it.ValidForPrefix(prefix); it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			item := it.Item()
			k := item.Key()
			if end != nil && string(k) >= string(end) {
				return nil
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
