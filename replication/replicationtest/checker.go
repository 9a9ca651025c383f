package replicationtest

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

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
//  6. State machines agree: replicas at one applied index hold the same
//     digest (a hash chain over the applied entries) and the same config; a
//     snapshot a replica installs holds the digest and config the group had
//     at its index; every conf change applies (raft would panic otherwise).
//  7. Membership: a replica that is not an initial voter is a learner in the
//     first config that names it (no replica counts as a voter before it was
//     promoted), a new replica (created empty) starts by installing a
//     snapshot and the first config it learns lists it as a learner (design
//     risk 7), and no replica campaigns (sends MsgVote or MsgPreVote) before
//     some config made it a voter.
//
// Payloads are compared as bytes, so each must be unique.
type Checker struct {
	mu          sync.Mutex
	nodes       int
	initial     *raftpb.ConfState                           // every group's bootstrap config
	base        uint64                                      // the bootstrap's applied index
	entries     map[replication.GroupID]map[uint64]applyRec // index -> the entry
	appliedAt   map[string]applyRec                         // payload -> where it was applied
	lastApplied map[[2]uint64]uint64                        // (replica, group) -> index
	digests     map[replication.GroupID]map[uint64]Digest   // the state machine after each index
	confs       map[replication.GroupID]map[uint64]*raftpb.ConfState
	lastConf    map[replication.GroupID]uint64 // the highest conf change index seen
	learner     map[[2]uint64]bool             // (replica, group): named as a learner by some config
	voter       map[[2]uint64]bool             // (replica, group): made a voter by some config
	newRep      map[[2]uint64]bool             // (replica, group): created empty
	learned     map[[2]uint64]bool             // (replica, group): has learned a config naming it
	acks        map[string]ack
	notWrit     map[string]bool
	maxAcked    map[replication.GroupID]uint64 // the highest acknowledged index per group
	reads       int                            // reads that returned
	leaseReads  int                            // of which served from a lease
	installs    int                            // snapshots installed
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

func newChecker(nodes int, initial *raftpb.ConfState) *Checker {
	return &Checker{
		nodes:       nodes,
		initial:     initial,
		base:        BootstrapIndex,
		digests:     make(map[replication.GroupID]map[uint64]Digest),
		confs:       make(map[replication.GroupID]map[uint64]*raftpb.ConfState),
		lastConf:    make(map[replication.GroupID]uint64),
		learner:     make(map[[2]uint64]bool),
		voter:       make(map[[2]uint64]bool),
		newRep:      make(map[[2]uint64]bool),
		learned:     make(map[[2]uint64]bool),
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
	if last := c.baseLocked(key); from > last {
		c.violate("node %d group %d restarts at applied index %d, but had applied only up to %d", n, g, from, last)
	}
	c.lastApplied[key] = from
}

// baseLocked is a replica's applied index before its first apply or install.
func (c *Checker) baseLocked(key [2]uint64) uint64 {
	if last, ok := c.lastApplied[key]; ok {
		return last
	}
	if c.newRep[key] {
		return 0
	}
	return c.base
}

// newReplica records that replica r of g was created empty.
func (c *Checker) newReplica(r replication.ReplicaID, g replication.GroupID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.newRep[[2]uint64{uint64(r), uint64(g)}] = true
}

// configAtLocked is the config in force at index idx of g: the newest conf
// change at or below it, else the bootstrap config.
func (c *Checker) configAtLocked(g replication.GroupID, idx uint64) *raftpb.ConfState {
	best, cs := uint64(0), c.initial
	for i, x := range c.confs[g] {
		if i <= idx && i > best {
			best, cs = i, x
		}
	}
	return cs
}

// learnConfLocked checks the first config replica r of g learns (from a
// snapshot or a conf change it applies).
func (c *Checker) learnConfLocked(n replication.NodeID, r replication.ReplicaID, g replication.GroupID, cs *raftpb.ConfState, how string) {
	key := [2]uint64{uint64(r), uint64(g)}
	if c.learned[key] || !c.newRep[key] {
		return
	}
	c.learned[key] = true
	if !slices.Contains(cs.GetLearners(), uint64(r)) {
		c.violate("group %d: new replica %d on node %d learned its first config from %s, and it is not a learner there: %v", g, r, n, how, cs)
	}
}

// recordConfLocked checks a config some replica reached at index idx of g
// against what others reached there, and the learner-first rule.
func (c *Checker) recordConfLocked(g replication.GroupID, idx uint64, cs *raftpb.ConfState) {
	byIdx := c.confs[g]
	if byIdx == nil {
		byIdx = make(map[uint64]*raftpb.ConfState)
		c.confs[g] = byIdx
	}
	if prev, ok := byIdx[idx]; ok {
		if !proto.Equal(prev, cs) {
			c.violate("group %d index %d: replicas hold different configs: %v and %v", g, idx, prev, cs)
		}
		return
	}
	byIdx[idx] = cs
	c.lastConf[g] = max(c.lastConf[g], idx)
	for _, l := range slices.Concat(cs.GetLearners(), cs.GetLearnersNext()) {
		c.learner[[2]uint64{l, uint64(g)}] = true
	}
	for _, v := range slices.Concat(cs.GetVoters(), cs.GetVotersOutgoing()) {
		key := [2]uint64{v, uint64(g)}
		if !c.voter[key] && !slices.Contains(c.initial.GetVoters(), v) && !c.learner[key] {
			c.violate("group %d index %d: replica %d is a voter without having been a learner first: %v", g, idx, v, cs)
		}
		c.voter[key] = true
	}
}

// applied is called for every entry replica r (on node n) applies to group
// g, in order, with its state machine after it: digest, config (err: the
// conf change did not apply).
func (c *Checker) applied(n replication.NodeID, r replication.ReplicaID, g replication.GroupID, ent *raftpb.Entry, d Digest, cs *raftpb.ConfState, cerr error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	idx := ent.GetIndex()
	key := [2]uint64{uint64(r), uint64(g)}
	if last := c.baseLocked(key); idx != last+1 {
		c.violate("node %d group %d replica %d applied index %d after %d (indexes must go up by one, never back; a new replica starts with a snapshot)", n, g, r, idx, last)
	}
	c.lastApplied[key] = idx
	c.entryLocked(n, g, ent)
	dg := c.digests[g]
	if dg == nil {
		dg = make(map[uint64]Digest)
		c.digests[g] = dg
	}
	if prev, ok := dg[idx]; !ok {
		dg[idx] = d
	} else if prev != d {
		c.violate("group %d index %d: replica %d on node %d holds another state than a replica before it", g, idx, r, n)
	}
	if ent.GetType() != raftpb.EntryNormal {
		if cerr != nil {
			c.violate("group %d index %d: conf change does not apply: %v", g, idx, cerr)
		} else {
			c.recordConfLocked(g, idx, cs)
			c.learnConfLocked(n, r, g, cs, fmt.Sprintf("the conf change at index %d", idx))
		}
	}
}

// appliedEntry is applied for a pipeline that reports entries only (the WAL
// pipeline's test: replica id = node id, no digests, no conf changes).
func (c *Checker) appliedEntry(n replication.NodeID, g replication.GroupID, ent *raftpb.Entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	idx := ent.GetIndex()
	key := [2]uint64{uint64(n), uint64(g)}
	if last := c.baseLocked(key); idx != last+1 {
		c.violate("node %d group %d applied index %d after %d (indexes must go up by one, never back)", n, g, idx, last)
	}
	c.lastApplied[key] = idx
	c.entryLocked(n, g, ent)
}

// entryLocked checks the entry node n applied at its index (invariants 1,
// 3 and 4).
func (c *Checker) entryLocked(n replication.NodeID, g replication.GroupID, ent *raftpb.Entry) {
	idx := ent.GetIndex()
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

// installedWAL is called when node n's replica of g (replica id = node id)
// holds a snapshot at idx with term in Badger (the WAL pipeline's test): an
// index beyond what it applied, that a replica applied with that term.
func (c *Checker) installedWAL(n replication.NodeID, g replication.GroupID, idx, term uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := [2]uint64{uint64(n), uint64(g)}
	if last := c.baseLocked(key); idx <= last {
		c.violate("node %d group %d installed a snapshot at %d, having applied %d", n, g, idx, last)
	}
	if rec, ok := c.entries[g][idx]; !ok || rec.term != term {
		c.violate("group %d: node %d installed a snapshot at %d term %d, which no replica applied (%v %+v)", g, n, idx, term, ok, rec)
	}
	c.lastApplied[key] = idx
	c.installs++
}

// restored is called when replica r (on node n) of g installs snap.
func (c *Checker) restored(n replication.NodeID, r replication.ReplicaID, g replication.GroupID, snap *raftpb.Snapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	idx := snap.GetMetadata().GetIndex()
	key := [2]uint64{uint64(r), uint64(g)}
	if last := c.baseLocked(key); idx <= last {
		c.violate("node %d group %d replica %d installed a snapshot at %d, having applied %d", n, g, r, idx, last)
	}
	c.lastApplied[key] = idx
	c.installs++
	var d Digest
	copy(d[:], snap.GetData())
	if want, ok := c.digests[g][idx]; !ok {
		c.violate("group %d: replica %d on node %d installed a snapshot at %d, an index no replica applied", g, r, n, idx)
	} else if want != d {
		c.violate("group %d: replica %d on node %d installed a snapshot at %d whose state differs from the group's there", g, r, n, idx)
	}
	cs := raftpb.EnsureConfState(snap.GetMetadata().GetConfState())
	if want := c.configAtLocked(g, idx); cs.Equivalent(want) != nil {
		c.violate("group %d: replica %d on node %d installed a snapshot at %d with config %v, the group's there is %v", g, r, n, idx, cs, want)
	}
	c.learnConfLocked(n, r, g, cs, fmt.Sprintf("a snapshot at index %d", idx))
}

// sent sees every message the network carries: a replica that no config
// made a voter must not campaign.
func (c *Checker) sent(from replication.NodeID, env replication.Envelope) {
	m := env.Msg
	if t := m.GetType(); t != raftpb.MsgVote && t != raftpb.MsgPreVote {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r := m.GetFrom()
	if !c.voter[[2]uint64{r, uint64(env.Group)}] && !slices.Contains(c.initial.GetVoters(), r) {
		c.violate("group %d: replica %d on node %d campaigns (%s), but no config made it a voter", env.Group, r, from, m.GetType())
	}
}

// Voters returns the voters of g's newest config the checker saw applied.
func (c *Checker) Voters(g replication.GroupID) []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.configAtLocked(g, c.lastConf[g]).GetVoters()
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

// Installs returns the number of snapshots replicas installed.
func (c *Checker) Installs() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.installs
}

// Reads returns the number of reads that returned.
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
// fewer than a majority of the group's voters (in the newest config) have
// applied (applied(r, g) is replica r's applied index of g), or nil.
func (c *Checker) underReplicated(applied func(r replication.ReplicaID, g replication.GroupID) uint64) error {
	c.mu.Lock()
	type item struct {
		p string
		a ack
	}
	items := make([]item, 0, len(c.acks))
	for p, a := range c.acks {
		items = append(items, item{p, a})
	}
	voters := make(map[replication.GroupID][]uint64)
	for _, it := range items {
		if _, ok := voters[it.a.group]; !ok {
			voters[it.a.group] = c.configAtLocked(it.a.group, c.lastConf[it.a.group]).GetVoters()
		}
	}
	c.mu.Unlock()
	sort.Slice(items, func(i, j int) bool { return items[i].p < items[j].p })
	var missing []string
	for _, it := range items {
		have, vs := 0, voters[it.a.group]
		for _, r := range vs {
			if applied(replication.ReplicaID(r), it.a.group) >= it.a.res.Index {
				have++
			}
		}
		if have <= len(vs)/2 {
			missing = append(missing, fmt.Sprintf("%q (group %d index %d) applied on %d of %d voters", it.p, it.a.group, it.a.res.Index, have, len(vs)))
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
