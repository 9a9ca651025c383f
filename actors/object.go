package actors

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/holdfast/holdfast/persistence"
)

// envelope carries one request into an object's mailbox and its reply out.
type envelope struct {
	msg   any
	reply chan result // buffered: the actor never blocks on a caller that left
	// done, when set instead of reply, takes the reply (RequestAsync).
	done func(val any, err error)
	act  *activation
	// resent counts the hand-overs of this request, unrun, from an activation
	// that was retired to the object's activation now (Host.resend).
	resent int
	// The reply held at the output gate (respond) until its write is durable.
	h   *Host
	val any
	err error
}

type result struct {
	val any
	err error
}

// finish delivers the reply. cerr is the outcome of the write the reply waited for.
func (e *envelope) finish(val any, err, cerr error) {
	if cerr != nil {
		val, err = nil, commitError(cerr)
	}
	if e.done != nil {
		e.done(val, err)
	} else {
		e.reply <- result{val, err}
	}
	e.act.inflight.Add(-1)
}

func commitError(cerr error) error {
	if errors.Is(cerr, persistence.ErrTooLarge) {
		return &Error{Kind: KindTooLarge, Msg: "the write is too large for one commit", cause: cerr}
	}
	if errors.Is(cerr, persistence.ErrUnavailable) {
		// Nothing was written; the storage takes writes again once the
		// resource it lacked (descriptors, space, a database caught up) is back.
		return &Error{Kind: KindUnavailable, Msg: "the node's storage cannot take writes for now; retry", RetryAfter: time.Second, cause: cerr}
	}
	var e *Error
	if errors.As(cerr, &e) { // a fence refusal already says what happened
		return e
	}
	return unavailable("the write could not be made durable; its outcome is unknown", cerr)
}

// object is the actor of one activation of one object. Only Receive, on the
// actor's goroutine, touches its fields.
type object struct {
	h    *Host
	act  *activation
	part uint32
	// epoch is the partition's ownership epoch this activation loaded its state
	// under: its writes carry it, and once the partition's epoch moves on (a
	// handoff, a lost lease) the activation answers no more requests.
	epoch uint64
	ov    overlay
	st    store
	chain *persistence.Chain
	// last is the ticket of the latest write submitted: the output gate holds
	// every reply until it is done.
	last *persistence.Ticket
	// broken is set once a write of this activation failed: the in-memory state
	// may be ahead of disk, so the activation answers 503 and goes away.
	broken error
	// movedOn is set with broken when the activation was retired (moved): it
	// hands the requests left in its mailbox, unrun, to the object's
	// activation now (Host.resend).
	movedOn bool

	ready    bool // state may be read: earlier activations' writes are applied
	typ      *TypeSpec
	opts     TypeOptions
	kv       *kvState    // loaded on the first KV message
	log      *logState   // loaded on the first log message
	alarms   *alarmState // loaded on the first alarm message
	queue    *queueState // loaded on the first queue message
	push     pushState   // push handlers in flight
	cur      *envelope   // the message being handled
	deferred bool        // its handler replies later (deferReply)
	flush    *flushState
	// subs are the live feed's subscribers (copy-on-write; see subscribe.go).
	subs subscribers
}

func (o *object) Receive(c actor.Context) {
	if o.act != nil && o.act.queued.Swap(false) {
		// A write of the previous message of this mailbox run: commit it now
		// rather than after the whole run.
		o.h.pipe.Kick()
	}
	switch m := c.Message().(type) {
	case *activation:
		o.init(c, m)
	case *envelope:
		a := o.act // m.act moves on if handle hands m over
		o.handle(c, m)
		o.h.ran(a)
	case passivate:
		o.idle(c, m.memory)
	case flushDone:
		o.evict() // long trims run here, pass after pass: keep the overlay short
		o.onFlushDone(m)
	case resume:
		o.evict()
		m.fn()
	case dropPartition:
		o.drop(c)
	case tidy:
		o.evict()
		if o.health() == nil && o.last == nil && len(o.ov.entries) == 0 {
			o.act.dirty.Store(false)
		}
	}
}

func (o *object) init(c actor.Context, a *activation) {
	o.act = a
	o.part = persistence.Partition(a.id, o.h.db.Partitions())
	o.epoch = a.epoch // not the epoch now: a lapse since the admission retires it
	o.st = store{db: o.h.db, ov: &o.ov}
	o.chain = a.chain
	o.typ = o.h.types[a.id.Type]
	o.opts = o.h.typeOptions(a.id.Type)
}

// evict drops the overlay's entries that Badger shows now.
func (o *object) evict() { o.ov.evict(o.h.pipe.AppliedSeq()) }

// passivate asks an object that the host's sweeper saw idle to go away; memory
// says that the memory governor asked (memory.go).
type passivate struct{ memory bool }

// tidy asks a quiet object to drop the buffers of its applied writes.
type tidy struct{}

func (o *object) handle(c actor.Context, env *envelope) {
	o.evict()
	if o.broken == nil && o.retired() {
		o.moved()
	}
	if !o.ready && o.broken == nil {
		// An earlier activation's writes may be durable but not yet in Badger
		// (after a failed write, the next activation starts at once), or even
		// not yet durable (taken into the log just before it was retired:
		// WaitLanded, first, so that WaitPartition's target covers them). Both
		// waits end: every record the log begins ends, and WaitPartition ends
		// when the pipeline stops, failed or closed.
		if c := o.act.landing; c != nil {
			_ = c.WaitLanded(context.Background()) // fails only with its context
		}
		if err := o.h.pipe.WaitPartition(context.Background(), o.part); err != nil {
			o.broken = fmt.Errorf("the database cannot show every acknowledged write: %w", err)
			o.h.forget(o.act)
		} else if o.retired() { // dropped while it waited
			o.moved()
		} else {
			o.ready = true
			o.act.ready.Store(true)
		}
	}
	if o.movedOn && o.h.resend(env) {
		// Never run here: the object's activation now runs it, and the caller
		// does not hear of the hand-over.
		if o.act.inflight.Load() == 0 {
			c.Stop(c.Self())
		}
		return
	}
	if err := o.health(); err != nil {
		if f, ok := env.msg.(alarmFire); ok {
			o.h.retryAlarm(f.d) // the next activation looks at it
		}
		env.finish(nil, err, nil)
		if env.act.inflight.Load() == 0 {
			c.Stop(c.Self())
		}
		return
	}
	o.cur, o.deferred = env, false
	val, err := o.dispatch(env.msg)
	o.noteBytes()
	o.cur = nil
	if o.deferred {
		return // the handler replies later, from a later turn or a goroutine
	}
	o.respond(env, val, err)
}

// deferReply tells handle that the current message's handler replies itself,
// later, and returns its envelope.
func (o *object) deferReply() *envelope {
	o.deferred = true
	return o.cur
}

// dispatch runs one message in the object's turn. A panic is a bug: it is logged
// and answered as an internal error; no write of the failed turn was submitted.
func (o *object) dispatch(msg any) (val any, err error) {
	defer func() {
		if r := recover(); r != nil {
			o.h.log.Error("object handler panicked", "object", o.act.id.String(), "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			val, err = nil, &Error{Kind: KindInternal, Msg: "internal error", cause: fmt.Errorf("panic: %v", r)}
		}
	}()
	switch m := msg.(type) {
	case KVGet, *KVGet:
		return o.kvGet()
	case KVGetSlot:
		return o.kvGetSlot(m.Slot)
	case *KVWrite:
		return o.kvWrite(m)
	case KVReadLog:
		return o.kvReadLog(m)
	case KVSubscribe:
		return o.kvSubscribe(m)
	case KVUnsubscribe:
		return o.kvUnsubscribe(m)
	case Publish:
		return o.publish(m)
	case LogAppend:
		return o.logAppend(m)
	case LogRead:
		return o.logRead(m)
	case LogBoundsGet:
		return o.logBounds()
	case LogCommit:
		return o.logCommit(m)
	case LogCursorGet:
		return o.logCursorGet(m)
	case LogCursorsGet:
		return o.logCursors()
	case LogLoadGet:
		return o.logLoadGet()
	case LogTrim:
		return o.logTrim()
	case LogForgetCold:
		return o.logForgetCold(m)
	case LogLease:
		return o.logLease(m)
	case LogAck:
		return o.settle(m.Consumer, m.BatchID, true)
	case LogNack:
		return o.settle(m.Consumer, m.BatchID, false)
	case LogLeasesGet:
		return o.logLeases(m)
	case LogDeadLettersGet:
		return o.logDeadLetters(m)
	case QueueEnqueue:
		return o.queueEnqueue(m)
	case QueueReceive:
		return o.queueReceive(m)
	case QueueAck:
		return o.queueAck(m)
	case QueueNack:
		return o.queueNack(m)
	case QueueDead:
		return o.queueDead(m)
	case QueueMessageGet:
		return o.queueMessageGet(m)
	case QueueStatsGet:
		return o.queueStats()
	case QueueReplay:
		return o.queueReplay(m)
	case QueueDeadLettersGet:
		return o.queueDeadLetters(m)
	case QueueRedrive:
		return o.queueRedrive(m)
	case QueueDeadLetterDelete:
		return o.queueDeadLetterDelete(m)
	case queueStartReplay:
		q, err := o.queueLoad()
		if err != nil {
			return nil, err
		}
		o.queuePump()
		return q.replayed, nil
	case queuePushDone:
		return o.queuePushed(m)
	case AlarmSet:
		return o.alarmSet(m)
	case AlarmGet:
		return o.alarmGet(m)
	case AlarmDelete:
		return o.alarmDelete(m)
	case AlarmListGet:
		return o.alarmList(m)
	case alarmFire:
		return o.alarmFire(m)
	}
	if o.typ == nil {
		return nil, notFoundf("object type %q has no handler for %T", o.act.id.Type, msg)
	}
	return o.runUser(msg)
}

// respond is the output gate: the reply leaves only once every write this
// activation submitted before it is durable, while the actor goes on with its
// mailbox.
func (o *object) respond(env *envelope, val any, err error) {
	if ackBeforeDurable {
		env.finish(val, err, nil) // the planted bug: see plantedbug_off.go
		return
	}
	t := o.last
	if t == nil {
		env.finish(val, err, nil)
		return
	}
	env.h, env.val, env.err = o.h, val, err
	t.Notify(env) // at once if the outcome is already known
}

// WriteDone sends the reply respond held, once the write it waited for is
// durable (cerr nil) or lost.
func (e *envelope) WriteDone(cerr error) {
	if cerr != nil {
		// Route later requests to a fresh activation at once (before this reply
		// leaves); this one may hold state that never reached disk.
		e.h.forget(e.act)
	}
	e.finish(e.val, e.err, cerr)
}

// gate is the output gate: it runs f once every write submitted before now is
// durable, at once when none is pending; if one failed, it runs lost instead.
func (o *object) gate(f func(), lost func(error)) {
	t := o.last
	if t == nil {
		f()
		return
	}
	t.OnDone(func(err error) { // at once if the outcome is already known
		if err != nil {
			lost(err)
			return
		}
		f()
	})
}

// health reports whether the activation can still serve. After a failed write it
// forgets itself so that the next request activates a fresh copy from disk.
func (o *object) health() error {
	if o.broken == nil && o.last != nil && o.last.Done() {
		if err := o.last.Err(); err != nil {
			o.broken = err
			o.h.log.Warn("object write failed; deactivating", "object", o.act.id.String(), "err", o.broken)
			o.h.forget(o.act)
		} else if o.last.Applied() {
			o.last = nil // nothing to wait for; do not keep the write alive
		}
	}
	if o.broken != nil {
		return commitError(o.broken)
	}
	return nil
}

// submit queues w in the commit pipeline without waiting and makes it the write
// that later replies wait for. It does not wake the committer: Host.send, which
// delivered the message, commits it once the mailbox run is over, or the next
// message of the same run has it committed first (Receive).
//
// readBack says which keys of w later turns read from storage, so that reads see
// them before Badger does; nil means every key.
func (o *object) submit(w *persistence.Write, readBack func([]byte) bool) {
	w.Partition = o.part
	w.Epoch = o.epoch
	w.Chain = o.chain
	t := o.h.pipe.Queue(w)
	o.act.queued.Store(true)
	o.ov.record(w, t, readBack)
	o.last = t
	o.act.dirty.Store(true)
}

// idle passivates the activation when nothing is in flight: every reply was
// delivered, every write is durable and visible in Badger, and no caller holds the
// activation.
func (o *object) idle(c actor.Context, memory bool) {
	o.evict()
	// Applied, not only durable: the next activation loads from Badger. An object
	// with subscribers stays: its feed lives in this activation.
	if len(o.subs) == 0 && o.push.inflight == 0 && (o.last == nil || o.last.Applied()) && o.h.release(o.act) {
		if f := o.h.cfg.Hooks.Passivated; f != nil {
			f()
		}
		if memory {
			o.h.mem.passivated.Add(1)
		}
		c.Stop(c.Self())
	}
}

// dropPartition tells an activation that its partition left this node (or its
// epoch moved on): the host already forgot it.
type dropPartition struct{}

// errMoved is the answer of an activation whose partition's epoch moved on.
func errMoved() error {
	return &Error{Kind: KindUnavailable, Code: CodeNotServed, Msg: "the object's partition is moving between nodes; retry", RetryAfter: 100 * time.Millisecond}
}

// retired reports whether this activation may serve no more: the host took it
// out of its routing table (a fresh activation serves the object now, or will),
// or its partition's epoch moved on.
func (o *object) retired() bool {
	return o.act.gone.Load() || o.h.epoch(o.part) != o.epoch
}

// moved retires an activation whose partition is no longer served under its
// epoch, or that the host no longer routes to: the requests already in its
// mailbox go, unrun, to the object's activation now if this node serves the
// partition (Host.resend), else get 503 (not served: a cluster's router asks
// the node that serves it); subscribers are told to resume elsewhere, and the
// host routes new requests to a fresh activation.
func (o *object) moved() {
	o.broken, o.movedOn = errMoved(), true
	o.h.forget(o.act)
	o.cancelPush() // its handlers' results cannot come back to it (owners.go)
	subs := o.subs
	o.subs = nil
	o.act.subscribed.Store(0)
	lose(subs, o.broken)
}

// drop stops an activation the host dropped with its partition, once the
// requests that already reached it were answered.
func (o *object) drop(c actor.Context) {
	if o.broken == nil {
		o.moved()
	}
	// Not o.push.inflight: the host forgot this activation, so its push
	// handlers' results go to a fresh one (or nowhere), never back here.
	if o.act.inflight.Load() != 0 || (o.last != nil && !o.last.Done()) {
		o.h.retryDrop(o.act) // owners.go
		return
	}
	c.Stop(c.Self())
}

func (o *object) bg() context.Context { return context.Background() }
