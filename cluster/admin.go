package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Operator commands (`holdfast cluster status|leave|forget-node`). They talk to
// etcd directly: the cluster's state lives there, and they work while nodes are
// down.

// Status is the cluster as etcd and the nodes' routers show it. Its JSON
// (holdfast cluster status --json) uses camelCase keys, as the HTTP API does.
type Status struct {
	Name       string `json:"name"`
	Partitions int    `json:"partitionCount"`
	Controller string `json:"controller,omitempty"` // node id of the placement controller, "" if none
	// Nodes are the registered nodes and the nodes that own partitions
	// without being registered (down), in id order.
	Nodes []NodeStatus `json:"nodes"`
	// Served, Unavailable and Refused count the partitions in each state;
	// Moving counts the served ones with a handoff in progress.
	Served      int `json:"served"`
	Unavailable int `json:"unavailable"`
	Refused     int `json:"refused"`
	Moving      int `json:"moving"`
	// ReplicationFactor is how many replicas each partition has (1: one
	// copy, owned through etcd). UnderReplicated counts the partitions with
	// fewer live replicas than that, served or not.
	ReplicationFactor int `json:"replicationFactor"`
	UnderReplicated   int `json:"underReplicated"`
	// Parts has one row per partition.
	Parts []PartStatus `json:"partitions,omitempty"`
}

// Node states in NodeStatus.State.
const (
	NodeLive        = "live"        // registered, and every node's router reaches it
	NodeLeaving     = "leaving"     // handing its partitions off before it exits
	NodeClient      = "client"      // a client member: no partitions
	NodeUnreachable = "unreachable" // registered, but some node's router cannot reach it: its partitions get 503
	NodeRefused     = "refused"     // registered, refuses its partitions: its data directory is not theirs
	NodeDown        = "down"        // owns partitions, not registered (crashed or stopped)
)

// NodeStatus is one node's row of Status.
type NodeStatus struct {
	NodeInfo
	State string `json:"state"`
	// Owned counts the partitions the table gives the node; Served,
	// Unavailable and Refused split them.
	Owned       int `json:"owned"`
	Served      int `json:"served"`
	Unavailable int `json:"unavailable"`
	Refused     int `json:"refused"`
	// UnreachableFrom lists the nodes whose routers cannot reach this one.
	UnreachableFrom []string `json:"unreachableFrom,omitempty"`
	// Reason says why the node is not live, for people.
	Reason string `json:"reason,omitempty"`
}

// Partition states in PartStatus.State.
const (
	PartServed      = "served"
	PartUnavailable = "unavailable"
	PartRefused     = "refused"
)

// PartStatus is one partition's row of Status.
type PartStatus struct {
	Partition uint32 `json:"partition"`
	Owner     string `json:"owner,omitempty"`
	Epoch     uint64 `json:"epoch"`
	Target    string `json:"target,omitempty"` // a handoff in progress to this node
	// StorageID is the storage ID of the data directory it was last served from.
	StorageID string `json:"storageId,omitempty"`
	// Available: the owner is live, serves the partition under its lease, and
	// every live node's router reaches it.
	Available bool   `json:"available"`
	State     string `json:"state"`
	// Reason says why it is not served, for people.
	Reason string `json:"reason,omitempty"`
	// Replicated clusters: the node that serves the partition (its leader
	// under the lease; also in Owner) and its raft term (also in Epoch), the
	// replicas, and whether fewer than the replication factor are live.
	Leader          string          `json:"leader,omitempty"`
	Term            uint64          `json:"term,omitempty"`
	Replicas        []ReplicaStatus `json:"replicas,omitempty"`
	UnderReplicated bool            `json:"underReplicated,omitempty"`
}

// UnavailableParts lists the partitions that are not served now (refused ones
// included).
func (s *Status) UnavailableParts() []uint32 {
	var out []uint32
	for _, p := range s.Parts {
		if !p.Available {
			out = append(out, p.Partition)
		}
	}
	return out
}

// Node returns node id's row, if any.
func (s *Status) Node(id string) (NodeStatus, bool) {
	for _, n := range s.Nodes {
		if n.ID == id {
			return n, true
		}
	}
	return NodeStatus{}, false
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
	// reach/ records of live nodes: who cannot reach whom (reach.go).
	unreachableFrom := map[string][]string{}
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		if !strings.HasPrefix(key, k.reaches()) {
			continue
		}
		observer := key[len(k.reaches()):]
		if _, live := nodes[observer]; !live {
			continue
		}
		var r reachRecord
		if json.Unmarshal(kv.Value, &r) != nil {
			continue
		}
		for id, boot := range r.Unreachable {
			if n, ok := nodes[id]; ok && n.Boot == boot && id != observer {
				unreachableFrom[id] = append(unreachableFrom[id], observer)
			}
		}
	}
	st := &Status{Name: name, Partitions: meta.Partitions, ReplicationFactor: meta.rf()}
	if i := strings.LastIndexByte(ctrl, '/'); i > 0 {
		st.Controller = ctrl[:i] // the value is node/lease
	}
	rows := map[string]*NodeStatus{}
	for _, id := range sortedIDs(nodes) {
		n := nodes[id]
		ns := &NodeStatus{NodeInfo: n, State: NodeLive}
		switch {
		case n.Client:
			ns.State = NodeClient
		case len(unreachableFrom[id]) > 0:
			sort.Strings(unreachableFrom[id])
			ns.State, ns.UnreachableFrom = NodeUnreachable, unreachableFrom[id]
			ns.Reason = "does not answer " + strings.Join(ns.UnreachableFrom, ", ")
		case n.Leaving:
			ns.State = NodeLeaving
		}
		rows[id] = ns
	}
	if meta.rf() > 1 {
		reports := map[string][]byte{}
		for _, kv := range resp.Kvs {
			if strings.HasPrefix(string(kv.Key), k.replicasPrefix()) {
				reports[string(kv.Key)] = kv.Value
			}
		}
		replicatedStatus(st, meta.rf(), nodes, v.groupsSnapshot(), replicaReports(k, reports, nodes), rows)
		parts = nil
	}
	for p, e := range parts {
		ps := PartStatus{Partition: uint32(p), Owner: e.Owner, Epoch: e.Epoch, Target: e.Target, StorageID: e.Storage, State: PartUnavailable}
		n, live := nodes[e.Owner]
		row := rows[e.Owner]
		if e.Owner != "" && row == nil {
			row = &NodeStatus{NodeInfo: NodeInfo{ID: e.Owner}, State: NodeDown, Reason: "not registered: crashed, stopped, or cut off from etcd"}
			rows[e.Owner] = row
		}
		switch {
		case e.Owner == "":
			ps.Reason = "no owner yet"
		case !live:
			ps.Reason = "its node " + e.Owner + " is down"
		case refusedBy(e, n.Storage):
			ps.State = PartRefused
			ps.Reason = fmt.Sprintf("its node %s refuses to serve it: its data directory (storage %s) is not the one the partition was served from (storage %s)", e.Owner, n.Storage, e.Storage)
			row.State = NodeRefused
			row.Reason = fmt.Sprintf("its data directory (storage %s) is not the one its partitions were served from: restore it, or holdfast cluster forget-node %s --accept-data-loss", n.Storage, e.Owner)
		case row.State == NodeUnreachable:
			ps.Reason = "its node " + e.Owner + " " + row.Reason
		case e.Lease == 0 || e.Lease != n.Lease:
			ps.Reason = "being taken up by " + e.Owner
		default:
			ps.Available, ps.State, ps.Reason = true, PartServed, ""
		}
		if row != nil {
			row.Owned++
			switch ps.State {
			case PartServed:
				row.Served++
			case PartRefused:
				row.Refused++
			default:
				row.Unavailable++
			}
		}
		switch ps.State {
		case PartServed:
			st.Served++
			if e.Target != "" {
				st.Moving++
			}
		case PartRefused:
			st.Refused++
		default:
			st.Unavailable++
		}
		st.Parts = append(st.Parts, ps)
	}
	ids := make([]string, 0, len(rows))
	for id := range rows {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		st.Nodes = append(st.Nodes, *rows[id])
	}
	return st, nil
}

// ErrReplicated refuses forget-node in a replicated cluster.
var ErrReplicated = errors.New("not for a replicated cluster")

// ErrNodeLive refuses to forget a node that is running (and serves its
// partitions).
var ErrNodeLive = errors.New("the node is live; stop it first (or let it leave: holdfast cluster leave)")

// ForgetNode gives up node's partitions: they lose their owner and the
// controller assigns them to the live nodes, which start them empty. Whatever
// the node held and did not hand off is lost. A live node is refused
// (ErrNodeLive), unless it refuses partitions (its data directory is not
// theirs): then those are given up, and the node, live and empty, gets its
// share of partitions as a new member would. It returns how many partitions
// were given up. Each is given up only if the node's registration has not
// changed since it was read (the node did not come back meanwhile).
func ForgetNode(ctx context.Context, endpoints []string, name, node string) (int, error) {
	cli, err := dial(endpoints)
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	k := newKeys(name)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	resp, err := cli.Get(ctx, k.node(node))
	if err != nil {
		return 0, fmt.Errorf("read node %s: %w", node, err)
	}
	nodeKey := k.node(node)
	same := clientv3.Compare(clientv3.CreateRevision(nodeKey), "=", 0) // not registered
	var info NodeInfo
	live := len(resp.Kvs) == 1
	if live {
		if err := json.Unmarshal(resp.Kvs[0].Value, &info); err != nil {
			return 0, fmt.Errorf("node %s: %w", node, err)
		}
		same = clientv3.Compare(clientv3.ModRevision(nodeKey), "=", resp.Kvs[0].ModRevision)
	}
	st, err := readStatus(ctx, cli, k, name)
	if err != nil {
		return 0, err
	}
	if st.ReplicationFactor > 1 {
		return 0, fmt.Errorf("%w: cluster %q keeps %d replicas of each partition: a node's replicas are re-created from the others once it has been down for cluster.replaceAfter (or at once when it comes back on another data directory); forget-node is for clusters of one copy", ErrReplicated, name, st.ReplicationFactor)
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
		if e.Owner != node || live && !refusedBy(e, info.Storage) {
			continue
		}
		if err := casPart(ctx, cli, k, ps.Partition, e, PartEntry{Epoch: e.Epoch, Losses: e.Losses + 1}, same); err != nil {
			if errors.Is(err, errConflict) {
				return n, fmt.Errorf("partition %d: node %s or its partition changed meanwhile; look again (holdfast cluster status)", ps.Partition, node)
			}
			return n, fmt.Errorf("partition %d: %w", ps.Partition, err)
		}
		n++
	}
	if live && n == 0 {
		return 0, fmt.Errorf("forget node %s: %w", node, ErrNodeLive)
	}
	return n, nil
}

// RequestLeave asks node to leave the cluster: it hands its partitions off and
// exits, as on SIGTERM. With wait it then waits, until ctx ends, for the
// handoffs to finish, the node to deregister, and its process to exit (its
// cluster and HTTP addresses refuse connections), reporting each step and the
// partitions left to hand off through progress (which may be nil).
func RequestLeave(ctx context.Context, endpoints []string, name, node string, wait bool, progress func(string)) error {
	if progress == nil {
		progress = func(string) {}
	}
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
	var info NodeInfo
	if err := json.Unmarshal(resp.Kvs[0].Value, &info); err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	if _, err := cli.Put(ctx, k.leave(node), time.Now().UTC().Format(time.RFC3339)); err != nil {
		return fmt.Errorf("ask node %s to leave: %w", node, err)
	}
	if !wait {
		return nil
	}
	last, lastAt := -1, time.Time{}
	for {
		st, err := readStatus(ctx, cli, k, name)
		if err == nil {
			row, _ := st.Node(node)
			registered := row.State != "" && row.State != NodeDown
			left := row.Owned - row.Refused
			switch {
			case registered && (left != last || time.Since(lastAt) >= 5*time.Second):
				progress(fmt.Sprintf("node %s: handing partitions off, %d left", node, left))
				last, lastAt = left, time.Now()
			case !registered && row.Owned > 0:
				return fmt.Errorf("node %s stopped with %d partitions not handed off: they are unavailable until it returns (or holdfast cluster forget-node %s --accept-data-loss)", node, row.Owned, node)
			case !registered:
				progress(fmt.Sprintf("node %s: every partition handed off; waiting for its process to exit", node))
				return waitClosed(ctx, node, info.Addr, info.HTTP)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s has not left yet: %w", node, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitClosed waits until every address of addrs ("" skipped) refuses
// connections: the process that listened there exited.
func waitClosed(ctx context.Context, node string, addrs ...string) error {
	var d net.Dialer
	for _, a := range addrs {
		if a == "" {
			continue
		}
		for {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			c, err := d.DialContext(cctx, "tcp", a)
			cancel()
			if err != nil && ctx.Err() == nil {
				break
			}
			if c != nil {
				_ = c.Close()
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("node %s handed its partitions off but its process still listens on %s: %w", node, a, ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}
