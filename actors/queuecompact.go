package actors

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// Compaction: complete pairs go after CompletedRetention (their ids are
// deduplicated until then), dead letters after DeadLetterRetention, and a
// message once none of its pairs is left, so a queue's disk use follows what
// it retains, not its history. It runs when the queue's alarm fires; settling
// a pair asks for the alarm at the time its pair falls due for compaction.

// compactBatch bounds the pairs one turn compacts; more wait for the next.
const compactBatch = 1000

func (o *object) queueCompact() {
	q, err := o.queueLoad()
	if err != nil {
		o.h.log.Warn("queue compaction: cannot load the queue", "object", o.act.id.String(), "err", err)
		return
	}
	now := o.h.now().UnixMilli()
	t := newQueueTxn(q)
	gone := map[string]map[string]bool{} // id -> targets whose pair goes
	n := 0
	for _, c := range []struct {
		idx    byte
		before int64
	}{{queueDoneIdx, now - q.opts.CompletedRetention.Milliseconds()}, {queueDeadIdx, now - q.opts.DeadLetterRetention.Milliseconds()}} {
		for _, target := range q.opts.Targets {
			prefix := targetKey(q.ks, c.idx, target)
			var keys [][]byte
			var ids []string
			err := o.st.scan(o.bg(), prefix, nil, append(bytes.Clone(prefix), u64(c.before+1)...), func(key, value []byte) (bool, error) {
				id := string(value)
				if c.idx == queueDeadIdx {
					_, rest, _ := bytes.Cut(value, []byte{0}) // topic 0x00 id
					id = string(rest)
				}
				keys, ids = append(keys, bytes.Clone(key)), append(ids, id)
				n++
				return n < compactBatch, nil
			})
			if err != nil {
				o.h.log.Warn("queue compaction: cannot read the queue", "object", o.act.id.String(), "err", err)
				t.rollback()
				return
			}
			for i, key := range keys {
				t.del(key)
				t.del(pairKey(q, target, ids[i]))
				if c.idx == queueDoneIdx {
					q.meta.Complete--
				} else {
					q.meta.Failed--
				}
				if gone[ids[i]] == nil {
					gone[ids[i]] = map[string]bool{}
				}
				gone[ids[i]][target] = true
			}
		}
	}
	// A message goes with its last pair.
	for id, targets := range gone {
		left := false
		for _, target := range q.opts.Targets {
			if targets[target] {
				continue
			}
			if _, found, err := o.st.get(o.bg(), pairKey(q, target, id)); err != nil || found {
				left = true // on a read error, keep the message: a later pass finds it
				break
			}
		}
		if !left {
			t.del(q.ks.KeyString(queueMessage, id))
		}
	}
	if n >= compactBatch {
		t.wakeAt(now) // more to do: the next turn
	} else if next, err := o.queueNextCompaction(q); err != nil {
		o.h.log.Warn("queue compaction: cannot read the queue", "object", o.act.id.String(), "err", err)
	} else {
		t.wakeAt(next)
	}
	o.queueCommit(t)
}

// queueNextCompaction returns when the oldest retained complete pair or dead
// letter falls due for compaction; 0 if there is none.
func (o *object) queueNextCompaction(q *queueState) (int64, error) {
	next := int64(0)
	for _, c := range []struct {
		idx    byte
		retain int64
	}{{queueDoneIdx, q.opts.CompletedRetention.Milliseconds()}, {queueDeadIdx, q.opts.DeadLetterRetention.Milliseconds()}} {
		for _, target := range q.opts.Targets {
			prefix := targetKey(q.ks, c.idx, target)
			err := o.st.scan(o.bg(), prefix, nil, nil, func(key, _ []byte) (bool, error) {
				if len(key) < len(prefix)+8 {
					return false, fmt.Errorf("queue index key %x", key)
				}
				at := int64(binary.BigEndian.Uint64(key[len(prefix):])) + c.retain
				if next == 0 || at < next {
					next = at
				}
				return false, nil
			})
			if err != nil {
				return 0, err
			}
		}
	}
	return next, nil
}
