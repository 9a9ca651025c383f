package actors

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/holdfast/holdfast/alarms"
	"github.com/holdfast/holdfast/persistence"
)

// Push consumers (spec/queue.md, "Consumers"): Go handlers registered with a
// type are called with each due message, outside the object's turn, at most
// Concurrency messages of one queue at a time.
//
// The object's turn takes due pairs as processing (as a receive does), and
// starts the handlers only once that commit, and so the enqueue before it, is
// durable. A handler's result comes back as a message of the object, which
// settles the pair with its receipt (a late result, after the visibility
// deadline, is fenced like any stale receipt) and takes more. When nothing is
// due, the object arms its reserved alarm QueueAlarm for the next due time or
// visibility deadline, so pushes go on after a passivation or a restart.

// QueueAction is what a push handler asks for.
type QueueAction int

const (
	// QueueAckAction completes the pair (the zero value).
	QueueAckAction QueueAction = iota
	// QueueRetryAction fails this attempt: the pair backs off (at least Delay).
	QueueRetryAction
	// QueueDeadLetterAction moves the pair to the dead letters (rejected).
	QueueDeadLetterAction
)

// QueueResult is a push handler's answer.
type QueueResult struct {
	Action QueueAction
	// Delay is the least wait before a retry.
	Delay time.Duration
	// Reason is kept as the pair's last error on a retry or a dead letter.
	Reason string
}

// QueueHandler is a push consumer of a type's queues: Handle is called with
// every due message of Target (every target when empty) and Topic (every
// topic when empty). An error or a panic is a retry. Its context ends at the
// delivery's visibility deadline, when the node closes (Host.Close waits for
// the handler to return) and when the object's partition leaves the node.
type QueueHandler struct {
	Topic, Target string
	Handle        func(ctx context.Context, m QueueDelivery) (QueueResult, error)
}

// QueueAlarm is the reserved alarm a queue with push handlers keeps armed for
// its next due time.
const QueueAlarm = ReservedAlarmPrefix + "queue"

var queueAlarmAction = json.RawMessage(`{"kind":"queue"}`)

// queuePushDone is a handler's result, posted back to the object.
type queuePushDone struct {
	receipt string
	res     QueueResult
	err     error
}

// pushState is an activation's handlers in flight.
type pushState struct {
	inflight int
	// gone ends when the activation moves away (owners.go, pushGone).
	gone  context.Context
	leave context.CancelFunc
}

// pushHandler returns the handler of a pair of target and topic: the most
// specific one registered.
func (o *object) pushHandler(target, topic string) *QueueHandler {
	if o.typ == nil {
		return nil
	}
	var best *QueueHandler
	score := -1
	for i := range o.typ.Queue {
		h := &o.typ.Queue[i]
		if (h.Target != "" && h.Target != target) || (h.Topic != "" && h.Topic != topic) {
			continue
		}
		s := 0
		if h.Target != "" {
			s += 2
		}
		if h.Topic != "" {
			s++
		}
		if s > score {
			best, score = h, s
		}
	}
	return best
}

// pushTopics says which pairs of target go to handlers: every topic, or the
// topics listed; ok is false when target has no handler.
func (o *object) pushTopics(target string) (all bool, topics []string, ok bool) {
	if o.typ == nil {
		return false, nil, false
	}
	for _, h := range o.typ.Queue {
		if h.Target != "" && h.Target != target {
			continue
		}
		ok = true
		if h.Topic == "" {
			all = true
		} else {
			topics = append(topics, h.Topic)
		}
	}
	return all, topics, ok
}

func (q QueueOptions) concurrency() int {
	if q.Concurrency > 0 {
		return q.Concurrency
	}
	return 1
}

// queuePump takes due pairs for the push handlers while fewer than
// Concurrency are in flight, starts them once durable, and arms the wake-up.
func (o *object) queuePump() {
	if o.typ == nil || len(o.typ.Queue) == 0 {
		return
	}
	q, err := o.queueLoad()
	if err != nil {
		o.h.log.Warn("queue push: cannot load the queue", "object", o.act.id.String(), "err", err)
		return
	}
	now := o.h.now().UnixMilli()
	t := newQueueTxn(q)
	type start struct {
		target string
		d      QueueDelivery
	}
	var starts []start
	dueNow := false
	for _, target := range q.opts.Targets {
		if _, _, ok := o.pushTopics(target); !ok {
			continue
		}
		d, err := o.queueExpire(t, target, now)
		if err != nil {
			t.rollback()
			o.h.log.Warn("queue push: cannot expire deliveries", "object", o.act.id.String(), "err", err)
			return
		}
		dueNow = dueNow || d
	}
	if dueNow {
		// As in queueReceive: the takes see the expiries once submitted.
		o.queueCommit(t)
		t = newQueueTxn(q)
	}
	for _, target := range q.opts.Targets {
		all, topics, ok := o.pushTopics(target)
		if !ok {
			continue
		}
		filters := topics
		if all {
			filters = []string{""}
		}
		for _, topic := range filters {
			free := q.opts.concurrency() - o.push.inflight - len(starts)
			if free <= 0 {
				break
			}
			// One take per filter: t's changes are not visible to a second
			// scan in the same turn, and the filters' topics differ.
			ds, err := o.queueTake(t, target, topic, free, q.opts.VisibilityTimeout, now)
			if err != nil {
				t.rollback()
				o.h.log.Warn("queue push: cannot take due messages", "object", o.act.id.String(), "err", err)
				return
			}
			for _, d := range ds {
				starts = append(starts, start{target, d})
			}
		}
	}
	if len(starts) > 0 {
		t.wakeAt(now + q.opts.VisibilityTimeout.Milliseconds()) // a handler that overruns
	}
	o.queueCommit(t)
	// Wake for the next due pair and the next visibility deadline, read once
	// t is submitted, so that it counts the retries t's expiries wrote.
	wake := newQueueTxn(q)
	for _, target := range q.opts.Targets {
		if _, _, ok := o.pushTopics(target); !ok {
			continue
		}
		next, err := o.queueNextDue(q, target, now)
		if err != nil {
			o.h.log.Warn("queue push: cannot read the queue", "object", o.act.id.String(), "err", err)
		}
		wake.wakeAt(next)
	}
	o.queueCommit(wake) // writes only when the alarm moves earlier
	if len(starts) == 0 {
		return
	}
	o.push.inflight += len(starts)
	h, id, vis := o.h, o.act.id, q.opts.VisibilityTimeout
	handlers := make([]*QueueHandler, len(starts))
	for i, s := range starts {
		handlers[i] = o.pushHandler(s.target, s.d.Topic)
	}
	// Start the handlers once the take (and every write before it) is durable,
	// as goroutines of h.push (owners.go).
	gone := o.pushGone()
	o.last.OnDone(func(commitErr error) {
		for i, s := range starts {
			started := h.push.Go(func(ctx context.Context) {
				done := queuePushDone{receipt: s.d.Receipt, err: commitErr}
				if commitErr == nil {
					done.res, done.err = runQueueHandler(ctx, gone, h, id, handlers[i], s.d, vis)
				}
				_ = h.post(id, done) // if the node is closing, the delivery expires and replays
			})
			if !started {
				return // the host is closing: the deliveries expire and replay
			}
		}
	})
}

// runQueueHandler calls a push handler under ctx (the host's), until the
// visibility deadline or until gone (its activation moved away) ends; a panic
// is an error like any other.
func runQueueHandler(ctx, gone context.Context, h *Host, id ObjectID, qh *QueueHandler, d QueueDelivery, vis time.Duration) (r QueueResult, err error) {
	ctx, cancel := context.WithTimeout(ctx, vis)
	defer cancel()
	defer context.AfterFunc(gone, cancel)()
	defer func() {
		if p := recover(); p != nil {
			h.log.Error("queue handler panicked", "object", id.String(), "message", d.ID, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return qh.Handle(ctx, d)
}

// queuePushDone settles a handler's result and takes more.
func (o *object) queuePushed(m queuePushDone) (any, error) {
	o.push.inflight = max(0, o.push.inflight-1)
	var err error
	switch {
	case m.err != nil:
		_, err = o.queueNack(QueueNack{Receipt: m.receipt, Error: m.err.Error()})
	case m.res.Action == QueueRetryAction:
		reason := m.res.Reason
		if reason == "" {
			reason = "the handler asked for a retry"
		}
		_, err = o.queueNack(QueueNack{Receipt: m.receipt, Delay: m.res.Delay, Error: reason})
	case m.res.Action == QueueDeadLetterAction:
		_, err = o.queueDead(QueueDead{Receipt: m.receipt, Reason: m.res.Reason})
	default:
		_, err = o.queueAck(QueueAck{Receipts: []string{m.receipt}})
	}
	if err != nil && err != ErrReceiptNotHeld {
		o.h.log.Warn("queue push: cannot settle a delivery", "object", o.act.id.String(), "err", err)
	}
	o.queuePump()
	return nil, nil
}

// queueNextDue returns the earliest time after now at which a pending pair of
// target falls due or a delivery's visibility deadline passes; 0 if none.
func (o *object) queueNextDue(q *queueState, target string, now int64) (int64, error) {
	next := int64(0)
	first := func(prefix []byte, from []byte) error {
		return o.st.scan(o.bg(), prefix, from, nil, func(key, _ []byte) (bool, error) {
			at := int64(binary.BigEndian.Uint64(key[len(prefix):]))
			if next == 0 || at < next {
				next = at
			}
			return false, nil
		})
	}
	for _, class := range []byte{classFirst, classRetry} {
		prefix := targetKey(q.ks, queueReady, target, []byte{class})
		if err := first(prefix, append(bytes.Clone(prefix), u64(now+1)...)); err != nil {
			return 0, err
		}
	}
	// From the low-water mark the last expiry left: the deletions of settled
	// deliveries before it need not be walked again.
	prefix := targetKey(q.ks, queueVisible, target)
	if err := first(prefix, q.scanFrom(prefix, now)); err != nil {
		return 0, err
	}
	return next, nil
}

// queueArm arms QueueAlarm at at in w, unless it is armed for earlier.
func (o *object) queueArm(w *persistence.Write, at int64) (*alarms.Due, error) {
	a, err := o.alarmLoad()
	if err != nil {
		return nil, err
	}
	old := a.recs[QueueAlarm]
	if old != nil && !old.Failed && old.At <= at {
		return nil, nil
	}
	return o.alarmWrite(a, w, QueueAlarm, old, &alarmRec{At: at, Scheduled: at, Gen: a.newGen(w), Action: queueAlarmAction}), nil
}
