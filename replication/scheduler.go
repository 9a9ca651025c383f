package replication

import "sync"

// Work flags: why a group is queued. A worker takes all of a group's flags
// (and queued ticks) at once.
const (
	flagTick    uint8 = 1 << iota // the ticker marked it: Tick the RawNode
	flagMessage                   // its inbox has messages (network or storage responses)
	flagPropose                   // its proposal buffer is not empty
)

// schedState is a group's place in the scheduler, guarded by scheduler.mu.
// A group is in at most one of: idle, queued (in the queue), running (a worker
// holds it). Work that arrives while it runs sets flags; the worker re-queues
// it when it finishes, so a group is never processed by two workers at once
// and never misses work (Cockroach's raftScheduler, stateQueued).
type schedState struct {
	flags   uint8
	ticks   int
	queued  bool
	running bool
}

// scheduler is a de-duplicated FIFO of ready groups served by a fixed pool of
// workers (started and stopped by the Engine).
type scheduler struct {
	mu       sync.Mutex
	cond     sync.Cond
	queue    []*group // FIFO; head at queue[head]
	head     int
	closed   bool
	maxTicks int
}

func newScheduler(maxTicks int) *scheduler {
	s := &scheduler{maxTicks: maxTicks}
	s.cond.L = &s.mu
	return s
}

// enqueue marks g with flags and queues it unless it is queued or running.
func (s *scheduler) enqueue(g *group, flags uint8) {
	s.mu.Lock()
	s.enqueueLocked(g, flags)
	s.mu.Unlock()
}

func (s *scheduler) enqueueLocked(g *group, flags uint8) {
	st := &g.sched
	st.flags |= flags
	if flags&flagTick != 0 && st.ticks < s.maxTicks {
		st.ticks++
	}
	if st.queued || st.running || s.closed {
		return
	}
	st.queued = true
	s.queue = append(s.queue, g)
	s.cond.Signal()
}

// tickAll marks every group in gs for a tick, under one lock.
func (s *scheduler) tickAll(gs []*group) {
	s.mu.Lock()
	for _, g := range gs {
		s.enqueueLocked(g, flagTick)
	}
	s.mu.Unlock()
}

// next blocks until a group is queued (and returns it marked running, with
// its flags and ticks taken) or the scheduler closes (nil).
func (s *scheduler) next() (g *group, flags uint8, ticks int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.head == len(s.queue) && !s.closed {
		s.cond.Wait()
	}
	if s.closed {
		return nil, 0, 0
	}
	g = s.queue[s.head]
	s.queue[s.head] = nil
	s.head++
	if s.head == len(s.queue) { // drained: reuse the backing array
		s.queue, s.head = s.queue[:0], 0
	}
	st := &g.sched
	st.queued, st.running = false, true
	flags, ticks = st.flags, st.ticks
	st.flags, st.ticks = 0, 0
	return g, flags, ticks
}

// done ends a worker's hold on g; work that arrived meanwhile re-queues it.
func (s *scheduler) done(g *group) {
	s.mu.Lock()
	st := &g.sched
	st.running = false
	if st.flags != 0 && !s.closed {
		st.queued = true
		s.queue = append(s.queue, g)
		s.cond.Signal()
	}
	s.mu.Unlock()
}

// close wakes every worker; next returns nil from now on.
func (s *scheduler) close() {
	s.mu.Lock()
	s.closed = true
	s.cond.Broadcast()
	s.mu.Unlock()
}
