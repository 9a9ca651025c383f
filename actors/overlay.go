package actors

import (
	"bytes"
	"context"
	"sort"

	"github.com/holdfast/holdfast/persistence"
)

// overlay holds what an actor wrote to keys that later turns read back, for the
// writes Badger does not show yet: Badger shows a write only once the pipeline
// applied it, but the actor moves on as soon as it submitted it. It is a list in
// submission order, short-lived and usually a handful of entries long; lookups
// search it from the newest entry. Only the actor's goroutine touches an overlay.
type overlay struct {
	entries []overlayEntry
	// appliedSeen is the pipeline's applied sequence number when evict last
	// looked at the tickets. A ticket is marked applied before that number
	// moves past it, so while the number stands still there is nothing new to
	// drop, and evict does not read tickets that other cores just wrote. (A
	// failed write's ticket is marked at once instead, but its activation is
	// forgotten on the failure, so nothing reads its overlay again.)
	appliedSeen uint64
}

type overlayEntry struct {
	key     []byte // shared with the submitted Write, never changed
	value   []byte
	deleted bool
	t       *persistence.Ticket
}

// record notes the writes of w, submitted under t, whose keys readBack accepts
// (nil: every key). Keys the actor never reads back from storage need no entry.
func (o *overlay) record(w *persistence.Write, t *persistence.Ticket, readBack func([]byte) bool) {
	for _, kv := range w.Sets {
		if readBack == nil || readBack(kv.Key) {
			o.entries = append(o.entries, overlayEntry{key: kv.Key, value: kv.Value, t: t})
		}
	}
	for _, key := range w.Deletes {
		if readBack == nil || readBack(key) {
			o.entries = append(o.entries, overlayEntry{key: key, deleted: true, t: t})
		}
	}
}

// evict drops the entries whose writes Badger shows now; applied is the
// pipeline's applied sequence number (Pipeline.AppliedSeq). Tickets are applied
// in submission order, so they leave from the front.
func (o *overlay) evict(applied uint64) {
	if len(o.entries) == 0 || applied == o.appliedSeen {
		return
	}
	o.appliedSeen = applied
	n := 0
	for n < len(o.entries) && o.entries[n].t.Applied() {
		n++
	}
	switch {
	case n == 0:
	case n == len(o.entries):
		o.entries = nil // let an idle actor shrink back
	default:
		o.entries = append(o.entries[:0], o.entries[n:]...)
	}
}

// get returns the newest overlay entry of key: found=false means "ask Badger".
func (o *overlay) get(key []byte) (value []byte, deleted, found bool) {
	for i := len(o.entries) - 1; i >= 0; i-- {
		if e := &o.entries[i]; bytes.Equal(e.key, key) {
			return e.value, e.deleted, true
		}
	}
	return nil, false, false
}

// store reads an actor's keyspace: its own not-yet-applied writes over Badger.
type store struct {
	db *persistence.DB
	ov *overlay
}

func (s store) get(ctx context.Context, key []byte) ([]byte, bool, error) {
	if v, deleted, found := s.ov.get(key); found {
		return v, !deleted, nil
	}
	return s.db.Get(ctx, key)
}

// scan calls fn for each live key in [start, end) under prefix in key order, merging
// the overlay over Badger, until fn returns false.
func (s store) scan(ctx context.Context, prefix, start, end []byte, fn func(key, value []byte) (bool, error)) error {
	if start == nil {
		start = prefix
	}
	// The overlay's keys in range, newest entry per key, sorted.
	var pending []*overlayEntry
	seen := map[string]bool{}
	for i := len(s.ov.entries) - 1; i >= 0; i-- {
		e := &s.ov.entries[i]
		if bytes.HasPrefix(e.key, prefix) && bytes.Compare(e.key, start) >= 0 && (end == nil || bytes.Compare(e.key, end) < 0) && !seen[string(e.key)] {
			seen[string(e.key)] = true
			pending = append(pending, e)
		}
	}
	sort.Slice(pending, func(i, j int) bool { return bytes.Compare(pending[i].key, pending[j].key) < 0 })
	// emitBelow emits the pending keys below limit (all of them for nil).
	emitBelow := func(limit []byte) (bool, error) {
		for len(pending) > 0 && (limit == nil || bytes.Compare(pending[0].key, limit) < 0) {
			e := pending[0]
			pending = pending[1:]
			if e.deleted {
				continue
			}
			if more, err := fn(e.key, e.value); err != nil || !more {
				return false, err
			}
		}
		return true, nil
	}
	stopped := false
	err := s.db.Scan(ctx, prefix, start, end, func(k, v []byte) (bool, error) {
		more, err := emitBelow(k)
		if err != nil || !more {
			stopped = true
			return false, err
		}
		if len(pending) > 0 && bytes.Equal(pending[0].key, k) {
			// The overlay's value of this key replaces Badger's.
			more, err := emitBelow(append(append([]byte(nil), k...), 0))
			stopped = err != nil || !more
			return more, err
		}
		more, err = fn(k, v)
		stopped = err != nil || !more
		return more, err
	})
	if err != nil || stopped {
		return err
	}
	_, err = emitBelow(nil)
	return err
}

// floor returns the greatest live key <= key under prefix and its value (copies),
// merging the overlay over Badger.
func (s store) floor(ctx context.Context, prefix, key []byte) (k, v []byte, found bool, err error) {
	// The overlay's best: its greatest key in range whose newest entry is a set.
	newest := map[string]*overlayEntry{}
	for i := len(s.ov.entries) - 1; i >= 0; i-- {
		e := &s.ov.entries[i]
		if bytes.HasPrefix(e.key, prefix) && bytes.Compare(e.key, key) <= 0 {
			if _, seen := newest[string(e.key)]; !seen {
				newest[string(e.key)] = e
			}
		}
	}
	for _, e := range newest {
		if !e.deleted && (k == nil || bytes.Compare(e.key, k) > 0) {
			k, v, found = e.key, e.value, true
		}
	}
	// Badger's best: its greatest key in range that the overlay does not delete.
	err = s.db.ScanReverse(ctx, prefix, key, func(bk, bv []byte) (bool, error) {
		if k != nil && bytes.Compare(bk, k) < 0 {
			return false, nil // below the overlay's best: nothing better here
		}
		if e := newest[string(bk)]; e != nil {
			if e.deleted {
				return true, nil // deleted by a write Badger does not show yet
			}
			bv = e.value
		}
		if k == nil || bytes.Compare(bk, k) > 0 {
			k, v, found = append([]byte(nil), bk...), append([]byte(nil), bv...), true
		}
		return false, nil
	})
	return k, v, found, err
}
