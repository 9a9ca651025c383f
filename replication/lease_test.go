package replication_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/replication"
	"github.com/holdfast/holdfast/replication/internal/testknobs"
	"github.com/holdfast/holdfast/replication/replicationtest"
)

const leaseGroup = replication.GroupID(1)

// waitLease waits until some node holds g's lease and returns it and the term.
func waitLease(ctx context.Context, t *testing.T, c *replicationtest.Cluster, g replication.GroupID) (replication.NodeID, uint64) {
	t.Helper()
	for {
		for _, id := range c.NodeIDs() {
			if e := c.Engine(id); e != nil {
				if term, ok := e.LeaseValid(g); ok {
					return id, term
				}
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("no node of group %d got a lease: %v", g, ctx.Err())
		}
		time.Sleep(time.Millisecond)
	}
}

func others(c *replicationtest.Cluster, id replication.NodeID) []replication.NodeID {
	var rest []replication.NodeID
	for _, n := range c.NodeIDs() {
		if n != id {
			rest = append(rest, n)
		}
	}
	return rest
}

// deafen cuts every link into node id (it still sends).
func deafen(c *replicationtest.Cluster, id replication.NodeID) {
	for _, n := range others(c, id) {
		c.Net.Cut(n, id)
	}
}

// higherLeader returns a node of among that leads g in a term above term (0:
// none).
func higherLeader(c *replicationtest.Cluster, g replication.GroupID, among []replication.NodeID, term uint64) replication.NodeID {
	for _, id := range among {
		if e := c.Engine(id); e != nil {
			if st, err := e.Status(g); err == nil && st.IsLeader && st.Term > term {
				return id
			}
		}
	}
	return 0
}

// TestLease_SteadyLeader: a steady leader holds the lease (for its term),
// followers never do, and a lease read sees the leader's acknowledged writes.
func TestLease_SteadyLeader(t *testing.T) {
	c := newCluster(t, replicationtest.Config{Nodes: 3, Groups: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitLeaders(ctx); err != nil {
		t.Fatal(err)
	}
	for _, g := range c.GroupIDs() {
		res, err := c.Propose(ctx, g, fmt.Appendf(nil, "w%d", g))
		if err != nil {
			t.Fatal(err)
		}
		l, term := waitLease(ctx, t, c, g)
		st, err := c.Engine(l).Status(g)
		if err != nil || !st.IsLeader || st.Term != term {
			t.Fatalf("group %d: node %d holds the lease of term %d, its status is %+v (%v)", g, l, term, st, err)
		}
		for range 20 {
			for _, f := range others(c, l) {
				if term, ok := c.Engine(f).LeaseValid(g); ok {
					t.Fatalf("group %d: follower %d holds a lease (term %d)", g, f, term)
				}
			}
			time.Sleep(time.Millisecond)
		}
		idx, err := c.LeaseRead(l, g)
		if err != nil {
			t.Fatalf("group %d: lease read on the leader: %v", g, err)
		}
		if idx < res.Index {
			t.Fatalf("group %d: lease read at %d, write acknowledged at %d", g, idx, res.Index)
		}
	}
	if _, ok := c.Engine(1).LeaseValid(99); ok {
		t.Fatal("a lease for an unknown group")
	}
	checkClean(t, c)
}

// TestLease_CutOffLeaderLosesLeaseFirst: a leader cut off from the majority
// loses its lease before any other replica leads in a later term. One
// goroutine samples, in order, "does a later-term leader exist?" then "is the
// old lease valid?": once the first answer was yes, every later yes to the
// second is a moment where both held. Several rounds, because without the
// lease's time bound the old leader outlives the new one's election in about
// half of them (CheckQuorum deposes it 1-2 election timeouts after the cut).
func TestLease_CutOffLeaderLosesLeaseFirst(t *testing.T) {
	c := newCluster(t, replicationtest.Config{Nodes: 3, Groups: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	g := leaseGroup
	for round := range 10 {
		old, term := waitLease(ctx, t, c, g)
		e := c.Engine(old)
		rest := others(c, old)
		c.Partition([]replication.NodeID{old}, rest)
		cut := time.Now()
		var lastValid, firstNew time.Time
		for firstNew.IsZero() || time.Since(firstNew) < 50*time.Millisecond {
			if ctx.Err() != nil {
				t.Fatalf("round %d: no new leader after the cut", round)
			}
			if nl := higherLeader(c, g, rest, term); nl != 0 && firstNew.IsZero() {
				firstNew = time.Now()
			}
			if _, ok := e.LeaseValid(g); ok {
				lastValid = time.Now()
				if !firstNew.IsZero() {
					t.Fatalf("round %d: node %d's lease of term %d valid %v after the cut, %v after a later-term leader appeared",
						round, old, term, lastValid.Sub(cut), lastValid.Sub(firstNew))
				}
			}
		}
		t.Logf("round %d: lease last seen valid %v after the cut, new leader seen %v after it", round, lastValid.Sub(cut), firstNew.Sub(cut))
		c.Heal()
	}
	checkClean(t, c)
}

// TestLease_TransferEndsLease: the lease ends when a transfer starts. The old
// leader is deafened first (nothing reaches it), so it does not step down when
// the transferee campaigns and gets no new acks: only the transfer can end
// its lease before the transferee leads. With the planted bug (the lease
// ignores transfers) the same check must fail.
func TestLease_TransferEndsLease(t *testing.T) {
	for _, planted := range []bool{false, true} {
		t.Run(fmt.Sprintf("planted=%v", planted), func(t *testing.T) {
			// ElectionTick 20: a lease of 161 ms, so that the transferee
			// leads well inside it even on a loaded machine.
			c := newCluster(t, replicationtest.Config{Nodes: 3, Groups: 1,
				Engine: replication.Config{TickInterval: 10 * time.Millisecond, ElectionTick: 20}})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			g := leaseGroup
			if err := c.WaitLeaders(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Propose(ctx, g, []byte("before")); err != nil {
				t.Fatal(err)
			}
			old, term := waitLease(ctx, t, c, g)
			e := c.Engine(old)
			if planted {
				testknobs.LeaseIgnoresTransfer(e)
			}
			to := others(c, old)[0]
			deafen(c, old)
			done := make(chan error, 1)
			tctx, tcancel := context.WithTimeout(ctx, 10*time.Second)
			defer tcancel()
			go func() { done <- e.TransferLeader(tctx, g, replication.ReplicaID(to)) }()
			// The moment the transferee is seen leading, the old lease
			// must be off (it was on just before the transfer).
			var nl replication.NodeID
			for nl == 0 {
				if tctx.Err() != nil {
					t.Fatalf("the transferee %d did not take over", to)
				}
				time.Sleep(200 * time.Microsecond)
				nl = higherLeader(c, g, []replication.NodeID{to}, term)
			}
			violation := ""
			if _, ok := e.LeaseValid(g); ok {
				violation = fmt.Sprintf("node %d's lease of term %d valid while node %d leads a later term", old, term, nl)
			}
			if planted {
				if violation == "" {
					t.Fatal("the planted bug (the lease ignores transfers) went unnoticed")
				}
				t.Logf("planted bug caught: %s", violation)
			} else if violation != "" {
				t.Fatal(violation)
			}
			// Once the old leader hears again, it follows the transferee
			// and TransferLeader reports success.
			c.Heal()
			if err := <-done; err != nil {
				t.Fatalf("TransferLeader: %v", err)
			}
			if _, ok := e.LeaseValid(g); ok {
				t.Fatal("the old leader holds a lease after the transfer")
			}
			if l, _ := waitLease(ctx, t, c, g); l != to {
				t.Fatalf("lease held by node %d, want the transferee %d", l, to)
			}
			checkClean(t, c)
		})
	}
}

// TestEngine_TransferLeader: a transfer returns once the target leads; on a
// follower it is refused with a NotLeaderError; to a non-member it fails.
func TestEngine_TransferLeader(t *testing.T) {
	c := newCluster(t, replicationtest.Config{Nodes: 3, Groups: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := leaseGroup
	if err := c.WaitLeaders(ctx); err != nil {
		t.Fatal(err)
	}
	old := c.Leader(g)
	to := others(c, old)[1]
	var nle *replication.NotLeaderError
	if err := c.Engine(to).TransferLeader(ctx, g, replication.ReplicaID(old)); !errors.As(err, &nle) {
		t.Fatalf("transfer on a follower: got %v, want a *NotLeaderError", err)
	}
	if err := c.Engine(old).TransferLeader(ctx, g, 42); err == nil {
		t.Fatal("transfer to a non-member succeeded")
	}
	if err := c.Engine(old).TransferLeader(ctx, g, replication.ReplicaID(to)); err != nil {
		t.Fatalf("transfer: %v", err)
	}
	for {
		if st, err := c.Engine(to).Status(g); err == nil && st.IsLeader {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("node %d does not lead after the transfer", to)
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := c.Propose(ctx, g, []byte("after")); err != nil {
		t.Fatal(err)
	}
	checkClean(t, c)
}

// TestEngine_TransferAbandoned: a transfer to a replica that cannot be
// reached is abandoned after an election timeout; the leader still leads and
// gets its lease back once the transferee answers a heartbeat sent after the
// transfer ended (the fence).
func TestEngine_TransferAbandoned(t *testing.T) {
	c := newCluster(t, replicationtest.Config{Nodes: 3, Groups: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := leaseGroup
	old, term := waitLease(ctx, t, c, g)
	to := others(c, old)[0]
	c.Net.Cut(old, to) // the MsgTimeoutNow never arrives; acks from to still do
	err := c.Engine(old).TransferLeader(ctx, g, replication.ReplicaID(to))
	if !errors.Is(err, replication.ErrTransferAbandoned) {
		t.Fatalf("transfer to an unreachable replica: got %v, want ErrTransferAbandoned", err)
	}
	if st, _ := c.Engine(old).Status(g); !st.IsLeader || st.Term != term {
		t.Fatalf("after the abandoned transfer: %+v, want leader of term %d", st, term)
	}
	// The fence: to hears no heartbeat, so no lease, although the third
	// replica acknowledges (a quorum with the leader).
	for range 30 {
		if _, ok := c.Engine(old).LeaseValid(g); ok {
			t.Fatal("lease valid before the transferee acknowledged a heartbeat sent after the transfer ended")
		}
		time.Sleep(time.Millisecond)
	}
	c.Heal()
	if l, lt := waitLease(ctx, t, c, g); l != old || lt != term {
		t.Fatalf("lease on node %d term %d, want node %d term %d", l, lt, old, term)
	}
	checkClean(t, c)
}

// TestLease_OldAcksDoNotCount: an ack of a heartbeat sent before this replica
// became leader (an older term) never counts, however recent. Heartbeats go
// every 20 ticks here, so a new leader has a window with no ack of its own.
func TestLease_OldAcksDoNotCount(t *testing.T) {
	c := newCluster(t, replicationtest.Config{Nodes: 3, Groups: 1,
		Engine: replication.Config{TickInterval: 10 * time.Millisecond, ElectionTick: 50, HeartbeatTick: 20}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	g := leaseGroup
	tested := false
	for attempt := 0; attempt < 5 && !tested; attempt++ {
		old, _ := waitLease(ctx, t, c, g)
		to := others(c, old)[attempt%2]
		before := time.Now() // before to leads
		if err := c.Engine(old).TransferLeader(ctx, g, replication.ReplicaID(to)); err != nil {
			t.Fatalf("transfer: %v", err)
		}
		e := c.Engine(to)
		// Propose through to, so that it applied an entry of its term.
		if _, err := e.Propose(ctx, g, fmt.Appendf(nil, "a%d", attempt)); err != nil {
			t.Fatalf("propose on the new leader: %v", err)
		}
		deafen(c, to) // no real ack from now on
		if _, ok := e.LeaseValid(g); ok {
			t.Logf("attempt %d: a heartbeat round came back already; again", attempt)
			c.Heal()
			continue
		}
		st, _ := e.Status(g)
		if !st.IsLeader {
			c.Heal()
			continue
		}
		for _, f := range others(c, to) {
			e.OnBeatAck(g, replication.ReplicaID(f), before)
		}
		if term, ok := e.LeaseValid(g); ok {
			t.Fatalf("lease of term %d from acks of heartbeats sent before the term began", term)
		}
		// The same ack sent now counts (the check above is not vacuous).
		e.OnBeatAck(g, replication.ReplicaID(others(c, to)[0]), time.Now())
		if term, ok := e.LeaseValid(g); !ok || term != st.Term {
			t.Fatalf("no lease of term %d from a fresh ack (got term %d, %v)", st.Term, term, ok)
		}
		tested = true
		c.Heal()
	}
	if !tested {
		t.Fatal("no attempt had a window without acks")
	}
	checkClean(t, c)
}

// TestLease_RestartedReplicaHoldsVotes: a replica that just started grants no
// vote of a higher term before ElectionTick ticks (it may have acked a
// heartbeat a lease counts). Its inbox is FIFO: a vote of a higher term
// then a heartbeat of the current leader are injected; a replica that took
// the vote ignores the heartbeat (lower term), one that held it follows.
func TestLease_RestartedReplicaHoldsVotes(t *testing.T) {
	c := newCluster(t, replicationtest.Config{Nodes: 3, Groups: 1,
		Engine: replication.Config{TickInterval: 10 * time.Millisecond, ElectionTick: 50}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := leaseGroup
	if err := c.WaitLeaders(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Propose(ctx, g, []byte("x")); err != nil {
		t.Fatal(err)
	}
	l := c.Leader(g)
	st, _ := c.Engine(l).Status(g)
	f, cand := others(c, l)[0], others(c, l)[1]
	c.Crash(f)
	deafen(c, f) // f hears nothing but what the test injects
	if err := c.Restart(f); err != nil {
		t.Fatal(err)
	}
	e := c.Engine(f)
	e.Receive([]replication.Envelope{
		{Group: g, Msg: &raftpb.Message{Type: raftpb.MsgVote.Enum(), From: new(uint64(cand)), To: new(uint64(f)),
			Term: new(st.Term + 5), LogTerm: new(st.Term + 5), Index: new(uint64(1 << 20))}},
		{Group: g, Msg: &raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), From: new(uint64(l)), To: new(uint64(f)),
			Term: new(st.Term)}},
	})
	for {
		fs, err := e.Status(g)
		if err != nil {
			t.Fatal(err)
		}
		if fs.Term > st.Term {
			t.Fatalf("the restarted replica took a vote of term %d at once", fs.Term)
		}
		if fs.Leader == l {
			break // it held the vote, then followed the heartbeat
		}
		if ctx.Err() != nil {
			t.Fatalf("the restarted replica took neither message: %+v", fs)
		}
		time.Sleep(time.Millisecond)
	}
	c.Heal()
	checkClean(t, c)
}

// TestLease_ClockJump: the lease is measured on the leader's clock (the test
// knob): when that clock jumps ahead by more than a lease, every ack it holds
// is too old at once; acks of heartbeats stamped on the new clock bring it
// back.
func TestLease_ClockJump(t *testing.T) {
	c := newCluster(t, replicationtest.Config{Nodes: 3, Groups: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := leaseGroup
	l, term := waitLease(ctx, t, c, g)
	c.SkewClock(l, time.Second)
	if _, ok := c.Engine(l).LeaseValid(g); ok {
		t.Fatal("lease valid after the leader's clock jumped a second ahead")
	}
	if l2, term2 := waitLease(ctx, t, c, g); l2 != l || term2 != term {
		t.Fatalf("lease on node %d term %d after the jump, want node %d term %d", l2, term2, l, term)
	}
	checkClean(t, c)
}

// TestEngine_TransferOnACutOffLeaderEnds: a transfer asked of a leader cut
// off from every other replica ends, ErrTransferAbandoned, well before the
// caller's context. (Raft's own abort at the election timeout usually ends
// it here; when the leader stepped down first (CheckQuorum, same term,
// leader unknown) it used to wait as long as the cut lasted: the stack
// test's leadership moves met that 1 run in 5.)
func TestEngine_TransferOnACutOffLeaderEnds(t *testing.T) {
	c := newCluster(t, replicationtest.Config{Nodes: 3, Groups: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := leaseGroup
	old, _ := waitLease(ctx, t, c, g)
	for _, o := range others(c, old) {
		c.Net.Cut(old, o)
		c.Net.Cut(o, old)
	}
	start := time.Now()
	err := c.Engine(old).TransferLeader(ctx, g, replication.ReplicaID(others(c, old)[0]))
	if !errors.Is(err, replication.ErrTransferAbandoned) || ctx.Err() != nil {
		t.Fatalf("transfer on a cut-off leader: %v after %v, want ErrTransferAbandoned before the context's end", err, time.Since(start))
	}
	c.Heal()
	checkClean(t, c)
}

// TestEngine_ACutOffLeaderAnswersItsProposals: a leader cut off from the
// majority steps down in its own term (CheckQuorum) and may never learn what
// became of its entries while the cut lasts: its pending proposals end with
// ErrOutcomeUnknown when it steps down, not when the cut heals.
func TestEngine_ACutOffLeaderAnswersItsProposals(t *testing.T) {
	c := newCluster(t, replicationtest.Config{Nodes: 3, Groups: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	g := leaseGroup
	old, _ := waitLease(ctx, t, c, g)
	c.Partition([]replication.NodeID{old}, others(c, old))
	done := make(chan error, 1)
	go func() {
		_, err := c.Engine(old).Propose(ctx, g, []byte("x"))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, replication.ErrOutcomeUnknown) && !errors.Is(err, replication.ErrNotWritten) {
			t.Fatalf("proposal on the cut-off leader: %v", err)
		}
		t.Logf("proposal on the cut-off leader: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("a proposal on a cut-off leader still waits 20 s after the cut")
	}
	c.Heal()
	checkClean(t, c)
}
