package cluster

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// oneNodeWithData starts a cluster of node a alone, writes slot v = p to one
// object of every partition, and returns the objects' keys by partition.
func oneNodeWithData(t *testing.T) (*testCluster, *Node, []string) {
	t.Helper()
	tc := newTestCluster(t)
	a := tc.start("a")
	tc.waitStable(30 * time.Second)
	return tc, a, tc.setAll(context.Background(), a)
}

// setAll writes slot v = p to one object of every partition through n, and
// returns the objects' keys by partition.
func (tc *testCluster) setAll(ctx context.Context, n *Node) []string {
	tc.t.Helper()
	keys := make([]string, testPartitions)
	for p := range uint32(testPartitions) {
		keys[p] = keyIn(p)
		if _, err := tc.set(ctx, n, keys[p], "v", int(p)); err != nil {
			tc.t.Fatal(err)
		}
	}
	return keys
}

// checkAll reads every object setAll wrote, through n.
func (tc *testCluster) checkAll(ctx context.Context, n *Node, keys []string) {
	tc.t.Helper()
	for p, key := range keys {
		st, _, err := tc.get(ctx, n, key)
		if err != nil {
			tc.t.Fatalf("partition %d: %v", p, err)
		}
		if got := string(st.State["v"]); got != strconv.Itoa(p) {
			tc.t.Fatalf("partition %d's object holds v=%q, want %d (state %v)", p, got, p, st.State)
		}
	}
}

// TestCluster_HandoffFailingAfterTheFreeze: a handoff whose table switch fails
// (its reply lost) after the owner stopped writes. The owner never serves the
// partition again at its old epoch (a write an old activation raced past the
// freeze would commit under it): it takes it up at a new one. The switch, were
// it still on its way to etcd, can no longer land, so the target, told to drop
// what it got, can never be made owner of a partition it emptied. Once
// switches go through, the partition moves with all its data.
func TestCluster_HandoffFailingAfterTheFreeze(t *testing.T) {
	tc, a, keys := oneNodeWithData(t)
	ctx := context.Background()

	type failure struct {
		p   uint32
		cur PartEntry
	}
	var failing atomic.Bool
	failing.Store(true)
	failed := make(chan failure, 1)
	hook := func(p uint32, cur PartEntry) error {
		if !failing.Load() {
			return nil
		}
		select {
		case failed <- failure{p, cur}:
		default:
		}
		return errors.New("test: the switch's reply was lost")
	}
	a.member.beforeSwitch.Store(&hook)
	tc.start("b") // half the partitions are to move to b

	var f failure
	select {
	case f = <-failed:
	case <-time.After(30 * time.Second):
		t.Fatal("no handoff reached its switch")
	}
	// a serves the partition again, at a new epoch only (retries keep failing).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if e := a.member.servingEpoch(f.p); e != 0 {
			if e <= f.cur.Epoch {
				t.Fatalf("a serves partition %d at epoch %d again after a failed handoff at epoch %d", f.p, e, f.cur.Epoch)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a does not serve partition %d again after its failed handoff", f.p)
		}
	}
	// The switch, had it still been on its way, fails its compare now.
	if err := casPart(ctx, a.member.cli, a.member.k, f.p, f.cur, PartEntry{Owner: "b", Epoch: f.cur.Epoch}); !errors.Is(err, errConflict) {
		t.Fatalf("a late switch of partition %d: %v, want a conflict", f.p, err)
	}
	tc.checkAll(ctx, a, keys)

	failing.Store(false)
	tc.waitStable(60 * time.Second)
	tc.checkAll(ctx, a, keys)
	tc.checkAll(ctx, tc.node("b"), keys)
	if err := tc.check.Verify(); err != nil {
		t.Fatal(err)
	}
	tc.activity.verify(t)
}

// TestCluster_CleanupKeepsAPartitionEtcdSaysIsOurs: a node about to delete
// its copy of a partition it believes another node owns (its view lags behind
// etcd, as after a handoff whose end it heard before the switch) reads the
// entry first, and keeps the data when the partition is in fact its own.
func TestCluster_CleanupKeepsAPartitionEtcdSaysIsOurs(t *testing.T) {
	tc, a, keys := oneNodeWithData(t)
	ctx := context.Background()
	const p = 3
	m := a.member
	m.mu.Lock()
	m.stopServing(p)
	m.state[p] = stCleaning
	m.stale[p] = true
	m.mu.Unlock()
	m.clean(p)
	m.mu.Lock()
	st, stale := m.state[p], m.stale[p]
	m.mu.Unlock()
	if st != stIdle || stale {
		t.Fatalf("after a cleanup of its own partition: state %d, stale %v; want idle, not stale", st, stale)
	}
	tc.waitStable(30 * time.Second) // a takes it up again
	tc.checkAll(ctx, a, keys)
}
