package replicationtest

import (
	"errors"
	"fmt"
	"sort"
	"sync"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/replication"
)

// Checker holds the model the invariants are checked against:
//
//  1. No two replicas of a group apply different entries at one index (the
//     first replica to apply an index fixes it, for the cluster's life).
//  2. A replica applies indexes in sequence, never going back, across its
//     restarts (its disk keeps the applied index), except that a restart may
//     start again lower, at most where it was (Restarted): the WAL pipeline
//     applies again every committed entry its log holds, and by 1 each must
//     be the entry applied there before.
//  3. Every acknowledged proposal is at its acknowledged index (same entry),
//     and, once the cluster is healed and quiet, applied on a majority
//     (WaitAcked). With 1, an acknowledged entry that a crash lost and a
//     later leader replaced is caught as soon as any replica applies the
//     replacement.
//  4. A payload reported not written is never applied.
//  5. Reads are linearizable against acknowledged writes: when a ReadIndex
//     succeeds on node n with index i, i covers every proposal of the group
//     acknowledged before the read was issued, and n had applied at least i
//     when it returned; so the applied prefix n's state machine then shows
//     holds them all (with 1, at their acknowledged indexes). A read served
//     from a leader lease (Cluster.LeaseRead) is checked the same way, with
//     n's applied index after LeaseValid held as its index.
//
// Payloads are compared as bytes, so each must be unique.
type Checker struct {
	mu          sync.Mutex
	nodes       int
	entries     map[replication.GroupID]map[uint64]applyRec // index -> the entry
	appliedAt   map[string]applyRec                         // payload -> where it was applied
	lastApplied map[[2]uint64]uint64                        // (node, group) -> index
	acks        map[string]ack
	notWrit     map[string]bool
	maxAcked    map[replication.GroupID]uint64 // the highest acknowledged index per group
	reads       int                            // reads that returned
	leaseReads  int                            // of which served from a lease
	violations  []string
}

type applyRec struct {
	group replication.GroupID
	index uint64
	term  uint64
	data  string
}

type ack struct {
	group replication.GroupID
	res   replication.Result
}

func newChecker(nodes int) *Checker {
	return &Checker{
		nodes:       nodes,
		entries:     make(map[replication.GroupID]map[uint64]applyRec),
		appliedAt:   make(map[string]applyRec),
		lastApplied: make(map[[2]uint64]uint64),
		acks:        make(map[string]ack),
		notWrit:     make(map[string]bool),
		maxAcked:    make(map[replication.GroupID]uint64),
	}
}

func (c *Checker) violate(format string, args ...any) {
	c.violations = append(c.violations, fmt.Sprintf(format, args...))
}

// restarted says node n restarts group g with applied index from: it applies
// again from from+1. A restart above the index it reached would skip entries.
func (c *Checker) restarted(n replication.NodeID, g replication.GroupID, from uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := [2]uint64{uint64(n), uint64(g)}
	if last := c.lastApplied[key]; from > last {
		c.violate("node %d group %d restarts at applied index %d, but had applied only up to %d", n, g, from, last)
	}
	c.lastApplied[key] = from
}

// applied is called for every entry node n applies to group g, in order.
func (c *Checker) applied(n replication.NodeID, g replication.GroupID, ent *raftpb.Entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	idx := ent.GetIndex()
	key := [2]uint64{uint64(n), uint64(g)}
	if last := c.lastApplied[key]; idx != last+1 {
		c.violate("node %d group %d applied index %d after %d (indexes must go up by one, never back)", n, g, idx, last)
	}
	c.lastApplied[key] = idx
	var payload string
	if ent.GetType() == raftpb.EntryNormal {
		if _, p, ok, err := replication.DecodeEntry(ent.GetData()); err != nil {
			c.violate("node %d group %d index %d: %v", n, g, idx, err)
		} else if ok {
			payload = string(p)
		}
	}
	rec := applyRec{group: g, index: idx, term: ent.GetTerm(), data: payload}
	byIdx := c.entries[g]
	if byIdx == nil {
		byIdx = make(map[uint64]applyRec)
		c.entries[g] = byIdx
	}
	if prev, ok := byIdx[idx]; !ok {
		byIdx[idx] = rec
	} else if prev.term != rec.term || prev.data != rec.data {
		c.violate("group %d index %d: node %d applied (term %d, %q), another replica applied (term %d, %q)", g, idx, n, rec.term, rec.data, prev.term, prev.data)
	}
	if payload == "" {
		return
	}
	if c.notWrit[payload] {
		c.violate("group %d index %d: node %d applied %q, reported not written", g, idx, n, payload)
	}
	if prev, ok := c.appliedAt[payload]; ok && prev.index != idx {
		c.violate("group %d: %q applied at index %d and at index %d", g, payload, prev.index, idx)
	}
	c.appliedAt[payload] = rec
	if a, ok := c.acks[payload]; ok && (a.res.Index != idx || a.res.Term != rec.term) {
		c.violate("group %d: %q acknowledged at index %d term %d, applied at index %d term %d", g, payload, a.res.Index, a.res.Term, idx, rec.term)
	}
}

// ackedPayloads returns every acknowledged payload.
func (c *Checker) ackedPayloads() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([][]byte, 0, len(c.acks))
	for p := range c.acks {
		out = append(out, []byte(p))
	}
	return out
}

// acked records a successful Propose.
func (c *Checker) acked(g replication.GroupID, payload []byte, res replication.Result) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := string(payload)
	c.acks[p] = ack{group: g, res: res}
	c.maxAcked[g] = max(c.maxAcked[g], res.Index)
	rec, ok := c.appliedAt[p]
	switch {
	case !ok:
		c.violate("group %d: %q acknowledged (index %d) before any replica applied it", g, p, res.Index)
	case rec.index != res.Index || rec.term != res.Term:
		c.violate("group %d: %q acknowledged at index %d term %d, applied at index %d term %d", g, p, res.Index, res.Term, rec.index, rec.term)
	}
	if e, ok := c.entries[g][res.Index]; ok && e.data != p {
		c.violate("group %d: %q acknowledged at index %d, which holds %q", g, p, res.Index, e.data)
	}
}

// notWritten records a proposal whose every attempt was reported not written.
func (c *Checker) notWritten(payload []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := string(payload)
	c.notWrit[p] = true
	if rec, ok := c.appliedAt[p]; ok {
		c.violate("group %d index %d: %q reported not written, but applied", rec.group, rec.index, p)
	}
}

// readStart is called just before a read of group g is issued: it returns
// the highest index of g acknowledged so far, which the read must cover.
func (c *Checker) readStart(g replication.GroupID) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.maxAcked[g]
}

// readDone records a read of group g that node n reported confirmed at index
// with applied its applied index on return; start is readStart's answer.
func (c *Checker) readDone(n replication.NodeID, g replication.GroupID, start, index, applied uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readDoneLocked(n, g, start, index, applied)
}

// leaseReadDone records a read of group g that node n served from its lease
// with applied its applied index after LeaseValid held: the state it shows
// must hold every proposal acknowledged before the read began.
func (c *Checker) leaseReadDone(n replication.NodeID, g replication.GroupID, start, applied uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leaseReads++
	c.readDoneLocked(n, g, start, applied, applied)
}

func (c *Checker) readDoneLocked(n replication.NodeID, g replication.GroupID, start, index, applied uint64) {
	c.reads++
	if index < start {
		c.violate("group %d: stale read on node %d: read index %d, but index %d was acknowledged before the read was issued", g, n, index, start)
	}
	if applied < index {
		c.violate("group %d: read on node %d returned at read index %d with only %d applied", g, n, index, applied)
	}
}

// LeaseReads returns the number of reads served from a lease.
func (c *Checker) LeaseReads() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leaseReads
}

// Reads returns the number of reads that returned (lease reads included).
func (c *Checker) Reads() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reads
}

// Err returns the invariant violations seen so far (1, 2, 4, 5 and the first
// half of 3), or nil.
func (c *Checker) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.violations) == 0 {
		return nil
	}
	errs := make([]error, 0, len(c.violations))
	for _, v := range c.violations {
		errs = append(errs, errors.New(v))
	}
	return errors.Join(errs...)
}

// Acked returns the number of acknowledged proposals.
func (c *Checker) Acked() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.acks)
}

// underReplicated returns an error naming the acknowledged proposals that
// fewer than a majority of nodes have applied (applied(n, g) is node n's
// applied index of g), or nil.
func (c *Checker) underReplicated(applied func(n replication.NodeID, g replication.GroupID) uint64) error {
	c.mu.Lock()
	type item struct {
		p string
		a ack
	}
	items := make([]item, 0, len(c.acks))
	for p, a := range c.acks {
		items = append(items, item{p, a})
	}
	nodes := c.nodes
	c.mu.Unlock()
	sort.Slice(items, func(i, j int) bool { return items[i].p < items[j].p })
	var missing []string
	for _, it := range items {
		have := 0
		for n := 1; n <= nodes; n++ {
			if applied(replication.NodeID(n), it.a.group) >= it.a.res.Index {
				have++
			}
		}
		if have <= nodes/2 {
			missing = append(missing, fmt.Sprintf("%q (group %d index %d) applied on %d of %d nodes", it.p, it.a.group, it.a.res.Index, have, nodes))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if len(missing) > 5 {
		missing = append(missing[:5], fmt.Sprintf("and %d more", len(missing)-5))
	}
	return fmt.Errorf("acknowledged proposals not on a majority: %v", missing)
}
