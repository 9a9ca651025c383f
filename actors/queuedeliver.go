package actors

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/holdfast/holdfast/persistence"
)

// Deliveries of the write-ahead queue (queue.go): a receive takes the due
// pairs of a target and expires the processing ones past their deadline; a
// delivery ends in an ack, a nack (a retry after its backoff, or a dead letter
// once its attempts are spent) or a dead letter.

func (o *object) queueTarget(q *queueState, target string) (string, *Error) {
	if target == "" {
		return q.opts.Targets[0], nil
	}
	if !q.hasTarget(target) {
		return "", notFoundf("the type has no queue target %q", target)
	}
	return target, nil
}

func (o *object) queueReceive(m QueueReceive) (any, error) {
	q, err := o.queueLoad()
	if err != nil {
		return nil, err
	}
	target, e := o.queueTarget(q, m.Target)
	if e != nil {
		return nil, e
	}
	limit := m.Max
	switch {
	case limit < 0:
		return nil, badRequestf("max must be at least 1")
	case limit == 0:
		limit = 1
	case limit > 1000:
		limit = 1000
	}
	vis := q.opts.VisibilityTimeout
	if m.Visibility > 0 {
		vis = m.Visibility
	}
	now := o.h.now().UnixMilli()
	t := newQueueTxn(q)
	dueNow, err := o.queueExpire(t, target, now)
	if err != nil {
		t.rollback()
		return nil, err
	}
	if dueNow {
		// The take scans the store, which shows t's writes only once they
		// are submitted: commit the expiries first, so that a pair whose
		// deadline and backoff both passed goes out in this receive.
		o.queueCommit(t)
		t = newQueueTxn(q)
	}
	ds, err := o.queueTake(t, target, m.Topic, limit, vis, now)
	if err != nil {
		t.rollback()
		return nil, err
	}
	o.queueCommit(t)
	o.queuePump() // a receive may have expired deliveries of pushed targets
	return &QueueReceived{Messages: ds}, nil
}

// queueTake hands out up to limit due pairs of target (of topic, unless
// empty) as processing, in t.
func (o *object) queueTake(t *queueTxn, target, topic string, limit int, vis time.Duration, now int64) ([]QueueDelivery, error) {
	q := t.q
	type hit struct {
		key []byte
		id  string
	}
	var hits []hit
	for _, class := range []byte{classFirst, classRetry} {
		if len(hits) >= limit {
			break
		}
		prefix := targetKey(q.ks, queueReady, target, []byte{class})
		end := append(bytes.Clone(prefix), u64(now+1)...)
		var skipped bool // an entry left behind (another topic): the front stays
		var last []byte
		err := o.st.scan(o.bg(), prefix, q.scanFrom(prefix, now), end, func(key, value []byte) (bool, error) {
			tp, id, ok := strings.Cut(string(value), "\x00")
			if !ok {
				return false, fmt.Errorf("queue index entry %q", value)
			}
			if topic == "" || topic == tp {
				hits = append(hits, hit{key: bytes.Clone(key), id: id})
				if !skipped {
					last = hits[len(hits)-1].key
				}
			} else {
				skipped = true
			}
			return len(hits) < limit, nil
		})
		if err != nil {
			return nil, unavailable("cannot read the queue", err)
		}
		if last != nil {
			// From last's millisecond: an entry written later for that same
			// millisecond (a redrive, a replay) may sort before last by its seq.
			q.skipTo(prefix, bytes.Clone(last[:len(prefix)+8]))
		}
	}
	out := []QueueDelivery{}
	for _, h := range hits {
		p, msg, err := o.queueRead(q, target, h.id)
		if err != nil {
			return nil, err
		}
		t.del(h.key)
		p.State, p.Attempts, p.Deadline = StateProcessing, p.Attempts+1, now+max(1, vis.Milliseconds())
		p.Receipt = newReceipt(o.h.boot, target, h.id)
		t.set(pairKey(q, target, h.id), p)
		t.w.Sets = append(t.w.Sets, persistence.KV{Key: visibleKey(q, target, p), Value: []byte(h.id)})
		q.meta.Pending--
		q.meta.Processing++
		out = append(out, QueueDelivery{ID: h.id, Topic: msg.Topic, Payload: msg.Payload, Attempt: p.Attempts,
			EnqueuedAt: msg.EnqueuedAt, Receipt: p.Receipt})
	}
	return out, nil
}

// queueExpire fails the deliveries of target whose visibility deadline passed;
// each is due again at its deadline plus the backoff. dueNow reports that one
// of them is due already (a take must see t's writes to hand it out).
func (o *object) queueExpire(t *queueTxn, target string, now int64) (dueNow bool, err error) {
	q := t.q
	prefix := targetKey(q.ks, queueVisible, target)
	end := append(bytes.Clone(prefix), u64(now+1)...)
	var ids []string
	err = o.st.scan(o.bg(), prefix, q.scanFrom(prefix, now), end, func(key, value []byte) (bool, error) {
		ids = append(ids, string(value))
		return len(ids) < expireBatch, nil
	})
	if err != nil {
		return false, unavailable("cannot read the queue", err)
	}
	if len(ids) < expireBatch {
		q.skipTo(prefix, end) // every deadline up to now is expired below
	}
	for _, id := range ids {
		p, _, err := o.queueRead(q, target, id)
		if err != nil {
			return false, err
		}
		if p.State == StateProcessing && p.Deadline <= now {
			// The attempt failed at its deadline, so its backoff counts from
			// there (as SQS makes a message visible when its timeout ends), not
			// from whenever a receive, a push or the stats noticed it. Never
			// before now: every index entry is written at or after now, which
			// the scans' low-water marks rely on (queueState.from); a due time
			// already passed is due at once.
			due := max(now, p.Deadline+q.opts.backoff(p.Attempts, o.h.jitter()).Milliseconds())
			if t.endDelivery(target, id, p, "visibility timeout passed", now, due) && due <= now {
				dueNow = true
			}
		}
	}
	return dueNow, nil
}

// queueFail settles a failed delivery of a processing pair: back to pending
// after the backoff (at least delay), or to the dead letters when its attempts
// are spent.
func (o *object) queueFail(t *queueTxn, target, id string, p *queuePairRec, delay time.Duration, lastErr string, now int64) {
	wait := max(delay, t.q.opts.backoff(p.Attempts, o.h.jitter()))
	t.endDelivery(target, id, p, lastErr, now, now+wait.Milliseconds())
}

// endDelivery ends the delivery of a processing pair that did not complete:
// the pair is pending again, due at due, or a dead letter when its attempts
// are spent. It reports whether the pair went back to pending.
func (t *queueTxn) endDelivery(target, id string, p *queuePairRec, lastErr string, now, due int64) bool {
	q := t.q
	t.del(visibleKey(q, target, p))
	q.meta.Processing--
	p.Receipt, p.Deadline, p.LastError = "", 0, lastErr
	if p.Attempts >= q.opts.MaxAttempts {
		t.deadLetter(target, id, p, "exhausted", now)
		return false
	}
	p.State, p.Class, p.Due = StatePending, classRetry, due
	q.meta.Pending++
	t.set(pairKey(q, target, id), p)
	t.w.Sets = append(t.w.Sets, persistence.KV{Key: readyKey(q, target, p), Value: []byte(p.Topic + "\x00" + id)})
	return true
}

// backoff is the wait after the n-th failed attempt: Initial·Multiplier^(n-1),
// at most Max, minus up to a fifth of it (jitter in [0, 1]).
func (q QueueOptions) backoff(n int, jitter float64) time.Duration {
	base := float64(q.Backoff.Initial) * math.Pow(q.Backoff.Multiplier, float64(max(n, 1)-1))
	base = math.Min(base, float64(q.Backoff.Max))
	return time.Duration(base - base*0.2*math.Min(math.Max(jitter, 0), 1))
}

func (o *object) queueRead(q *queueState, target, id string) (*queuePairRec, *queueMsgRec, error) {
	pv, found, err := o.st.get(o.bg(), pairKey(q, target, id))
	if err != nil || !found {
		return nil, nil, unavailable("cannot read the queue", fmt.Errorf("pair %s/%s: found %v: %v", target, id, found, err))
	}
	var p queuePairRec
	if err := json.Unmarshal(pv, &p); err != nil {
		return nil, nil, unavailable("cannot read the queue", err)
	}
	mv, found, err := o.st.get(o.bg(), q.ks.KeyString(queueMessage, id))
	if err != nil || !found {
		return nil, nil, unavailable("cannot read the queue", fmt.Errorf("message %s: found %v: %v", id, found, err))
	}
	var msg queueMsgRec
	if err := json.Unmarshal(mv, &msg); err != nil {
		return nil, nil, unavailable("cannot read the queue", err)
	}
	return &p, &msg, nil
}

// queueHeld returns the processing pair that receipt currently holds, or nil.
func (o *object) queueHeld(q *queueState, receipt string, now int64) (string, string, *queuePairRec, error) {
	target, id, ok := parseReceipt(receipt)
	if !ok || !q.hasTarget(target) {
		return "", "", nil, nil
	}
	pv, found, err := o.st.get(o.bg(), pairKey(q, target, id))
	if err != nil {
		return "", "", nil, unavailable("cannot read the queue", err)
	}
	if !found {
		return "", "", nil, nil
	}
	var p queuePairRec
	if err := json.Unmarshal(pv, &p); err != nil {
		return "", "", nil, unavailable("cannot read the queue", err)
	}
	// A passed deadline no longer holds, though no receive has expired it yet.
	if p.State != StateProcessing || p.Receipt != receipt || p.Deadline <= now {
		return "", "", nil, nil
	}
	return target, id, &p, nil
}

// ErrReceiptNotHeld answers a settlement whose receipt is no longer current.
var ErrReceiptNotHeld = &Error{Kind: KindConflict, Code: "lease_not_held", Msg: "the receipt is not held: the delivery expired or was settled"}

func (o *object) queueAck(m QueueAck) (any, error) {
	if len(m.Receipts) == 0 {
		return nil, badRequestf("no receipts to ack")
	}
	q, err := o.queueLoad()
	if err != nil {
		return nil, err
	}
	now := o.h.now().UnixMilli()
	t := newQueueTxn(q)
	out := &QueueAcked{}
	done := map[string]bool{}
	for _, r := range m.Receipts {
		target, id, p, err := o.queueHeld(q, r, now)
		if err != nil {
			t.rollback()
			return nil, err
		}
		if p == nil || done[r] {
			out.NotHeld++
			continue
		}
		done[r] = true
		t.del(visibleKey(q, target, p))
		p.State, p.Receipt, p.Deadline, p.SettledAt = StateComplete, "", 0, now
		t.set(pairKey(q, target, id), p)
		t.w.Sets = append(t.w.Sets, persistence.KV{Key: queueDoneKey(q, target, p), Value: []byte(id)})
		t.wakeAt(now + q.opts.CompletedRetention.Milliseconds()) // compaction
		q.meta.Processing--
		q.meta.Complete++
		out.Acked++
	}
	o.queueCommit(t)
	return out, nil
}

func (o *object) queueNack(m QueueNack) (any, error) {
	if m.Delay < 0 {
		return nil, badRequestf("delayMs cannot be negative")
	}
	lastErr := m.Error
	if lastErr == "" {
		lastErr = "nacked"
	}
	return o.queueSettleOne(m.Receipt, func(t *queueTxn, target, id string, p *queuePairRec, now int64) {
		o.queueFail(t, target, id, p, m.Delay, lastErr, now)
	})
}

func (o *object) queueDead(m QueueDead) (any, error) {
	return o.queueSettleOne(m.Receipt, func(t *queueTxn, target, id string, p *queuePairRec, now int64) {
		t.del(visibleKey(t.q, target, p))
		t.q.meta.Processing--
		p.Receipt, p.Deadline = "", 0
		if m.Reason != "" {
			p.LastError = m.Reason
		}
		t.deadLetter(target, id, p, "rejected", now)
	})
}

// queueSettleOne settles the delivery that receipt holds with settle, in one
// commit; ErrReceiptNotHeld when it holds none.
func (o *object) queueSettleOne(receipt string, settle func(t *queueTxn, target, id string, p *queuePairRec, now int64)) (any, error) {
	q, err := o.queueLoad()
	if err != nil {
		return nil, err
	}
	now := o.h.now().UnixMilli()
	target, id, p, err := o.queueHeld(q, receipt, now)
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, ErrReceiptNotHeld
	}
	t := newQueueTxn(q)
	settle(t, target, id, p, now)
	o.queueCommit(t)
	return &QueueSettled{State: p.State}, nil
}
