package replication_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/holdfast/holdfast/replication"
	"github.com/holdfast/holdfast/replication/replicationtest"
)

// TestReadIndex_Basic: on the leader a read after acknowledged writes covers
// them (its index reaches theirs, and the leader has applied it when the read
// returns); on a follower ReadIndex fails at once with a NotLeaderError
// naming the leader.
func TestReadIndex_Basic(t *testing.T) {
	c := newCluster(t, replicationtest.Config{Nodes: 3, Groups: 4})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitLeaders(ctx); err != nil {
		t.Fatal(err)
	}
	for _, g := range c.GroupIDs() {
		var last replication.Result
		for i := range 3 {
			res, err := c.Propose(ctx, g, fmt.Appendf(nil, "g%d-%d", g, i))
			if err != nil {
				t.Fatalf("group %d proposal %d: %v", g, i, err)
			}
			last = res
		}
		// The leader may change between the write and the read (a loaded
		// machine): retry on whoever leads, a bounded number of times.
		var idx uint64
		var err error
		for range 20 {
			l := c.Leader(g)
			if l == 0 {
				err = errors.New("no leader")
				time.Sleep(10 * time.Millisecond)
				continue
			}
			if idx, err = c.Read(ctx, l, g); err == nil {
				st, serr := c.Engine(l).Status(g)
				if serr != nil {
					t.Fatal(serr)
				}
				if st.Applied < idx {
					t.Fatalf("group %d: read returned index %d with only %d applied", g, idx, st.Applied)
				}
				break
			}
		}
		if err != nil {
			t.Fatalf("group %d: read on the leader: %v", g, err)
		}
		if idx < last.Index {
			t.Fatalf("group %d: read index %d, below the last acknowledged write's %d", g, idx, last.Index)
		}
	}

	g := c.GroupIDs()[0]
	l := c.Leader(g)
	if l == 0 {
		t.Skip("leadership moved; the follower case needs a stable leader")
	}
	for _, id := range c.NodeIDs() {
		if id == l {
			continue
		}
		_, err := c.Engine(id).ReadIndex(ctx, g)
		var nle *replication.NotLeaderError
		if !errors.As(err, &nle) {
			t.Fatalf("ReadIndex on follower %d: got %v, want a *NotLeaderError", id, err)
		}
		if nle.Leader != 0 && nle.Leader != l {
			t.Fatalf("ReadIndex on follower %d: leader hint %d, the leader is %d", id, nle.Leader, l)
		}
	}
	if _, err := c.Engine(l).ReadIndex(ctx, 999); !errors.Is(err, replication.ErrUnknownGroup) {
		t.Fatalf("ReadIndex on an unknown group: got %v, want ErrUnknownGroup", err)
	}
	checkClean(t, c)
	if c.Checker.Reads() < len(c.GroupIDs()) {
		t.Fatalf("checker saw %d reads, want %d", c.Checker.Reads(), len(c.GroupIDs()))
	}
}

// TestReadIndex_CutOffLeader: a leader cut off from the others is asked to
// read while it still believes it leads; the rest elect a new leader and take
// a write. The old leader's read never succeeds: it fails with
// ErrReadNotConfirmed when CheckQuorum deposes it (not when its context
// ends), and later reads there fail with NotLeaderError.
func TestReadIndex_CutOffLeader(t *testing.T) {
	c := newCluster(t, replicationtest.Config{Nodes: 3, Groups: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitLeaders(ctx); err != nil {
		t.Fatal(err)
	}
	const g = replication.GroupID(1)
	if _, err := c.Propose(ctx, g, []byte("before")); err != nil {
		t.Fatal(err)
	}
	old := c.Leader(g)
	if old == 0 {
		t.Fatal("no leader")
	}
	var rest []replication.NodeID
	for _, id := range c.NodeIDs() {
		if id != old {
			rest = append(rest, id)
		}
	}
	c.Partition([]replication.NodeID{old}, rest)

	type result struct {
		idx uint64
		err error
	}
	done := make(chan result, 1)
	go func() {
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		defer rcancel()
		idx, err := c.Read(rctx, old, g)
		done <- result{idx, err}
	}()

	// The rest elect a leader and take a write.
	var nl replication.NodeID
	for nl == 0 {
		for _, id := range rest {
			if st, err := c.Engine(id).Status(g); err == nil && st.IsLeader {
				nl = id
			}
		}
		if ctx.Err() != nil {
			t.Fatal("the majority elected no leader")
		}
		time.Sleep(2 * time.Millisecond)
	}
	res, err := c.Engine(nl).Propose(ctx, g, []byte("after"))
	if err != nil {
		t.Fatalf("write on the new leader %d: %v", nl, err)
	}

	r := <-done
	var nle *replication.NotLeaderError
	switch {
	case r.err == nil:
		t.Fatalf("read on the cut-off leader %d succeeded at index %d (the new leader acknowledged index %d)", old, r.idx, res.Index)
	case errors.Is(r.err, context.DeadlineExceeded):
		// CheckQuorum deposes it within two election timeouts (0.2 s
		// here); the pending read must fail then, not wait for its context.
		t.Fatalf("read on the cut-off leader was still pending after 10 s: %v", r.err)
	case errors.Is(r.err, replication.ErrReadNotConfirmed), errors.As(r.err, &nle):
	default:
		t.Fatalf("read on the cut-off leader: got %v, want ErrReadNotConfirmed or a NotLeaderError", r.err)
	}
	// Deposed by now (it could not confirm the read before stepping down):
	// a new read fails at once.
	if _, err := c.Engine(old).ReadIndex(ctx, g); !errors.As(err, &nle) {
		t.Fatalf("read on the deposed leader: got %v, want a *NotLeaderError", err)
	}
	c.Heal()
	checkClean(t, c)
}

// TestReadIndex_FailsAtClose: a read the leader cannot confirm (it is cut
// off) fails with ErrClosed when its engine closes, whatever its stage.
func TestReadIndex_FailsAtClose(t *testing.T) {
	c := newCluster(t, replicationtest.Config{Nodes: 3, Groups: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitLeaders(ctx); err != nil {
		t.Fatal(err)
	}
	const g = replication.GroupID(1)
	l := c.Leader(g)
	if l == 0 {
		t.Fatal("no leader")
	}
	var rest []replication.NodeID
	for _, id := range c.NodeIDs() {
		if id != l {
			rest = append(rest, id)
		}
	}
	e := c.Engine(l)
	c.Partition([]replication.NodeID{l}, rest)
	done := make(chan error, 1)
	go func() {
		_, err := e.ReadIndex(ctx, g)
		done <- err
	}()
	c.Crash(l)
	if err := <-done; !errors.Is(err, replication.ErrClosed) {
		t.Fatalf("read pending at Close: got %v, want ErrClosed", err)
	}
}
