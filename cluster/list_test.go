package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
)

// listAll pages through the keys of type kv through node n (limit per
// page).
func listAll(t *testing.T, n *Node, limit int) []string {
	t.Helper()
	var keys []string
	after := ""
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		page, err := n.List(ctx, actors.ListQuery{App: "app_t", Type: "kv", Kind: actors.ListObjects, After: after, Limit: limit})
		cancel()
		if err != nil {
			t.Fatalf("list through %s after %q: %v", n.member.id, after, err)
		}
		keys = append(keys, page.Keys...)
		if page.Next == "" {
			return keys
		}
		after = page.Next
	}
}

// writeListed writes one object in every partition and more besides,
// through the nodes in turn, and returns their keys in byte order.
func (tc *testCluster) writeListed(nodes []*Node) []string {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var keys []string
	for p := range uint32(testPartitions) {
		keys = append(keys, keyIn(p))
	}
	for i := range 20 {
		keys = append(keys, fmt.Sprintf("extra-%d", i))
	}
	for i, key := range keys {
		if _, err := tc.set(ctx, nodes[i%len(nodes)], key, "v", i); err != nil {
			tc.t.Fatal(err)
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// TestCluster_ListCoversEveryNode: in a cluster of three (one copy per
// partition), a listing through any node returns the keys of every
// partition, whichever node owns it, in byte order, page by page; after a
// node leaves (its partitions handed off), the rest list them all still.
// With a node crashed (its partitions unserved), the listing fails with a
// 503 naming the partitions, rather than a page short of their objects.
func TestCluster_ListCoversEveryNode(t *testing.T) {
	tc := newTestCluster(t)
	a, b, c := tc.start("a"), tc.start("b"), tc.start("c")
	tc.waitStable(30 * time.Second)
	want := tc.writeListed([]*Node{a, b, c})
	for _, n := range []*Node{a, b, c} {
		for _, limit := range []int{7, 1000} {
			if got := listAll(t, n, limit); !slices.Equal(got, want) {
				t.Fatalf("through %s, limit %d: %d keys %q\nwant %d %q", n.member.id, limit, len(got), got, len(want), want)
			}
		}
	}
	tc.leave("c")
	tc.waitStable(30 * time.Second)
	if got := listAll(t, a, 10); !slices.Equal(got, want) {
		t.Fatalf("after c left: %q\nwant %q", got, want)
	}
	tc.crash("b")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := a.List(ctx, actors.ListQuery{App: "app_t", Type: "kv", Kind: actors.ListObjects, Limit: 10})
	var ae *actors.Error
	if !errors.As(err, &ae) || ae.Kind != actors.KindUnavailable || !strings.Contains(ae.Msg, "partitions [") {
		t.Fatalf("a listing with b crashed: %v, want 503 naming b's partitions", err)
	}
	t.Logf("with b crashed: %v", err)
}

// TestReplicated_ListCoversEveryNode: in a replicated cluster of three, a
// listing through each node returns every partition's keys (each listed by
// its leader, wherever it is), and the app's types once each.
func TestReplicated_ListCoversEveryNode(t *testing.T) {
	tc := newReplicatedCluster(t, "a", "b", "c")
	nodes := tc.live()
	want := tc.writeListed(nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := nodes[0].Request(ctx, actors.ObjectID{App: "app_t", Type: "cart", Key: "c1"}, &actors.KVWrite{
		Ops: []actors.Op{{Op: "set", Key: "n", Value: []byte("1")}}, Route: actors.RoutePut}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if got := listAll(t, n, 9); !slices.Equal(got, want) {
			t.Fatalf("through %s: %d keys %q\nwant %d %q", n.member.id, len(got), got, len(want), want)
		}
		// The app's types, each once, though every partition holds kv.
		page, err := n.List(ctx, actors.ListQuery{App: "app_t", Kind: actors.ListTypes, Limit: 10})
		if err != nil || !slices.Equal(page.Keys, []string{"cart", "kv"}) || page.Next != "" {
			t.Fatalf("types through %s: %+v %v", n.member.id, page, err)
		}
	}
}
