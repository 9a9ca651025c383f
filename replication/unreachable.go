package replication

// ReportUnreachable tells group g's replica that the transport could not
// deliver a message to replica to (a full queue, a failed connection): raft
// then stops optimistic replication to it and probes instead. It only queues
// (the worker holding the group calls RawNode.ReportUnreachable), so it is
// safe from any goroutine. Unknown groups are ignored.
func (e *Engine) ReportUnreachable(g GroupID, to ReplicaID) {
	if e.closed.Load() {
		return
	}
	grp := e.group(g)
	if grp == nil || to == grp.replica {
		return
	}
	grp.mu.Lock()
	for _, r := range grp.unreach {
		if r == to {
			grp.mu.Unlock()
			return // already reported, not taken yet
		}
	}
	grp.unreach = append(grp.unreach, to)
	grp.mu.Unlock()
	e.sched.enqueue(grp, flagMessage)
}

// takeUnreachable empties the group's unreachable reports (worker only).
func (g *group) takeUnreachable() []ReplicaID {
	g.mu.Lock()
	r := g.unreach
	g.unreach = nil
	g.mu.Unlock()
	return r
}
