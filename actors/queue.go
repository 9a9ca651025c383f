package actors

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
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

func targetKey(ks persistence.Keyspace, sub byte, target string, rest ...[]byte) []byte {
	k := ks.KeyString(sub, target)
	k = append(k, 0)
	for _, r := range rest {
		k = append(k, r...)
	}
	return k
}

func u64(n int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(max(n, 0))) }

func pairKey(q *queueState, target, id string) []byte {
	return targetKey(q.ks, queuePair, target, []byte(id))
}

func readyKey(q *queueState, target string, p *queuePairRec) []byte {
	return targetKey(q.ks, queueReady, target, []byte{p.Class}, u64(p.Due), binary.BigEndian.AppendUint64(nil, p.Seq))
}

func queueDeadKey(q *queueState, target string, p *queuePairRec) []byte {
	return targetKey(q.ks, queueDeadIdx, target, u64(p.SettledAt), binary.BigEndian.AppendUint64(nil, p.Seq))
}

// queueDoneKey is a complete pair's entry in the index compaction reads.
func queueDoneKey(q *queueState, target string, p *queuePairRec) []byte {
	return targetKey(q.ks, queueDoneIdx, target, u64(p.SettledAt), binary.BigEndian.AppendUint64(nil, p.Seq))
}

// deadLetter moves p, no longer pending nor processing, to the dead letters.
func (t *queueTxn) deadLetter(target, id string, p *queuePairRec, reason string, now int64) {
	p.State, p.Reason, p.SettledAt = StateFailed, reason, now
	t.q.meta.Failed++
	t.wakeAt(now + t.q.opts.DeadLetterRetention.Milliseconds()) // compaction
	t.set(pairKey(t.q, target, id), p)
	t.w.Sets = append(t.w.Sets, persistence.KV{Key: queueDeadKey(t.q, target, p), Value: []byte(p.Topic + "\x00" + id)})
}

func visibleKey(q *queueState, target string, p *queuePairRec) []byte {
	return targetKey(q.ks, queueVisible, target, u64(p.Deadline), binary.BigEndian.AppendUint64(nil, p.Seq))
}

// checkQueueID checks a message id by the rule of every name (checkUserName):
// 1 to 128 bytes, and no control characters (422).
func checkQueueID(id string) *Error {
	if e := checkUserName("message id", id, maxQueueIDBytes, ""); e != nil {
		return e
	}
	if strings.ContainsFunc(id, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return invalidf("a message id must not contain control characters")
	}
	return nil
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

// A receipt names its pair and one delivery of it, and the node run (boot)
// that handed it out: random . boot . target . id.
func newReceipt(boot, target, id string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	enc := base64.RawURLEncoding
	return hex.EncodeToString(b[:]) + "." + boot + "." + enc.EncodeToString([]byte(target)) + "." + enc.EncodeToString([]byte(id))
}

func parseReceipt(r string) (target, id string, ok bool) {
	parts := strings.Split(r, ".")
	if len(parts) != 4 {
		return "", "", false
	}
	t, err1 := base64.RawURLEncoding.DecodeString(parts[2])
	i, err2 := base64.RawURLEncoding.DecodeString(parts[3])
	if err1 != nil || err2 != nil || len(i) == 0 {
		return "", "", false
	}
	return string(t), string(i), true
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
