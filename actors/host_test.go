package actors

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/pipehook"
	"github.com/holdfast/holdfast/persistence"
)

type testNode struct {
	t    testing.TB
	dir  string
	db   *persistence.DB
	pipe *persistence.Pipeline
	host *Host
}

type nodeOpts struct {
	db    persistence.Config // Dir is the node's; the rest as given
	cfg   Config
	pipe  persistence.PipelineConfig
	types []TypeSpec
	now   func() time.Time // the host's clock; nil: real time
	setup func(h *Host)    // run on the host before Start; nil: none
}

func startNode(t testing.TB, dir string, o nodeOpts) *testNode {
	t.Helper()
	o.db.Dir = dir
	db, err := persistence.Open(o.db)
	if err != nil {
		t.Fatal(err)
	}
	pipe := persistence.NewPipeline(db, o.pipe)
	pipe.Start()
	if o.cfg.Logger == nil {
		// Every test fails if the sweeper's backstop had to commit writes
		// that a delivery path left queued (Host.send).
		o.cfg.Logger = slog.New(&backstopAlarm{t: t, next: slog.Default().Handler()})
	}
	h := NewHost(db, pipe, o.cfg)
	if o.now != nil {
		h.now = o.now
	}
	for _, ty := range o.types {
		if err := h.RegisterType(ty); err != nil {
			t.Fatal(err)
		}
	}
	if o.setup != nil {
		o.setup(h)
	}
	h.Start()
	n := &testNode{t: t, dir: dir, db: db, pipe: pipe, host: h}
	t.Cleanup(n.stop)
	return n
}

func (n *testNode) stop() {
	if n.host == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.host.Close(ctx); err != nil {
		n.t.Errorf("host close: %v", err)
	}
	n.pipe.Close()
	if err := n.db.Close(); err != nil {
		n.t.Errorf("db close: %v", err)
	}
	n.host = nil
}

func (n *testNode) kv(typ, key string) *KV {
	return NewKV(n.host, ObjectID{App: "app_t", Type: typ, Key: key})
}

// backstopAlarm fails its test on the host's warning that writes waited in the
// commit queue, and passes every record on.
type backstopAlarm struct {
	t    testing.TB
	next slog.Handler
}

func (b *backstopAlarm) Enabled(ctx context.Context, l slog.Level) bool { return true }

func (b *backstopAlarm) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "commit queue") {
		b.t.Errorf("host warned: %s", r.Message)
	}
	if !b.next.Enabled(ctx, r.Level) {
		return nil
	}
	return b.next.Handle(ctx, r)
}

func (b *backstopAlarm) WithAttrs(as []slog.Attr) slog.Handler {
	return &backstopAlarm{t: b.t, next: b.next.WithAttrs(as)}
}

func (b *backstopAlarm) WithGroup(name string) slog.Handler {
	return &backstopAlarm{t: b.t, next: b.next.WithGroup(name)}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// holdablePipeline returns a pipeline config whose commits block while held.
type hold struct {
	mu      sync.Mutex
	held    bool
	release chan struct{}
	inHold  atomic.Int64 // writes of the commit waiting in the hold
	commits atomic.Int64
}

// newHold returns a hold that is released at the latest when the test ends, so a
// failing test cannot leave the pipeline stuck.
func newHold(t *testing.T) *hold {
	h := &hold{held: true, release: make(chan struct{})}
	t.Cleanup(h.open)
	return h
}

func (h *hold) before(n int) {
	h.mu.Lock()
	held, ch := h.held, h.release
	h.mu.Unlock()
	if held {
		h.inHold.Store(int64(n))
		<-ch
		h.inHold.Store(0)
	}
	h.commits.Add(1)
}

func (h *hold) open() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held {
		h.held = false
		close(h.release)
	}
}

func TestKV_SetGetSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, dir, nodeOpts{})
	ctx := context.Background()
	o := n.kv("order", "o-1")
	r, err := o.Set(ctx, "status", "new")
	if err != nil || r.LogID != 1 {
		t.Fatalf("set: %+v %v", r, err)
	}
	if r, err = o.Increment(ctx, "n", 2); err != nil || string(r.Value) != "2" || r.LogID != 2 {
		t.Fatalf("increment: %+v %v", r, err)
	}
	n.stop()
	n = startNode(t, dir, nodeOpts{})
	st, err := n.kv("order", "o-1").Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.LogID != 2 || string(st.State["status"]) != `"new"` || string(st.State["n"]) != "2" {
		t.Fatalf("after restart: %+v", st)
	}
}

// TestHost_RepliesWaitForTheSyncThatCoversThem holds the pipeline while writes to
// many objects queue: no reply (write or read) may leave before the commit, and the
// writes share a handful of commits.
func TestHost_RepliesWaitForTheSyncThatCoversThem(t *testing.T) {
	hd := newHold(t)
	n := startNode(t, t.TempDir(), nodeOpts{pipe: persistence.PipelineConfig{Hooks: &pipehook.Hooks{BeforeCommit: hd.before}}})
	ctx := context.Background()
	const objects = 300
	var replied atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < objects; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if _, err := n.kv("c", fmt.Sprint(i)).Set(ctx, "v", i); err != nil {
				t.Errorf("set %d: %v", i, err)
			}
			replied.Add(1)
		}(i)
	}
	waitFor(t, "every write to reach the pipeline", func() bool {
		return hd.inHold.Load()+int64(n.pipe.Queued()) == objects
	})
	// A read of an object whose write is pending must wait too.
	readDone := make(chan *KVState, 1)
	go func() {
		st, err := n.kv("c", "7").Get(ctx)
		if err != nil {
			t.Errorf("get: %v", err)
		}
		readDone <- st
	}()
	waitFor(t, "the read to reach the object", func() bool { return n.host.inflight() == objects+1 })
	if got := replied.Load(); got != 0 {
		t.Fatalf("%d writes acknowledged while their commit was held", got)
	}
	select {
	case <-readDone:
		t.Fatal("a read showed a write that was not yet durable")
	default:
	}
	hd.open()
	wg.Wait()
	if st := <-readDone; string(st.State["v"]) != "7" {
		t.Fatalf("read after release: %+v", st)
	}
	if c := hd.commits.Load(); c > 5 {
		t.Fatalf("%d writes to %d objects took %d commits, want them to share syncs", objects, objects, c)
	}
}

// 64 callers, one write in flight each, on one object: their writes share
// syncs. Sharing needs writes to come faster than the disk syncs: each sync
// here takes at least 1 ms, as a disk's does. Without that floor, under -race
// on a machine whose fdatasync took 100-200 µs, a race-instrumented turn and
// its reply were slower than a sync, and 3-4 runs in 20 took 1,035-1,280
// commits (each write committed alone, as fast as it came: nothing waited to
// share a sync) where the rest took 80-270; with the floor, 40-54 in 20 of 20.
func TestHost_OneObjectManyCallersShareSyncs(t *testing.T) {
	slowSync := func(int) { time.Sleep(time.Millisecond) }
	n := startNode(t, t.TempDir(), nodeOpts{pipe: persistence.PipelineConfig{Hooks: &pipehook.Hooks{BeforeCommit: slowSync}}})
	ctx := context.Background()
	o := n.kv("hot", "one")
	const callers, each = 64, 20
	seen := make([]atomic.Bool, callers*each+1)
	var wg sync.WaitGroup
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				r, err := o.Increment(ctx, "n", 1)
				if err != nil {
					t.Error(err)
					return
				}
				var v int
				fmt.Sscan(string(r.Value), &v)
				if v < 1 || v > callers*each || seen[v].Swap(true) {
					t.Errorf("increment returned %d twice or out of range", v)
				}
				if r.LogID != uint64(v) {
					t.Errorf("value %d at log_id %d", v, r.LogID)
				}
			}
		}()
	}
	wg.Wait()
	st := n.pipe.Stats()
	if st.Writes != callers*each {
		t.Fatalf("writes = %d", st.Writes)
	}
	if st.Commits > callers*each/4 {
		t.Fatalf("%d writes to one object took %d commits", st.Writes, st.Commits)
	}
}

func TestHost_PassivatesIdleObjectsAndReloads(t *testing.T) {
	n := startNode(t, t.TempDir(), nodeOpts{cfg: Config{IdleTimeout: 30 * time.Millisecond}})
	ctx := context.Background()
	for i := 0; i < 100; i++ {
		if _, err := n.kv("p", fmt.Sprint(i)).Append(ctx, "l", i); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "every object to passivate", func() bool { return n.host.Active() == 0 })
	for i := 0; i < 100; i++ {
		st, err := n.kv("p", fmt.Sprint(i)).Get(ctx)
		if err != nil || st.LogID != 1 || string(st.State["l"]) != fmt.Sprintf("[%d]", i) {
			t.Fatalf("object %d after passivation: %+v %v", i, st, err)
		}
	}
}

func TestHost_FailedWriteDeactivatesAndReloadsFromDisk(t *testing.T) {
	var refuse atomic.Bool
	errRefused := errors.New("refused for the test")
	n := startNode(t, t.TempDir(), nodeOpts{pipe: persistence.PipelineConfig{Fence: func(uint32, uint64) error {
		if refuse.Load() {
			return errRefused
		}
		return nil
	}}})
	ctx := context.Background()
	o := n.kv("f", "x")
	if _, err := o.Set(ctx, "a", 1); err != nil {
		t.Fatal(err)
	}
	refuse.Store(true)
	if _, err := o.Set(ctx, "a", 2); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("refused write: %v, want unavailable", err)
	}
	refuse.Store(false)
	st, err := o.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.LogID != 1 || string(st.State["a"]) != "1" {
		t.Fatalf("state after a lost write: %+v, want the durable a=1 at log_id 1", st)
	}
	r, err := o.Set(ctx, "a", 3)
	if err != nil || r.LogID != 2 {
		t.Fatalf("next write: %+v %v, want log_id 2 with no gap", r, err)
	}
}

func TestHost_AdmissionLimit(t *testing.T) {
	hd := newHold(t)
	n := startNode(t, t.TempDir(), nodeOpts{
		cfg:  Config{MaxInflightPerObject: 4},
		pipe: persistence.PipelineConfig{Hooks: &pipehook.Hooks{BeforeCommit: hd.before}},
	})
	ctx := context.Background()
	o := n.kv("busy", "x")
	errs := make(chan error, 10)
	for i := 0; i < 10; i++ {
		go func() { _, err := o.Set(ctx, "a", 1); errs <- err }()
	}
	overloaded := 0
	for i := 0; i < 6; i++ { // six must be refused at once, while four wait
		var err error
		select {
		case err = <-errs:
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d requests refused; more than the limit were admitted", overloaded)
		}
		var e *Error
		if !errors.As(err, &e) || e.Kind != KindOverloaded || e.RetryAfter <= 0 {
			t.Fatalf("got %v, want overloaded with a retry time", err)
		}
		overloaded++
	}
	hd.open()
	for i := 0; i < 4; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("admitted write: %v", err)
		}
	}
}

func TestHost_CloseFinishesInflightWrites(t *testing.T) {
	hd := newHold(t)
	dir := t.TempDir()
	n := startNode(t, dir, nodeOpts{pipe: persistence.PipelineConfig{Hooks: &pipehook.Hooks{BeforeCommit: hd.before}}})
	ctx := context.Background()
	res := make(chan error, 1)
	go func() { _, err := n.kv("c", "x").Set(ctx, "a", "kept"); res <- err }()
	waitFor(t, "the write to be held", func() bool { return hd.inHold.Load() == 1 })
	closed := make(chan struct{})
	go func() { n.stop(); close(closed) }()
	waitFor(t, "close to refuse new requests", func() bool { return n.host.closing.Load() })
	if _, err := n.kv("c", "y").Get(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("request during close: %v, want unavailable", err)
	}
	hd.open()
	if err := <-res; err != nil {
		t.Fatalf("in-flight write: %v", err)
	}
	<-closed
	n = startNode(t, dir, nodeOpts{})
	if v, err := n.kv("c", "x").GetSlot(ctx, "a"); err != nil || string(v) != `"kept"` {
		t.Fatalf("after restart: %s %v", v, err)
	}
}

func TestHost_LogReadSeesPendingWrites(t *testing.T) {
	hd := newHold(t)
	n := startNode(t, t.TempDir(), nodeOpts{pipe: persistence.PipelineConfig{Hooks: &pipehook.Hooks{BeforeCommit: hd.before}}})
	ctx := context.Background()
	o := n.kv("l", "x")
	hd.open() // first write goes through
	if _, err := o.Set(ctx, "a", 1); err != nil {
		t.Fatal(err)
	}
	hd.mu.Lock()
	hd.held, hd.release = true, make(chan struct{})
	hd.mu.Unlock()
	go o.Set(ctx, "b", 2)    //nolint:errcheck // checked through the log below
	go o.Append(ctx, "c", 3) //nolint:errcheck
	waitFor(t, "both writes to be pending", func() bool { return hd.inHold.Load()+int64(n.pipe.Queued()) == 2 })
	page := make(chan *LogPage, 1)
	go func() {
		p, err := o.Log(ctx, 0, 100)
		if err != nil {
			t.Error(err)
		}
		page <- p
	}()
	waitFor(t, "the read to queue", func() bool { return n.host.inflight() == 3 })
	hd.open()
	p := <-page
	if len(p.Items) != 3 || p.Items[2].LogID != 3 {
		t.Fatalf("log read while writes were pending: %+v, want all three entries", p.Items)
	}
}

// TestHost_NewActivationWaitsForAppliedWrites holds the applier: a write is
// acknowledged (durable) but Badger does not show it yet. A failed write then
// forces a fresh activation, whose first read must wait for the applier and see
// the acknowledged write.
func TestHost_NewActivationWaitsForAppliedWrites(t *testing.T) {
	var refuse atomic.Bool
	applyHold := newHold(t)
	applyHold.open()
	n := startNode(t, t.TempDir(), nodeOpts{pipe: persistence.PipelineConfig{
		Fence: func(uint32, uint64) error {
			if refuse.Load() {
				return errors.New("refused for the test")
			}
			return nil
		},
		Hooks: &pipehook.Hooks{BeforeApply: func(uint64) { applyHold.before(1) }},
	}})
	t.Cleanup(applyHold.open) // before the node stops: cleanups run last first
	ctx := context.Background()
	o := n.kv("f", "x")
	if _, err := o.Set(ctx, "a", 0); err != nil { // activate; applied at once
		t.Fatal(err)
	}
	applyHold.mu.Lock()
	applyHold.held, applyHold.release = true, make(chan struct{})
	applyHold.mu.Unlock()
	if _, err := o.Set(ctx, "a", 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the applier to hold the write", func() bool { return applyHold.inHold.Load() == 1 })
	refuse.Store(true)
	if _, err := o.Set(ctx, "a", 2); err == nil {
		t.Fatal("refused write succeeded")
	}
	refuse.Store(false)
	got := make(chan *KVState, 1)
	go func() {
		st, err := o.Get(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- st
	}()
	select {
	case st := <-got:
		t.Fatalf("a fresh activation read %+v before the acknowledged write was applied", st)
	case <-time.After(50 * time.Millisecond): // it must be waiting
	}
	applyHold.open()
	if st := <-got; st == nil || st.LogID != 2 || string(st.State["a"]) != "1" {
		t.Fatalf("state %+v, want a=1 at log_id 2", st)
	}
}

// TestKV_GoAPIValues: values the Go API encodes itself are stored as
// json.Marshal wrote them, while a caller's json.RawMessage is still checked
// (invalid: refused, writing nothing) and compacted, through every method
// that takes a value.
func TestKV_GoAPIValues(t *testing.T) {
	n := startNode(t, t.TempDir(), nodeOpts{})
	ctx := context.Background()
	kv := n.kv("t", "values")
	type point struct {
		X, Y int
		Tag  string `json:"tag"`
	}
	if _, err := kv.Set(ctx, "p", point{1, 2, "a\"b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Patch(ctx, []PatchEntry{{Slot: "q", Value: map[string]any{"k": []int{1}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Append(ctx, "l", "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Set(ctx, "raw", json.RawMessage(" { \"a\" : [ 1 , 2 ] } ")); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []func() error{
		func() error { _, err := kv.Set(ctx, "bad", json.RawMessage(`{"a":`)); return err },
		func() error { _, err := kv.Append(ctx, "l", json.RawMessage(`[1,`)); return err },
		func() error {
			_, err := kv.Patch(ctx, []PatchEntry{{Slot: "bad", Value: json.RawMessage(`nope`)}})
			return err
		},
	} {
		if err := bad(); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("invalid raw JSON: %v, want ErrBadRequest", err)
		}
	}
	st, err := kv.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"p": `{"X":1,"Y":2,"tag":"a\"b"}`, "q": `{"k":[1]}`, "l": `["x"]`, "raw": `{"a":[1,2]}`}
	if st.LogID != 4 || len(st.State) != len(want) {
		t.Fatalf("log_id %d, state %s: the refused writes changed something", st.LogID, st.State)
	}
	for slot, v := range want {
		if got := string(st.State[slot]); got != v {
			t.Errorf("%s: %s, want %s", slot, got, v)
		}
	}
}

// TestHost_RequestAsyncRepliesOnceAfterTheSync: RequestAsync's done takes a
// write's reply once, only after the commit that covers it, while the
// goroutine that sent it has gone on (each sends from its own, which may run
// a commit: Pipeline.Help); a request the host refuses gets its error at once.
func TestHost_RequestAsyncRepliesOnceAfterTheSync(t *testing.T) {
	hd := newHold(t)
	n := startNode(t, t.TempDir(), nodeOpts{pipe: persistence.PipelineConfig{Hooks: &pipehook.Hooks{BeforeCommit: hd.before}}})
	const writes = 50
	var calls atomic.Int64
	replies := make(chan *WriteResult, writes)
	var sent sync.WaitGroup
	for i := range writes {
		msg := &KVWrite{Route: RoutePut, Ops: []Op{{Op: "set", Key: "v", Value: json.RawMessage(fmt.Sprint(i))}}}
		sent.Add(1)
		go func() {
			defer sent.Done()
			n.host.RequestAsync(ObjectID{App: "app_t", Type: "c", Key: fmt.Sprint(i % 5)}, msg, func(v any, err error) {
				calls.Add(1)
				if err != nil {
					t.Errorf("write %d: %v", i, err)
				}
				r, _ := v.(*WriteResult)
				replies <- r
			})
		}()
	}
	waitFor(t, "every write to reach the pipeline", func() bool {
		return hd.inHold.Load()+int64(n.pipe.Queued()) > 0 && n.host.inflight() == writes
	})
	if got := calls.Load(); got != 0 {
		t.Fatalf("%d writes replied to while their commit was held", got)
	}
	hd.open()
	sent.Wait()
	for range writes {
		if r := <-replies; r == nil || r.LogID == 0 {
			t.Fatalf("a write's reply: %+v", r)
		}
	}
	time.Sleep(50 * time.Millisecond) // a second call would come now
	if got := calls.Load(); got != writes {
		t.Fatalf("done was called %d times for %d writes", got, writes)
	}
	refused := make(chan error, 1)
	n.host.RequestAsync(ObjectID{App: "app_t", Type: "c", Key: ""}, &KVGet{}, func(_ any, err error) { refused <- err })
	select {
	case err := <-refused:
		if err == nil {
			t.Fatal("a request for an object with no key was not refused")
		}
	default:
		t.Fatal("a refused request's done was not called before RequestAsync returned")
	}
}

// TestHost_StartsAtOnce: only an active object of a built-in type past its
// first turn (which waits for its partition's writes to reach Badger) may be
// started on a goroutine that must not block; a user type's handler may block.
func TestHost_StartsAtOnce(t *testing.T) {
	n := startNode(t, t.TempDir(), nodeOpts{types: []TypeSpec{counterType()}})
	ctx := context.Background()
	kv := ObjectID{App: "app_t", Type: "c", Key: "x"}
	if n.host.StartsAtOnce(kv) {
		t.Fatal("an object not active starts at once")
	}
	if _, err := n.kv("c", "x").Set(ctx, "a", 1); err != nil {
		t.Fatal(err)
	}
	if !n.host.StartsAtOnce(kv) {
		t.Fatal("an active KV object does not start at once")
	}
	user := ObjectID{App: "app_t", Type: "counter", Key: "c1"}
	if _, err := n.host.Request(ctx, user, inc{By: 1}); err != nil {
		t.Fatal(err)
	}
	if n.host.StartsAtOnce(user) {
		t.Fatal("an object of a user type starts at once")
	}
}
