package actors

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cespare/xxhash/v2"

	"github.com/holdfast/holdfast/alarms"
	"github.com/holdfast/holdfast/cold"
	"github.com/holdfast/holdfast/internal/owner"
	"github.com/holdfast/holdfast/internal/slogx"
	"github.com/holdfast/holdfast/persistence"
)

// mailboxThroughput is how many messages one mailbox run handles before yielding.
const mailboxThroughput = 300

// Config configures a Host.
type Config struct {
	// IdleTimeout passivates an object after this long without a message. Zero
	// means 60s.
	IdleTimeout time.Duration
	// MaxInflightPerObject is the admission limit: requests queued or running in
	// one object beyond it get ErrOverloaded (429). Zero means 10,000.
	MaxInflightPerObject int64
	// TypeOptions returns the options of an object type. Nil means DefaultTypeOptions.
	TypeOptions func(typ string) TypeOptions
	// Epoch returns the ownership epoch of a partition; writes carry it so that the
	// pipeline can fence them. Nil means 1 for every partition (a single node).
	Epoch func(partition uint32) uint64
	// DataLosses returns how many times a partition's stored data was given up
	// (a cluster's forget-node --accept-data-loss); an object with no stored
	// change log starts its log_ids above a floor derived from it
	// (logfloor.go). nil: never (a single node).
	DataLosses func(partition uint32) uint64
	// Partitions returns the partitions this node serves: their alarms fire and
	// their queues are replayed at start. Nil means every partition.
	Partitions func() []uint32
	// Logger is the host's logger. Nil means slog.Default().
	Logger *slog.Logger
	// Cold is the node's cold segment store; nil means none (a log type with
	// cold storage then fails its trims).
	Cold cold.Store
	// ColdTimeout bounds one cold store call; zero means 10s.
	ColdTimeout time.Duration
	// Alarms configures the node's alarm scheduler; its DB, Fire and clock are
	// the host's.
	Alarms alarms.Config
	// Hooks observe the host's work (metrics); nil fields are skipped.
	Hooks Hooks
	// MemoryBudget bounds the Go heap the node's objects may fill, in bytes
	// (memory.go): from 60% of it the least recently used idle objects are
	// passivated, from 75% new activations and writes are refused (503) until
	// the heap is under 65%. Zero means DefaultMemoryBudget (half of the
	// machine's or the cgroup's memory); otherwise at least MinMemoryBudget.
	MemoryBudget int64
}

// Hooks observe a host's work for metrics. Each is called on an object's turn
// or a pipeline goroutine and must not block. Nil fields are skipped.
type Hooks struct {
	// Passivated: an idle activation went away.
	Passivated func()
	// AlarmRan: an alarm ran, late by this much after its time.
	AlarmRan func(late time.Duration)
	// Queue: n queue messages made a transition: "enqueued", "delivered",
	// "completed" or "dead_lettered" (counted as their change is submitted).
	Queue func(event string, n int)
	// Routed: an activation of id entered (true) or left (false) the host's
	// routing table. Only an activation in the table serves requests: one that
	// left it runs none of those already in its mailbox (they go to the
	// object's activation now, or are refused). Tests check single activity
	// across nodes with it.
	Routed func(id ObjectID, in bool)
}

// TypeOptions are the per-type settings the actors use.
type TypeOptions struct {
	// ChangeLogEntries is how many change-log entries an object keeps (at least 1).
	ChangeLogEntries int
	// Log are the options of the type's retained logs.
	Log LogOptions
	// Alarms are the options of the type's alarms.
	Alarms AlarmOptions
	// Queue are the options of the type's write-ahead queues.
	Queue QueueOptions
}

// DefaultTypeOptions returns the options of a type nobody configured.
func DefaultTypeOptions() TypeOptions {
	return TypeOptions{ChangeLogEntries: 10000, Log: LogOptions{MaxBatchSize: DefaultMaxBatchSize}}
}

// newBoot returns a fresh name for a run of the node.
func newBoot() string {
	var b [6]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Host runs the object actors of one node: it activates an object on its first
// message, routes every message to the object's one activation, and passivates it
// when idle. Request may be called from any goroutine.
type Host struct {
	db   *persistence.DB
	pipe Pipeline
	cfg  Config
	log  *slog.Logger

	system *actor.ActorSystem
	props  *actor.Props
	types  map[string]*TypeSpec
	shards [64]hostShard

	closing atomic.Bool
	started bool
	stop    chan struct{}
	swept   sync.WaitGroup
	sched   *alarms.Scheduler
	// push and bg own the goroutines that run outside objects' turns: user
	// push handlers, and cold I/O and retries (owners.go). Close stops both.
	push, bg *owner.Group

	now func() time.Time // clock; a test may replace it before Start
	// jitter returns a number in [0, 1) for backoff jitter; a test may replace it.
	jitter func() float64
	// boot names this run of the node: queue receipts carry it, and replay puts
	// back the deliveries of earlier runs (queuereplay.go).
	boot   string
	replay replayState
	// mem is the memory governor (memory.go).
	mem memGovernor
}

type hostShard struct {
	mu   sync.RWMutex
	m    map[ObjectID]*activation
	peak int // the map's largest size since it was last rebuilt
	// routed, if set, hears every activation entering (true) and leaving
	// (false) the map, under mu (Hooks.Routed).
	routed func(id ObjectID, in bool)
	// draining holds, per object, the newest retired activation that is not
	// settled yet (gate.go): the next activation of the object waits for it.
	draining map[ObjectID]*activation
	// landing holds, per object, the chain of the newest retired activation
	// that still had writes in the log's unfinished records when it was
	// retired (persistence.Chain.Landed): the committer took them before the
	// retirement, so they become durable after it. The next activation of the
	// object waits for them (landing) before its first read, or it could read
	// a state without them and build on it. A newer retired activation
	// without such writes leaves the entry as it is; one with them replaces
	// it, since its own first read waited for the entry it found. The sweeper
	// deletes entries that landed.
	landing map[ObjectID]*persistence.Chain
}

// remove deletes a from the shard (under s.mu). A Go map never gives memory back,
// so once it holds a quarter of its peak it is rebuilt: passivated objects leave
// nothing resident.
func (s *hostShard) remove(a *activation) {
	if s.m[a.id] != a {
		return
	}
	a.gone.Store(true)
	a.chain.Retire(errMoved())
	if !a.chain.Landed() { // looked at after Retire: see persistence.Chain's inLog
		if s.landing == nil {
			s.landing = make(map[ObjectID]*persistence.Chain)
		}
		s.landing[a.id] = a.chain
	}
	delete(s.m, a.id)
	if a.unrun.Load() > 0 || a.gated.Load() {
		// Not settled: it may still hand requests over (gate.go).
		if s.draining == nil {
			s.draining = make(map[ObjectID]*activation)
		}
		s.draining[a.id] = a
	}
	if s.routed != nil {
		s.routed(a.id, false)
	}
	if s.peak >= 256 && len(s.m) < s.peak/4 {
		m := make(map[ObjectID]*activation, len(s.m))
		for k, v := range s.m {
			m[k] = v
		}
		s.m, s.peak = m, len(m)
	}
}

// forgetLanded deletes the shard's landing entries whose writes all ended.
func (s *hostShard) forgetLanded() {
	s.mu.Lock()
	for id, c := range s.landing {
		if c.Landed() {
			delete(s.landing, id)
		}
	}
	s.mu.Unlock()
}

// activation is one live copy of an object. inflight counts requests sent to it
// and not yet answered; it passivates only at zero, under the shard lock, so no
// request can reach a stopped actor.
type activation struct {
	id ObjectID
	// epoch is the partition's epoch the activation was admitted under (never
	// 0): it serves under that epoch only (object.retired).
	epoch    uint64
	pid      *actor.PID
	inflight atomic.Int64
	lastUsed atomic.Int64 // unix nanoseconds of the last request admitted
	// dirty is set when the object submitted a write: until its next turn it keeps
	// the write's buffers (overlay, output gate). The sweeper tidies quiet ones.
	dirty atomic.Bool
	// subscribed counts the live feed's subscribers: the sweeper leaves the
	// object active while it has any.
	subscribed atomic.Int32
	// queued is set when the object's turn queued a write without waking the
	// committer (object.submit); whoever delivered the message wakes it or
	// commits on its own goroutine (Host.send).
	queued atomic.Bool
	// bytes estimates the state the activation holds (object.noteBytes), for
	// the memory governor.
	bytes atomic.Int64
	// ready is set once the object's first turn saw its partition's
	// acknowledged writes in Badger (object.handle): its later turns do not
	// wait for the pipeline (StartsAtOnce).
	ready atomic.Bool
	// gone is set, and chain (the object's writes) retired, as the
	// activation leaves the routing table (hostShard.remove). From then on it
	// answers none of the requests still in its mailbox (object.handle), and
	// none of the writes it submits after that reaches the log: the next
	// activation of the object, on this node, may already be serving, even
	// under the same epoch (a replicated node's lease that lapsed and came
	// back within one raft term). Otherwise both would write, each from its
	// own state.
	gone  atomic.Bool
	chain *persistence.Chain
	// landing is the chain of a retired activation of the object whose
	// writes the log had not finished when it was retired (hostShard's
	// landing): the first turn waits for them before it reads. Set before
	// the actor's first message.
	landing *persistence.Chain
	// unrun counts the envelopes admitted (acquire) and not yet handled by a
	// turn; gated says sends wait at the gate; settled that the retired
	// activation will hand nothing more over. See gate.go.
	unrun   atomic.Int64
	gated   atomic.Bool
	settled atomic.Bool
	gateMu  sync.Mutex
	gate    gateState
}

// NewHost returns a host over db and pipe; register types, then Start it.
func NewHost(db *persistence.DB, pipe Pipeline, cfg Config) *Host {
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 60 * time.Second
	}
	if cfg.MaxInflightPerObject <= 0 {
		cfg.MaxInflightPerObject = 10000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ColdTimeout <= 0 {
		cfg.ColdTimeout = 10 * time.Second
	}
	h := &Host{db: db, pipe: pipe, cfg: cfg, log: cfg.Logger, types: map[string]*TypeSpec{}, now: time.Now, jitter: mrand.Float64,
		boot: newBoot(), push: owner.New(nil), bg: owner.New(nil)}
	h.initMemory()
	for i := range h.shards {
		h.shards[i].m = make(map[ObjectID]*activation)
		h.shards[i].routed = cfg.Hooks.Routed
	}
	return h
}

// RegisterType registers a user-defined object type. Call it before Start.
func (h *Host) RegisterType(spec TypeSpec) error {
	if h.started {
		return errors.New("actors: RegisterType after Start")
	}
	if err := checkName("type", spec.Name, ":/"); err != nil {
		return fmt.Errorf("actors: register type: %w", err)
	}
	if spec.Handle == nil && len(spec.Queue) == 0 && len(spec.Alarms) == 0 {
		return fmt.Errorf("actors: register type %q: no Handle, no queue handler, no alarm handler", spec.Name)
	}
	for _, qh := range spec.Queue {
		if qh.Handle == nil {
			return fmt.Errorf("actors: register type %q: a queue handler without Handle", spec.Name)
		}
	}
	if _, dup := h.types[spec.Name]; dup {
		return fmt.Errorf("actors: type %q registered twice", spec.Name)
	}
	h.types[spec.Name] = &spec
	return nil
}

// Start starts the actor system.
func (h *Host) Start() {
	h.started = true
	// protoactor logs routine events at info; keep its warnings and errors only.
	logger := slog.New(slogx.MinLevel(h.log.Handler(), slog.LevelWarn)).With("component", "protoactor")
	h.system = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }))
	// The synchronized dispatcher runs an object's mailbox on the goroutine that
	// posted to it (the caller's) instead of a new goroutine per run: one hand-off
	// less per request, and no fresh stack to grow. The mailbox still runs one
	// message at a time. Nothing may post to an object while holding a lock that
	// the object's turn takes.
	h.props = actor.PropsFromProducer(func() actor.Actor { return &object{h: h} },
		actor.WithDispatcher(actor.NewSynchronizedDispatcher(mailboxThroughput)))
	h.stop = make(chan struct{})
	h.swept.Add(1)
	go h.sweepLoop()
	h.startMemory()
	sc := h.cfg.Alarms
	sc.DB, sc.WaitApplied, sc.Fire = h.db, h.pipe.WaitApplied, h.fireAlarm
	if sc.Logger == nil {
		sc.Logger = h.log
	}
	if sc.Partitions == nil {
		sc.Partitions = h.cfg.Partitions
	}
	h.sched = alarms.NewScheduler(sc)
	h.sched.SetClock(h.now)
	h.sched.Start()
	h.swept.Add(1)
	go h.replayQueues()
}

// Scheduler returns the node's alarm scheduler (after Start).
func (h *Host) Scheduler() *alarms.Scheduler { return h.sched }

// fireAlarm wakes d's object for its alarm without waiting for it.
func (h *Host) fireAlarm(d alarms.Due) error { return h.post(d.ID, alarmFire{d}) }

// retryAlarm wakes d's object again later: it could not look at its alarm now.
func (h *Host) retryAlarm(d alarms.Due) {
	if h.sched != nil && !h.closing.Load() {
		h.sched.Retry(d)
	}
}

// post sends msg to object id, activating it if needed, without waiting for the
// reply.
func (h *Host) post(id ObjectID, msg any) error {
	act, err := h.acquire(id)
	if err != nil {
		return err
	}
	h.send(act, &envelope{msg: msg, reply: make(chan result, 1), act: act}, false)
	return nil
}

// maxResends bounds the hand-overs of one request (resend): each needs the
// activation it went to retired before it ran the request, a lease that lapses
// and comes back, or a partition dropped, while the request waited.
const maxResends = 3

// resend hands env, which a retired activation refused without running it, to
// the retired activation's successor (gate.go), or, when none was created
// yet, to the object's activation now, a fresh one if need be. It reports
// false, and does nothing, when it cannot: this node does not serve the
// partition now, the object cannot be activated, or env was handed over
// maxResends times already; the retired activation then answers with its
// refusal.
//
// The successor even when it was retired in turn: its gate stays closed until
// the retired activation has handed everything over, and it passes what it
// was handed on to its own successor in order. Handing a retired activation's
// later requests to the activation now instead put them ahead of the earlier
// ones its successor still held (TestHost_HandOversFollowTheChainOfRetiredActivations).
//
// The request is counted at once in the new activation's inflight (so Close
// waits for it) and queued at its gate, ahead of the requests posted to it
// directly: the new activation runs the retired one's requests first, in the
// retired mailbox's order, then its own (gate.go). Never on the caller's
// goroutine: the new activation's first turn waits for its partition's writes
// to reach Badger (WaitPartition), and the synchronized dispatcher would run
// it right there, which may be the cluster transport's connection reader
// (StartsAtOnce lets it run turns of ready objects only: session 26 saw a
// reader held past its probe fail every call on its connection).
func (h *Host) resend(env *envelope) bool {
	if env.resent >= maxResends {
		return false
	}
	old := env.act
	a, err := h.successor(old)
	if err != nil {
		return false
	}
	env.resent++
	env.act = a
	old.inflight.Add(-1)
	h.handOver(a, env)
	if testHandedOver != nil {
		testHandedOver()
	}
	return true
}

// successor returns the activation that takes over retired activation old's
// requests, with one more counted in its inflight and unrun: old's successor
// if one was created (it waits for old: its gate is closed until old
// settles, so it is not settled either, retired or not), else the object's
// activation now (acquire; made with old as its predecessor, since old still
// has requests and so is draining).
func (h *Host) successor(old *activation) (*activation, error) {
	s := h.shard(old.id)
	s.mu.RLock() // succ is set under the write lock (acquire)
	a := old.gate.succ
	if a != nil {
		a.inflight.Add(1)
		a.unrun.Add(1)
	}
	s.mu.RUnlock()
	if a != nil {
		a.lastUsed.Store(time.Now().UnixNano())
		return a, nil
	}
	return h.acquire(old.id)
}

// testHandedOver, when set by a test, runs after each hand-over (resend), on
// the retired activation's turn.
var testHandedOver func()

// send delivers msg to a's actor: every message to an object goes through here.
// The mailbox runs on this goroutine (the synchronized dispatcher), and the
// object's turns queue their writes without waking the committer
// (object.submit); send then sees that they are committed. help says that this
// goroutine may commit them itself when the committer is idle
// (Pipeline.Help): a request's caller, which waits for the reply anyway.
// Otherwise it wakes the committer. While a's gate is closed (gate.go), msg
// waits there instead, and a drainer posts it.
func (h *Host) send(a *activation, msg any, help bool) {
	if a.gated.Load() && h.hold(a, msg) {
		return
	}
	h.system.Root.Send(a.pid, msg)
	h.commitQueued(a, help)
}

// commitQueued commits, or has the committer commit, what a's turns queued.
func (h *Host) commitQueued(a *activation, help bool) {
	if !a.queued.Swap(false) {
		return
	}
	if help {
		h.pipe.Help()
	} else {
		h.pipe.Kick()
	}
}

// sweepLoop passivates idle objects: one goroutine and one ticker for the node,
// instead of a timer per object. An object whose last request was admitted more
// than IdleTimeout ago and that has nothing in flight is asked to passivate.
func (h *Host) sweepLoop() {
	defer h.swept.Done()
	every := min(h.cfg.IdleTimeout/4, time.Second)
	if every < time.Millisecond {
		every = time.Millisecond
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	var idle, quiet []*activation
	for {
		select {
		case <-h.stop:
			return
		case now := <-tick.C:
			cutoff := now.Add(-h.cfg.IdleTimeout).UnixNano()
			idle, quiet = idle[:0], quiet[:0]
			for i := range h.shards {
				s := &h.shards[i]
				s.mu.RLock()
				for _, a := range s.m {
					switch {
					case a.inflight.Load() != 0, a.subscribed.Load() != 0:
					case a.lastUsed.Load() < cutoff:
						idle = append(idle, a)
					case a.dirty.Load():
						quiet = append(quiet, a)
					}
				}
				landing := len(s.landing) > 0
				s.mu.RUnlock()
				if landing {
					s.forgetLanded()
				}
			}
			// Sent without a lock held: the object's turn runs right here and
			// takes the shard lock to release itself.
			for _, a := range idle {
				h.send(a, passivate{}, false)
			}
			for _, a := range quiet {
				h.send(a, tidy{}, false)
			}
			// A backstop: every delivery commits what its turns queued, so
			// this finds nothing to do unless a delivery path was missed.
			if h.pipe.KickStale(time.Second) {
				h.log.Warn("writes waited over a second in the commit queue: a turn ran long after writing, or a delivery path did not commit what its turn queued")
			}
			clear(idle)
			clear(quiet)
		}
	}
}

// Close stops admitting requests, cancels the push handlers, waits until every
// admitted request was answered (so every acknowledged write is durable) or ctx
// ends, cancels and waits for the host's other goroutines (cold I/O, retries,
// the alarm scheduler) and the push handlers, then stops every actor. Only then
// may the caller close the pipeline and the database.
func (h *Host) Close(ctx context.Context) error {
	h.closing.Store(true)
	h.push.Stop() // owners.go: user code ends first; its results are refused now
	close(h.stop)
	h.swept.Wait()
	h.sched.Close()
	var err error
	for h.inflight() > 0 {
		if ctx.Err() != nil {
			err = fmt.Errorf("actors: close: %d requests still in flight: %w", h.inflight(), ctx.Err())
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if oerr := h.closeOwned(ctx); oerr != nil && err == nil { // owners.go
		err = oerr
	}
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		for id, a := range s.m {
			h.system.Root.Stop(a.pid)
			h.commitQueued(a, false)
			delete(s.m, id)
			if s.routed != nil {
				s.routed(id, false)
			}
		}
		s.mu.Unlock()
	}
	h.system.Shutdown()
	return err
}

// Inflight returns the requests queued in or run by objects now (the sum of
// their mailbox depths).
func (h *Host) Inflight() int64 { return h.inflight() }

func (h *Host) inflight() int64 {
	var n int64
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.RLock()
		for _, a := range s.m {
			n += a.inflight.Load()
		}
		s.mu.RUnlock()
	}
	return n
}

// RequestAsync is Request without a goroutine waiting for the reply: it
// sends msg to object id, activating it if needed, and done takes the reply,
// once, on the goroutine that has it (this one, when the object answers at
// once or id cannot be reached; the commit pipeline's, once a write is
// durable). done must not block. There is no timeout: the caller keeps its
// own. Unlike Request, it never runs a commit itself (Pipeline.Kick, not
// Help): it does not block, so a connection's reader may call it (the
// cluster transport starts requests from other nodes there; with Help the
// reader ran the group commits itself, one fsync after another, 0.08x-0.12x
// of the forward's throughput).
//
// Why: a request from another node held a goroutine from its arrival until
// its write was durable, and waking it again cost a scheduling round; with
// 64 writers forwarded through another node, those goroutines were most of
// the runnable ones (go tool trace -pprof=sched of bench -case
// cluster-latency).
func (h *Host) RequestAsync(id ObjectID, msg any, done func(val any, err error)) {
	if h.refuses(msg) {
		done(nil, errOverBudget())
		return
	}
	act, err := h.acquire(id)
	if err != nil {
		done(nil, err)
		return
	}
	h.send(act, &envelope{msg: msg, done: done, act: act}, false)
}

// StartsAtOnce reports whether a request for id may be started with
// RequestAsync on a goroutine that must not block for long (the cluster
// transport's connection reader, which also answers the liveness probes of the
// calls on its connection): under the synchronized dispatcher the sender runs
// the object's turns when its mailbox is idle. True when the object is active
// and past its first turn (which waits for its partition's acknowledged writes
// to reach Badger: under a replicated partition's backlog that took over a
// second, and the probe failed the connection with every call on it), and of a
// built-in type (a user type's handler may block). An object passivated after
// the check activates on the sender after all; it was idle for IdleTimeout, so
// its partition's backlog is the only wait.
func (h *Host) StartsAtOnce(id ObjectID) bool {
	if h.types[id.Type] != nil {
		return false
	}
	s := h.shard(id)
	s.mu.RLock()
	a := s.m[id]
	s.mu.RUnlock()
	return a != nil && a.ready.Load()
}

// Active returns the number of active objects.
func (h *Host) Active() int {
	n := 0
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.RLock()
		n += len(s.m)
		s.mu.RUnlock()
	}
	return n
}

func (h *Host) shard(id ObjectID) *hostShard {
	d := xxhash.New()
	_, _ = d.WriteString(id.App)
	_, _ = d.WriteString(id.Type)
	_, _ = d.WriteString(id.Key)
	return &h.shards[d.Sum64()%uint64(len(h.shards))]
}

// Request sends msg to object id, activating it if needed, and waits for its
// reply or for ctx. A reply is only sent once every write before it is durable.
func (h *Host) Request(ctx context.Context, id ObjectID, msg any) (any, error) {
	if h.refuses(msg) {
		return nil, errOverBudget()
	}
	act, err := h.acquire(id)
	if err != nil {
		return nil, err
	}
	env := &envelope{msg: msg, reply: make(chan result, 1), act: act}
	h.send(act, env, true)
	if ctx.Done() == nil { // a context that never ends: no select to pay for
		r := <-env.reply
		return r.val, r.err
	}
	select {
	case r := <-env.reply:
		return r.val, r.err
	case <-ctx.Done():
		return nil, TimedOut(ctx.Err())
	}
}

// acquire returns id's activation with the request counted in its inflight. It
// checks id's name (ValidateID) before it activates an object: an active one
// passed that check.
func (h *Host) acquire(id ObjectID) (*activation, error) {
	if h.closing.Load() {
		return nil, &Error{Kind: KindUnavailable, Msg: "the node is shutting down", RetryAfter: time.Second}
	}
	if err := h.pipe.Failed(); err != nil {
		// Fail closed: Badger may show writes whose sync failed.
		return nil, unavailable("the node's storage failed; it must restart", err)
	}
	p := persistence.Partition(id, h.db.Partitions())
	epoch := h.epoch(p)
	if epoch == 0 {
		return nil, &Error{Kind: KindUnavailable, Code: CodeNotServed, Msg: fmt.Sprintf("partition %d is not served by this node now", p), RetryAfter: 100 * time.Millisecond}
	}
	s := h.shard(id)
	s.mu.RLock()
	a := s.m[id]
	if a != nil {
		n := a.inflight.Add(1)
		a.unrun.Add(1)
		s.mu.RUnlock()
		return h.admit(a, n)
	}
	s.mu.RUnlock()
	if err := ValidateID(id); err != nil {
		return nil, err
	}
	if h.refusesActivation() {
		return nil, errOverBudget()
	}
	s.mu.Lock()
	if a = s.m[id]; a == nil {
		a = &activation{id: id, epoch: epoch, chain: &persistence.Chain{}}
		if c := s.landing[id]; c != nil {
			if c.Landed() {
				delete(s.landing, id)
			} else {
				a.landing = c
			}
		}
		a.pid = h.system.Root.Spawn(h.props)
		// The activation is the actor's first message: nothing can reach the new
		// actor before it, since the shard lock is held until it is sent.
		h.send(a, a, false) // init queues no write
		if pred := s.draining[id]; pred != nil {
			// A retired activation may still hand requests over: they run
			// before this one's own (gate.go).
			pred.gate.succ = a
			a.gated.Store(true)
		}
		s.m[id] = a
		if s.routed != nil {
			s.routed(id, true)
		}
		s.peak = max(s.peak, len(s.m))
	}
	n := a.inflight.Add(1)
	a.unrun.Add(1)
	s.mu.Unlock()
	return h.admit(a, n)
}

// admit applies the admission limit to a request counted as the n-th in flight.
func (h *Host) admit(a *activation, n int64) (*activation, error) {
	if n > h.cfg.MaxInflightPerObject {
		a.inflight.Add(-1)
		h.ran(a)
		return nil, &Error{Kind: KindOverloaded, Msg: "the object has too many requests in flight", RetryAfter: 100 * time.Millisecond}
	}
	a.lastUsed.Store(time.Now().UnixNano())
	return a, nil
}

// release removes a from the routing table if nothing is in flight; the caller
// (a's actor) then stops. Returns false if a request arrived meanwhile.
func (h *Host) release(a *activation) bool {
	s := h.shard(a.id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.inflight.Load() != 0 {
		return false
	}
	s.remove(a)
	return true
}

// forget removes a broken activation from the routing table at once, so that the
// next request activates a fresh copy from disk.
func (h *Host) forget(a *activation) {
	s := h.shard(a.id)
	s.mu.Lock()
	s.remove(a)
	s.mu.Unlock()
}

// DropPartition retires every activation of partition p: call it once p is no
// longer served under the epoch they were activated at (Config.Epoch already
// says so). Requests that reached them are not run there: they go to fresh
// activations if p is served again by then, else get 503 (not served); new
// requests activate afresh.
func (h *Host) DropPartition(p uint32) {
	n := h.db.Partitions()
	var drop []*activation
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		for _, a := range s.m {
			if persistence.Partition(a.id, n) == p {
				s.remove(a)
				drop = append(drop, a)
			}
		}
		s.mu.Unlock()
	}
	for _, a := range drop {
		h.send(a, dropPartition{}, false)
	}
}

func (h *Host) typeOptions(typ string) TypeOptions {
	opts := DefaultTypeOptions()
	if h.cfg.TypeOptions != nil {
		opts = h.cfg.TypeOptions(typ)
	}
	if opts.ChangeLogEntries < 1 {
		opts.ChangeLogEntries = 1
	}
	return opts
}

func (h *Host) dataLosses(partition uint32) uint64 {
	if h.cfg.DataLosses == nil {
		return 0
	}
	return h.cfg.DataLosses(partition)
}

func (h *Host) epoch(partition uint32) uint64 {
	if h.cfg.Epoch == nil {
		return 1
	}
	return h.cfg.Epoch(partition)
}
