package actors

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/holdfast/holdfast/persistence"
)

// The queue's dead letters: the failed pairs, listed oldest first, redriven
// with a fresh attempt budget, or deleted.

// QueueDeadLettersGet lists dead letters, oldest first: of Target (every
// target when empty) and Topic (every topic when empty), at most Limit (zero:
// 100, at most 1,000). Reply: *QueueDeadLetters.
type QueueDeadLettersGet struct {
	Target, Topic string
	Limit         int
}

// QueueDeadLetters is the reply to QueueDeadLettersGet.
type QueueDeadLetters struct {
	DeadLetters []QueueDeadLetter `json:"deadLetters"`
}

// QueueDeadLetter is one failed (message, target) pair.
type QueueDeadLetter struct {
	ID        string          `json:"id"`
	Target    string          `json:"target"`
	Topic     string          `json:"topic"`
	Payload   json.RawMessage `json:"payload"`
	Attempts  int             `json:"attempts"`
	Reason    string          `json:"reason"`
	LastError string          `json:"lastError"`
	FailedAt  int64           `json:"failedAt"`
}

// QueueRedrive puts the dead letters of IDs (every dead letter when empty)
// back to pending, due now, with a fresh attempt budget. Reply: *QueueRedriven.
type QueueRedrive struct{ IDs []string }

// QueueRedriven counts the pairs redriven.
type QueueRedriven struct {
	Redriven int `json:"redriven"`
}

// QueueDeadLetterDelete deletes the dead letters of one message (every target
// where it failed). ErrNotFound when it has none. Reply: *QueueRedriven with
// the count deleted.
type QueueDeadLetterDelete struct{ ID string }

const maxDeadLetterPage = 1000

type deadEntry struct {
	key           []byte
	target, topic string
	id            string
}

// queueDeadScan calls fn for each dead letter of the targets, oldest first
// per target, until fn returns false.
func (o *object) queueDeadScan(q *queueState, targets []string, fn func(e deadEntry) bool) error {
	for _, target := range targets {
		prefix := targetKey(q.ks, queueDeadIdx, target)
		more := true
		err := o.st.scan(o.bg(), prefix, nil, nil, func(key, value []byte) (bool, error) {
			topic, id, ok := strings.Cut(string(value), "\x00")
			if !ok {
				return false, fmt.Errorf("dead letter index entry %q", value)
			}
			more = fn(deadEntry{key: bytes.Clone(key), target: target, topic: topic, id: id})
			return more, nil
		})
		if err != nil {
			return unavailable("cannot read the dead letters", err)
		}
		if !more {
			return nil
		}
	}
	return nil
}

func (o *object) queueDeadLetters(m QueueDeadLettersGet) (any, error) {
	q, err := o.queueLoad()
	if err != nil {
		return nil, err
	}
	targets := q.opts.Targets
	if m.Target != "" {
		t, e := o.queueTarget(q, m.Target)
		if e != nil {
			return nil, e
		}
		targets = []string{t}
	}
	limit := m.Limit
	switch {
	case limit < 0:
		return nil, badRequestf("limit must be at least 1")
	case limit == 0:
		limit = 100
	case limit > maxDeadLetterPage:
		limit = maxDeadLetterPage
	}
	out := &QueueDeadLetters{DeadLetters: []QueueDeadLetter{}}
	var readErr error
	err = o.queueDeadScan(q, targets, func(e deadEntry) bool {
		if m.Topic != "" && e.topic != m.Topic {
			return true
		}
		p, msg, err := o.queueRead(q, e.target, e.id)
		if err != nil {
			readErr = err
			return false
		}
		out.DeadLetters = append(out.DeadLetters, QueueDeadLetter{ID: e.id, Target: e.target, Topic: e.topic, Payload: msg.Payload,
			Attempts: p.Attempts, Reason: p.Reason, LastError: p.LastError, FailedAt: p.SettledAt})
		return len(out.DeadLetters) < limit
	})
	if err != nil {
		return nil, err
	}
	if readErr != nil {
		return nil, readErr
	}
	return out, nil
}

func (o *object) queueRedrive(m QueueRedrive) (any, error) {
	q, err := o.queueLoad()
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, id := range m.IDs {
		if e := checkQueueID(id); e != nil {
			return nil, e
		}
		want[id] = true
	}
	var entries []deadEntry
	if err := o.queueDeadScan(q, q.opts.Targets, func(e deadEntry) bool {
		if len(want) == 0 || want[e.id] {
			entries = append(entries, e)
		}
		return true
	}); err != nil {
		return nil, err
	}
	now := o.h.now().UnixMilli()
	t := newQueueTxn(q)
	for _, e := range entries {
		p, _, err := o.queueRead(q, e.target, e.id)
		if err != nil {
			t.rollback()
			return nil, err
		}
		t.del(e.key)
		q.meta.Failed--
		q.meta.Pending++
		// A fresh attempt budget: it goes out as a first attempt, due now.
		p.State, p.Attempts, p.Class, p.Due, p.Reason, p.SettledAt = StatePending, 0, classFirst, now, "", 0
		t.set(pairKey(q, e.target, e.id), p)
		t.w.Sets = append(t.w.Sets, persistence.KV{Key: readyKey(q, e.target, p), Value: []byte(p.Topic + "\x00" + e.id)})
	}
	o.queueCommit(t)
	o.queuePump()
	return &QueueRedriven{Redriven: len(entries)}, nil
}

// queueDeadLetterDelete deletes a message's dead letters; the message goes
// too once none of its pairs is left (its id is then no longer deduplicated).
func (o *object) queueDeadLetterDelete(m QueueDeadLetterDelete) (any, error) {
	if e := checkQueueID(m.ID); e != nil {
		return nil, e
	}
	q, err := o.queueLoad()
	if err != nil {
		return nil, err
	}
	t := newQueueTxn(q)
	deleted, left := 0, 0
	for _, target := range q.opts.Targets {
		_, found, err := o.st.get(o.bg(), pairKey(q, target, m.ID))
		if err != nil {
			t.rollback()
			return nil, unavailable("cannot read the queue", err)
		}
		if !found {
			continue
		}
		p, _, err := o.queueRead(q, target, m.ID)
		if err != nil {
			t.rollback()
			return nil, err
		}
		if p.State != StateFailed {
			left++
			continue
		}
		t.del(queueDeadKey(q, target, p))
		t.del(pairKey(q, target, m.ID))
		q.meta.Failed--
		deleted++
	}
	if deleted == 0 {
		return nil, notFoundf("message %q has no dead letter", m.ID)
	}
	if left == 0 {
		t.del(q.ks.KeyString(queueMessage, m.ID))
	}
	o.queueCommit(t)
	return &QueueRedriven{Redriven: deleted}, nil
}
