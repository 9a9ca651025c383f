package actors

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cold"
	"github.com/holdfast/holdfast/persistence"
)

// closeNode closes n's host with ctx, then its pipeline and database, and
// returns the host's error.
func closeNode(n *testNode, ctx context.Context) error {
	err := n.host.Close(ctx)
	n.pipe.Close()
	if cerr := n.db.Close(); cerr != nil {
		n.t.Errorf("db close: %v", cerr)
	}
	n.host = nil // the cleanup closes nothing more
	return err
}

// blockedHandler is a push handler that blocks until its context ends, then
// records why and returns a moment later (so that a Close that does not wait
// for it returns first).
type blockedHandler struct {
	started  chan struct{}
	cause    atomic.Value // error
	returned atomic.Bool
}

func newBlockedHandler() *blockedHandler { return &blockedHandler{started: make(chan struct{}, 16)} }

func (b *blockedHandler) handle(ctx context.Context, m QueueDelivery) (QueueResult, error) {
	b.started <- struct{}{}
	<-ctx.Done()
	b.cause.Store(ctx.Err())
	time.Sleep(20 * time.Millisecond)
	b.returned.Store(true)
	return QueueResult{}, ctx.Err()
}

func waitStarted(t *testing.T, ch chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("the push handler did not start")
	}
}

// A push handler blocked on its context returns when the host closes, and
// Close returns only after it did (not at its visibility deadline, a minute
// away).
func TestHost_CloseCancelsPushHandlersAndWaitsForThem(t *testing.T) {
	b := newBlockedHandler()
	n, q := pushNode(t, t.TempDir(), QueueOptions{VisibilityTimeout: time.Minute}, QueueHandler{Handle: b.handle})
	if _, err := q.Enqueue(context.Background(), msg("a", 1)); err != nil {
		t.Fatal(err)
	}
	waitStarted(t, b.started)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := closeNode(n, ctx); err != nil {
		t.Fatal(err)
	}
	if !b.returned.Load() {
		t.Fatal("Host.Close returned before the push handler did")
	}
	if err, _ := b.cause.Load().(error); !errors.Is(err, context.Canceled) {
		t.Fatalf("the handler's context ended with %v, want context.Canceled", err)
	}
}

// When the object's partition leaves the node, its push handlers' context ends,
// and the dropped activation stops without waiting for their results (which go
// to a fresh activation): its retries of dropPartition end.
func TestHost_DropPartitionCancelsPushHandlers(t *testing.T) {
	b := newBlockedHandler()
	n, q := pushNode(t, t.TempDir(), QueueOptions{VisibilityTimeout: time.Minute}, QueueHandler{Handle: b.handle})
	if _, err := q.Enqueue(context.Background(), msg("a", 1)); err != nil {
		t.Fatal(err)
	}
	waitStarted(t, b.started)
	id := ObjectID{App: "app_t", Type: "jobs", Key: "q"}
	n.host.DropPartition(persistence.Partition(id, n.db.Partitions()))
	waitFor(t, "the handler to return", b.returned.Load)
	if err, _ := b.cause.Load().(error); !errors.Is(err, context.Canceled) {
		t.Fatalf("the handler's context ended with %v, want context.Canceled", err)
	}
	waitFor(t, "the dropped activation's retries to end", func() bool { return n.host.bg.Running() == 0 })
}

// holdingStore is a cold store whose Get and Create block until their context
// ends, and say whether one is still blocked.
type holdingStore struct {
	cold.Store
	hold    atomic.Bool
	entered chan struct{}
	blocked atomic.Int32
}

func (s *holdingStore) block(ctx context.Context) error {
	s.blocked.Add(1)
	defer s.blocked.Add(-1)
	s.entered <- struct{}{}
	<-ctx.Done()
	time.Sleep(20 * time.Millisecond) // a Close that does not wait returns first
	return ctx.Err()
}

func (s *holdingStore) Get(ctx context.Context, key string) ([]byte, error) {
	if s.hold.Load() {
		return nil, s.block(ctx)
	}
	return s.Store.Get(ctx, key)
}

func (s *holdingStore) Create(ctx context.Context, key string, data []byte) error {
	if s.hold.Load() {
		return s.block(ctx)
	}
	return s.Store.Create(ctx, key, data)
}

// Cold I/O in flight when Close gives up on the requests waiting for it is
// cancelled and waited for before Close returns: the pipeline and the database
// close after it.
func TestHost_CloseWaitsForColdIO(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   func(l *Log) error
	}{
		{"read", func(l *Log) error { _, err := l.Read(context.Background(), 0, 0); return err }},
		{"flush", func(l *Log) error { _, err := l.Trim(context.Background()); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &holdingStore{Store: cold.NewMemory(), entered: make(chan struct{}, 16)}
			opts := LogOptions{Cold: true, MaxBatchSize: 2, MaxRecords: 1}
			n := startNode(t, t.TempDir(), nodeOpts{cfg: Config{
				Cold: store, ColdTimeout: time.Minute,
				TypeOptions: func(string) TypeOptions { o := DefaultTypeOptions(); o.Log = opts; return o },
			}})
			l := NewLog(n.host, ObjectID{App: "app_t", Type: "events", Key: "p"})
			appendN(t, l, 0, 2)
			appendN(t, l, 2, 1)
			if tc.name == "read" {
				if _, err := l.Trim(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			store.hold.Store(true)
			done := make(chan error, 1)
			go func() { done <- tc.op(l) }()
			select {
			case <-store.entered:
			case <-time.After(10 * time.Second):
				t.Fatal("the cold store call did not start")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			err := closeNode(n, ctx)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Close = %v, want it to give up on the request in flight", err)
			}
			if b := store.blocked.Load(); b != 0 {
				t.Fatalf("Close returned with %d cold store calls still running", b)
			}
			select {
			case err := <-done:
				if !errors.Is(err, ErrUnavailable) {
					t.Fatalf("the %s in flight at Close got %v, want 503", tc.name, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("the %s in flight at Close got no reply", tc.name)
			}
		})
	}
}

// A user handler's Context ends when Close gives up waiting for the requests
// in flight: a turn blocked on it ends, and its caller gets a reply.
func TestHost_UserContextEndsAtClose(t *testing.T) {
	entered := make(chan struct{}, 1)
	n := startNode(t, t.TempDir(), nodeOpts{types: []TypeSpec{{Name: "waiter", Handle: func(c *Context, msg any) (any, error) {
		entered <- struct{}{}
		<-c.Context().Done()
		return nil, c.Context().Err()
	}}}})
	done := make(chan error, 1)
	go func() {
		_, err := n.host.Request(context.Background(), ObjectID{App: "app_t", Type: "waiter", Key: "w"}, "wait")
		done <- err
	}()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := closeNode(n, ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v, want it to give up on the request in flight", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the turn ended with %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the turn blocked on its context did not end after Close")
	}
}
