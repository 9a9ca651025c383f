package replicationtest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/holdfast/holdfast/replication"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// modelOptions select planted bugs (none in the real test).
type modelOptions struct {
	ackBeforeSync        bool
	staleReads           bool
	leaseIgnoresTransfer bool
	// reads and leaseReads, if set, count the reads that succeeded and
	// those of them served from a lease (so that a test can require the
	// read checks to have had something to check).
	reads, leaseReads *atomic.Int64
	// moves and installs, if set, count the moves that completed and the
	// snapshots installed (the membership checks must have had work).
	moves, installs *atomic.Int64
}

// runModel is the property: a random cluster (3 to 5 nodes, 3 or 5 replicas
// per group, 1-3 groups, logs compacted or not) runs random actions (proposal
// streams, read streams through ReadIndex or the leader lease, leadership
// transfers, crashes of any set of nodes at one instant losing what was not
// synced, restarts, partitions and heals, message faults, pauses, moves of a
// voter to a new replica on a node without one); after every action the
// Checker's invariants hold; at the end, once healed, restarted and quiet,
// every acknowledged proposal is applied on a majority of the newest
// config's voters. See Checker for the invariants.
func runModel(t *rapid.T, opts modelOptions) {
	nodes := rapid.SampledFrom([]int{3, 4, 5, 5}).Draw(t, "nodes")
	replicas := 3
	if nodes == 5 && rapid.Bool().Draw(t, "fiveReplicas") {
		replicas = 5
	}
	compactEvery := rapid.SampledFrom([]uint64{0, 8, 32}).Draw(t, "compactEvery")
	compactKeep := rapid.Uint64Range(0, 4).Draw(t, "compactKeep")
	groups := rapid.IntRange(1, 3).Draw(t, "groups")
	syncDelay := rapid.SampledFrom([]time.Duration{0, 500 * time.Microsecond, 2 * time.Millisecond}).Draw(t, "syncDelay")
	c, err := NewCluster(Config{
		Nodes: nodes, Groups: groups, Replicas: replicas,
		CompactEvery: compactEvery, CompactKeep: compactKeep,
		Seed:                 rapid.Uint64().Draw(t, "seed"),
		Engine:               replication.Config{TickInterval: 2 * time.Millisecond, ElectionTick: 10, Workers: 4},
		SyncDelay:            syncDelay,
		ackBeforeSync:        opts.ackBeforeSync,
		staleReads:           opts.staleReads,
		leaseIgnoresTransfer: opts.leaseIgnoresTransfer,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	ctx, cancel := context.WithCancel(context.Background())
	// Start from a cluster with leaders, so that the first actions meet a
	// working cluster rather than a starting one.
	lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
	err = c.WaitLeaders(lctx)
	lcancel()
	if err != nil {
		t.Fatal(err)
	}
	var streams sync.WaitGroup
	defer streams.Wait() // after cancel, before c.Close
	defer cancel()
	var running atomic.Int32
	var next atomic.Uint64

	ids := c.NodeIDs()
	down := func() (up, crashed []replication.NodeID) {
		for _, id := range ids {
			if c.Up(id) {
				up = append(up, id)
			} else {
				crashed = append(crashed, id)
			}
		}
		return up, crashed
	}
	// stream proposes n payloads to g, one after another, each waiting for
	// its outcome; it stops at the first failure.
	stream := func(t *rapid.T, g replication.GroupID) {
		if running.Load() >= 4 {
			t.Skip("enough streams")
		}
		n := rapid.IntRange(1, 20).Draw(t, "count")
		running.Add(1)
		streams.Go(func() {
			defer running.Add(-1)
			for range n {
				pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
				_, err := c.Propose(pctx, g, fmt.Appendf(nil, "g%d-%d", g, next.Add(1)))
				pcancel()
				if err != nil {
					return
				}
			}
		})
	}
	// leaderOf returns the engine of a node that believes it leads g (if
	// several do, a random one of them) and its id, or 0.
	leaderOf := func(t *rapid.T, g replication.GroupID, among []replication.NodeID) replication.NodeID {
		var leaders []replication.NodeID
		for _, id := range among {
			if e := c.Engine(id); e != nil {
				if st, err := e.Status(g); err == nil && st.IsLeader {
					leaders = append(leaders, id)
				}
			}
		}
		if len(leaders) == 0 {
			return 0
		}
		return rapid.SampledFrom(leaders).Draw(t, "leader")
	}
	var reading atomic.Int32
	var moving atomic.Bool
	// Move a voter of a group (the leader's too) to a new replica on a
	// node that hosts none: learner, catch-up (by snapshot when the
	// logs are compacted), one joint promote+remove. One move at a time;
	// it may fail (crashes, partitions): the checker watches either way.
	move := func(t *rapid.T) {
		if moving.Load() {
			t.Skip("a move is running")
		}
		g := replication.GroupID(rapid.IntRange(1, groups).Draw(t, "group"))
		l := c.Leader(g)
		e := c.Engine(l)
		if l == 0 || e == nil {
			t.Skip("no leader")
		}
		hosts := c.Hosts(g)
		var free []replication.NodeID
		for _, id := range ids {
			if _, ok := hosts[id]; !ok {
				free = append(free, id)
			}
		}
		cs, _, err := e.Membership(g)
		if len(free) == 0 || err != nil || len(cs.GetVotersOutgoing()) > 0 {
			t.Skip("no free node, or a move is half done")
		}
		remove := replication.ReplicaID(rapid.SampledFrom(cs.GetVoters()).Draw(t, "remove"))
		node := rapid.SampledFrom(free).Draw(t, "to")
		moving.Store(true)
		streams.Go(func() {
			defer moving.Store(false)
			mctx, mcancel := context.WithTimeout(ctx, 2*time.Second)
			defer mcancel()
			if _, err := c.Replace(mctx, g, node, remove); err == nil && opts.moves != nil {
				opts.moves.Add(1)
			}
		})
	}
	t.Repeat(map[string]func(*rapid.T){
		"move":      move,
		"moveAgain": move, // twice as likely: a move takes a while, and often fails
		"propose": func(t *rapid.T) {
			stream(t, replication.GroupID(rapid.IntRange(1, groups).Draw(t, "group")))
		},
		// A stream of reads on a node that believes it leads (the checker
		// checks every read that succeeds); failures are expected. Lease
		// reads fall back to ReadIndex when no lease holds (design
		// section 3).
		"read": func(t *rapid.T) {
			if reading.Load() >= 2 {
				t.Skip("enough readers")
			}
			g := replication.GroupID(rapid.IntRange(1, groups).Draw(t, "group"))
			l := leaderOf(t, g, ids)
			if l == 0 {
				t.Skip("no leader")
			}
			n := rapid.IntRange(1, 10).Draw(t, "count")
			lease := rapid.Bool().Draw(t, "lease")
			reading.Add(1)
			streams.Go(func() {
				defer reading.Add(-1)
				for range n {
					if lease {
						if _, err := c.LeaseRead(l, g); err == nil {
							_ = sleepCtx(ctx, time.Millisecond) // spread the reads over the run
							continue
						}
					}
					rctx, rcancel := context.WithTimeout(ctx, 100*time.Millisecond)
					_, _ = c.Read(rctx, l, g)
					rcancel()
					if ctx.Err() != nil {
						return
					}
				}
			})
		},
		// Cut a group's leader off from everyone and propose to the group at
		// once: the old leader takes proposals it cannot commit, which the
		// next leader's entries overwrite after a heal (ErrNotWritten).
		"isolateLeader": func(t *rapid.T) {
			g := replication.GroupID(rapid.IntRange(1, groups).Draw(t, "group"))
			l := c.Leader(g)
			if l == 0 {
				t.Skip("no leader")
			}
			var rest []replication.NodeID
			for _, id := range ids {
				if id != l {
					rest = append(rest, id)
				}
			}
			e := c.Engine(l)
			c.Partition([]replication.NodeID{l}, rest)
			payload := fmt.Appendf(nil, "g%d-%d", g, next.Add(1))
			streams.Go(func() {
				// Long enough to outlive a heal, at the latest the final one.
				pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
				defer pcancel()
				res, err := e.Propose(pctx, g, payload)
				switch {
				case err == nil:
					c.Checker.acked(g, payload, res)
				case errors.Is(err, replication.ErrNotWritten):
					c.Checker.notWritten(payload)
				}
			})
			// Once the rest elect a leader of their own, write through it,
			// then read on the old leader: the read must fail (or wait
			// until its context ends) while the old leader cannot reach a
			// quorum, however long it still believes it leads (CheckQuorum
			// deposes it within 20-40 ms).
			streams.Go(func() {
				deadline := time.Now().Add(150 * time.Millisecond)
				var nl replication.NodeID
				for nl == 0 && time.Now().Before(deadline) && ctx.Err() == nil {
					for _, id := range rest {
						if e := c.Engine(id); e != nil {
							if st, err := e.Status(g); err == nil && st.IsLeader {
								nl = id
							}
						}
					}
					_ = sleepCtx(ctx, time.Millisecond)
				}
				ne := c.Engine(nl)
				if nl == 0 || ne == nil {
					return
				}
				w := fmt.Appendf(nil, "g%d-%d", g, next.Add(1))
				pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
				res, err := ne.Propose(pctx, g, w)
				pcancel()
				switch {
				case err == nil:
					c.Checker.acked(g, w, res)
				case errors.Is(err, replication.ErrNotWritten):
					c.Checker.notWritten(w)
					return
				default:
					return
				}
				_, _ = c.LeaseRead(l, g)
				rctx, rcancel := context.WithTimeout(ctx, 100*time.Millisecond)
				_, _ = c.Read(rctx, l, g)
				rcancel()
			})
			// Hold the cut long enough, often, for the rest to elect (the
			// election timeout is 20-40 ms).
			time.Sleep(time.Duration(rapid.IntRange(0, 80).Draw(t, "holdMs")) * time.Millisecond)
		},
		// Transfer a group's leadership to another running replica, the old
		// leader deafened first or not (then it hears nothing, so it does
		// not step down when the transferee campaigns: only the transfer
		// itself can end its lease in time). Once the transferee leads,
		// write through it, then read on the old leader from its lease.
		"transfer": func(t *rapid.T) {
			g := replication.GroupID(rapid.IntRange(1, groups).Draw(t, "group"))
			l := leaderOf(t, g, ids)
			e := c.Engine(l)
			if l == 0 || e == nil {
				t.Skip("no leader")
			}
			st, err := e.Status(g)
			if err != nil {
				t.Skip("no status")
			}
			var targets []replication.NodeID
			for _, id := range ids {
				if id != l && c.Up(id) {
					targets = append(targets, id)
				}
			}
			if len(targets) == 0 {
				t.Skip("no target")
			}
			to := rapid.SampledFrom(targets).Draw(t, "to")
			if rapid.Bool().Draw(t, "deafen") {
				for _, id := range ids {
					if id != l {
						c.Net.Cut(id, l)
					}
				}
			}
			streams.Go(func() {
				tctx, tcancel := context.WithTimeout(ctx, 100*time.Millisecond)
				_ = e.TransferLeader(tctx, g, replication.ReplicaID(to))
				tcancel()
			})
			streams.Go(func() {
				deadline := time.Now().Add(100 * time.Millisecond)
				var ne *replication.Engine
				for ne == nil && time.Now().Before(deadline) && ctx.Err() == nil {
					if te := c.Engine(to); te != nil {
						if ts, err := te.Status(g); err == nil && ts.IsLeader && ts.Term > st.Term {
							ne = te
							break
						}
					}
					_ = sleepCtx(ctx, 200*time.Microsecond)
				}
				if ne == nil {
					return
				}
				w := fmt.Appendf(nil, "g%d-%d", g, next.Add(1))
				pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
				res, err := ne.Propose(pctx, g, w)
				pcancel()
				switch {
				case err == nil:
					c.Checker.acked(g, w, res)
				case errors.Is(err, replication.ErrNotWritten):
					c.Checker.notWritten(w)
					return
				default:
					return
				}
				_, _ = c.LeaseRead(l, g)
			})
		},
		// A power cut of 1..all running nodes at one instant.
		"crash": func(t *rapid.T) {
			up, _ := down()
			if len(up) == 0 {
				t.Skip("all down")
			}
			victims := rapid.SliceOfNDistinct(rapid.SampledFrom(up), 1, len(up), rapid.ID[replication.NodeID]).Draw(t, "victims")
			c.Crash(victims...)
		},
		"restart": func(t *rapid.T) {
			_, crashed := down()
			if len(crashed) == 0 {
				t.Skip("none down")
			}
			id := rapid.SampledFrom(crashed).Draw(t, "node")
			if err := c.Restart(id); err != nil {
				t.Fatalf("restart node %d: %v", id, err)
			}
		},
		"partition": func(t *rapid.T) {
			var a, b []replication.NodeID
			for _, id := range ids {
				if rapid.Bool().Draw(t, fmt.Sprintf("side%d", id)) {
					a = append(a, id)
				} else {
					b = append(b, id)
				}
			}
			c.Partition(a, b)
		},
		"heal": func(*rapid.T) { c.Heal() },
		"faults": func(t *rapid.T) {
			f := rapid.SampledFrom([]Faults{
				{},
				{Drop: 0.05, Duplicate: 0.05, MaxDelay: time.Millisecond},
				{Drop: 0.2, Duplicate: 0.1, MaxDelay: 5 * time.Millisecond},
				{MaxDelay: 3 * time.Millisecond},
			}).Draw(t, "faults")
			c.Net.SetFaults(f)
		},
		"pause": func(t *rapid.T) {
			time.Sleep(time.Duration(rapid.IntRange(1, 30).Draw(t, "ms")) * time.Millisecond)
		},
		"": func(t *rapid.T) {
			// Let a little real time pass between actions: raft works in ticks
			// (2 ms), and without this a whole run would fit in a few ticks.
			time.Sleep(3 * time.Millisecond)
			if err := c.Checker.Err(); err != nil {
				t.Fatalf("invariant violated: %v", err)
			}
			if err := c.Err(); err != nil {
				t.Fatalf("cluster failure: %v", err)
			}
		},
	})

	// Quiesce: the network heals, every node runs again, the streams end
	// (each proposal is bounded); then every acknowledged proposal must reach
	// a majority.
	c.Heal()
	c.Net.SetFaults(Faults{})
	_, crashed := down()
	for _, id := range crashed {
		if err := c.Restart(id); err != nil {
			t.Fatalf("restart node %d: %v", id, err)
		}
	}
	streams.Wait()
	if opts.reads != nil {
		opts.reads.Add(int64(c.Checker.Reads()))
	}
	if opts.leaseReads != nil {
		opts.leaseReads.Add(int64(c.Checker.LeaseReads()))
	}
	if opts.installs != nil {
		opts.installs.Add(int64(c.Checker.Installs()))
	}
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	werr := c.WaitAcked(wctx)
	if err := c.Checker.Err(); err != nil {
		t.Fatalf("invariant violated: %v", err)
	}
	if err := c.Err(); err != nil {
		t.Fatalf("cluster failure: %v", err)
	}
	if werr != nil {
		t.Fatalf("after healing: %v", werr)
	}
}

// cmdlineFlags are the flags the command line set, taken before any
// setRapidFlag: flag.Visit also lists the flags flag.Set set, so a later
// look would take an earlier test's setting for the command line's.
var cmdlineFlags = sync.OnceValue(func() map[string]bool {
	set := make(map[string]bool)
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
})

// setRapidFlag sets one of rapid's flags unless the command line did, and
// returns the restore function.
func setRapidFlag(name, value string) func() {
	if cmdlineFlags()[name] {
		return func() {}
	}
	old := flag.Lookup(name).Value.String()
	_ = flag.Set(name, value)
	return func() { _ = flag.Set(name, old) }
}

// TestModel is the model test. Each check runs a fresh cluster for about a
// second of real time, so the default is 40 checks (8 with -short; rapid
// divides by 5); -rapid.checks overrides.
func TestModel(t *testing.T) {
	defer setRapidFlag("rapid.checks", "40")()
	var reads, leaseReads, moves, installs atomic.Int64
	rapid.Check(t, func(t *rapid.T) {
		runModel(t, modelOptions{reads: &reads, leaseReads: &leaseReads, moves: &moves, installs: &installs})
	})
	if !t.Failed() && reads.Load() == 0 {
		t.Fatal("no read succeeded in any run: the read checks checked nothing")
	}
	if !t.Failed() && !testing.Short() && leaseReads.Load() == 0 { // -short runs 8 checks: too few to require one
		t.Fatal("no lease read succeeded in any run: the lease checks checked nothing")
	}
	if !t.Failed() && !testing.Short() && (moves.Load() == 0 || installs.Load() == 0) {
		t.Fatalf("%d moves completed and %d snapshots installed in all runs: the membership checks checked nothing", moves.Load(), installs.Load())
	}
	t.Logf("%d reads checked (%d from a lease), %d moves completed, %d snapshots installed", reads.Load(), leaseReads.Load(), moves.Load(), installs.Load())
}

// failureTB is a rapid.TB that records failures instead of failing the test,
// so that a test can require rapid to find a counterexample.
type failureTB struct {
	*testing.T
	mu     sync.Mutex
	failed bool
	msgs   []string
}

func (f *failureTB) record(s string) {
	f.mu.Lock()
	f.failed = true
	f.msgs = append(f.msgs, s)
	f.mu.Unlock()
}
func (f *failureTB) Errorf(format string, args ...any) { f.record(fmt.Sprintf(format, args...)) }
func (f *failureTB) Error(args ...any)                 { f.record(fmt.Sprint(args...)) }
func (f *failureTB) Fatalf(format string, args ...any) { f.record(fmt.Sprintf(format, args...)) }
func (f *failureTB) Fatal(args ...any)                 { f.record(fmt.Sprint(args...)) }
func (f *failureTB) Fail()                             { f.record("Fail") }
func (f *failureTB) FailNow()                          { f.record("FailNow") }
func (f *failureTB) Failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}
func (f *failureTB) Logf(string, ...any) {}
func (f *failureTB) Log(...any)          {}

// TestModel_PlantedBugs runs the same property with a planted bug and
// requires rapid to find a counterexample.
func TestModel_PlantedBugs(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts modelOptions
	}{
		// The pipeline delivers append responses (a follower's MsgAppResp,
		// the leader's own) before the sync: raft counts an entry durable
		// that a crash then loses.
		{"AckBeforeSync", modelOptions{ackBeforeSync: true}},
		// ReadIndex is answered from the replica's own commit index, without
		// a quorum round: a leader cut off from the majority serves stale
		// reads while a new leader takes writes.
		{"StaleReads", modelOptions{staleReads: true}},
		// The lease is not ended when a leadership transfer starts: the
		// transferee's forced campaign bypasses the followers' lease, so a
		// deafened old leader serves lease reads while the transferee
		// takes writes.
		{"LeaseIgnoresTransfer", modelOptions{leaseIgnoresTransfer: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer setRapidFlag("rapid.checks", "500")() // stops at the first counterexample; -short divides by 5
			defer setRapidFlag("rapid.nofailfile", "true")()
			defer setRapidFlag("rapid.shrinktime", "2s")()
			tb := &failureTB{T: t}
			start := time.Now()
			rapid.Check(tb, func(t *rapid.T) { runModel(t, tc.opts) })
			if !tb.Failed() {
				t.Fatalf("the model test found no counterexample with the planted bug %s", tc.name)
			}
			msg := strings.Join(tb.msgs, "\n")
			if !strings.Contains(msg, "invariant violated") && !strings.Contains(msg, "restart node") &&
				!strings.Contains(msg, "cluster failure") && !strings.Contains(msg, "after healing") {
				t.Fatalf("the property failed, but not on one of its checks: %s", msg)
			}
			if len(msg) > 600 {
				msg = msg[:600]
			}
			t.Logf("caught in %v: %s", time.Since(start).Round(time.Millisecond), msg)
		})
	}
}
