package actors

import (
	"bytes"
	"context"
	"sort"

	"github.com/holdfast/holdfast/persistence"
)

// overlay holds the latest value an actor wrote to each key whose write Badger
// does not show yet. Badger shows a write only once the pipeline applied it, but
// the actor moves on as soon as it submitted it; reads in later turns look here
// first.
// Only the actor's goroutine touches an overlay.
type overlay struct {
	m    map[string]overlayEntry
	fifo []fifoEntry // keys in submission order, for eviction
}

type overlayEntry struct {
	value   []byte // nil: deleted
	deleted bool
	t       *persistence.Ticket
}

type fifoEntry struct {
	key string
	t   *persistence.Ticket
}

// record notes the writes of w, submitted under t, whose keys readBack accepts
// (nil: every key). Keys the actor never reads back from storage need no entry.
func (o *overlay) record(w *persistence.Write, t *persistence.Ticket, readBack func([]byte) bool) {
	if o.m == nil {
		o.m = make(map[string]overlayEntry)
	}
	for _, kv := range w.Sets {
		if readBack != nil && !readBack(kv.Key) {
			continue
		}
		k := string(kv.Key)
		o.m[k] = overlayEntry{value: kv.Value, t: t}
		o.fifo = append(o.fifo, fifoEntry{k, t})
	}
	for _, key := range w.Deletes {
		if readBack != nil && !readBack(key) {
			continue
		}
		k := string(key)
		o.m[k] = overlayEntry{deleted: true, t: t}
		o.fifo = append(o.fifo, fifoEntry{k, t})
	}
}

// evict drops entries whose writes Badger shows now.
func (o *overlay) evict() {
	n := 0
	for n < len(o.fifo) && o.fifo[n].t.Applied() {
		f := o.fifo[n]
		if e, ok := o.m[f.key]; ok && e.t == f.t {
			delete(o.m, f.key)
		}
		n++
	}
	if n == 0 {
		return
	}
	o.fifo = append(o.fifo[:0], o.fifo[n:]...)
	if len(o.fifo) == 0 {
		o.fifo = nil // let an idle actor shrink back
		o.m = nil
	}
}

// get returns the overlay's value of key: found=false means "ask Badger".
func (o *overlay) get(key []byte) (value []byte, deleted, found bool) {
	e, ok := o.m[string(key)]
	if !ok {
		return nil, false, false
	}
	return e.value, e.deleted, true
}

// store reads an actor's keyspace: its own not-yet-durable writes over Badger.
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
	var pending []string
	for k := range s.ov.m {
		kb := []byte(k)
		if bytes.HasPrefix(kb, prefix) && bytes.Compare(kb, start) >= 0 && (end == nil || bytes.Compare(kb, end) < 0) {
			pending = append(pending, k)
		}
	}
	sort.Strings(pending)
	stopped := false
	emitPendingBelow := func(limit []byte) (bool, error) {
		for len(pending) > 0 && (limit == nil || pending[0] < string(limit)) {
			e := s.ov.m[pending[0]]
			k := pending[0]
			pending = pending[1:]
			if e.deleted {
				continue
			}
			more, err := fn([]byte(k), e.value)
			if err != nil || !more {
				return false, err
			}
		}
		return true, nil
	}
	err := s.db.Scan(ctx, prefix, start, end, func(k, v []byte) (bool, error) {
		more, err := emitPendingBelow(k)
		if err != nil || !more {
			stopped = true
			return false, err
		}
		if _, _, found := s.ov.get(k); found {
			if len(pending) > 0 && pending[0] == string(k) {
				more, err := emitPendingBelow(append(append([]byte(nil), k...), 0))
				if !more || err != nil {
					stopped = true
				}
				return more, err
			}
			return true, nil
		}
		more, err = fn(k, v)
		if !more || err != nil {
			stopped = true
		}
		return more, err
	})
	if err != nil || stopped {
		return err
	}
	_, err = emitPendingBelow(nil)
	return err
}
