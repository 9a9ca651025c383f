package replication_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/replication"
	"github.com/holdfast/holdfast/replication/replicationtest"
)

// TestEngine_CoalescedCommitsReachFollowers: under load, leaders leave out
// commit-only appends that a later append of the same Ready carries
// (coalesce.go), and yet every follower learns every commit without waiting
// for a heartbeat: heartbeats here go every 900 ms, and after each burst of
// proposals every replica must have applied everything within 150 ms. An
// engine that dropped a commit-only append nothing later carried would leave
// a follower behind until the next heartbeat (in about 6 of 7 bursts).
func TestEngine_CoalescedCommitsReachFollowers(t *testing.T) {
	const groups, writers, perWriter, bursts = 4, 8, 40, 5
	c := newCluster(t, replicationtest.Config{
		Nodes: 3, Groups: groups,
		// 10 ms ticks (replicationtest's default): a heartbeat every 900 ms,
		// an election after 1-2 s of silence.
		Engine: replication.Config{ElectionTick: 100, HeartbeatTick: 90},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.WaitLeaders(ctx); err != nil {
		t.Fatal(err)
	}
	coalesced := func() (n uint64) {
		for _, id := range c.NodeIDs() {
			n += c.Engine(id).Stats().Coalesced
		}
		return n
	}
	for b := range bursts {
		var wg sync.WaitGroup
		errs := make(chan error, groups*writers)
		for _, g := range c.GroupIDs() {
			for w := range writers {
				wg.Go(func() {
					for i := range perWriter {
						if _, err := c.Propose(ctx, g, fmt.Appendf(nil, "b%d-g%d-w%d-%d", b, g, w, i)); err != nil {
							errs <- err
							return
						}
					}
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		// Propose returns once the leader applied: every follower must
		// have applied as far, soon after.
		deadline := time.Now().Add(150 * time.Millisecond)
		for _, g := range c.GroupIDs() {
			leader := c.Leader(g)
			if leader == 0 {
				t.Fatalf("burst %d: group %d has no leader", b, g)
			}
			st, err := c.Engine(leader).Status(g)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range c.NodeIDs() {
				for {
					f, err := c.Engine(id).Status(g)
					if err != nil {
						t.Fatal(err)
					}
					if f.Applied >= st.Applied {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("burst %d: group %d: node %d applied %d, the leader (node %d) %d: a commit did not reach it", b, g, id, f.Applied, leader, st.Applied)
					}
					time.Sleep(time.Millisecond)
				}
			}
		}
	}
	if coalesced() == 0 {
		t.Fatal("no commit-only append was coalesced: the test did not exercise it")
	}
	t.Logf("commit-only appends coalesced: %d", coalesced())
	checkClean(t, c)
}
