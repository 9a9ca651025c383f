package replicationtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/replication"
)

// The actors' Proposer is a Pipeline (replication cannot import actors).
var _ actors.Pipeline = (*replication.Proposer)(nil)

// hostOn starts an actors host on node id over its Proposer, serving the
// partitions (groups) its replica leads, each in the term it leads.
func (c *walCluster) hostOn(t *testing.T, id replication.NodeID) *actors.Host {
	t.Helper()
	c.mu.Lock()
	n := c.nodes[id]
	c.mu.Unlock()
	e := n.e
	epoch := func(p uint32) uint64 {
		st, err := e.Status(replication.GroupID(p))
		if err != nil || !st.IsLeader {
			return 0
		}
		return st.Term
	}
	h := actors.NewHost(n.db, replication.NewProposer(e, n.pp), actors.Config{
		Epoch: epoch,
		Partitions: func() []uint32 {
			var out []uint32
			for _, g := range c.groups {
				if epoch(uint32(g)) != 0 {
					out = append(out, uint32(g))
				}
			}
			return out
		},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	h.Start()
	return h
}

// leadAll moves the leadership of every group to node to.
func (c *walCluster) leadAll(t *testing.T, to replication.NodeID) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, g := range c.groups {
		for {
			lead, _ := c.leaderOf(t, g)
			if lead == to {
				break
			}
			if err := c.engine(lead).TransferLeader(ctx, g, replication.ReplicaID(to)); err != nil && ctx.Err() != nil {
				t.Fatalf("group %d: move the leadership to node %d: %v", g, to, err)
			}
		}
	}
}

// increment adds 1 to id's slot n through h on node at, with idempotency key
// key, trying again while the partition is not served there (a spurious
// election moved its leadership: it is moved back) or the outcome is
// unknown: the key makes a retried increment count once.
func (c *walCluster) increment(ctx context.Context, t *testing.T, h *actors.Host, at replication.NodeID, id actors.ObjectID, key string) error {
	w := &actors.KVWrite{Route: actors.RouteIncrement, Ops: []actors.Op{{Op: "increment", Key: "n"}}, IdempotencyKey: key}
	for {
		_, err := actors.NewKV(h, id).Write(ctx, w)
		var ae *actors.Error
		if err == nil || !errors.As(err, &ae) || ae.Kind != actors.KindUnavailable || ctx.Err() != nil {
			if err != nil {
				return fmt.Errorf("%v: %w", id, err)
			}
			return nil
		}
		c.moveMu.Lock()
		c.leadAll(t, at)
		c.moveMu.Unlock()
	}
}

func counter(t *testing.T, h *actors.Host, id actors.ObjectID) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	raw, err := actors.NewKV(h, id).GetSlot(ctx, "n")
	if err != nil {
		t.Fatalf("%v: %v", id, err)
	}
	var n int
	if err := json.Unmarshal(raw, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestActors_KVObjectsOverRaftSurviveTheirLeadersCrash: KV objects served by
// an actors host whose writes go through raft (the Proposer over the
// WAL-backed engine, three replicas per partition): every acknowledged
// increment is there after the node that served them crashes and another
// replica's node serves the objects from its own Badger, and the objects
// take writes again there.
func TestActors_KVObjectsOverRaftSurviveTheirLeadersCrash(t *testing.T) {
	c := newWALCluster(t, 3, 4, uint64(time.Now().UnixNano()))
	defer c.close()
	c.leadAll(t, 1)
	h1 := c.hostOn(t, 1)
	const objects, each = 8, 25
	ids := make([]actors.ObjectID, objects)
	for i := range ids {
		ids[i] = actors.ObjectID{App: "app_t", Type: "counter", Key: fmt.Sprintf("k%d", i)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, objects)
	for _, id := range ids {
		wg.Go(func() {
			for i := range each {
				if err := c.increment(ctx, t, h1, 1, id, fmt.Sprintf("%s-%d", id.Key, i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, id := range ids {
		if n := counter(t, h1, id); n != each {
			t.Fatalf("%v = %d on node 1, want %d", id, n, each)
		}
	}
	if err := h1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	c.crash(1)
	c.leadAll(t, 2)
	h2 := c.hostOn(t, 2)
	defer func() { _ = h2.Close(context.Background()) }()
	for _, id := range ids {
		if n := counter(t, h2, id); n != each {
			t.Fatalf("%v = %d on node 2 after node 1 crashed, want %d", id, n, each)
		}
		if err := c.increment(ctx, t, h2, 2, id, id.Key+"-after"); err != nil {
			t.Fatal(err)
		}
		if n := counter(t, h2, id); n != each+1 {
			t.Fatalf("%v = %d after one more increment, want %d", id, n, each+1)
		}
	}
	if err := c.start(1); err != nil { // back as a follower: it catches up
		t.Fatal(err)
	}
	if err := c.checker.Err(); err != nil {
		t.Fatal(err)
	}
}
