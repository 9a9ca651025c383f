package cluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
)

// TestNode_StorageID: a new data directory gets a storage ID that survives a
// restart; a directory of an older version (data, no ID file) gets one at its
// first open; a damaged ID file stops start-up.
func TestNode_StorageID(t *testing.T) {
	dir := t.TempDir()
	open := func() (*Node, error) { return Start(Config{DataDir: dir, Partitions: 4}) }
	n, err := open()
	if err != nil {
		t.Fatal(err)
	}
	id := n.StorageID()
	if !validStorageID(id) {
		t.Fatalf("storage ID %q", id)
	}
	if err := n.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n, err = open(); err != nil || n.StorageID() != id {
		t.Fatalf("after a restart: %v, id %q, want %q", err, n.StorageID(), id)
	}
	_ = n.Close(context.Background())
	// An older version's directory: data, no ID.
	if err := os.Remove(filepath.Join(dir, storageIDFile)); err != nil {
		t.Fatal(err)
	}
	if n, err = open(); err != nil || !validStorageID(n.StorageID()) || n.StorageID() == id {
		t.Fatalf("a directory without an ID: %v, id %q", err, n.StorageID())
	}
	_ = n.Close(context.Background())
	if err := os.WriteFile(filepath.Join(dir, storageIDFile), []byte("not an id\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err = open(); err == nil || !strings.Contains(err.Error(), "storage ID") {
		if n != nil {
			_ = n.Close(context.Background())
		}
		t.Fatalf("a damaged ID file: %v", err)
	}
}

// TestCluster_RefusedNodeJoinsEmptyAfterForgetNode models a disk loss with a
// reused nodeId, in one process: b crashes and comes back on an empty data
// directory. It refuses b's partitions (503 through a, nothing served empty;
// the controller moves none of them), and forget-node is refused for a node
// that serves, allowed for one that refuses; then the live b takes up its
// share of partitions as a new, empty member.
func TestCluster_RefusedNodeJoinsEmptyAfterForgetNode(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start("a")
	tc.start("b")
	tc.waitStable(30 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	keys := keysOwnedBy(t, a, "b", 3)
	for _, k := range keys {
		// A cluster that never lost a partition numbers log_ids from 1 (a
		// handoff raised every epoch; no loss, no floor).
		if r, err := tc.set(ctx, a, k, "v", 7); err != nil || r.LogID != 1 {
			t.Fatalf("first write of %s: %+v %v, want log_id 1", k, r, err)
		}
	}
	tc.crash("b")
	tc.dirs["b"] = filepath.Join(t.TempDir(), "b-new-disk")
	b := tc.start("b") // waits out the crashed run's lease
	eps := []string{tc.etcd.Endpoint()}
	var st *Status
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var err error
		if st, err = ReadStatus(ctx, eps, tc.name); err != nil {
			t.Fatal(err)
		}
		if row, _ := st.Node("b"); row.State == NodeRefused && st.Refused == row.Owned && row.Owned > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b not shown refused: %+v", st.Nodes)
		}
	}
	for _, k := range keys {
		for _, n := range []*Node{a, b} {
			// Each node's view follows etcd's by a watch: a's may still
			// show b's crashed run gone ("down") for a moment after
			// ReadStatus saw the new one's registration.
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				_, err := n.Request(ctx, actors.ObjectID{App: "app_t", Type: "kv", Key: k}, actors.KVGet{})
				var ae *actors.Error
				if errors.As(err, &ae) && ae.Kind == actors.KindUnavailable && strings.Contains(ae.Msg, "refuses") {
					break
				}
				if !errors.As(err, &ae) || !strings.Contains(ae.Msg, "is down") || time.Now().After(deadline) {
					t.Fatalf("get %s during the refusal: %v", k, err)
				}
			}
		}
	}
	if len(b.member.served()) != 0 {
		t.Fatalf("b serves %v from an empty disk", b.member.served())
	}
	if _, err := ForgetNode(ctx, eps, tc.name, "a"); !errors.Is(err, ErrNodeLive) {
		t.Fatalf("forget a live node that serves: %v", err)
	}
	n, err := ForgetNode(ctx, eps, tc.name, "b")
	if err != nil || n != st.Refused {
		t.Fatalf("forget the refused partitions of b: %d %v, want %d", n, err, st.Refused)
	}
	tc.waitStable(30 * time.Second) // every partition served, b has its share
	if len(b.member.served()) == 0 {
		t.Fatal("b took no partition up after forget-node")
	}
	for _, k := range keys { // given up: empty, and writable
		s, _, err := tc.get(ctx, a, k)
		if err != nil || len(s.State) != 0 {
			t.Fatalf("get %s after forget-node: %+v %v", k, s, err)
		}
		// Its log_ids go on above the lost ones (issue 26, point 9), and a
		// reader resuming after a lost log_id is told that it cannot.
		r, err := tc.set(ctx, a, k, "v", 8)
		if err != nil || r.LogID != 1<<32+1 {
			t.Fatalf("first write of %s after forget-node: %+v %v, want log_id 2^32+1", k, r, err)
		}
		_, err = a.Request(ctx, actors.ObjectID{App: "app_t", Type: "kv", Key: k}, actors.KVReadLog{After: 1, Limit: 10})
		var lt *actors.LogTruncatedError
		if !errors.As(err, &lt) || lt.After != 1 || lt.Oldest != r.LogID {
			t.Fatalf("read %s's log after the lost log_id 1: %v, want log truncated", k, err)
		}
	}
	// A partition that lost nothing numbers its new objects from 1.
	_, parts, _, _ := a.member.view.snapshot()
	fresh := ""
	for p, e := range parts {
		if e.Losses == 0 {
			fresh = keyIn(uint32(p))
			break
		}
	}
	if fresh == "" {
		t.Fatal("every partition was lost")
	}
	if r, err := tc.set(ctx, a, fresh, "v", 1); err != nil || r.LogID != 1 {
		t.Fatalf("first write of %s: %+v %v, want log_id 1", fresh, r, err)
	}
	if st, err = ReadStatus(ctx, eps, tc.name); err != nil || st.Refused != 0 || st.Served != testPartitions {
		t.Fatalf("status after forget-node: %+v %v", st, err)
	}
}
