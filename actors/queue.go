package actors

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/holdfast/holdfast/alarms"
	"github.com/holdfast/holdfast/internal/jsonvalid"
	"github.com/holdfast/holdfast/persistence"
)

// The write-ahead queue (shared/spec/queue.md), a behaviour of the object
// actor. Keys, under the object's queue keyspace:
//
//	'M'                                   meta: the enqueue sequence and the counts by state
//	'm' | id                              a message: topic, payload, enqueuedAt, seq
//	'p' | target 0x00 | id                a (message, target) pair: state, attempts, ...
//	'i' | target 0x00 | class | due | seq -> topic 0x00 id: the pair is pending, due at due
//	'v' | target 0x00 | deadline | seq    -> id: the pair is processing until deadline
//	'f' | target 0x00 | failedAt | seq    -> topic 0x00 id: the pair is a dead letter
//	'c' | target 0x00 | completedAt | seq -> id: the pair is complete (compaction's order)
//
// class 0 holds first attempts, class 1 retries: a receive takes the due first
// attempts in (due, seq) order, then the due retries. A first attempt is due at
// its enqueue time, or at its deliverAt when delayed, so undelayed messages go
// out in enqueue order and a delayed one joins that order at its time.
//
// Every change of a turn is one durable commit; the reply waits for it (the
// output gate), so an acknowledged enqueue is on disk.

const (
	queueMeta    = 'M'
	queueMessage = 'm'
	queuePair    = 'p'
	queueReady   = 'i'
	queueVisible = 'v'
	queueDeadIdx = 'f'
	queueDoneIdx = 'c'

	classFirst = 0
	classRetry = 1

	maxQueueIDBytes      = 128
	maxQueuePayloadBytes = 1 << 20
	// expireBatch bounds the processing pairs a receive expires in one turn.
	expireBatch = 1000
)

// Pair states.
const (
	StatePending    = "pending"
	StateProcessing = "processing"
	StateComplete   = "complete"
	StateFailed     = "failed"
)

type queueState struct {
	ks   persistence.Keyspace
	opts QueueOptions
	meta queueMetaRec
	// replayed is what the replay at this activation's load did.
	replayed *ReplaySummary
	// from holds, per index prefix (ready: target and class; processing:
	// target), a key before which every entry is known to be gone, so that
	// scans skip the deletions piled up at the front of the index (an LSM
	// walks its tombstones). It is sound because every entry is written with a
	// time at or after now (a deadline after now), and taken or expired only
	// once its time is at or before now: ready scans restart at the
	// millisecond of the last entry taken, processing scans after now. A clock
	// that goes back forgets them (lastNow).
	from    map[string][]byte
	lastNow int64
	// listed: this activation wrote the queue's entry in its partition's
	// IndexQueueObjects (once per activation; see queueFinish).
	listed bool
}

// scanFrom returns where a scan of prefix may start at now; nil: at prefix.
func (q *queueState) scanFrom(prefix []byte, now int64) []byte {
	if now < q.lastNow {
		clear(q.from)
	}
	q.lastNow = now
	if k, ok := q.from[string(prefix)]; ok {
		return k
	}
	return nil
}

// skipTo notes that every entry of prefix before key is gone.
func (q *queueState) skipTo(prefix, key []byte) {
	if q.from == nil {
		q.from = map[string][]byte{}
	}
	q.from[string(prefix)] = key
}

type queueMetaRec struct {
	Seq        uint64 `json:"seq"`
	Pending    int    `json:"pending"`
	Processing int    `json:"processing"`
	Complete   int    `json:"complete"`
	Failed     int    `json:"failed"`
}

type queueMsgRec struct {
	Topic      string          `json:"topic"`
	Payload    json.RawMessage `json:"payload"`
	EnqueuedAt int64           `json:"enqueuedAt"`
	Seq        uint64          `json:"seq"`
}

type queuePairRec struct {
	State     string `json:"state"`
	Topic     string `json:"topic"`
	Seq       uint64 `json:"seq"`
	Attempts  int    `json:"attempts"`
	Class     byte   `json:"class"`
	Due       int64  `json:"due"`                // pending: when it is due
	Deadline  int64  `json:"deadline,omitempty"` // processing: the visibility deadline
	Receipt   string `json:"receipt,omitempty"`  // processing: the current receipt
	LastError string `json:"lastError,omitempty"`
	Reason    string `json:"reason,omitempty"` // failed: exhausted or rejected
	SettledAt int64  `json:"settledAt,omitempty"`
}

func (o *object) queueLoad() (*queueState, error) {
	if o.queue != nil {
		return o.queue, nil
	}
	q := &queueState{ks: persistence.NewKeyspace(o.part, o.act.id, behaviourQueue), opts: o.opts.Queue.withDefaults()}
	v, found, err := o.st.get(o.bg(), q.ks.Key(queueMeta, nil))
	if err != nil {
		return nil, unavailable("cannot load the queue", err)
	}
	if found {
		if err := json.Unmarshal(v, &q.meta); err != nil {
			return nil, unavailable("cannot load the queue", err)
		}
	}
	o.queue = q
	q.replayed = o.queueReplayLoad(q)
	return q, nil
}

// queueTxn gathers one turn's changes of the queue. A turn that fails after
// changing the counts puts them back (rollback) and writes nothing.
type queueTxn struct {
	q     *queueState
	w     persistence.Write
	saved queueMetaRec
	// wake is when the queue wants its alarm (QueueAlarm) next; 0: no need.
	wake int64
	// enqueued counts the pairs this transaction enqueued (metrics).
	enqueued int
}

// wakeAt asks for the queue's alarm at at (the earliest asked wins).
func (t *queueTxn) wakeAt(at int64) {
	if at > 0 && (t.wake == 0 || at < t.wake) {
		t.wake = at
	}
}

func newQueueTxn(q *queueState) *queueTxn { return &queueTxn{q: q, saved: q.meta} }

func (t *queueTxn) rollback() { t.q.meta = t.saved }

func (t *queueTxn) set(key []byte, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // our own records always marshal
	}
	t.w.Sets = append(t.w.Sets, persistence.KV{Key: key, Value: b})
}

func (t *queueTxn) del(key []byte) { t.w.Deletes = append(t.w.Deletes, key) }

func (o *object) queueCommit(t *queueTxn) {
	var notify []alarms.Due
	if t.wake > 0 {
		d, err := o.queueArm(&t.w, t.wake)
		if err != nil {
			o.h.log.Warn("queue: cannot arm its alarm", "object", o.act.id.String(), "err", err)
		} else if d != nil {
			notify = append(notify, *d)
		}
	}
	if len(t.w.Sets) == 0 && len(t.w.Deletes) == 0 {
		return
	}
	o.queueFinish(t)
	o.submit(&t.w, nil)
	o.alarmNotify(notify)
	if f := o.h.cfg.Hooks.Queue; f != nil {
		for _, c := range [...]struct {
			event string
			n     int
		}{{"enqueued", t.enqueued}, {"delivered", t.q.meta.Processing - t.saved.Processing},
			{"completed", t.q.meta.Complete - t.saved.Complete}, {"dead_lettered", t.q.meta.Failed - t.saved.Failed}} {
			if c.n > 0 {
				f(c.event, c.n)
			}
		}
	}
}

// queueFinish adds the meta and the partition index to t's write.
func (o *object) queueFinish(t *queueTxn) {
	t.set(t.q.ks.Key(queueMeta, nil), t.q.meta)
	// The partition's list of queue objects (QueueDepth). Written again by each
	// activation's first change rather than only when the meta is created, so
	// that a queue whose entry is missing (older data) is listed once it is used.
	if !t.q.listed {
		t.w.Sets = append(t.w.Sets, persistence.KV{Key: queueObjectKey(o.part, o.act.id), Value: []byte{}})
		t.q.listed = true
	}
	// The partition's index of queues with deliveries in flight (replay at start).
	switch was, is := t.saved.Processing > 0, t.q.meta.Processing > 0; {
	case !was && is:
		t.w.Sets = append(t.w.Sets, persistence.KV{Key: queueIndexKey(o.part, o.act.id), Value: []byte{}})
	case was && !is:
		t.del(queueIndexKey(o.part, o.act.id))
	}
}

// deadLetter moves p, no longer pending nor processing, to the dead letters.
func (t *queueTxn) deadLetter(target, id string, p *queuePairRec, reason string, now int64) {
	p.State, p.Reason, p.SettledAt = StateFailed, reason, now
	t.q.meta.Failed++
	t.wakeAt(now + t.q.opts.DeadLetterRetention.Milliseconds()) // compaction
	t.set(pairKey(t.q, target, id), p)
	t.w.Sets = append(t.w.Sets, persistence.KV{Key: queueDeadKey(t.q, target, p), Value: []byte(p.Topic + "\x00" + id)})
}

func (q *queueState) hasTarget(t string) bool { return slices.Contains(q.opts.Targets, t) }

func (o *object) queueEnqueue(m QueueEnqueue) (any, error) {
	if len(m.Messages) == 0 {
		return nil, invalidf("no messages to enqueue: a batch holds at least one")
	}
	q, err := o.queueLoad()
	if err != nil {
		return nil, err
	}
	t := newQueueTxn(q)
	ids, err := o.queueStageEnqueue(t, m.Messages)
	if err != nil {
		return nil, err
	}
	t.enqueued = t.q.meta.Pending - t.saved.Pending // new pairs (one per target)
	o.queueCommit(t)
	o.queuePump()
	return &QueueEnqueued{IDs: ids}, nil
}

// queueStageEnqueue checks msgs and adds the new ones to t; on an error t is
// unchanged.
func (o *object) queueStageEnqueue(t *queueTxn, msgs []QueueMessageIn) ([]string, error) {
	m := QueueEnqueue{Messages: msgs}
	q := t.q
	now := o.h.now().UnixMilli()
	ids := make([]string, len(m.Messages))
	for i, in := range m.Messages {
		if in.ID != "" {
			if e := checkQueueID(in.ID); e != nil {
				return nil, e
			}
		}
		if len(in.Payload) == 0 || !jsonvalid.Valid(in.Payload) {
			return nil, badRequestf("message %d: the payload must be a JSON value", i)
		}
		if len(in.Payload) > maxQueuePayloadBytes {
			return nil, tooLargef("message %d: the payload is %d bytes, at most %d", i, len(in.Payload), maxQueuePayloadBytes)
		}
		if in.DeliverAt < 0 || in.Delay < 0 {
			return nil, badRequestf("message %d: deliverAt and delayMs cannot be negative", i)
		}
		ids[i] = in.ID
	}
	// Deduplicate against the queue and within the batch; only new messages
	// are written.
	fresh := make([]bool, len(ids))
	seen := map[string]bool{}
	newPairs := 0
	for i, id := range ids {
		if id == "" || seen[id] {
			fresh[i] = id == ""
		} else {
			_, found, err := o.st.get(o.bg(), q.ks.KeyString(queueMessage, id))
			if err != nil {
				return nil, unavailable("cannot read the queue", err)
			}
			fresh[i] = !found
		}
		if id != "" {
			seen[id] = true
		}
		if fresh[i] {
			newPairs += len(q.opts.Targets)
		}
	}
	if newPairs > 0 && q.meta.Pending+newPairs > q.opts.MaxPending {
		return nil, &Error{Kind: KindOverloaded, Msg: fmt.Sprintf("the queue holds %d pending messages, at most %d", q.meta.Pending, q.opts.MaxPending),
			RetryAfter: time.Second}
	}
	for i, in := range m.Messages {
		if !fresh[i] {
			continue
		}
		if ids[i] == "" {
			var b [16]byte
			_, _ = rand.Read(b[:])
			ids[i] = hex.EncodeToString(b[:])
		}
		topic := in.Topic
		if topic == "" {
			topic = "default"
		}
		q.meta.Seq++
		due := now
		if in.DeliverAt > 0 {
			due = max(due, in.DeliverAt)
		}
		if in.Delay > 0 {
			due = max(due, now+in.Delay.Milliseconds())
		}
		t.set(q.ks.KeyString(queueMessage, ids[i]), queueMsgRec{Topic: topic, Payload: in.Payload, EnqueuedAt: now, Seq: q.meta.Seq})
		for _, target := range q.opts.Targets {
			p := &queuePairRec{State: StatePending, Topic: topic, Seq: q.meta.Seq, Class: classFirst, Due: due}
			t.set(pairKey(q, target, ids[i]), p)
			t.w.Sets = append(t.w.Sets, persistence.KV{Key: readyKey(q, target, p), Value: []byte(topic + "\x00" + ids[i])})
			q.meta.Pending++
		}
	}
	return ids, nil
}

func (o *object) queueMessageGet(m QueueMessageGet) (any, error) {
	if e := checkQueueID(m.ID); e != nil {
		return nil, e
	}
	q, err := o.queueLoad()
	if err != nil {
		return nil, err
	}
	if _, found, err := o.st.get(o.bg(), q.ks.KeyString(queueMessage, m.ID)); err != nil {
		return nil, unavailable("cannot read the queue", err)
	} else if !found {
		return nil, notFoundf("no message %q", m.ID)
	}
	out := &QueueMessage{ID: m.ID, Targets: map[string]QueuePair{}}
	for _, target := range q.opts.Targets {
		if _, found, err := o.st.get(o.bg(), pairKey(q, target, m.ID)); err != nil {
			return nil, unavailable("cannot read the queue", err)
		} else if !found {
			continue // its dead letter was deleted
		}
		p, msg, err := o.queueRead(q, target, m.ID)
		if err != nil {
			return nil, err
		}
		out.Topic, out.Payload, out.EnqueuedAt = msg.Topic, msg.Payload, msg.EnqueuedAt
		qp := QueuePair{State: p.State, Attempts: p.Attempts, LastError: p.LastError, Reason: p.Reason}
		if p.State == StatePending {
			qp.NextAttemptAt = p.Due
		}
		out.Targets[target] = qp
	}
	return out, nil
}

func (o *object) queueStats() (any, error) {
	q, err := o.queueLoad()
	if err != nil {
		return nil, err
	}
	now := o.h.now().UnixMilli()
	// Deliveries past their deadline are expired first, so that they count
	// where they now are (pending, delayed or failed), not as processing.
	t := newQueueTxn(q)
	for _, target := range q.opts.Targets {
		if _, err := o.queueExpire(t, target, now); err != nil {
			t.rollback()
			return nil, err
		}
	}
	o.queueCommit(t)
	delayed := 0
	for _, target := range q.opts.Targets {
		for _, class := range []byte{classFirst, classRetry} {
			prefix := targetKey(q.ks, queueReady, target, []byte{class})
			err := o.st.scan(o.bg(), prefix, append(bytes.Clone(prefix), u64(now+1)...), nil, func(_, _ []byte) (bool, error) {
				delayed++
				return true, nil
			})
			if err != nil {
				return nil, unavailable("cannot read the queue", err)
			}
		}
	}
	m := q.meta
	return &QueueStats{Pending: m.Pending - delayed, Delayed: delayed, Processing: m.Processing, Complete: m.Complete, Failed: m.Failed}, nil
}
