package actors

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/alarms"
	"github.com/holdfast/holdfast/cold"
	"github.com/holdfast/holdfast/persistence"
)

// testClock is a clock the test moves by hand.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock() *testClock { return &testClock{t: time.UnixMilli(1_800_000_000_000)} }

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *testClock) Add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

// The alarmer type: Go alarm handlers whose behaviour the test sets, and
// messages that schedule alarms inside a turn.
type alarmer struct {
	mu     sync.Mutex
	calls  []AlarmCall
	at     []time.Time // the host clock at each call
	clock  func() time.Time
	behave func(c *Context, a AlarmCall) error
}

type (
	setInTurn struct {
		Name, Put string
		At        time.Time
		Fail      bool
		Panic     bool
	}
	readKey   struct{ Key string }
	turnMixed struct{ At time.Time } // sets tick and tock, deletes tock, lists
)

func (a *alarmer) handler(c *Context, call AlarmCall) error {
	a.mu.Lock()
	a.calls = append(a.calls, call)
	a.at = append(a.at, a.clock())
	behave := a.behave
	a.mu.Unlock()
	if behave != nil {
		return behave(c, call)
	}
	return nil
}

func (a *alarmer) count() int { a.mu.Lock(); defer a.mu.Unlock(); return len(a.calls) }

func (a *alarmer) call(i int) AlarmCall { a.mu.Lock(); defer a.mu.Unlock(); return a.calls[i] }

func (a *alarmer) spec() TypeSpec {
	return TypeSpec{Name: "alarmer", Alarms: map[string]AlarmHandler{"tick": a.handler, "tock": a.handler},
		Handle: func(c *Context, msg any) (any, error) {
			switch m := msg.(type) {
			case setInTurn:
				if m.Put != "" {
					if err := c.Put(m.Put, []byte("1")); err != nil {
						return nil, err
					}
				}
				gen, err := c.SetAlarm(m.Name, m.At, nil)
				if err != nil {
					return nil, err
				}
				if m.Panic {
					panic("handler bug after scheduling")
				}
				if m.Fail {
					return nil, errors.New("refused after scheduling")
				}
				return gen, nil
			case readKey:
				_, found, err := c.Get(m.Key)
				return found, err
			case turnMixed:
				for _, name := range []string{"tick", "tock"} {
					if _, err := c.SetAlarm(name, m.At, nil); err != nil {
						return nil, err
					}
				}
				if ok, err := c.DeleteAlarm("tock"); err != nil || !ok {
					return nil, fmt.Errorf("delete tock: %v %v", ok, err)
				}
				if ok, err := c.DeleteAlarm("never"); err != nil || ok {
					return nil, fmt.Errorf("delete never: %v %v", ok, err)
				}
				if _, found, err := c.GetAlarm("tock"); err != nil || found {
					return nil, fmt.Errorf("tock after delete: %v %v", found, err)
				}
				return c.ListAlarms()
			}
			return nil, fmt.Errorf("unknown message %T", msg)
		}}
}

type alarmNode struct {
	*testNode
	clock *testClock // nil: real time
	a     *alarmer
}

func startAlarmNode(t *testing.T, dir string, clock *testClock, opts func(typ string) TypeOptions, a *alarmer) *alarmNode {
	t.Helper()
	o := nodeOpts{cfg: Config{TypeOptions: opts}}
	if a == nil {
		a = &alarmer{}
	}
	a.clock = time.Now
	if clock != nil {
		o.now, a.clock = clock.Now, clock.Now
	}
	o.types = []TypeSpec{a.spec()}
	return &alarmNode{testNode: startNode(t, dir, o), clock: clock, a: a}
}

func (n *alarmNode) alarms(key string) *Alarms {
	return NewAlarms(n.host, ObjectID{App: "app_t", Type: "alarmer", Key: key})
}

// advance moves the test clock and wakes the scheduler.
func (n *alarmNode) advance(d time.Duration) time.Time {
	now := n.clock.Add(d)
	n.host.sched.Kick()
	return now
}

// indexEntries counts the node's alarm index entries.
func (n *alarmNode) indexEntries(t *testing.T) int {
	t.Helper()
	n.pipe.WaitApplied(context.Background())
	count := 0
	for p := range n.db.Partitions() {
		err := n.db.Scan(context.Background(), persistence.PartitionIndexPrefix(uint32(p), indexAlarms), nil, nil, func(k, v []byte) (bool, error) {
			count++
			return true, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return count
}

func alarmOpts(maxAttempts int) func(string) TypeOptions {
	return func(string) TypeOptions {
		o := DefaultTypeOptions()
		o.Alarms.MaxAttempts = maxAttempts
		return o
	}
}

func TestAlarm_SetGetListDelete(t *testing.T) {
	n := startAlarmNode(t, t.TempDir(), nil, nil, nil)
	ctx := context.Background()
	al := n.alarms("o1")
	later := time.Now().Add(time.Hour)
	s1, err := al.Set(ctx, "tock", later.Add(time.Minute), nil)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := al.Set(ctx, "tick", later, json.RawMessage(` { "kind" : "trim" } `))
	if err != nil {
		t.Fatal(err)
	}
	if s1.Generation == 0 || s2.Generation <= s1.Generation || s2.At != later.UnixMilli() || s2.Name != "tick" {
		t.Fatalf("scheduled %+v then %+v", s1, s2)
	}
	got, err := al.Get(ctx, "tick")
	if err != nil {
		t.Fatal(err)
	}
	want := AlarmInfo{Name: "tick", At: later.UnixMilli(), ScheduledTime: later.UnixMilli(), Action: json.RawMessage(`{"kind":"trim"}`),
		Status: AlarmPending, IdempotencyKey: alarms.IdempotencyKey(ObjectID{App: "app_t", Type: "alarmer", Key: "o1"}, "tick", s2.Generation), Generation: s2.Generation}
	if fmt.Sprint(*got) != fmt.Sprint(want) {
		t.Fatalf("got %+v\nwant %+v", *got, want)
	}
	list, err := al.List(ctx)
	if err != nil || len(list) != 2 || list[0].Name != "tick" || list[1].Name != "tock" {
		t.Fatalf("list (by at) = %+v, %v", list, err)
	}
	if n.indexEntries(t) != 2 {
		t.Fatal("want two index entries")
	}
	if err := al.Delete(ctx, "tick"); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{al.Delete(ctx, "tick"), func() error { _, err := al.Get(ctx, "tick"); return err }()} {
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("after delete: %v, want not found", err)
		}
	}
	if n.indexEntries(t) != 1 {
		t.Fatal("the deleted alarm kept its index entry")
	}
	// Another object's alarms are its own.
	if list, err := n.alarms("o2").List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("o2 list = %+v, %v", list, err)
	}
	// They survive a restart.
	n.stop()
	n = startAlarmNode(t, n.dir, nil, nil, nil)
	if got, err := n.alarms("o1").Get(ctx, "tock"); err != nil || got.Generation != s1.Generation {
		t.Fatalf("after restart: %+v, %v", got, err)
	}
}

func TestAlarm_BadInputs(t *testing.T) {
	n := startAlarmNode(t, t.TempDir(), nil, nil, nil)
	ctx := context.Background()
	at := time.Now().Add(time.Hour)
	trim := json.RawMessage(`{"kind":"trim"}`)
	for _, c := range []struct {
		id     ObjectID
		name   string
		at     time.Time
		action json.RawMessage
		want   error
	}{
		// The rule of every name (checkUserName): not UTF-8 is malformed, the rest refused.
		{name: "", at: at, action: trim, want: ErrInvalid},
		{name: "a/b", at: at, action: trim, want: ErrInvalid},
		{name: strings.Repeat("n", MaxAlarmName+1), at: at, action: trim, want: ErrInvalid},
		{name: "bad\xff", at: at, action: trim, want: ErrBadRequest},
		{name: TrimAlarm, at: at, action: trim, want: ErrInvalid},
		{name: "x", at: time.UnixMilli(-1), action: trim, want: ErrBadRequest},
		{name: "x", at: time.UnixMilli(maxAlarmTime + 1), action: trim, want: ErrBadRequest},
		{name: "x", at: at, action: json.RawMessage(`{"kind":"explode"}`), want: ErrInvalid},
		{name: "x", at: at, action: json.RawMessage(`{"nokind":1}`), want: ErrBadRequest},
		{name: "x", at: at, action: json.RawMessage(`["trim"]`), want: ErrBadRequest},
		{name: "x", at: at, action: json.RawMessage(`{"kind":`), want: ErrBadRequest},
		{name: "x", at: at, action: json.RawMessage(`{"kind":"trim","pad":"` + strings.Repeat("p", MaxAlarmAction) + `"}`), want: ErrTooLarge},
		{name: "x", at: at, action: json.RawMessage(`{"kind":"enqueue","topic":"t"}`), want: ErrBadRequest},
		{name: "x", at: at, action: json.RawMessage(`{"kind":"enqueue","topic":"","payload":1}`), want: ErrInvalid},
		{name: "x", at: at, action: json.RawMessage(`{"kind":"enqueue","payload":1,"extra":2}`), want: ErrBadRequest},
		{name: "nohandler", at: at, action: nil, want: ErrInvalid}, // no action and no Go handler
		{id: ObjectID{App: "app_t", Type: "kvtype", Key: "k"}, name: "tick", at: at, action: nil, want: ErrInvalid},
	} {
		id := c.id
		if id.App == "" {
			id = ObjectID{App: "app_t", Type: "alarmer", Key: "k"}
		}
		if _, err := NewAlarms(n.host, id).Set(ctx, c.name, c.at, c.action); !errors.Is(err, c.want) {
			t.Errorf("set %q at %d action %.40s: %v, want %v", c.name, c.at.UnixMilli(), c.action, err, c.want)
		}
	}
	if n.indexEntries(t) != 0 {
		t.Fatal("a refused alarm left an index entry")
	}
	// A past time is fine: it fires at once.
	if _, err := n.alarms("k").Set(ctx, "tick", time.UnixMilli(0), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the past alarm to fire", func() bool { return n.a.count() == 1 })
}

// Never early: a wake-up before the alarm's time does nothing; the scheduler
// fires it once the clock reaches it.
func TestAlarm_NeverEarly(t *testing.T) {
	clock := newTestClock()
	n := startAlarmNode(t, t.TempDir(), clock, nil, nil)
	ctx := context.Background()
	id := ObjectID{App: "app_t", Type: "alarmer", Key: "k"}
	at := clock.Now().Add(10 * time.Second)
	s, err := NewAlarms(n.host, id).Set(ctx, "tick", at, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.advance(10*time.Second - time.Millisecond)
	// A wake-up one millisecond early (as a stale or hurried scheduler would
	// send) is ignored; the request after it is served after it.
	if err := n.host.post(id, alarmFire{alarms.Due{At: at.UnixMilli(), Partition: persistence.Partition(id, n.db.Partitions()), ID: id, Name: "tick", Gen: s.Generation}}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.alarms("k").Get(ctx, "tick"); err != nil {
		t.Fatal(err)
	}
	if c := n.a.count(); c != 0 {
		t.Fatalf("fired %d times before its time", c)
	}
	n.advance(time.Millisecond)
	waitFor(t, "the alarm", func() bool { return n.a.count() == 1 })
	if n.a.at[0].Before(at) { // the test clock stands still: no race on at
		t.Fatalf("ran at %v, scheduled %v", n.a.at[0], at)
	}
	c := n.a.call(0)
	if c.Name != "tick" || !c.ScheduledTime.Equal(at) || c.Attempt != 0 || c.IdempotencyKey != alarms.IdempotencyKey(id, "tick", s.Generation) {
		t.Fatalf("call %+v", c)
	}
	waitFor(t, "the occurrence to be removed", func() bool {
		_, err := n.alarms("k").Get(ctx, "tick")
		return errors.Is(err, ErrNotFound)
	})
	if n.indexEntries(t) != 0 {
		t.Fatal("index entry left behind")
	}
}

// Scheduling a name again replaces its occurrence: only the replacement fires,
// with a new idempotency key.
func TestAlarm_ReplacementFiresOnceWithANewKey(t *testing.T) {
	clock := newTestClock()
	n := startAlarmNode(t, t.TempDir(), clock, nil, nil)
	ctx := context.Background()
	al := n.alarms("k")
	first, err := al.Set(ctx, "tick", clock.Now().Add(time.Second), nil)
	if err != nil {
		t.Fatal(err)
	}
	second, err := al.Set(ctx, "tick", clock.Now().Add(3*time.Second), nil)
	if err != nil {
		t.Fatal(err)
	}
	if n.indexEntries(t) != 1 {
		t.Fatal("the replaced occurrence kept its index entry")
	}
	n.advance(2 * time.Second)
	if _, err := al.Get(ctx, "tick"); err != nil { // a round trip after the wake-up
		t.Fatal(err)
	}
	n.advance(time.Second)
	waitFor(t, "the replacement", func() bool { return n.a.count() == 1 })
	n.advance(time.Hour)
	if _, err := al.List(ctx); err != nil {
		t.Fatal(err)
	}
	if n.a.count() != 1 {
		t.Fatalf("fired %d times, want once", n.a.count())
	}
	c := n.a.call(0)
	id := ObjectID{App: "app_t", Type: "alarmer", Key: "k"}
	if c.IdempotencyKey != alarms.IdempotencyKey(id, "tick", second.Generation) || c.IdempotencyKey == alarms.IdempotencyKey(id, "tick", first.Generation) {
		t.Fatalf("key %s is not the replacement's", c.IdempotencyKey)
	}
	// A generation is never handed out twice, even after the name was removed.
	third, err := al.Set(ctx, "tick", clock.Now().Add(time.Hour), nil)
	if err != nil || third.Generation <= second.Generation {
		t.Fatalf("third generation %+v, %v", third, err)
	}
}

// A failing handler (an error, a panic) is retried with backoff under the same
// key, its writes discarded, until MaxAttempts; then the occurrence is failed and
// kept until it is replaced.
func TestAlarm_RetriesThenFailed(t *testing.T) {
	clock := newTestClock()
	a := &alarmer{}
	a.behave = func(c *Context, call AlarmCall) error {
		_ = c.Put(fmt.Sprintf("attempt-%d", call.Attempt), []byte("x"))
		if call.Attempt == 1 {
			panic("handler bug")
		}
		return fmt.Errorf("attempt %d refused", call.Attempt)
	}
	n := startAlarmNode(t, t.TempDir(), clock, alarmOpts(3), a)
	ctx := context.Background()
	al := n.alarms("k")
	s, err := al.Set(ctx, "tick", clock.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	n.host.sched.Kick()
	for attempt := 1; attempt <= 3; attempt++ {
		waitFor(t, fmt.Sprintf("attempt %d", attempt), func() bool { return a.count() == attempt })
		var info *AlarmInfo
		waitFor(t, "the attempt to settle", func() bool {
			info, err = al.Get(ctx, "tick")
			return err == nil && info.Attempt == attempt
		})
		now := clock.Now()
		if attempt < 3 {
			backoff := alarms.Backoff(attempt, 0)
			if info.Status != AlarmPending || info.At > now.Add(backoff).UnixMilli() || info.At < now.Add(backoff*8/10).UnixMilli() {
				t.Fatalf("after attempt %d: %+v (now %d, backoff %v)", attempt, info, now.UnixMilli(), backoff)
			}
			if attempt == 2 && info.LastError != "panic: handler bug" {
				t.Fatalf("lastError %q after the panic", info.LastError)
			}
			n.advance(time.Duration(info.At-now.UnixMilli()) * time.Millisecond)
			continue
		}
		if info.Status != AlarmFailed || info.LastError != "attempt 2 refused" || info.Generation != s.Generation {
			t.Fatalf("after the last attempt: %+v", info)
		}
	}
	for i := range 3 {
		c := a.call(i)
		if c.Attempt != i || c.IdempotencyKey != a.call(0).IdempotencyKey {
			t.Fatalf("call %d: %+v", i, c)
		}
	}
	if n.indexEntries(t) != 0 {
		t.Fatal("a failed occurrence is still in the index")
	}
	for i := range 3 { // every failed attempt's writes were discarded
		if found, err := n.host.Request(ctx, ObjectID{App: "app_t", Type: "alarmer", Key: "k"}, readKey{fmt.Sprintf("attempt-%d", i)}); err != nil || found.(bool) {
			t.Fatalf("attempt %d's write: found=%v err=%v", i, found, err)
		}
	}
	// Replacing a failed occurrence starts over.
	a.mu.Lock()
	a.behave = nil
	a.mu.Unlock()
	if _, err := al.Set(ctx, "tick", clock.Now(), nil); err != nil {
		t.Fatal(err)
	}
	n.host.sched.Kick()
	waitFor(t, "the replacement to run", func() bool { return a.count() == 4 })
	if c := a.call(3); c.Attempt != 0 || c.IdempotencyKey == a.call(0).IdempotencyKey {
		t.Fatalf("replacement call %+v", c)
	}
}

// A handler's writes commit with the settlement; a handler that schedules its
// own name again keeps the new occurrence (success removes only the one that
// ran).
func TestAlarm_HandlerWritesAndSelfReschedule(t *testing.T) {
	clock := newTestClock()
	a := &alarmer{}
	a.behave = func(c *Context, call AlarmCall) error {
		if err := c.Put("ran-"+call.IdempotencyKey, []byte("1")); err != nil {
			return err
		}
		if call.ScheduledTime.Equal(time.UnixMilli(1_800_000_000_000)) { // the first: come back in a minute
			_, err := c.SetAlarm("tick", call.ScheduledTime.Add(time.Minute), nil)
			return err
		}
		return nil
	}
	n := startAlarmNode(t, t.TempDir(), clock, nil, a)
	ctx := context.Background()
	id := ObjectID{App: "app_t", Type: "alarmer", Key: "k"}
	al := n.alarms("k")
	if _, err := al.Set(ctx, "tick", clock.Now(), nil); err != nil {
		t.Fatal(err)
	}
	n.host.sched.Kick()
	waitFor(t, "the first run", func() bool { return a.count() == 1 })
	var info *AlarmInfo
	waitFor(t, "the rescheduled occurrence", func() bool {
		var err error
		info, err = al.Get(ctx, "tick")
		return err == nil && info.At == clock.Now().Add(time.Minute).UnixMilli()
	})
	if info.Attempt != 0 || info.Status != AlarmPending {
		t.Fatalf("rescheduled %+v", info)
	}
	if found, err := n.host.Request(ctx, id, readKey{"ran-" + a.call(0).IdempotencyKey}); err != nil || !found.(bool) {
		t.Fatalf("the handler's write: %v %v", found, err)
	}
	n.advance(time.Minute)
	waitFor(t, "the second run", func() bool { return a.count() == 2 })
	waitFor(t, "the occurrence to go", func() bool { _, err := al.Get(ctx, "tick"); return errors.Is(err, ErrNotFound) })
	if n.indexEntries(t) != 0 {
		t.Fatal("index entry left")
	}
}

// An alarm scheduled in a turn whose write fails (an error or a panic) does not
// exist.
func TestAlarm_ScheduledInAFailedTurnDoesNotExist(t *testing.T) {
	n := startAlarmNode(t, t.TempDir(), nil, nil, nil)
	ctx := context.Background()
	id := ObjectID{App: "app_t", Type: "alarmer", Key: "k"}
	at := time.Now().Add(50 * time.Millisecond)
	for _, m := range []setInTurn{{Name: "tick", Put: "a", At: at, Fail: true}, {Name: "tick", Put: "b", At: at, Panic: true}} {
		if _, err := n.host.Request(ctx, id, m); err == nil {
			t.Fatalf("%+v succeeded", m)
		}
		if _, err := n.alarms("k").Get(ctx, "tick"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("after %+v: %v, want not found", m, err)
		}
		if found, _ := n.host.Request(ctx, id, readKey{m.Put}); found.(bool) {
			t.Fatalf("the failed turn's write %q exists", m.Put)
		}
	}
	if n.indexEntries(t) != 0 {
		t.Fatal("index entry of a failed turn")
	}
	// A turn that succeeds schedules it, in the same commit as its write.
	gen, err := n.host.Request(ctx, id, setInTurn{Name: "tick", Put: "c", At: at})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the alarm", func() bool { return n.a.count() == 1 })
	if c := n.a.call(0); c.IdempotencyKey != alarms.IdempotencyKey(id, "tick", gen.(uint64)) {
		t.Fatalf("call %+v", c)
	}
}

// Inside a turn, the object's alarms as the turn left them are what it reads.
func TestAlarm_ContextSeesItsOwnAlarms(t *testing.T) {
	n := startAlarmNode(t, t.TempDir(), nil, nil, nil)
	ctx := context.Background()
	id := ObjectID{App: "app_t", Type: "alarmer", Key: "k"}
	at := time.Now().Add(time.Hour)
	if _, err := n.alarms("k").Set(ctx, "tock", at.Add(time.Minute), nil); err != nil {
		t.Fatal(err)
	}
	v, err := n.host.Request(ctx, id, turnMixed{At: at})
	if err != nil {
		t.Fatal(err)
	}
	inTurn := v.([]AlarmInfo)
	if len(inTurn) != 1 || inTurn[0].Name != "tick" || inTurn[0].At != at.UnixMilli() {
		t.Fatalf("the turn listed %+v", inTurn)
	}
	after, err := n.alarms("k").List(ctx)
	if err != nil || fmt.Sprint(after) != fmt.Sprint(inTurn) {
		t.Fatalf("after the turn %+v (%v), the turn saw %+v", after, err, inTurn)
	}
	if n.indexEntries(t) != 1 {
		t.Fatal("want one index entry: tick's")
	}
}

// Real time and a passivated object: the scheduler activates it.
func TestAlarm_FiresOnAPassivatedObject(t *testing.T) {
	a := &alarmer{clock: time.Now}
	n := startNode(t, t.TempDir(), nodeOpts{cfg: Config{IdleTimeout: 20 * time.Millisecond}, types: []TypeSpec{a.spec()}})
	ctx := context.Background()
	at := time.UnixMilli(time.Now().Add(time.Second).UnixMilli()) // alarm times are in milliseconds
	if _, err := NewAlarms(n.host, ObjectID{App: "app_t", Type: "alarmer", Key: "k"}).Set(ctx, "tick", at, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "passivation", func() bool { return n.host.Active() == 0 })
	if a.count() != 0 {
		t.Skip("the machine was too slow to see the object passivated before its alarm")
	}
	waitFor(t, "the alarm", func() bool { return a.count() == 1 })
	a.mu.Lock()
	defer a.mu.Unlock()
	if late := a.at[0].Sub(at); late < 0 || late > 2*time.Second {
		t.Fatalf("fired %v after its time", late)
	}
}

// Alarms that fell due while the node was down fire once it is back.
func TestAlarm_DueDuringDowntimeFiresAfterRestart(t *testing.T) {
	clock := newTestClock()
	dir := t.TempDir()
	n := startAlarmNode(t, dir, clock, nil, nil)
	ctx := context.Background()
	at := clock.Now().Add(time.Minute)
	for i := range 5 {
		if _, err := n.alarms(fmt.Sprint(i)).Set(ctx, "tick", at.Add(time.Duration(i)*time.Second), nil); err != nil {
			t.Fatal(err)
		}
	}
	n.stop()
	clock.Add(time.Hour) // the node was down for an hour
	n = startAlarmNode(t, dir, clock, nil, nil)
	waitFor(t, "every alarm", func() bool { return n.a.count() == 5 })
	seen := map[int64]bool{}
	for i := range 5 {
		seen[n.a.call(i).ScheduledTime.UnixMilli()] = true
	}
	for i := range 5 {
		if !seen[at.Add(time.Duration(i)*time.Second).UnixMilli()] {
			t.Fatalf("alarm %d did not fire: %v", i, seen)
		}
	}
}

// One name runs one handler at a time: a trim action on a cold log runs across
// turns; a replacement scheduled while it runs waits for it, and the first
// one's success removes only itself.
func TestAlarm_OneHandlerPerNameAndReplacementWaits(t *testing.T) {
	clock := newTestClock()
	mem := cold.NewMemory()
	fs := &faultyStore{Store: mem}
	opts := func(string) TypeOptions {
		o := DefaultTypeOptions()
		o.Log = LogOptions{MaxBatchSize: 100, MaxRecords: 1, Cold: true}
		return o
	}
	n := startNode(t, t.TempDir(), nodeOpts{now: clock.Now, cfg: Config{Cold: fs, ColdTimeout: 10 * time.Second, TypeOptions: opts}})
	ctx := context.Background()
	id := ObjectID{App: "app_t", Type: "events", Key: "p"}
	l, al := NewLog(n.host, id), NewAlarms(n.host, id)
	appendN(t, l, 0, 3)
	hold := make(chan struct{})
	fs.set(func(f *faultyStore) { f.holdCreates = hold })
	trim := json.RawMessage(`{"kind":"trim"}`)
	if _, err := al.Set(ctx, "compact", clock.Now(), trim); err != nil {
		t.Fatal(err)
	}
	n.host.sched.Kick()
	waitFor(t, "the first trim to reach the store", func() bool {
		fs.mu.Lock()
		defer fs.mu.Unlock()
		return len(fs.creates) == 1
	})
	// While it runs, more records and a replacement that is due at once.
	appendN(t, l, 3, 2)
	repl, err := al.Set(ctx, "compact", clock.Now(), trim)
	if err != nil {
		t.Fatal(err)
	}
	n.host.sched.Kick()
	if _, err := l.Bounds(ctx); err != nil { // the object serves other requests meanwhile
		t.Fatal(err)
	}
	info, err := al.Get(ctx, "compact")
	if err != nil || info.Generation != repl.Generation || info.Status != AlarmPending {
		t.Fatalf("replacement %+v, %v", info, err)
	}
	fs.set(func(f *faultyStore) { f.holdCreates = nil })
	close(hold)
	waitFor(t, "both trims", func() bool {
		b, err := l.Bounds(ctx)
		return err == nil && b.HotOffset == 4
	})
	waitFor(t, "the replacement to settle", func() bool { _, err := al.Get(ctx, "compact"); return errors.Is(err, ErrNotFound) })
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.maxInCreate != 1 || len(fs.creates) != 2 {
		t.Fatalf("%d creates, at most %d at once; want 2, one at a time", len(fs.creates), fs.maxInCreate)
	}
}

// An alarm's trim action runs the log's trim.
func TestAlarm_TrimAction(t *testing.T) {
	opts := func(string) TypeOptions {
		o := DefaultTypeOptions()
		o.Log = LogOptions{MaxBatchSize: 100, MaxRecords: 5} // trimEvery off
		return o
	}
	n := startNode(t, t.TempDir(), nodeOpts{cfg: Config{TypeOptions: opts}})
	ctx := context.Background()
	id := ObjectID{App: "app_t", Type: "events", Key: "p"}
	l := NewLog(n.host, id)
	appendN(t, l, 0, 20)
	if list, _ := NewAlarms(n.host, id).List(ctx); len(list) != 0 {
		t.Fatalf("trimEvery 0 armed %+v", list)
	}
	if _, err := NewAlarms(n.host, id).Set(ctx, "compact", time.Now(), json.RawMessage(`{"kind":"trim"}`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the trim", func() bool { b, err := l.Bounds(ctx); return err == nil && b.HotOffset == 15 })
}

// trimEvery keeps a log within maxRecords with no client calling trim, and the
// alarm is re-armed only while something is hot.
func TestAlarm_TrimEveryKeepsTheLogWithinItsRetention(t *testing.T) {
	opts := func(typ string) TypeOptions {
		o := DefaultTypeOptions()
		o.Log = LogOptions{MaxBatchSize: 100, MaxRecords: 10, TrimEvery: 30 * time.Millisecond}
		if typ == "aging" {
			o.Log = LogOptions{MaxBatchSize: 100, MaxAge: 50 * time.Millisecond, TrimEvery: 30 * time.Millisecond}
		}
		return o
	}
	n := startNode(t, t.TempDir(), nodeOpts{cfg: Config{TypeOptions: opts}})
	ctx := context.Background()
	id := ObjectID{App: "app_t", Type: "events", Key: "p"}
	l := NewLog(n.host, id)
	for i := range 5 {
		appendN(t, l, i*20, 20)
	}
	waitFor(t, "the automatic trim", func() bool {
		b, err := l.Bounds(ctx)
		return err == nil && b.NextOffset == 100 && b.HotOffset == 90
	})
	info, err := NewAlarms(n.host, id).Get(ctx, TrimAlarm)
	if err != nil || info.Status != AlarmPending || string(info.Action) != `{"kind":"trim"}` {
		t.Fatalf("the trim alarm while records are hot: %+v, %v", info, err)
	}
	// A log whose records all age out drops its alarm, and an append re-arms it.
	aid := ObjectID{App: "app_t", Type: "aging", Key: "p"}
	al := NewLog(n.host, aid)
	appendN(t, al, 0, 10)
	waitFor(t, "every record to age out and the alarm to go", func() bool {
		b, err := al.Bounds(ctx)
		list, lerr := NewAlarms(n.host, aid).List(ctx)
		return err == nil && lerr == nil && b.HotOffset == 10 && len(list) == 0
	})
	appendN(t, al, 10, 1)
	if list, err := NewAlarms(n.host, aid).List(ctx); err != nil || len(list) != 1 || list[0].Name != TrimAlarm {
		t.Fatalf("after an append: %+v, %v", list, err)
	}
	waitFor(t, "the new record to age out", func() bool { b, err := al.Bounds(ctx); return err == nil && b.HotOffset == 11 })
}
