package persistence

import (
	"bytes"
	"container/heap"
	"context"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/dgraph-io/badger/v4"
)

// ListQuery selects the objects of one type that ListObjects returns.
type ListQuery struct {
	App, Type string
	// Marks: an object is listed when it holds a key under its object prefix
	// followed by one of these (a behaviour byte, optionally a sub-byte: the
	// layers above decide what counts as state). None: any key.
	Marks [][]byte
	// Prefix and After: only keys that start with Prefix and sort after
	// After (byte order).
	Prefix, After string
	// Limit is the most keys returned (> 0).
	Limit int
}

// ListObjects returns, in byte order, the first q.Limit keys of q's objects
// in the given partitions.
//
// An object's keys sit under its length-prefixed key (keys.go), so a type's
// objects are in order of key length first, and byte order only among keys
// of one length. A listing therefore merges one cursor per (partition, key
// length) present: each seeks to its first key at or after max(Prefix,
// After), and moves on object by object (one seek past the object, plus one
// per mark), so a page costs about Limit + cursors seeks whatever the
// objects hold (a log of a million records is skipped in one seek). Badger
// skips deleted keys inside a seek: a type whose objects were deleted in
// bulk costs their tombstones until compaction drops them.
func (db *DB) ListObjects(ctx context.Context, partitions []uint32, q ListQuery) ([]string, error) {
	if len(q.Type) > 0xFFFF {
		return nil, fmt.Errorf("persistence: ListObjects: a name of over 65535 bytes")
	}
	return db.listNames(ctx, partitions, q, func(p []byte) []byte {
		return appendName(appendName(p, q.App), q.Type)
	})
}

// ListTypes is ListObjects one level up: the first q.Limit types of app
// q.App (q.Type and q.Marks unused) that hold any key in the given
// partitions, by the same merge (a type is skipped in one seek).
func (db *DB) ListTypes(ctx context.Context, partitions []uint32, q ListQuery) ([]string, error) {
	q.Marks = nil
	return db.listNames(ctx, partitions, q, func(p []byte) []byte { return appendName(p, q.App) })
}

func appendName(b []byte, s string) []byte {
	return append(binary.BigEndian.AppendUint16(b, uint16(len(s))), s...)
}

// listNames lists the length-prefixed names under parent(partition prefix)
// in each partition, merged in byte order. Past a name, every key under it
// continues with a byte below 0xFF: a behaviour byte (actors/keys.go) after
// an object's key, or the high byte of a key's length (at most 65535, and
// names are far shorter) after a type.
func (db *DB) listNames(ctx context.Context, partitions []uint32, q ListQuery, parent func([]byte) []byte) ([]string, error) {
	if q.Limit <= 0 {
		return nil, fmt.Errorf("persistence: list: limit %d", q.Limit)
	}
	if len(q.App) > 0xFFFF {
		return nil, fmt.Errorf("persistence: list: a name of over 65535 bytes")
	}
	var out []string
	err := db.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{PrefetchValues: false})
		defer it.Close()
		l := &lister{it: it, q: q, ctx: ctx}
		var h cursorHeap
		for _, p := range partitions {
			cs, err := l.cursors(parent(PartitionPrefix(p)))
			if err != nil {
				return err
			}
			h = append(h, cs...)
		}
		heap.Init(&h)
		for len(h) > 0 && len(out) < q.Limit {
			c := h[0]
			// Marks are checked only for the name on top: a cursor that
			// never reaches the top costs no mark seeks (up to one per mark
			// for each of hundreds of cursors, in a listing of logs over
			// objects that mostly have none).
			if (c.checked || l.marked(c.obj)) && (len(out) == 0 || out[len(out)-1] != c.key) { // a type is in many partitions
				out = append(out, c.key)
			}
			if err := l.next(c); err != nil {
				return err
			}
			if c.done {
				heap.Pop(&h)
			} else {
				heap.Fix(&h, 0)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	return out, nil
}

// lister walks one listing's cursors with one iterator.
type lister struct {
	it    *badger.Iterator
	q     ListQuery
	ctx   context.Context
	seeks int
}

// listCursor is one partition's names of one length: key is the listed
// name it stands on (unless done), seek where the next search starts.
type listCursor struct {
	bucket []byte // parent prefix | name length
	n      int    // key length
	key    string
	obj    []byte // the prefix of the name it stands on
	// checked: the name holds one of the query's marks (next leaves it
	// false; the merge checks it once the name is on top).
	checked bool
	seek    []byte
	done    bool
}

// cursors returns the cursors of the names under prefix typ, one per name
// length present (one seek each), each on its first listed name.
func (l *lister) cursors(typ []byte) ([]*listCursor, error) {
	var out []*listCursor
	for n := len(l.q.Prefix); n <= 0xFFFF; n++ {
		l.it.Seek(binary.BigEndian.AppendUint16(bytes.Clone(typ), uint16(n)))
		if !l.it.ValidForPrefix(typ) {
			break
		}
		k := l.it.Item().Key()
		if len(k) < len(typ)+2 {
			break
		}
		n = int(binary.BigEndian.Uint16(k[len(typ):]))
		c := &listCursor{bucket: binary.BigEndian.AppendUint16(bytes.Clone(typ), uint16(n)), n: n}
		// The first key of this length at or after both Prefix and After:
		// a key of length n sorts after After exactly when it sorts at or
		// after After's first n bytes (and is not equal to After).
		from := l.q.Prefix
		if a := l.q.After[:min(n, len(l.q.After))]; a > from {
			from = a
		}
		c.seek = append(bytes.Clone(c.bucket), from...)
		if err := l.next(c); err != nil {
			return nil, err
		}
		if !c.done {
			out = append(out, c)
		}
	}
	return out, nil
}

// next moves c to the first name at or after c.seek that has the query's
// prefix and sorts after its After, or marks it done. Whether the name holds
// a mark is the merge's to check (listNames).
func (l *lister) next(c *listCursor) error {
	for {
		if l.seeks++; l.seeks%256 == 0 {
			if err := l.ctx.Err(); err != nil {
				return err
			}
		}
		l.it.Seek(c.seek)
		if !l.it.ValidForPrefix(c.bucket) {
			c.done = true
			return nil
		}
		k := l.it.Item().Key()
		end := len(c.bucket) + c.n
		if len(k) < end {
			return fmt.Errorf("a key shorter than its object's name: %x", k)
		}
		key := string(k[len(c.bucket):end])
		if !strings.HasPrefix(key, l.q.Prefix) {
			c.done = true // past the prefix: keys of one length sort by bytes
			return nil
		}
		obj := bytes.Clone(k[:end])
		c.seek = append(obj, 0xFF) // past this name (listNames)
		if key <= l.q.After {
			continue
		}
		c.key, c.obj, c.checked = key, obj[:len(obj):len(obj)], len(l.q.Marks) == 0
		return nil
	}
}

// marked reports whether the object whose prefix is obj holds a key under
// one of the query's marks.
func (l *lister) marked(obj []byte) bool {
	if len(l.q.Marks) == 0 {
		return true
	}
	for _, m := range l.q.Marks {
		p := append(bytes.Clone(obj), m...)
		l.it.Seek(p)
		if l.it.ValidForPrefix(p) {
			return true
		}
	}
	return false
}

// cursorHeap orders cursors by the key they stand on.
type cursorHeap []*listCursor

func (h cursorHeap) Len() int           { return len(h) }
func (h cursorHeap) Less(i, j int) bool { return h[i].key < h[j].key }
func (h cursorHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *cursorHeap) Push(x any)        { *h = append(*h, x.(*listCursor)) }
func (h *cursorHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}
