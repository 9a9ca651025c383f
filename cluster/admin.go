package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Operator commands (`holdfast cluster status|leave|forget-node`). They talk to
// etcd directly: the cluster's state lives there, and they work while nodes are
// down.

// Status is the cluster as etcd shows it.
type Status struct {
	Name       string
	Partitions int
	Controller string // node id of the placement controller, "" if none
	Nodes      []NodeInfo
	Parts      []PartStatus
}

// PartStatus is one partition's row of Status.
type PartStatus struct {
	Partition uint32
	Owner     string
	Epoch     uint64
	Target    string // a handoff in progress to this node
	// Available: the owner is live and serves the partition under its lease.
	Available bool
}

// Unavailable lists the partitions that are not served now.
func (s *Status) Unavailable() []uint32 {
	var out []uint32
	for _, p := range s.Parts {
		if !p.Available {
			out = append(out, p.Partition)
		}
	}
	return out
}

func dial(endpoints []string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zapNop()})
	if err != nil {
		return nil, fmt.Errorf("connect to etcd %v: %w", endpoints, err)
	}
	return cli, nil
}

// ReadStatus reads cluster name's state from etcd.
func ReadStatus(ctx context.Context, endpoints []string, name string) (*Status, error) {
	cli, err := dial(endpoints)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	return readStatus(ctx, cli, newKeys(name), name)
}

func readStatus(ctx context.Context, cli *clientv3.Client, k keys, name string) (*Status, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, k.root, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read cluster %q from etcd: %w", name, err)
	}
	var meta clusterMeta
	for _, kv := range resp.Kvs {
		if string(kv.Key) == k.meta() {
			if err := json.Unmarshal(kv.Value, &meta); err != nil {
				return nil, fmt.Errorf("cluster meta: %w", err)
			}
		}
	}
	if meta.Partitions == 0 {
		return nil, fmt.Errorf("no cluster %q in etcd %v", name, cli.Endpoints())
	}
	v := newView(meta.Partitions)
	v.load(k, resp)
	nodes, parts, ctrl, _ := v.snapshot()
	st := &Status{Name: name, Partitions: meta.Partitions}
	if i := strings.LastIndexByte(ctrl, '/'); i > 0 {
		st.Controller = ctrl[:i] // the value is node/lease
	}
	for _, id := range sortedIDs(nodes) {
		st.Nodes = append(st.Nodes, nodes[id])
	}
	for p, e := range parts {
		n, live := nodes[e.Owner]
		st.Parts = append(st.Parts, PartStatus{Partition: uint32(p), Owner: e.Owner, Epoch: e.Epoch, Target: e.Target,
			Available: e.Owner != "" && live && e.Lease != 0 && e.Lease == n.Lease})
	}
	return st, nil
}

// ErrNodeLive refuses to forget a node that is running.
var ErrNodeLive = errors.New("the node is live; stop it first (or let it leave: holdfast cluster leave)")

// ForgetNode gives up node's partitions: they lose their owner and the
// controller assigns them to the live nodes, which start them empty. Whatever
// the node held and did not hand off is lost. It refuses while the node is
// live. It returns how many partitions were given up.
func ForgetNode(ctx context.Context, endpoints []string, name, node string) (int, error) {
	cli, err := dial(endpoints)
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	k := newKeys(name)
	st, err := readStatus(ctx, cli, k, name)
	if err != nil {
		return 0, err
	}
	for _, n := range st.Nodes {
		if n.ID == node {
			return 0, fmt.Errorf("forget node %s: %w", node, ErrNodeLive)
		}
	}
	n := 0
	for _, ps := range st.Parts {
		if ps.Owner != node {
			continue
		}
		e, err := readPart(ctx, cli, k, ps.Partition)
		if err != nil {
			return n, err
		}
		if e.Owner != node {
			continue
		}
		if err := casPart(ctx, cli, k, ps.Partition, e, PartEntry{Epoch: e.Epoch}); err != nil {
			return n, fmt.Errorf("partition %d: %w", ps.Partition, err)
		}
		n++
	}
	return n, nil
}

// RequestLeave asks node to leave the cluster: it hands its partitions off and
// exits, as on SIGTERM. It waits until the node is gone or ctx ends.
func RequestLeave(ctx context.Context, endpoints []string, name, node string) error {
	cli, err := dial(endpoints)
	if err != nil {
		return err
	}
	defer cli.Close()
	k := newKeys(name)
	resp, err := cli.Get(ctx, k.node(node))
	if err != nil {
		return fmt.Errorf("read node %s: %w", node, err)
	}
	if len(resp.Kvs) == 0 {
		return fmt.Errorf("node %s is not live in cluster %q", node, name)
	}
	if _, err := cli.Put(ctx, k.leave(node), time.Now().UTC().Format(time.RFC3339)); err != nil {
		return fmt.Errorf("ask node %s to leave: %w", node, err)
	}
	for {
		resp, err := cli.Get(ctx, k.node(node))
		if err == nil && len(resp.Kvs) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s has not left yet: %w", node, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
