package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
)

// TestCluster_ClientMemberUsesEveryBehaviour: a Go service joins as a client
// member and uses the typed APIs (KV, log, leases, queue, alarms) on objects of
// every node, with the same typed errors as the embedded API.
func TestCluster_ClientMemberUsesEveryBehaviour(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start("a")
	tc.start("b")
	tc.waitStable(30 * time.Second)
	c, err := StartClient(ClientConfig{Name: tc.name, ID: "svc", Endpoints: []string{tc.etcd.Endpoint()}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, owner := range []string{"a", "b"} {
		id := keyOwnedBy(t, a, "kv", owner)
		kv := actors.NewKV(c, id)
		// An object's first log_id follows a floor of its partition's epoch
		// (issue 26, actors/logfloor.go): a multiple of 2^32.
		if r, err := kv.Set(ctx, "x", 41); err != nil || r.LogID%(1<<32) != 1 {
			t.Fatalf("set on %s's object: %+v %v", owner, r, err)
		}
		if r, err := kv.Increment(ctx, "x", 1); err != nil || string(r.Value) != "42" {
			t.Fatalf("increment: %+v %v", r, err)
		}
		if _, err := kv.GetSlot(ctx, "missing"); !errors.Is(err, actors.ErrNotFound) {
			t.Fatalf("missing slot: %v", err)
		}

		lg := actors.NewLog(c, keyOwnedBy(t, a, "leased", owner))
		offs, err := lg.Append(ctx, actors.LogInput{Body: json.RawMessage(`1`)}, actors.LogInput{Body: json.RawMessage(`2`)})
		if err != nil || len(offs) != 2 || offs[1] != offs[0]+1 {
			t.Fatalf("append: %v %v", offs, err)
		}
		page, err := lg.Read(ctx, offs[0], 10)
		if err != nil || len(page.Records) != 2 {
			t.Fatalf("read: %+v %v", page, err)
		}
		lease, err := lg.Lease(ctx, "c1", 10)
		if err != nil || lease.FirstOffset != offs[0] || lease.LastOffset != offs[1] {
			t.Fatalf("lease: %+v %v", lease, err)
		}
		if _, err := lg.Ack(ctx, "c1", lease.BatchID); err != nil {
			t.Fatalf("ack: %v", err)
		}
		if _, err := lg.Ack(ctx, "c1", lease.BatchID); !errors.Is(err, actors.ErrLeaseNotHeld) {
			t.Fatalf("second ack: %v", err)
		}
		if _, err := actors.NewLog(c, keyOwnedBy(t, a, "plain", owner)).Lease(ctx, "c1", 10); !errors.Is(err, actors.ErrLeasesDisabled) {
			t.Fatalf("lease without leases: %v", err)
		}

		q := actors.NewQueue(c, keyOwnedBy(t, a, "work", owner))
		if _, err := q.Enqueue(ctx, actors.QueueMessageIn{ID: "m1", Payload: json.RawMessage(`"p"`)}); err != nil {
			t.Fatalf("enqueue: %v", err)
		}
		got, err := q.Receive(ctx, actors.QueueReceive{})
		if err != nil || len(got) != 1 || got[0].ID != "m1" {
			t.Fatalf("receive: %+v %v", got, err)
		}
		if r, err := q.Ack(ctx, got[0].Receipt); err != nil || r == nil {
			t.Fatalf("ack: %+v %v", r, err)
		}

		al := actors.NewAlarms(c, keyOwnedBy(t, a, "kv", owner))
		at := time.Now().Add(time.Hour)
		if _, err := al.Set(ctx, "later", at, json.RawMessage(`{"kind":"trim"}`)); err != nil {
			t.Fatalf("alarm set: %v", err)
		}
		if info, err := al.Get(ctx, "later"); err != nil || info.At != at.UnixMilli() {
			t.Fatalf("alarm get: %+v %v", info, err)
		}
		if _, err := al.Get(ctx, "nope"); !errors.Is(err, actors.ErrNotFound) {
			t.Fatalf("missing alarm: %v", err)
		}
	}
	// A client owns nothing: no partition's table entry names it.
	st, err := ReadStatus(ctx, []string{tc.etcd.Endpoint()}, tc.name)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Parts {
		if p.Owner == "svc" {
			t.Fatalf("the client owns partition %d", p.Partition)
		}
	}
}

// TestReplicated_AClientMemberFollowsLeaders: in a replicated cluster a
// client member sends each request to its partition's leader, and after the
// leader's node crashes, to the replica elected in its place; no
// acknowledged increment is lost.
func TestReplicated_AClientMemberFollowsLeaders(t *testing.T) {
	tc := newReplicatedCluster(t, "a", "b", "c")
	c, err := StartClient(ClientConfig{Name: tc.name, ID: "svc", Endpoints: []string{tc.etcd.Endpoint()}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id := actors.ObjectID{App: "app", Type: "kv", Key: "counter"}
	kv := actors.NewKV(c, id)
	acked := 0
	increment := func() {
		t.Helper()
		for {
			sctx, served := actors.WithServedRecord(ctx)
			r, err := kv.Increment(sctx, "n", 1)
			if err == nil {
				acked++
				if string(r.Value) != fmt.Sprint(acked) {
					t.Fatalf("increment %d: value %s", acked, r.Value)
				}
				if s := served(); s.Node != tc.leaderOf(t, id) {
					t.Fatalf("served by %q, not the partition's leader %s", s.Node, tc.leaderOf(t, id))
				}
				return
			}
			var e *actors.Error
			if !errors.As(err, &e) || e.Kind != actors.KindUnavailable || ctx.Err() != nil {
				t.Fatalf("increment %d: %v", acked+1, err)
			}
			time.Sleep(50 * time.Millisecond) // 503: an election is under way
		}
	}
	for range 20 {
		increment()
	}
	leader := tc.leaderOf(t, id)
	tc.crash(leader)
	start := time.Now()
	for range 20 {
		increment()
	}
	if now := tc.leaderOf(t, id); now == leader {
		t.Fatalf("the crashed node %s still leads", leader)
	}
	t.Logf("the client followed the new leader %s after the crash of %s within %v", tc.leaderOf(t, id), leader, time.Since(start).Round(time.Millisecond))
}
