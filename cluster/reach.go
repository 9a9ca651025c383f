package cluster

import (
	"context"
	"encoding/json"
	"maps"
	"sort"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Reachability as routing sees it. A node's router answers 503 "does not
// answer" for a node whose connection failed (transport.isDown) long before
// etcd drops the node's registration (its lease, seconds later). So that
// `holdfast cluster status` says what routing does, every node records in etcd,
// under its lease, the nodes its transport finds unreachable (reach/<id>), and
// status shows a node unreachable, and its partitions unavailable, as soon as
// any live node records it so.

// reachRecord is the value of reach/<observer>: the nodes the observer cannot
// reach, each with the boot (run) it could not reach, so that a record about
// an earlier run of a node says nothing about its new one.
type reachRecord struct {
	Unreachable map[string]string `json:"unreachable"` // node id -> boot
}

// reachEvery is how often a node compares its transport's state with what it
// recorded; pingDownEvery how often it pings a node it cannot reach, to see
// it answer again when no request goes its way.
const (
	reachEvery    = 200 * time.Millisecond
	pingDownEvery = time.Second
)

// reachLoop keeps reach/<this node> current until m.ctx ends.
func (m *member) reachLoop() {
	tick := time.NewTicker(reachEvery)
	defer tick.Stop()
	var recorded map[string]string
	var recordedLease int64
	lastPing := time.Now()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-tick.C:
		}
		s := m.sess.Load()
		if s == nil || !s.valid() {
			continue
		}
		nodes, _, _, _ := m.view.snapshot()
		now := map[string]string{}
		for id, n := range nodes {
			if id != m.id && !n.Client && m.tr.unreachable(n.Addr) {
				now[id] = n.Boot
			}
		}
		if len(now) > 0 && time.Since(lastPing) >= pingDownEvery {
			lastPing = time.Now()
			for id := range now {
				if _, ok := m.tr.ping(nodes[id].Addr); ok {
					m.tr.clearDown(nodes[id].Addr)
					delete(now, id)
				}
			}
		}
		if int64(s.lease) == recordedLease && maps.Equal(now, recorded) {
			continue
		}
		b, _ := json.Marshal(reachRecord{Unreachable: now})
		ctx, cancel := context.WithTimeout(m.ctx, 3*time.Second)
		_, err := m.cli.Put(ctx, m.k.reach(m.id), string(b), clientv3.WithLease(s.lease))
		cancel()
		if err != nil {
			m.log.Debug("cannot record which nodes are unreachable; retrying", "err", err)
			continue
		}
		if len(now) != len(recorded) {
			m.log.Info("nodes this node cannot reach", "unreachable", len(now), "nodes", sortedKeys(now))
		}
		recorded, recordedLease = now, int64(s.lease)
	}
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range maps.Keys(m) {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
