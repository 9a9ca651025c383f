package persistence

import (
	"bytes"
	"context"

	"github.com/dgraph-io/badger/v4"
)

// Change is one key's newest state in an Export: its value, or its deletion.
type Change struct {
	Key     []byte
	Value   []byte // nil for a deletion
	Deleted bool
}

// Export calls fn, in key order, with the newest state of every key under prefix
// whose newest version is above since: a full copy for since 0 (deletions left
// out), the changes made after since otherwise (deletions included; they are
// kept from compaction only while a Pipeline.HoldVersions at or below since is
// held). Key and Value are copies. It returns the highest version it saw.
func (db *DB) Export(ctx context.Context, prefix []byte, since uint64, fn func(Change) error) (uint64, error) {
	var top uint64
	err := db.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: false, AllVersions: true})
		defer it.Close()
		var last []byte
		for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			item := it.Item()
			k := item.Key()
			if last != nil && bytes.Equal(k, last) {
				continue // an older version of a key already seen
			}
			last = append(last[:0], k...)
			v := item.Version()
			top = max(top, v)
			if v <= since {
				continue
			}
			c := Change{Key: item.KeyCopy(nil), Deleted: item.IsDeletedOrExpired()}
			if c.Deleted {
				if since == 0 {
					continue
				}
			} else {
				val, err := item.ValueCopy(nil)
				if err != nil {
					return err
				}
				c.Value = val
			}
			if err := fn(c); err != nil {
				return err
			}
		}
		return nil
	})
	return top, err
}

// HasPrefix reports whether any key lies under prefix.
func (db *DB) HasPrefix(ctx context.Context, prefix []byte) (bool, error) {
	found := false
	err := db.Scan(ctx, prefix, nil, nil, func(_, _ []byte) (bool, error) {
		found = true
		return false, nil
	})
	return found, err
}
