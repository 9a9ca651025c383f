package alarms

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/persistence"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

type env struct {
	db   *persistence.DB
	pipe *persistence.Pipeline
}

func newEnv(t *testing.T, dir string) *env {
	t.Helper()
	db, err := persistence.Open(persistence.Config{Dir: dir, Partitions: 16})
	if err != nil {
		t.Fatal(err)
	}
	p := persistence.NewPipeline(db, persistence.PipelineConfig{})
	p.Start()
	e := &env{db: db, pipe: p}
	t.Cleanup(e.close)
	return e
}

func (e *env) close() {
	if e.pipe != nil {
		e.pipe.Close()
		_ = e.db.Close()
		e.pipe = nil
	}
}

func id(i int) persistence.ObjectID {
	return persistence.ObjectID{App: "app", Type: "t", Key: fmt.Sprintf("k%d", i)}
}

// put writes index entries durably and waits until Badger shows them.
func (e *env) put(t *testing.T, ds ...Due) {
	t.Helper()
	w := &persistence.Write{}
	for _, d := range ds {
		w.Sets = append(w.Sets, persistence.KV{Key: IndexKey(d.Partition, d.At, d.ID, d.Name), Value: IndexValue(d.Gen)})
	}
	if err := e.pipe.Submit(w).Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.pipe.WaitApplied(context.Background())
}

func due(i int, at int64) Due {
	d := Due{At: at, ID: id(i), Name: fmt.Sprintf("n%d", i), Gen: uint64(i + 1)}
	d.Partition = persistence.Partition(d.ID, 16)
	return d
}

// recorder is a Fire that records each wake-up with the time it saw.
type recorder struct {
	mu    sync.Mutex
	got   []Due
	at    []time.Time
	clock func() time.Time
	fail  atomic.Int32 // fail this many calls first
}

func (r *recorder) fire(d Due) error {
	if r.fail.Load() > 0 && r.fail.Add(-1) >= 0 {
		return errors.New("overloaded")
	}
	r.mu.Lock()
	r.got = append(r.got, d)
	r.at = append(r.at, r.clock())
	r.mu.Unlock()
	return nil
}

func (r *recorder) count() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.got) }

func (r *recorder) waitFor(t *testing.T, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for r.count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d wake-ups after %v, want %d", r.count(), within, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func start(t *testing.T, cfg Config) *Scheduler {
	t.Helper()
	s := NewScheduler(cfg)
	if cfg.now != nil {
		s.SetClock(cfg.now)
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func TestIndexKey_RoundTripAndOrder(t *testing.T) {
	d := Due{At: 1_700_000_000_123, Partition: 7, ID: persistence.ObjectID{App: "a", Type: "ty", Key: "k/ü"}, Name: "name:x", Gen: 42}
	got, err := DecodeIndex(7, IndexKey(7, d.At, d.ID, d.Name), IndexValue(d.Gen))
	if err != nil || got != d {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if string(IndexKey(7, -5, d.ID, "z")) >= string(IndexKey(7, 0, d.ID, "a")) ||
		string(IndexKey(7, 999, d.ID, "z")) >= string(IndexKey(7, 1000, d.ID, "a")) {
		t.Fatal("index keys do not sort by due time")
	}
	for _, bad := range [][]byte{nil, IndexKey(7, 1, d.ID, "")[:20], append(atKey(7, 1), 0, 9, 'x')} {
		if _, err := DecodeIndex(7, bad, IndexValue(1)); err == nil {
			t.Fatalf("malformed key %x decoded", bad)
		}
	}
}

func TestIdempotencyKey_StablePerOccurrence(t *testing.T) {
	a := IdempotencyKey(id(1), "x", 3)
	if a != IdempotencyKey(id(1), "x", 3) {
		t.Fatal("not stable")
	}
	for _, other := range []string{IdempotencyKey(id(1), "x", 4), IdempotencyKey(id(2), "x", 3), IdempotencyKey(id(1), "y", 3),
		IdempotencyKey(persistence.ObjectID{App: "app", Type: "t", Key: "k1x"}, "", 3)} {
		if other == a {
			t.Fatal("two occurrences share a key")
		}
	}
}

func TestBackoff_DoublesFromOneSecondToFiveMinutesWithJitter(t *testing.T) {
	for f, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 9: 256 * time.Second, 10: 5 * time.Minute, 100: 5 * time.Minute} {
		if got := Backoff(f, 0); got != want {
			t.Errorf("Backoff(%d, 0) = %v, want %v", f, got, want)
		}
		if got := Backoff(f, 0.999); got < want*8/10 || got >= want {
			t.Errorf("Backoff(%d, ~1) = %v, want in [%v, %v)", f, got, want*8/10, want)
		}
	}
}

// Real time: the scheduler's own wake-up fires entries at or after their time,
// never before, and soon after.
func TestScheduler_FiresAtOrAfterDueNeverBefore(t *testing.T) {
	e := newEnv(t, t.TempDir())
	rec := &recorder{clock: time.Now}
	now := time.Now().UnixMilli()
	var ds []Due
	for i := range 20 {
		ds = append(ds, due(i, now+int64(30+10*i)))
	}
	e.put(t, ds...)
	start(t, Config{DB: e.db, WaitApplied: e.pipe.WaitApplied, Fire: rec.fire})
	rec.waitFor(t, len(ds), 5*time.Second)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for i, d := range rec.got {
		if rec.at[i].UnixMilli() < d.At {
			t.Fatalf("%s fired at %d, due %d: early", d.Name, rec.at[i].UnixMilli(), d.At)
		}
		if late := rec.at[i].Sub(time.UnixMilli(d.At)); late > time.Second {
			t.Errorf("%s fired %v late", d.Name, late)
		}
	}
}

// Entries that fell due while no scheduler ran (the node was down) fire as soon
// as it starts, oldest first.
func TestScheduler_FiresWhatFellDueWhileDown(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, dir)
	now := time.Now().UnixMilli()
	var ds []Due
	for i := range 50 {
		ds = append(ds, due(i, now-int64(1000*(50-i))))
	}
	e.put(t, ds...)
	e.close()
	e = newEnv(t, dir) // a restart
	rec := &recorder{clock: time.Now}
	s := start(t, Config{DB: e.db, WaitApplied: e.pipe.WaitApplied, Fire: rec.fire, Workers: 1})
	<-s.Ready()
	rec.waitFor(t, 50, 5*time.Second)
	for i, d := range rec.got {
		if d != ds[i] {
			t.Fatalf("wake-up %d: %+v, want %+v (oldest first)", i, d, ds[i])
		}
	}
}

// Only the near future is resident: with 5,000 entries over 50 minutes and room
// for 100, the heap never holds more than 100 (plus one millisecond that holds
// 300 and is loaded whole), and moving the clock across the
// whole range fires every entry exactly once.
func TestScheduler_KeepsOnlyTheNearFutureResident(t *testing.T) {
	e := newEnv(t, t.TempDir())
	base := time.UnixMilli(1_800_000_000_000)
	clock := &fakeClock{t: base}
	const n = 5000
	rng := rand.New(rand.NewPCG(1, 2))
	var ds []Due
	for i := range n {
		ds = append(ds, due(i, base.UnixMilli()+rng.Int64N(50*60*1000)))
	}
	ds = append(ds, due(n, base.UnixMilli()+60*1000)) // 300 in one millisecond: never split
	for i := range 299 {
		ds = append(ds, due(n+1+i, base.UnixMilli()+60*1000))
	}
	for i := 0; i < len(ds); i += 500 {
		e.put(t, ds[i:min(i+500, len(ds))]...)
	}
	rec := &recorder{clock: clock.Now}
	s := start(t, Config{DB: e.db, WaitApplied: e.pipe.WaitApplied, Fire: rec.fire, MaxResident: 100, Window: 10 * time.Minute, now: clock.Now})
	<-s.Ready()
	maxResident := int64(0)
	for step := time.Duration(0); step <= 51*time.Minute; step += 5 * time.Second {
		clock.Set(base.Add(step))
		s.Kick()
		// Wait until the scheduler fired what is due at this time.
		wantFired := 0
		for _, d := range ds {
			if d.At <= clock.Now().UnixMilli() {
				wantFired++
			}
		}
		rec.waitFor(t, wantFired, 5*time.Second)
		maxResident = max(maxResident, s.Stats().Resident)
	}
	// At most MaxResident, plus the rest of a millisecond that is never split.
	if maxResident > 100+299 {
		t.Fatalf("%d entries resident, want at most 399", maxResident)
	}
	seen := map[string]int{}
	for i, d := range rec.got {
		seen[d.Name]++
		if rec.at[i].UnixMilli() < d.At {
			t.Fatalf("%s fired early", d.Name)
		}
	}
	if len(seen) != len(ds) {
		t.Fatalf("%d distinct alarms fired, want %d", len(seen), len(ds))
	}
	for name, c := range seen {
		if c != 1 {
			t.Fatalf("%s fired %d times", name, c)
		}
	}
	if st := s.Stats(); st.Refills < 10 {
		t.Fatalf("%d loads of the index; the horizon did not move in steps", st.Refills)
	}
}

// A notified entry within the horizon fires without a reload; one beyond it is
// loaded from disk when the horizon gets there.
func TestScheduler_NotifiedAndLaterEntries(t *testing.T) {
	e := newEnv(t, t.TempDir())
	base := time.UnixMilli(1_800_000_000_000)
	clock := &fakeClock{t: base}
	rec := &recorder{clock: clock.Now}
	s := start(t, Config{DB: e.db, WaitApplied: e.pipe.WaitApplied, Fire: rec.fire, Window: time.Minute, now: clock.Now})
	<-s.Ready()
	near, far := due(1, base.UnixMilli()+10_000), due(2, base.UnixMilli()+10*60_000)
	e.put(t, near, far)
	s.Notify(near)
	s.Notify(far) // beyond the horizon: dropped now, found on disk later
	clock.Set(base.Add(10 * time.Second))
	s.Kick()
	rec.waitFor(t, 1, 5*time.Second)
	if rec.got[0] != near {
		t.Fatalf("fired %+v", rec.got[0])
	}
	if r := s.Stats().Resident; r != 0 {
		t.Fatalf("%d resident after the near one fired", r)
	}
	for step := time.Minute; step <= 10*time.Minute; step += 20 * time.Second {
		clock.Set(base.Add(step))
		s.Kick()
		time.Sleep(2 * time.Millisecond)
	}
	rec.waitFor(t, 2, 5*time.Second)
	if rec.got[1] != far {
		t.Fatalf("fired %+v", rec.got[1])
	}
}

// A failed wake-up (the object was overloaded) is retried after RetryFire.
func TestScheduler_RetriesAFailedWakeUp(t *testing.T) {
	e := newEnv(t, t.TempDir())
	rec := &recorder{clock: time.Now}
	rec.fail.Store(2)
	d := due(1, time.Now().UnixMilli())
	e.put(t, d)
	start(t, Config{DB: e.db, WaitApplied: e.pipe.WaitApplied, Fire: rec.fire, RetryFire: 20 * time.Millisecond})
	rec.waitFor(t, 1, 5*time.Second)
	if rec.got[0].Name != d.Name || rec.got[0].Gen != d.Gen {
		t.Fatalf("fired %+v", rec.got[0])
	}
}

// Only the partitions the node fires are loaded; Reset reloads after the set
// changed.
func TestScheduler_OnlyItsPartitionsAndReset(t *testing.T) {
	e := newEnv(t, t.TempDir())
	var mine, theirs Due
	for i := 0; mine.Name == "" || theirs.Name == ""; i++ {
		d := due(i, time.Now().UnixMilli()-1000)
		if d.Partition == 3 {
			mine = d
		} else if theirs.Name == "" {
			theirs = d
		}
	}
	e.put(t, mine, theirs)
	var owned atomic.Value
	owned.Store([]uint32{3})
	rec := &recorder{clock: time.Now}
	s := start(t, Config{DB: e.db, WaitApplied: e.pipe.WaitApplied, Fire: rec.fire, Partitions: func() []uint32 { return owned.Load().([]uint32) }})
	rec.waitFor(t, 1, 5*time.Second)
	time.Sleep(50 * time.Millisecond)
	if rec.count() != 1 || rec.got[0] != mine {
		t.Fatalf("fired %+v, want only partition 3's", rec.got)
	}
	owned.Store([]uint32{theirs.Partition})
	s.Reset()
	rec.waitFor(t, 2, 5*time.Second)
	if rec.got[1] != theirs {
		t.Fatalf("after the reset fired %+v", rec.got[1])
	}
}

// Notifications respect MaxResident too: many alarms set for the near future
// are not all held in memory, and every one still fires.
func TestScheduler_NotificationsStayWithinMaxResident(t *testing.T) {
	e := newEnv(t, t.TempDir())
	base := time.UnixMilli(1_800_000_000_000)
	clock := &fakeClock{t: base}
	rec := &recorder{clock: clock.Now}
	s := start(t, Config{DB: e.db, WaitApplied: e.pipe.WaitApplied, Fire: rec.fire, MaxResident: 20, Window: time.Hour, now: clock.Now})
	<-s.Ready()
	var ds []Due
	for i := range 500 {
		ds = append(ds, due(i, base.UnixMilli()+int64(1000+i*10)))
	}
	e.put(t, ds...)
	for _, d := range ds {
		s.Notify(d)
	}
	maxResident := int64(0)
	fired := map[string]bool{}
	for step := time.Second; step <= 7*time.Second; step += 100 * time.Millisecond {
		clock.Set(base.Add(step))
		s.Kick()
		want := 0
		for _, d := range ds {
			if d.At <= clock.Now().UnixMilli() {
				want++
			}
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			rec.mu.Lock()
			for _, d := range rec.got {
				fired[d.Name] = true
			}
			rec.mu.Unlock()
			if len(fired) >= want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("at +%v: %d fired, want %d", step, len(fired), want)
			}
			time.Sleep(time.Millisecond)
		}
		maxResident = max(maxResident, s.Stats().Resident)
	}
	if len(fired) != len(ds) {
		t.Fatalf("%d of %d fired", len(fired), len(ds))
	}
	if maxResident > 40 { // MaxResident plus what one load may add before the next notification
		t.Fatalf("%d resident, MaxResident 20", maxResident)
	}
}
