package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// recover-partition (docs/replication.md, "A partition that lost its
// majority"): an operator gives up the writes that only a partition's lost
// replicas held, to serve it again from the best replica left.
//
// The command picks, among the group's replicas whose nodes are live on the
// data directory the replica was placed on, the one whose log goes furthest
// (the highest last term, then last index, as its node reports it), and
// rewrites the group's entry in etcd, by compare-and-swap, to one new
// replica on that node, RecoverFrom the survivor, with Losses one higher.
// The node then copies the survivor's log into the new replica with itself
// as the only voter (replication.WALPipeline.Reseed), starts it (it elects
// itself and commits the whole copy), and the controller grows the group
// back to the replication factor by adding replicas, filled by snapshot.
// Every other replica of the group, on whatever node, is no longer listed:
// a node that runs one stops it, and a node that returns never starts it.
// Objects of the partition number their next log_ids above a floor raised by
// the new Losses, so no log_id the lost replicas issued is issued again.

// ErrMajorityLive refuses recover-partition for a partition whose majority
// is live: raft serves it without losing anything.
var ErrMajorityLive = errors.New("a majority of its replicas is live")

// ErrServed refuses recover-partition for a partition a replica reports it
// serves (its report may lag a second behind a lost lease: try again).
var ErrServed = errors.New("the partition is served")

// RecoverResult is what RecoverPartition did.
type RecoverResult struct {
	Partition uint32
	// Node is the node whose replica the partition restarts from; From is
	// that replica, Replica the new one.
	Node          string
	From, Replica uint64
	// LastIndex and LastTerm are the end of the survivor's log, as its node
	// last reported it.
	LastIndex, LastTerm uint64
	// Lost lists the nodes of the replicas given up.
	Lost []string
	// Losses is the partition's new count of recoveries.
	Losses uint64
}

// RecoverPartition restarts partition p of cluster name from its best
// surviving replica, giving up whatever only its lost replicas held (see
// above). It refuses a partition whose majority is live (ErrMajorityLive), a
// cluster of one copy (ErrReplicated: forget-node is its command), and a
// partition with no live replica that reported its log.
func RecoverPartition(ctx context.Context, endpoints []string, name string, p uint32) (RecoverResult, error) {
	cli, err := dial(endpoints)
	if err != nil {
		return RecoverResult{}, err
	}
	defer cli.Close()
	k := newKeys(name)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	resp, err := cli.Get(ctx, k.root, clientv3.WithPrefix())
	if err != nil {
		return RecoverResult{}, fmt.Errorf("read cluster %q from etcd: %w", name, err)
	}
	var meta clusterMeta
	reports := map[string][]byte{}
	for _, kv := range resp.Kvs {
		switch key := string(kv.Key); {
		case key == k.meta():
			if err := json.Unmarshal(kv.Value, &meta); err != nil {
				return RecoverResult{}, fmt.Errorf("cluster meta: %w", err)
			}
		case strings.HasPrefix(key, k.replicasPrefix()):
			reports[key] = kv.Value
		}
	}
	if meta.Partitions == 0 {
		return RecoverResult{}, fmt.Errorf("no cluster %q in etcd %v", name, cli.Endpoints())
	}
	if meta.rf() <= 1 {
		return RecoverResult{}, fmt.Errorf("%w: cluster %q keeps one copy of each partition: a partition of a dead node is given up with holdfast cluster forget-node NODE --accept-data-loss", ErrReplicated, name)
	}
	if int(p) >= meta.Partitions {
		return RecoverResult{}, fmt.Errorf("no partition %d: cluster %q has partitions 0 to %d", p, name, meta.Partitions-1)
	}
	v := newView(meta.Partitions)
	v.load(k, resp)
	nodes, _, _, _ := v.snapshot()
	reps := replicaReports(k, reports, nodes)
	g, err := readGroup(ctx, cli, k, p)
	if err != nil {
		return RecoverResult{}, err
	}
	if len(g.Replicas) == 0 {
		return RecoverResult{}, fmt.Errorf("partition %d has no replicas yet: the cluster forms it once enough nodes are live", p)
	}
	type candidate struct {
		rep       ReplicaEntry
		last, lt  uint64
		reporting bool
	}
	var live []candidate
	var lost []string
	voters, servedBy := 0, ""

	for _, rep := range g.Replicas {
		if !rep.pending() {
			voters++
		}
		n, up := nodes[rep.Node]
		if !up || n.Storage != rep.Storage {
			lost = append(lost, rep.Node)
			continue
		}
		c := candidate{rep: rep}
		if r, ok := reps[rep.Node].Parts[strconv.Itoa(int(p))]; ok && r.Replica == rep.ID && r.Failed == "" {
			if r.Serving {
				servedBy = rep.Node
			}
			c.last, c.lt, c.reporting = r.Last, r.LastTerm, true
		}
		live = append(live, c)
	}
	liveVoters := 0
	for _, c := range live {
		if !c.rep.pending() {
			liveVoters++
		}
	}
	if 2*liveVoters > voters {
		return RecoverResult{}, fmt.Errorf("%w: partition %d has %d of its %d voting replicas live; it elects a leader by itself (holdfast cluster status --partitions shows why it is not served yet)", ErrMajorityLive, p, liveVoters, voters)
	}
	if servedBy != "" {
		return RecoverResult{}, fmt.Errorf("%w: partition %d is served by %s, as its last report says", ErrServed, p, servedBy)
	}
	sort.SliceStable(live, func(i, j int) bool {
		a, b := live[i], live[j]
		if a.reporting != b.reporting {
			return a.reporting
		}
		if a.lt != b.lt {
			return a.lt > b.lt
		}
		return a.last > b.last
	})
	if len(live) == 0 || !live[0].reporting {
		return RecoverResult{}, fmt.Errorf("partition %d: no live replica has reported its log (replicas on %s are down or on another data directory); start one of those nodes on its data directory, wait a few seconds, and try again", p, strings.Join(lost, ", "))
	}
	best := live[0]
	for _, c := range live[1:] {
		lost = append(lost, c.rep.Node)
	}
	sort.Strings(lost)
	n := nodes[best.rep.Node]
	ne := GroupEntry{
		Replicas: []ReplicaEntry{{ID: g.Next, Node: n.ID, Num: n.Num, Storage: n.Storage, RecoverFrom: best.rep.ID}},
		Next:     g.Next + 1,
		Losses:   g.Losses + 1,
	}
	if err := casGroup(ctx, cli, k, p, g, ne); err != nil {
		if errors.Is(err, errConflict) {
			return RecoverResult{}, fmt.Errorf("partition %d changed meanwhile (a move, or another recovery); look again (holdfast cluster status --partitions)", p)
		}
		return RecoverResult{}, fmt.Errorf("partition %d: %w", p, err)
	}
	return RecoverResult{Partition: p, Node: n.ID, From: best.rep.ID, Replica: g.Next, LastIndex: best.last, LastTerm: best.lt, Lost: lost, Losses: ne.Losses}, nil
}
