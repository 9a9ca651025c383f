package cluster

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The placement controller: one node at a time, elected by creating the
// controller key under its lease, assigns partitions without an owner to live
// nodes, asks the owners of a leaving node's partitions to hand them off, and
// evens out the partition counts after a join, a few handoffs at a time. It only
// ever writes owners and targets; a node changes its own entries' epochs when it
// takes a partition up. A crashed node's partitions keep their owner: they wait
// for it (or for `holdfast cluster forget-node`).

// controllerLoop campaigns for the controller key and, while it holds it, places
// partitions at every change of the cluster's state.
func (m *member) controllerLoop() {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		changed := m.view.wait()
		if s := m.sess.Load(); s != nil && s.valid() {
			if m.campaign(s) {
				place := m.place
				if m.r != nil {
					place = func(*session) error { return m.r.placeGroups() }
				}
				if err := place(s); err != nil && m.ctx.Err() == nil {
					m.log.Debug("placement pass failed", "err", err)
				}
			}
		}
		select {
		case <-m.ctx.Done():
			return
		case <-changed:
		case <-tick.C:
		}
	}
}

// controllerValue is what the controller key holds: the node and its lease.
func (m *member) controllerValue(s *session) string {
	return fmt.Sprintf("%s/%d", m.id, int64(s.lease))
}

// campaign reports whether this node is the controller, trying to become it
// when nobody is.
func (m *member) campaign(s *session) bool {
	m.view.mu.RLock()
	ctrl := m.view.ctrl
	m.view.mu.RUnlock()
	me := m.controllerValue(s)
	if ctrl == me {
		return true
	}
	if ctrl != "" {
		return false
	}
	ctx, cancel := context.WithTimeout(m.ctx, 3*time.Second)
	defer cancel()
	key := m.k.controller()
	resp, err := m.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, me, clientv3.WithLease(s.lease))).Commit()
	if err != nil || !resp.Succeeded {
		return false
	}
	m.log.Info("this node is the placement controller")
	return true
}

// place runs one placement pass.
func (m *member) place(s *session) error {
	nodes, parts, _, _ := m.view.snapshot()
	// A partition its live owner refuses to serve (another data directory)
	// keeps its owner and gets no target: a handoff would copy nothing. Its
	// owner gets no partition until it refuses none (forget-node).
	refused := func(e PartEntry) bool {
		n, live := nodes[e.Owner]
		return live && refusedBy(e, n.Storage)
	}
	blocked := map[string]bool{}
	for _, e := range parts {
		if refused(e) {
			blocked[e.Owner] = true
		}
	}
	isEligible := func(id string) bool {
		n, ok := nodes[id]
		return ok && !n.Client && !n.Leaving && !blocked[id]
	}
	eligible := []string{}
	for _, id := range sortedIDs(nodes) {
		if isEligible(id) {
			eligible = append(eligible, id)
		}
	}
	// load counts what each eligible node owns or is about to receive.
	load := map[string]int{}
	for _, id := range eligible {
		load[id] = 0
	}
	moves := 0
	for _, e := range parts {
		switch {
		case e.Target != "":
			moves++
			load[e.Target]++
		case e.Owner != "":
			if _, ok := load[e.Owner]; ok {
				load[e.Owner]++
			}
		}
	}
	least := func(except string) string {
		best := ""
		for _, id := range eligible {
			if id != except && (best == "" || load[id] < load[best]) {
				best = id
			}
		}
		return best
	}
	update := func(p int, e PartEntry) error {
		err := casPart(m.ctx, m.cli, m.k, uint32(p), parts[p], e)
		if err == nil {
			e.rev = -1 // changed: not to be changed again in this pass
			parts[p] = e
		}
		return err
	}
	for p, e := range parts {
		switch {
		case e.Owner == "" && len(eligible) > 0:
			// A new cluster (or a forgotten node's partitions): assign.
			to := least("")
			if err := update(p, PartEntry{Owner: to, Epoch: e.Epoch, Losses: e.Losses}); err != nil {
				return err
			}
			load[to]++
		case e.Target != "" && (!isEligible(e.Target) || nodes[e.Owner].ID == "" || refused(e)):
			// The move cannot happen: its target left, its owner is down, or
			// its owner does not hold its data.
			ne := e
			ne.Target = ""
			if err := update(p, ne); err != nil {
				return err
			}
			moves--
			load[e.Target]--
		}
	}
	// A leaving node's partitions go first, then the most loaded node's.
	for p, e := range parts {
		if moves >= m.cfg.MaxMoves {
			return nil
		}
		owner, live := nodes[e.Owner]
		if e.Owner == "" || e.Target != "" || e.rev < 0 || !live || !owner.Leaving || refused(e) {
			continue
		}
		to := least(e.Owner)
		if to == "" {
			continue // nobody to take it: it stays (and goes down with its node)
		}
		ne := e
		ne.Target = to
		if err := update(p, ne); err != nil {
			return err
		}
		moves++
		load[to]++
	}
	for moves < m.cfg.MaxMoves && len(eligible) > 1 {
		most, few := "", least("")
		for _, id := range eligible {
			if most == "" || load[id] > load[most] {
				most = id
			}
		}
		if load[most]-load[few] <= 1 {
			return nil
		}
		moved := false
		for p, e := range parts {
			if e.Owner == most && e.Target == "" && e.rev >= 0 {
				ne := e
				ne.Target = few
				if err := update(p, ne); err != nil {
					return err
				}
				load[most]--
				load[few]++
				moves++
				moved = true
				break
			}
		}
		if !moved {
			return nil
		}
	}
	return nil
}
