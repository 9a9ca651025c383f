package alarms

import (
	"container/heap"
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/persistence"
)

// Config configures a Scheduler.
type Config struct {
	// DB holds the alarm index. Required.
	DB *persistence.DB
	// WaitApplied, if set, waits until Badger shows every write acknowledged
	// before the call (persistence.Pipeline.WaitApplied). The scheduler calls it
	// before reading the index, so that an entry made durable before the read is
	// never missed while its notification was dropped as "beyond the horizon".
	WaitApplied func(context.Context) error
	// Fire wakes the object of d. It runs on one of the scheduler's workers and
	// must not block for long. An error (overloaded, node closing) wakes it again
	// after RetryFire.
	Fire func(d Due) error
	// Partitions returns the partitions whose alarms this node fires. Nil means
	// every partition of DB.
	Partitions func() []uint32
	// Window is how far ahead of now the scheduler loads the index. Zero means 30s.
	Window time.Duration
	// MaxResident bounds the index entries held in memory. When more fall due
	// within Window, the horizon shrinks to what fits (entries due in the same
	// millisecond are never split). Zero means 100,000.
	MaxResident int
	// Workers is the number of goroutines that call Fire. Zero means 32: a wake-up
	// that activates an object waits for the applier (see Pipeline.WaitApplied) on
	// its worker, so few workers would serialize activations.
	Workers int
	// RetryFire is the wait before waking an object again after Fire failed. Zero
	// means 1s.
	RetryFire time.Duration
	// Logger is the scheduler's logger. Nil means slog.Default().
	Logger *slog.Logger

	now func() time.Time // clock; tests replace it
}

// Scheduler is the node's one alarm scheduler. One goroutine owns its state: a
// min-heap of the index entries due at or before the horizon. Notify, Kick and
// the Stats calls may be used from any goroutine.
type Scheduler struct {
	cfg Config
	log *slog.Logger

	mu    sync.Mutex
	inbox []inboxItem
	reset bool
	wake  chan struct{}

	stop  chan struct{}
	fires chan Due
	wg    sync.WaitGroup

	// Owned by the loop goroutine.
	heap        dueHeap
	horizon     int64 // every index entry due at or before it is resident (or fired)
	refillAfter time.Time

	resident, fired, refills, loaded atomic.Int64
	started, closed                  atomic.Bool
	ready                            chan struct{} // closed after the first refill
}

type inboxItem struct {
	d     Due
	force bool // push even if beyond the horizon (a retried wake-up)
}

// NewScheduler returns a scheduler; Start starts it.
func NewScheduler(cfg Config) *Scheduler {
	if cfg.Window <= 0 {
		cfg.Window = 30 * time.Second
	}
	if cfg.MaxResident <= 0 {
		cfg.MaxResident = 100_000
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 32
	}
	if cfg.RetryFire <= 0 {
		cfg.RetryFire = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	return &Scheduler{
		cfg: cfg, log: cfg.Logger.With("component", "alarms"),
		wake: make(chan struct{}, 1), stop: make(chan struct{}),
		fires: make(chan Due, 1024), horizon: math.MinInt64, ready: make(chan struct{}),
	}
}

// SetClock replaces the scheduler's clock; call it before Start. With a clock
// that does not follow real time, call Kick after moving it.
func (s *Scheduler) SetClock(now func() time.Time) { s.cfg.now = now }

// Start starts the scheduler's goroutine and its workers. Its first act is to
// load what is due, so alarms that fell due while the node was down fire now.
func (s *Scheduler) Start() {
	s.started.Store(true)
	s.wg.Add(1 + s.cfg.Workers)
	go s.loop()
	for range s.cfg.Workers {
		go s.worker()
	}
}

// Close stops the scheduler and waits for its goroutines. Alarms it did not fire
// stay in the index.
func (s *Scheduler) Close() {
	if !s.started.Load() || s.closed.Swap(true) {
		return
	}
	close(s.stop)
	s.wg.Wait()
}

// Ready is closed once the scheduler loaded the index for the first time.
func (s *Scheduler) Ready() <-chan struct{} { return s.ready }

// Notify tells the scheduler about an index entry that was just made durable.
// Call it only after the commit that wrote the entry is durable. It never blocks.
func (s *Scheduler) Notify(d Due) { s.post(inboxItem{d: d}) }

// Kick wakes the scheduler to look at its clock again.
func (s *Scheduler) Kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Reset drops everything resident and reloads the index from disk, for when the
// set of partitions changed.
func (s *Scheduler) Reset() {
	s.mu.Lock()
	s.reset = true
	s.mu.Unlock()
	s.Kick()
}

func (s *Scheduler) post(it inboxItem) {
	s.mu.Lock()
	s.inbox = append(s.inbox, it)
	s.mu.Unlock()
	s.Kick()
}

// Stats are the scheduler's counters.
type Stats struct {
	Resident int64 // index entries held in memory
	Fired    int64 // wake-ups handed to Fire
	Refills  int64 // index loads
	Loaded   int64 // index entries loaded from disk
}

// Stats returns the scheduler's counters.
func (s *Scheduler) Stats() Stats {
	return Stats{Resident: s.resident.Load(), Fired: s.fired.Load(), Refills: s.refills.Load(), Loaded: s.loaded.Load()}
}

func (s *Scheduler) nowMs() int64 { return s.cfg.now().UnixMilli() }

// reloadAt is when the next load of the index is due: at once before the first,
// else a quarter of the window before the horizon while at most half of
// MaxResident is resident, and at the horizon otherwise (everything resident is
// due by then, so it will have fired).
func (s *Scheduler) reloadAt() int64 {
	switch {
	case s.horizon == math.MinInt64:
		return math.MinInt64
	case len(s.heap) >= s.cfg.MaxResident/2:
		return s.horizon
	}
	return s.horizon - max(s.cfg.Window.Milliseconds()/4, 1)
}

func (s *Scheduler) loop() {
	defer s.wg.Done()
	defer close(s.fires)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.takeInbox()
		now := s.cfg.now()
		nowMs := now.UnixMilli()
		if nowMs >= s.reloadAt() && !now.Before(s.refillAfter) {
			s.refill(nowMs)
			s.takeInbox()
		}
		for len(s.heap) > 0 && s.heap[0].At <= nowMs {
			d := heap.Pop(&s.heap).(Due)
			s.resident.Store(int64(len(s.heap)))
			select {
			case s.fires <- d:
				s.fired.Add(1)
			case <-s.stop:
				return
			}
		}
		next := max(s.reloadAt(), nowMs) // after a failed load: refillAfter below
		if r := s.refillAfter.Sub(now); r > 0 && next <= nowMs {
			next = s.refillAfter.UnixMilli()
		}
		if len(s.heap) > 0 {
			next = min(next, s.heap[0].At)
		}
		wait := min(time.UnixMilli(next).Sub(now), time.Hour)
		timer.Reset(max(wait, 0))
		select {
		case <-s.stop:
			return
		case <-s.wake:
		case <-timer.C:
		}
	}
}

// takeInbox moves notified entries due within the horizon into the heap.
func (s *Scheduler) takeInbox() {
	s.mu.Lock()
	items, reset := s.inbox, s.reset
	s.inbox, s.reset = nil, false
	s.mu.Unlock()
	if reset {
		s.heap = s.heap[:0]
		s.horizon = math.MinInt64
		s.refillAfter = time.Time{}
	}
	for _, it := range items {
		switch {
		case it.force:
			heap.Push(&s.heap, it.d)
		case it.d.At > s.horizon:
			// On disk; loaded when the horizon gets there.
		case len(s.heap) >= s.cfg.MaxResident:
			// Full: pull the horizon in front of it instead, so the next load
			// reads it from disk. Entries resident beyond the new horizon may be
			// loaded twice; the object ignores the second wake-up.
			s.horizon = it.d.At - 1
		default:
			heap.Push(&s.heap, it.d)
		}
	}
	s.resident.Store(int64(len(s.heap)))
}

// refill loads the index entries due in (horizon, now+Window] of every partition
// this node fires, in due order across partitions, until about MaxResident are
// in memory, and moves the horizon to the last due time loaded completely
// (entries due in one millisecond are never split).
func (s *Scheduler) refill(now int64) {
	if s.cfg.WaitApplied != nil {
		if err := s.cfg.WaitApplied(context.Background()); err != nil {
			return // the pipeline stopped: nothing can fire
		}
	}
	limit := now + s.cfg.Window.Milliseconds()
	budget := max(s.cfg.MaxResident-len(s.heap), 1)
	parts := s.partitions()
	ranges := make([]persistence.Range, len(parts))
	for i, p := range parts {
		ranges[i] = persistence.Range{Prefix: persistence.PartitionIndexPrefix(p, IndexKind), Start: atKey(p, s.horizon+1), End: atKey(p, limit+1)}
	}
	n, last := 0, int64(math.MinInt64)
	err := s.cfg.DB.ScanMerged(context.Background(), ranges, func(i int, k, v []byte) (bool, error) {
		d, err := DecodeIndex(parts[i], k, v)
		if err != nil {
			s.log.Error("skipping a malformed alarm index entry", "partition", parts[i], "key", fmt.Sprintf("%x", k))
			return true, nil
		}
		if n >= budget && d.At != last {
			limit = last // everything due at or before last is loaded
			return false, nil
		}
		heap.Push(&s.heap, d)
		n++
		last = d.At
		return true, nil
	})
	if err != nil {
		s.log.Error("cannot read the alarm index; retrying in 1s", "err", err)
		s.refillAfter = s.cfg.now().Add(time.Second)
		// What was pushed is due before the old limit's entries that were not
		// read; the horizon stays, so they are read (again) next time. A repeat
		// wake-up is harmless.
		return
	}
	s.horizon = limit
	s.resident.Store(int64(len(s.heap)))
	s.refills.Add(1)
	s.loaded.Add(int64(n))
	if s.refills.Load() == 1 {
		close(s.ready)
	}
}

func (s *Scheduler) partitions() []uint32 {
	if s.cfg.Partitions != nil {
		return s.cfg.Partitions()
	}
	ps := make([]uint32, s.cfg.DB.Partitions())
	for i := range ps {
		ps[i] = uint32(i)
	}
	return ps
}

func (s *Scheduler) worker() {
	defer s.wg.Done()
	for d := range s.fires {
		if err := s.cfg.Fire(d); err != nil {
			if s.closed.Load() {
				continue
			}
			s.log.Debug("cannot wake an object for its alarm; retrying", "object", d.ID.String(), "alarm", d.Name, "err", err)
			s.Retry(d)
		}
	}
}

// dueHeap is a min-heap of entries by due time.
type dueHeap []Due

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].At < h[j].At }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(Due)) }
func (h *dueHeap) Pop() any {
	old := *h
	d := old[len(old)-1]
	old[len(old)-1] = Due{}
	*h = old[:len(old)-1]
	return d
}

// Retry wakes d's object again after RetryFire: it could not handle the wake-up.
func (s *Scheduler) Retry(d Due) {
	d.At = s.nowMs() + s.cfg.RetryFire.Milliseconds()
	s.post(inboxItem{d: d, force: true})
}
