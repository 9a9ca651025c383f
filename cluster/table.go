package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The cluster's state in etcd, under /holdfast/<cluster name>/:
//
//	meta            {"partitions": P}: fixed when the first node creates the cluster
//	nodes/<id>      NodeInfo of a live node, attached to the node's lease
//	parts/<p>       PartEntry: owner and epoch of partition p; absent = no owner yet
//	                (a cluster of one copy, replicationFactor 1)
//	groups/<p>      GroupEntry: the replicas of partition p's raft group
//	                (replicationFactor > 1); absent = not formed yet
//	nodenum/<id>    fixes node id's raft node number: the key's create revision
//	replicas/<id>   what node id's replicas are doing (replicastatus.go), on its lease
//	controller      the node id of the placement controller, attached to its lease
//	leave/<id>      an operator asked node id to leave (holdfast cluster leave)
//	reach/<id>      the nodes node id's router finds unreachable, attached to its lease
//
// Every change of a parts/ entry is a compare-and-swap on its mod revision.

// keys builds the etcd keys of one cluster.
type keys struct{ root string }

func newKeys(cluster string) keys { return keys{root: "/holdfast/" + cluster + "/"} }

func (k keys) meta() string           { return k.root + "meta" }
func (k keys) nodes() string          { return k.root + "nodes/" }
func (k keys) node(id string) string  { return k.root + "nodes/" + id }
func (k keys) parts() string          { return k.root + "parts/" }
func (k keys) part(p uint32) string   { return fmt.Sprintf("%sparts/%05d", k.root, p) }
func (k keys) controller() string     { return k.root + "controller" }
func (k keys) groups() string         { return k.root + "groups/" }
func (k keys) group(p uint32) string  { return fmt.Sprintf("%sgroups/%05d", k.root, p) }
func (k keys) replicasPrefix() string { return k.root + "replicas/" }
func (k keys) replicas(id string) string {
	return k.root + "replicas/" + id
}
func (k keys) nodeNum(id string) string {
	return k.root + "nodenum/" + id
}
func (k keys) leaves() string         { return k.root + "leave/" }
func (k keys) leave(id string) string { return k.root + "leave/" + id }
func (k keys) reaches() string        { return k.root + "reach/" }
func (k keys) reach(id string) string { return k.root + "reach/" + id }

// clusterMeta is what is fixed when the cluster is created.
type clusterMeta struct {
	Partitions int `json:"partitions"`
	// ReplicationFactor is how many replicas each partition has; 0 (a cluster
	// made by an older version) means 1.
	ReplicationFactor int `json:"replicationFactor,omitempty"`
}

// rf is the meta's replication factor.
func (m clusterMeta) rf() int { return max(m.ReplicationFactor, 1) }

// NodeInfo is a live node's entry.
type NodeInfo struct {
	ID      string `json:"id"`
	Addr    string `json:"addr"`           // its cluster transport's address (host:port; remote.go)
	HTTP    string `json:"http,omitempty"` // its HTTP listener, for operators
	Boot    string `json:"boot"`           // names this run of the node
	Lease   int64  `json:"lease"`          // the etcd lease the node serves under
	Leaving bool   `json:"leaving,omitempty"`
	Client  bool   `json:"client,omitempty"` // a client member: owns no partitions
	// Storage is the storage ID of the node's data directory (storageid.go);
	// empty for a client member and for a node of an older version.
	Storage string `json:"storageId,omitempty"`
	// Raft is the address the node's raft carrier is reached at, and Num its
	// raft node number (nodenum/<id>); both empty in a cluster of one copy.
	Raft string `json:"raft,omitempty"`
	Num  uint64 `json:"num,omitempty"`
	// ColdMarker says that the node writes its marker in the cold store
	// and checks the others' (coldshare.go): the others look for its
	// marker only then (a node of an earlier version, or one nothing
	// flushes cold on, writes none).
	ColdMarker bool `json:"coldMarker,omitempty"`
	// rev is the entry's etcd mod revision in the view that read it: a move
	// that places a replica on the node writes only if the entry is unchanged
	// (casGroup), so never on a node that began leaving meanwhile.
	rev int64
}

// GroupEntry is one partition's raft group: its replicas, as the controller
// placed them. The raft configuration itself lives in the group's log; this
// entry says where each replica lives and which data directory it belongs
// to, so that a node whose directory changed never runs its old replicas
// (spec/cluster.md, storage identity).
type GroupEntry struct {
	Replicas []ReplicaEntry `json:"replicas"`
	// Next is the next unused replica id of the group.
	Next uint64 `json:"next"`
	// Losses counts the recoveries of the group from a minority
	// (recover-partition adds one), as PartEntry.Losses counts forget-node's:
	// the partition's objects number their log_ids above a floor derived
	// from it (actors/logfloor.go). Every rewrite of the entry carries it on.
	Losses uint64 `json:"losses,omitempty"`

	rev int64
}

// ReplicaEntry is one replica of a group.
type ReplicaEntry struct {
	ID      uint64 `json:"id"`
	Node    string `json:"node"`
	Num     uint64 `json:"num"`       // the node's raft node number
	Storage string `json:"storageId"` // the data directory the replica lives in
	// Founder says the replica is one of the group's founding voters: it
	// starts its log from the founding configuration. A replica added later
	// starts empty and is sent a snapshot.
	Founder bool `json:"founder,omitempty"`
	// Replaces, on a replica being added by a move, is the replica it
	// replaces (moves.go); 0 once the move is done.
	Replaces uint64 `json:"replaces,omitempty"`
	// Adding, on a replica being added to a group with fewer replicas than
	// the replication factor (no replica is replaced), says the move is not
	// done yet.
	Adding bool `json:"adding,omitempty"`
	// Abort, on a replica being added, asks the group's leader to give the
	// move up (its node went down or away): the new replica is removed
	// from the group if it was added, and from the entry.
	Abort bool `json:"abort,omitempty"`
	// RecoverFrom, on the one replica of a group recover-partition
	// restarted, is the surviving replica (on the same node and data
	// directory) whose log it starts from: the node copies that log into the
	// new replica, with the new replica as its only voter, before it starts
	// it (replication.WALPipeline.Reseed).
	RecoverFrom uint64 `json:"recoverFrom,omitempty"`
}

// replicaOn returns the replica of g on node id with data directory storage.
func (g GroupEntry) replicaOn(id, storage string) (ReplicaEntry, bool) {
	for _, r := range g.Replicas {
		if r.Node == id && r.Storage == storage {
			return r, true
		}
	}
	return ReplicaEntry{}, false
}

// PartEntry is one partition's row of the partition table.
type PartEntry struct {
	Owner string `json:"owner,omitempty"`
	// Epoch grows by one every time a node takes the partition up: each serving
	// period of each node has its own epoch.
	Epoch uint64 `json:"epoch"`
	// Lease is the owner's lease while it serves the partition; 0 until the
	// owner takes it up under its current lease.
	Lease int64 `json:"lease,omitempty"`
	// Target is where the controller asked the owner to hand the partition off.
	Target string `json:"target,omitempty"`
	// Storage is the storage ID of the data directory the partition is served
	// from: recorded when the owner takes it up, and set to the target's at a
	// handoff's switch. A node whose data directory has another ID refuses to
	// serve the partition (refusedBy). Empty: never served since the cluster
	// (or the last forget-node) began, or recorded by an older version; the
	// next take-up records it. With replication this becomes one (node,
	// storage) pair per replica, and voters are counted by storage ID.
	Storage string `json:"storageId,omitempty"`
	// Losses counts the times the partition's data was given up (forget-node
	// --accept-data-loss adds one). Objects that start with no stored state
	// number their log_ids above a floor derived from it, so that a log_id
	// never goes back (actors/logfloor.go). Every rewrite of the entry carries
	// it on.
	Losses uint64 `json:"losses,omitempty"`

	rev int64 // etcd mod revision; 0 when the key does not exist
}

// view is a node's copy of the cluster's state, kept current by one watch.
type view struct {
	mu      sync.RWMutex
	rev     int64
	nodes   map[string]NodeInfo
	parts   []PartEntry
	groups  []GroupEntry
	ctrl    string
	leaves  map[string]bool // nodes asked to leave
	changed chan struct{}   // closed and replaced on every change
	synced  bool
}

func newView(partitions int) *view {
	return &view{nodes: map[string]NodeInfo{}, parts: make([]PartEntry, partitions), groups: make([]GroupEntry, partitions), leaves: map[string]bool{}, changed: make(chan struct{})}
}

// part returns partition p's entry.
func (v *view) part(p uint32) PartEntry {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.parts[p]
}

// group returns partition p's raft group entry.
func (v *view) group(p uint32) GroupEntry {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.groups[p]
}

// groupsSnapshot copies the group entries.
func (v *view) groupsSnapshot() []GroupEntry {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return append([]GroupEntry(nil), v.groups...)
}

// node returns a live node's entry.
func (v *view) node(id string) (NodeInfo, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	n, ok := v.nodes[id]
	return n, ok
}

// leaveRequested reports whether an operator asked node id to leave.
func (v *view) leaveRequested(id string) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.leaves[id]
}

// wait returns a channel closed at the next change.
func (v *view) wait() <-chan struct{} {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.changed
}

// snapshot copies the whole view.
func (v *view) snapshot() (nodes map[string]NodeInfo, parts []PartEntry, ctrl string, rev int64) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	nodes = make(map[string]NodeInfo, len(v.nodes))
	for k, n := range v.nodes {
		nodes[k] = n
	}
	return nodes, append([]PartEntry(nil), v.parts...), v.ctrl, v.rev
}

// notify wakes the waiters (under v.mu).
func (v *view) notify() {
	close(v.changed)
	v.changed = make(chan struct{})
}

// apply records one key's new value (nil: deleted) at mod revision rev.
func (v *view) apply(k keys, key string, value []byte, rev int64) {
	switch {
	case strings.HasPrefix(key, k.nodes()):
		id := key[len(k.nodes()):]
		if value == nil {
			delete(v.nodes, id)
			return
		}
		var n NodeInfo
		if json.Unmarshal(value, &n) == nil {
			n.rev = rev
			v.nodes[id] = n
		}
	case strings.HasPrefix(key, k.parts()):
		p, err := strconv.ParseUint(key[len(k.parts()):], 10, 32)
		if err != nil || int(p) >= len(v.parts) {
			return
		}
		if value == nil {
			v.parts[p] = PartEntry{}
			return
		}
		var e PartEntry
		if json.Unmarshal(value, &e) == nil {
			e.rev = rev
			v.parts[p] = e
		}
	case strings.HasPrefix(key, k.groups()):
		p, err := strconv.ParseUint(key[len(k.groups()):], 10, 32)
		if err != nil || int(p) >= len(v.groups) {
			return
		}
		var g GroupEntry
		if value != nil && json.Unmarshal(value, &g) == nil {
			g.rev = rev
		}
		v.groups[p] = g
	case key == k.controller():
		v.ctrl = string(value)
	case strings.HasPrefix(key, k.leaves()):
		v.leaves[key[len(k.leaves()):]] = value != nil
	}
}

// load replaces the view with the state at one revision.
func (v *view) load(k keys, resp *clientv3.GetResponse) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.nodes = map[string]NodeInfo{}
	v.leaves = map[string]bool{}
	for i := range v.parts {
		v.parts[i] = PartEntry{}
		v.groups[i] = GroupEntry{}
	}
	v.ctrl = ""
	for _, kv := range resp.Kvs {
		v.apply(k, string(kv.Key), kv.Value, kv.ModRevision)
	}
	v.rev = resp.Header.Revision
	v.synced = true
	v.notify()
}

// follow keeps v current until ctx ends: one read of everything, then a watch
// from the next revision; after any watch failure, again from a fresh read.
func (v *view) follow(ctx context.Context, cli *clientv3.Client, k keys, log *slog.Logger) {
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := cli.Get(rctx, k.root, clientv3.WithPrefix())
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				log.Debug("cannot read the cluster state; retrying", "err", err)
			}
			sleep(ctx, 200*time.Millisecond)
			continue
		}
		v.load(k, resp)
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for wr := range cli.Watch(wctx, k.root, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
			if err := wr.Err(); err != nil {
				log.Debug("cluster watch ended; reading again", "err", err)
				break
			}
			v.mu.Lock()
			for _, ev := range wr.Events {
				var val []byte
				if ev.Type == clientv3.EventTypePut {
					val = ev.Kv.Value
				}
				v.apply(k, string(ev.Kv.Key), val, ev.Kv.ModRevision)
			}
			v.rev = wr.Header.Revision
			v.notify()
			v.mu.Unlock()
		}
		wcancel()
		sleep(ctx, 100*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// errConflict is a compare-and-swap that lost to another change.
var errConflict = errors.New("cluster: the partition table changed meanwhile")

// casPart replaces partition p's entry old (as read, with its revision) by e.
// Every cond must hold as well.
func casPart(ctx context.Context, cli *clientv3.Client, k keys, p uint32, old PartEntry, e PartEntry, cond ...clientv3.Cmp) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	key := k.part(p)
	cmp := clientv3.Compare(clientv3.ModRevision(key), "=", old.rev)
	if old.rev == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cli.Txn(ctx).If(append([]clientv3.Cmp{cmp}, cond...)...).Then(clientv3.OpPut(key, string(b))).Commit()
	if err != nil {
		return fmt.Errorf("update partition %d: %w", p, err)
	}
	if !resp.Succeeded {
		return errConflict
	}
	return nil
}

// casGroup replaces partition p's group entry old (as read, with its
// revision) by g.
// also are further conditions of the write (a target node's entry unchanged).
func casGroup(ctx context.Context, cli *clientv3.Client, k keys, p uint32, old, g GroupEntry, also ...clientv3.Cmp) error {
	b, err := json.Marshal(g)
	if err != nil {
		return err
	}
	key := k.group(p)
	cmp := clientv3.Compare(clientv3.ModRevision(key), "=", old.rev)
	if old.rev == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cli.Txn(ctx).If(append([]clientv3.Cmp{cmp}, also...)...).Then(clientv3.OpPut(key, string(b))).Commit()
	if err != nil {
		return fmt.Errorf("update the group of partition %d: %w", p, err)
	}
	if !resp.Succeeded {
		return errConflict
	}
	return nil
}

// readGroup reads partition p's group entry from etcd (not from a view).
func readGroup(ctx context.Context, cli *clientv3.Client, k keys, p uint32) (GroupEntry, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, k.group(p))
	if err != nil {
		return GroupEntry{}, err
	}
	if len(resp.Kvs) == 0 {
		return GroupEntry{}, nil
	}
	var g GroupEntry
	if err := json.Unmarshal(resp.Kvs[0].Value, &g); err != nil {
		return GroupEntry{}, fmt.Errorf("partition %d's group: %w", p, err)
	}
	g.rev = resp.Kvs[0].ModRevision
	return g, nil
}

// readPart reads partition p's entry from etcd (not from a view).
func readPart(ctx context.Context, cli *clientv3.Client, k keys, p uint32) (PartEntry, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, k.part(p))
	if err != nil {
		return PartEntry{}, err
	}
	if len(resp.Kvs) == 0 {
		return PartEntry{}, nil
	}
	var e PartEntry
	if err := json.Unmarshal(resp.Kvs[0].Value, &e); err != nil {
		return PartEntry{}, fmt.Errorf("partition %d: %w", p, err)
	}
	e.rev = resp.Kvs[0].ModRevision
	return e, nil
}

// ensureMeta creates the cluster with partitions partitions and replication
// factor rf, or checks that the existing cluster has as many of each.
func ensureMeta(ctx context.Context, cli *clientv3.Client, k keys, partitions, rf int) error {
	b, _ := json.Marshal(clusterMeta{Partitions: partitions, ReplicationFactor: rf})
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k.meta()), "=", 0)).
		Then(clientv3.OpPut(k.meta(), string(b))).Else(clientv3.OpGet(k.meta())).Commit()
	if err != nil {
		return fmt.Errorf("create the cluster in etcd: %w", err)
	}
	if resp.Succeeded {
		return nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return errors.New("cluster meta vanished")
	}
	var m clusterMeta
	if err := json.Unmarshal(kvs[0].Value, &m); err != nil {
		return fmt.Errorf("cluster meta: %w", err)
	}
	if m.Partitions != partitions {
		return fmt.Errorf("the cluster has %d partitions and this node's data directory %d; partitions are fixed when a cluster is created", m.Partitions, partitions)
	}
	if m.rf() != rf {
		return fmt.Errorf("the cluster keeps %d replicas of each partition and this node is configured with cluster.replicationFactor %d; it is fixed when a cluster is created", m.rf(), rf)
	}
	return nil
}

// nodeNumber returns node id's raft node number, allocating it on first use:
// the create revision of its nodenum key, unique in the cluster and the same
// for every later run of the node (its replicas are addressed by it).
func nodeNumber(ctx context.Context, cli *clientv3.Client, k keys, id string) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	key := k.nodeNum(id)
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, id)).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return 0, fmt.Errorf("cluster: allocate the raft node number of %q: %w", id, err)
	}
	if resp.Succeeded {
		return uint64(resp.Header.Revision), nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return 0, errors.New("cluster: a node number key vanished")
	}
	return uint64(kvs[0].CreateRevision), nil
}

// ownedBy lists the partitions whose owner is id, in order.
func ownedBy(parts []PartEntry, id string) []uint32 {
	var out []uint32
	for p, e := range parts {
		if e.Owner == id {
			out = append(out, uint32(p))
		}
	}
	return out
}

// sortedIDs returns the ids of nodes in order.
func sortedIDs(nodes map[string]NodeInfo) []string {
	ids := make([]string, 0, len(nodes))
	for id := range nodes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}
