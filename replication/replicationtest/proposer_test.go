package replicationtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/holdfast/holdfast/persistence"
	"github.com/holdfast/holdfast/replication"
)

// leaderOf waits until group g has a leader and returns its node and term.
func (c *walCluster) leaderOf(t *testing.T, g replication.GroupID) (replication.NodeID, uint64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if id := c.leader(g); id != 0 {
			if st, err := c.engine(id).Status(g); err == nil && st.IsLeader {
				return id, st.Term
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("group %d elected no leader", g)
	return 0, 0
}

func proposerWrite(part uint32, epoch uint64, chain *persistence.Chain, key string) *persistence.Write {
	return &persistence.Write{Partition: part, Epoch: epoch, Chain: chain, Sets: []persistence.KV{{Key: []byte(key), Value: []byte("v-" + key)}}}
}

// inBadgerOn says whether node id's Badger holds key.
func (c *walCluster) inBadgerOn(t *testing.T, id replication.NodeID, key string) bool {
	t.Helper()
	c.mu.Lock()
	db := c.nodes[id].db
	c.mu.Unlock()
	_, found, err := db.Get(context.Background(), []byte(key))
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// inBadger counts the nodes whose Badger holds key.
func (c *walCluster) inBadger(t *testing.T, key string) int {
	t.Helper()
	n := 0
	for id := range c.nodes {
		c.mu.Lock()
		db := c.nodes[id].db
		c.mu.Unlock()
		if _, found, err := db.Get(context.Background(), []byte(key)); err != nil {
			t.Fatal(err)
		} else if found {
			n++
		}
	}
	return n
}

// TestProposer_WritesCommitOnAMajorityThenComplete: the actors' pipeline over
// raft. A write of the leader's term completes once committed, is marked
// applied once the leader's Badger shows it, and is in Badger on a majority; a
// write of another term, or proposed on a follower, is refused as not
// written and never reaches any Badger; once a write of a chain is refused,
// the later writes of the chain are refused too, although they are of the
// right term; WaitApplied returns once every earlier write is applied.
func TestProposer_WritesCommitOnAMajorityThenComplete(t *testing.T) {
	c := newWALCluster(t, 3, 2, uint64(time.Now().UnixNano()))
	defer c.close()
	const g = replication.GroupID(1)
	lead, term := c.leaderOf(t, g)
	c.mu.Lock()
	n := c.nodes[lead]
	prop := replication.NewProposer(n.e, n.pp)
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	var tickets []*persistence.Ticket
	chain := &persistence.Chain{}
	for i := range 20 {
		tickets = append(tickets, prop.Queue(proposerWrite(uint32(g), term, chain, fmt.Sprintf("p/ok-%d", i))))
	}
	before := prop.AppliedSeq()
	for i, tk := range tickets {
		if err := tk.Wait(ctx); err != nil {
			t.Fatalf("write %d: %v (the leader may have changed: term %d)", i, err, term)
		}
	}
	// Completed at commit; marked applied once the leader applied it.
	for i, tk := range tickets {
		for !tk.Applied() {
			if ctx.Err() != nil {
				t.Fatalf("write %d completed but never marked applied", i)
			}
			time.Sleep(time.Millisecond)
		}
		if c.inBadgerOn(t, lead, fmt.Sprintf("p/ok-%d", i)) == false {
			t.Fatalf("write %d marked applied, but the leader's Badger does not hold it", i)
		}
	}
	if prop.AppliedSeq() == before && before < 20 {
		t.Fatalf("AppliedSeq did not move (%d)", before)
	}
	// Committed on a majority; the followers apply when they learn the
	// commit index (the next append or heartbeat).
	for i := range 20 {
		k := fmt.Sprintf("p/ok-%d", i)
		for got := c.inBadger(t, k); got < 2; got = c.inBadger(t, k) {
			if ctx.Err() != nil {
				t.Fatalf("%s is in Badger on %d nodes, want a majority", k, got)
			}
			time.Sleep(time.Millisecond)
		}
	}

	// Another term: refused, never written.
	stale := prop.Queue(proposerWrite(uint32(g), term+1, nil, "p/stale"))
	if err := stale.Wait(ctx); !errors.Is(err, replication.ErrNotWritten) {
		t.Fatalf("a write of term %d on the leader of term %d: %v, want ErrNotWritten", term+1, term, err)
	}
	// A chain: its first write refused, the next ones refused with it.
	broken := &persistence.Chain{}
	first := prop.Queue(proposerWrite(uint32(g), term+1, broken, "p/chain-0"))
	next := prop.Queue(proposerWrite(uint32(g), term, broken, "p/chain-1"))
	if err := first.Wait(ctx); !errors.Is(err, replication.ErrNotWritten) {
		t.Fatalf("the chain's first write: %v, want ErrNotWritten", err)
	}
	if err := next.Wait(ctx); !errors.Is(err, replication.ErrNotWritten) {
		t.Fatalf("the chain's write after a refused one: %v, want ErrNotWritten", err)
	}
	// A retired chain: its writes that raft has not taken are refused with
	// the error it was retired with; a write taken before stays written.
	retired := &persistence.Chain{}
	kept := prop.Queue(proposerWrite(uint32(g), term, retired, "p/retired-0"))
	if err := kept.Wait(ctx); err != nil {
		t.Fatalf("a write before its chain was retired: %v", err)
	}
	errRetired := errors.New("the activation left the routing table")
	retired.Retire(errRetired)
	late := prop.Queue(proposerWrite(uint32(g), term, retired, "p/retired-1"))
	if err := late.Wait(ctx); !errors.Is(err, replication.ErrNotWritten) || !errors.Is(err, errRetired) {
		t.Fatalf("a write of a retired chain: %v, want ErrNotWritten and the retirement's error", err)
	}
	// On a follower: not the leader.
	follower := lead%3 + 1
	c.mu.Lock()
	fn := c.nodes[follower]
	fprop := replication.NewProposer(fn.e, fn.pp)
	c.mu.Unlock()
	var nl *replication.NotLeaderError
	if err := fprop.Queue(proposerWrite(uint32(g), term, nil, "p/follower")).Wait(ctx); !errors.As(err, &nl) {
		t.Fatalf("a write on a follower: %v, want *NotLeaderError", err)
	}
	if err := prop.WaitPartition(ctx, uint32(g)); err != nil {
		t.Fatal(err)
	}
	if !c.inBadgerOn(t, lead, "p/retired-0") {
		t.Fatal("a write taken before its chain was retired is not in the leader's Badger")
	}
	for _, k := range []string{"p/stale", "p/chain-0", "p/chain-1", "p/follower", "p/retired-1"} {
		if got := c.inBadger(t, k); got != 0 {
			t.Fatalf("%s, refused, is in Badger on %d nodes", k, got)
		}
	}
	// WaitApplied covers the writes queued before it.
	last := prop.Queue(proposerWrite(uint32(g), term, nil, "p/last"))
	if err := prop.WaitPartition(ctx, uint32(g)); err != nil {
		t.Fatal(err)
	}
	if !last.Done() || !last.Applied() {
		t.Fatal("WaitApplied returned before an earlier write was applied")
	}
	if err := fprop.WaitPartition(ctx, uint32(g)); !errors.As(err, &nl) {
		t.Fatalf("WaitApplied on a follower: %v, want *NotLeaderError", err)
	}
}
