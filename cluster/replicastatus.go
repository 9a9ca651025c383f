package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sort"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast/metrics"
)

// What a replicated node tells the cluster about its replicas, for
// `holdfast cluster status` and for routing from nodes that have no replica
// of a partition: replicas/<id> (attached to the node's lease) holds, per
// partition this node has a replica of, its raft term, its applied index and
// whether it serves the partition (leads it under the lease). It is written
// at most once per reportEvery, when something changed. Nothing decides
// who serves from it: raft does.

// reportEvery is how often a node's replica report may be rewritten.
const reportEvery = time.Second

// replicaReport is one node's replicas/<id> value.
type replicaReport struct {
	// Parts maps a partition (decimal) to its replica on the node.
	Parts map[string]replicaState `json:"parts"`
}

// replicaState is one replica as its node reports it.
type replicaState struct {
	Replica uint64 `json:"replica"`
	Term    uint64 `json:"term"`
	Applied uint64 `json:"applied"`
	// Last and LastTerm are the end of the replica's log (what
	// recover-partition compares).
	Last     uint64 `json:"last,omitempty"`
	LastTerm uint64 `json:"lastTerm,omitempty"`
	Serving  bool   `json:"serving,omitempty"`
	Failed   string `json:"failed,omitempty"` // the replica could not start, or its group failed
}

// report builds this node's replica report now.
func (r *replicated) report() replicaReport {
	out := replicaReport{Parts: map[string]replicaState{}}
	for _, g := range r.e.Groups() {
		st, err := r.e.Status(g)
		if err != nil {
			continue
		}
		rs := replicaState{Replica: uint64(st.Replica), Term: st.Term, Applied: st.Applied, Serving: r.epoch(uint32(g)) != 0}
		ls := r.db.RaftStorage(uint64(g), uint64(st.Replica), nil)
		rs.Last, _ = ls.LastIndex()
		rs.LastTerm, _ = ls.Term(rs.Last)
		if st.Err != nil {
			rs.Failed = st.Err.Error()
		}
		out.Parts[strconv.Itoa(int(g))] = rs
	}
	r.mu.Lock()
	for p, why := range r.failed {
		out.Parts[strconv.Itoa(int(p))] = replicaState{Replica: uint64(r.local[p]), Failed: why}
	}
	r.mu.Unlock()
	return out
}

// reportLoop keeps this node's replica report current until the member stops.
func (r *replicated) reportLoop() {
	m := r.m
	t := time.NewTicker(reportEvery)
	defer t.Stop()
	var last replicaReport
	var lastLease int64
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		s := m.sess.Load()
		if s == nil || !s.valid() {
			continue
		}
		rep := r.report()
		if int64(s.lease) == lastLease && maps.Equal(rep.Parts, last.Parts) {
			continue
		}
		b, _ := json.Marshal(rep)
		ctx, cancel := context.WithTimeout(m.ctx, 3*time.Second)
		_, err := m.cli.Put(ctx, m.k.replicas(m.id), string(b), clientv3.WithLease(s.lease))
		cancel()
		if err != nil {
			m.log.Debug("cannot record this node's replicas; retrying", "err", err)
			continue
		}
		last, lastLease = rep, int64(s.lease)
	}
}

// ReplicaStatus is one replica's row in a replicated partition's status.
type ReplicaStatus struct {
	Node    string `json:"node"`
	Replica uint64 `json:"replica"`
	// State: live (its node is up and runs it), down (its node is not
	// registered), refused (its node runs on another data directory: the
	// replica is lost), failed (it could not start), unknown (not reported).
	State   string `json:"state"`
	Term    uint64 `json:"term,omitempty"`
	Applied uint64 `json:"applied,omitempty"`
	// Lag is how many entries it applied fewer than the leader (as of the
	// last reports, a second apart at most).
	Lag uint64 `json:"lag"`
	// Moving says a move is adding this replica (ReplicaEntry.Adding or
	// Replaces): until the move promotes it to a voter it does not count
	// toward the partition's replicas, live or not.
	Moving bool `json:"moving,omitempty"`
}

// replicatedStatus fills st's partitions and node rows from the group
// entries and the nodes' replica reports.
func replicatedStatus(st *Status, rf int, nodes map[string]NodeInfo, groups []GroupEntry, reports map[string]replicaReport, rows map[string]*NodeStatus) {
	st.ReplicationFactor = rf
	for p, g := range groups {
		key := strconv.Itoa(p)
		ps := PartStatus{Partition: uint32(p), State: PartUnavailable}
		if len(g.Replicas) == 0 {
			ps.Reason = fmt.Sprintf("not formed yet: the cluster waits for %d nodes", rf)
		}
		live := 0
		// The replicas no move is adding, and how many of them are live:
		// a replica being added is a learner until its move promotes it, so
		// a group of two voters and one being added is under-replicated
		// (losing a voter then loses the majority). Counting it let status
		// say "settled" while a move was still under way (a test crashed a
		// voter then, and the partition stayed unavailable).
		settledReps, liveSettled := 0, 0
		var leaderApplied uint64
		for _, rep := range g.Replicas {
			rs := ReplicaStatus{Node: rep.Node, Replica: rep.ID, State: "unknown", Moving: rep.Adding || rep.Replaces != 0}
			if !rs.Moving {
				settledReps++
			}
			n, up := nodes[rep.Node]
			row := rows[rep.Node]
			if row == nil {
				row = &NodeStatus{NodeInfo: NodeInfo{ID: rep.Node}, State: NodeDown, Reason: "not registered: crashed, stopped, or cut off from etcd"}
				rows[rep.Node] = row
			}
			row.Owned++
			switch {
			case !up:
				rs.State = "down"
			case n.Storage != rep.Storage:
				rs.State = "refused"
				row.Refused++
				row.State = NodeRefused
				row.Reason = fmt.Sprintf("its data directory (storage %s) is not the one its replicas were placed on: they are lost, and are not re-created yet", n.Storage)
			default:
				if r, ok := reports[rep.Node].Parts[key]; ok && r.Replica == rep.ID {
					rs.Term, rs.Applied = r.Term, r.Applied
					rs.State = "live"
					if r.Failed != "" {
						rs.State = "failed"
					}
					if r.Serving && r.Term >= ps.Term {
						ps.Leader, ps.Term, leaderApplied = rep.Node, r.Term, r.Applied
					}
				}
			}
			if rs.State == "live" {
				live++
				if !rs.Moving {
					liveSettled++
				}
			}
			ps.Replicas = append(ps.Replicas, rs)
		}
		for i := range ps.Replicas {
			if a := ps.Replicas[i].Applied; ps.Leader != "" && ps.Replicas[i].State == "live" && a < leaderApplied {
				ps.Replicas[i].Lag = leaderApplied - a
			}
		}
		ps.Owner, ps.Epoch = ps.Leader, ps.Term
		switch {
		case ps.Leader != "":
			ps.Available, ps.State = true, PartServed
			st.Served++
			rows[ps.Leader].Served++
		case len(g.Replicas) > 0 && 2*live <= len(g.Replicas):
			ps.Reason = fmt.Sprintf("only %d of its %d replicas are live: a majority is needed (it is served again once enough of them return; holdfast cluster recover-partition %d --accept-data-loss serves it from what is left)", live, len(g.Replicas), p)
			st.Unavailable++
		default:
			if len(g.Replicas) > 0 {
				ps.Reason = "no leader now (an election is under way)"
			}
			st.Unavailable++
		}
		if len(g.Replicas) > 0 && (liveSettled < settledReps || settledReps < rf) {
			ps.UnderReplicated = true
			st.UnderReplicated++
		}
		st.Parts = append(st.Parts, ps)
	}
	sort.Slice(st.Parts, func(i, j int) bool { return st.Parts[i].Partition < st.Parts[j].Partition })
}

// replicaReports parses the replicas/ records of live nodes.
func replicaReports(k keys, kvs map[string][]byte, nodes map[string]NodeInfo) map[string]replicaReport {
	out := map[string]replicaReport{}
	for key, v := range kvs {
		id := key[len(k.replicasPrefix()):]
		if _, live := nodes[id]; !live {
			continue
		}
		var r replicaReport
		if json.Unmarshal(v, &r) == nil {
			out[id] = r
		}
	}
	return out
}

// replicatedHalf returns the member's raft half, or nil (a single node, or a
// cluster of one copy).
func (m *member) replicatedHalf() *replicated {
	if m == nil {
		return nil
	}
	return m.r
}

// registerMetrics registers the raft measurements of a replicated node.
func (r *replicated) registerMetrics(mt *metrics.Metrics) {
	mt.GaugeFunc("holdfast_raft_replicas", "Raft replicas (partitions' group members) this node runs.", func() float64 { return float64(len(r.e.Groups())) })
	mt.GaugeFunc("holdfast_raft_leaders", "Partitions this node leads under the leader lease (serves).", func() float64 { return float64(len(r.served())) })
	mt.CounterFunc("holdfast_raft_proposals_total", "Entries this node's leaders proposed.", func() float64 { return float64(r.e.Stats().Proposed) })
	mt.CounterFunc("holdfast_raft_commits_total", "Entries this node's replicas saw committed.", func() float64 { return float64(r.e.Stats().Committed) })
	mt.CounterFunc("holdfast_raft_applies_total", "Entries this node's replicas applied.", func() float64 { return float64(r.e.Stats().Applied) })
	mt.CounterFunc("holdfast_raft_appends_coalesced_total", "Commit-only appends this node's leaders did not send: a later append to the same follower carried their commit index.", func() float64 { return float64(r.e.Stats().Coalesced) })
	mt.CounterFunc("holdfast_raft_messages_sent_total", "Raft messages this node sent to other nodes (heartbeats apart: they travel coalesced per node pair).", func() float64 { return float64(r.tr.Stats().MessagesOut) })
	mt.CounterFunc("holdfast_raft_elections_won_total", "Leaderships this node's replicas won (elections and transfers).", func() float64 { return float64(r.e.Stats().Elected) })
	mt.CounterFunc("holdfast_raft_leaderships_lost_total", "Leaderships this node's replicas lost.", func() float64 { return float64(r.e.Stats().SteppedDown) })
	mt.CounterFunc("holdfast_raft_snapshots_sent_total", "Snapshots this node streamed to a replica that was behind or new.", func() float64 { return float64(r.tr.Stats().SnapsSent) })
	mt.CounterFunc("holdfast_raft_snapshots_received_total", "Snapshots this node's replicas received whole.", func() float64 { return float64(r.tr.Stats().SnapsReceived) })
	mt.GaugeFunc("holdfast_raft_follower_lag_entries", "The most entries any follower of a partition this node leads is behind its log.", func() float64 {
		var most uint64
		for _, g := range r.e.Groups() {
			if st, err := r.e.Status(g); err != nil || !st.IsLeader {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			lag, _ := r.e.Lag(ctx, g) // a group that just lost its leader has none
			cancel()
			for _, l := range lag {
				most = max(most, l)
			}
		}
		return float64(most)
	})
}
