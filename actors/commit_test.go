package actors

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/goroutine"
	"github.com/holdfast/holdfast/internal/pipehook"
	"github.com/holdfast/holdfast/persistence"
)

// A caller that waits for each reply before its next request commits its own
// writes: the committer goroutine stays parked, and no hand-off to it and back
// sits on the write's path.
func TestHost_ASerialCallerCommitsItsOwnWrites(t *testing.T) {
	var mu sync.Mutex
	var ids []int64
	n := startNode(t, t.TempDir(), nodeOpts{pipe: persistence.PipelineConfig{Hooks: &pipehook.Hooks{BeforeCommit: func(int) {
		mu.Lock()
		ids = append(ids, goroutine.ID())
		mu.Unlock()
	}}}})
	ctx := context.Background()
	kv := n.kv("t", "serial")
	if _, err := kv.Set(ctx, "n", 0); err != nil { // activates the object
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the committer parks
	mu.Lock()
	ids = nil
	mu.Unlock()
	me := goroutine.ID()
	for i := 1; i <= 20; i++ {
		if _, err := kv.Set(ctx, "n", i); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ids) != 20 {
		t.Fatalf("%d commits for 20 serial writes", len(ids))
	}
	for i, id := range ids {
		if id != me {
			t.Fatalf("write %d was committed on goroutine %d, not the caller's (%d)", i+1, id, me)
		}
	}
	s, err := kv.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if string(s.State["n"]) != "20" {
		t.Fatalf("n = %s, want 20", s.State["n"])
	}
}

// A turn queues its write without waking the committer; when the mailbox run
// goes on with another message, the write is committed at the start of that
// message, not after the whole run.
func TestHost_AWriteIsCommittedBeforeTheNextMessageOfItsRun(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var n *testNode
	var elapsed time.Duration
	spec := TypeSpec{Name: "runs", Handle: func(c *Context, msg any) (any, error) {
		switch msg {
		case "hold":
			close(entered)
			<-release
		case "write":
			return nil, c.Put("k", []byte("v"))
		case "check": // waits for the write of the message before it
			start := time.Now()
			for n.pipe.Stats().Writes < 2 && time.Since(start) < 5*time.Second {
				time.Sleep(time.Millisecond)
			}
			elapsed = time.Since(start)
		}
		return nil, nil
	}}
	n = startNode(t, t.TempDir(), nodeOpts{types: []TypeSpec{spec}})
	id := ObjectID{App: "app_t", Type: "runs", Key: "a"}
	ctx := context.Background()
	if _, err := n.host.Request(ctx, id, "first"); err != nil { // activates it
		t.Fatal(err)
	}
	if _, err := n.host.Request(ctx, id, "write"); err != nil { // the first write
		t.Fatal(err)
	}
	s := n.host.shard(id)
	s.mu.RLock()
	act := s.m[id]
	s.mu.RUnlock()
	errs := make(chan error, 3)
	request := func(msg string) {
		_, err := n.host.Request(ctx, id, msg)
		errs <- err
	}
	go request("hold")
	<-entered
	// Queue "write" then "check" behind "hold": one mailbox run takes all three.
	go request("write")
	waitFor(t, "the write to be delivered", func() bool { return act.inflight.Load() == 2 })
	time.Sleep(20 * time.Millisecond) // admitted, then posted
	go request("check")
	waitFor(t, "the check to be delivered", func() bool { return act.inflight.Load() == 3 })
	time.Sleep(20 * time.Millisecond)
	close(release)
	for i := 0; i < 3; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// Without the commit at the start of "check", the write would wait for
	// the end of the run, and "check" would wait 5 s for it (or for the
	// sweeper's backstop, which waits a second first).
	if elapsed > 500*time.Millisecond {
		t.Fatalf("the write of the message before took %v to commit", elapsed)
	}
}

// warnings records the messages of the warnings logged through it.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(context.Context, slog.Level) bool { return true }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		w.mu.Lock()
		w.msgs = append(w.msgs, r.Message)
		w.mu.Unlock()
	}
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

// A write queued without anyone committing it (a delivery path that forgot)
// is committed by the sweeper once it has waited a second, with a warning.
func TestHost_TheSweeperCommitsWritesLeftQueued(t *testing.T) {
	var logged warnings
	n := startNode(t, t.TempDir(), nodeOpts{cfg: Config{Logger: slog.New(&logged)}})
	time.Sleep(50 * time.Millisecond) // the committer parks
	start := time.Now()
	tk := n.pipe.Queue(&persistence.Write{Sets: []persistence.KV{{Key: []byte("stranded"), Value: []byte("v")}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tk.Wait(ctx); err != nil {
		t.Fatalf("the stranded write was never committed: %v", err)
	}
	if waited := time.Since(start); waited < time.Second {
		t.Fatalf("committed after %v: something other than the sweeper committed it", waited)
	}
	logged.mu.Lock()
	defer logged.mu.Unlock()
	if len(logged.msgs) != 1 || !strings.Contains(logged.msgs[0], "commit queue") {
		t.Fatalf("warnings %q, want the commit queue's", logged.msgs)
	}
}
