package persistence

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
)

// The raft logs of the replicas this node holds, as the write-ahead log holds
// them (docs/replication-design.md, 1.4-1.8): for each replica, its HardState,
// its first index, and per entry the term and where the entry's data is in
// the log (segment and offset), with the newest entries' bytes cached.
//
// Invariants:
//   - the index is the log: it changes only after the record that says so is
//     durable (the committer updates it right after the record's sync, before
//     any job of that record is done), and replay rebuilds it record by record;
//   - a replica's entries [first, last] are each in an unreleased segment:
//     a segment is released only once every replica's highest index in it is
//     below that replica's first index (pinned);
//   - the op 6 state a new segment starts with is taken from the index, which
//     then equals the log up to the record before it.

// raftCacheBytes is the bytes of entry data each replica keeps in memory,
// newest entries first; older entries are read from their segment. A
// variable for tests.
var raftCacheBytes = 4 << 20

// raftIndex is the node's raft logs.
type raftIndex struct {
	// mu guards logs and segMax. Lock order: raftIndex.mu, then a
	// replicaLog's mu, then wal.mu (a read of an entry's bytes).
	mu     sync.Mutex
	logs   map[raftKey]*replicaLog
	segMax map[uint64]map[raftKey]uint64 // per segment: each replica's highest index in it
	w      *wal                          // set once the log is open: entry reads
}

// replicaLog is one replica's log.
type replicaLog struct {
	mu              sync.Mutex
	hs              hardState
	hasHS           bool
	first, prevTerm uint64  // the first index kept; the term of first-1
	conf            logConf // the configuration as of first-1
	// snap is the staged snapshot first-1 is, while Badger may not hold it
	// (raftsnapshot.go); any truncation clears it.
	snap   snapRef
	ents   []entryLoc // ents[i] is index first+i
	cached int        // bytes of data held in ents
	// cacheFrom: entries below this index hold no data (eviction walks up).
	cacheFrom uint64
}

// entryLoc is one entry of a replicaLog.
type entryLoc struct {
	term uint64
	seg  uint64 // the segment it is in; 0 while replay knows it only from a state record
	off  int64  // offset of its data in the segment file
	size uint32
	typ  uint8
	data []byte // cached bytes, or nil
}

func newRaftIndex() *raftIndex {
	return &raftIndex{logs: map[raftKey]*replicaLog{}, segMax: map[uint64]map[raftKey]uint64{}}
}

// replica returns k's log, creating an empty one (first index 1) if asked.
func (x *raftIndex) replica(k raftKey, create bool) *replicaLog {
	x.mu.Lock()
	defer x.mu.Unlock()
	l := x.logs[k]
	if l == nil && create {
		l = &replicaLog{first: 1, cacheFrom: 1}
		x.logs[k] = l
	}
	return l
}

// hasState reports whether the node holds any raft log: its WAL must then
// survive a clean close.
func (x *raftIndex) hasState() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.logs) > 0
}

func (l *replicaLog) last() uint64 { return l.first + uint64(len(l.ents)) - 1 }

// term returns the term of entry i and whether it is known (replay may know
// entries only from a state record: then only the last one's term).
func (l *replicaLog) term(i uint64) (uint64, bool) {
	switch {
	case i+1 == l.first:
		return l.prevTerm, true
	case i < l.first || i > l.last():
		return 0, false
	}
	e := &l.ents[i-l.first]
	return e.term, e.seg != 0 || i == l.last()
}

// raftReplayError is a raft change that does not continue its log; replay
// turns it into a *CorruptionError at the record's place.
type raftReplayError struct {
	key    raftKey
	index  uint64
	reason string
}

func (e *raftReplayError) Error() string {
	return fmt.Sprintf("group %d replica %d: %s", e.key.group, e.key.replica, e.reason)
}

// checkBlock says why b cannot follow l's log (nil if it can): entries must
// start at most one above the last index and not below the first, their
// first term not below the term of the entry before them; a HardState's term
// may not go down, nor its commit pass the last index once b's entries are in.
func (l *replicaLog) checkBlock(b *raftBlock) *raftReplayError {
	last := l.last()
	if len(b.ents) > 0 {
		i := b.ents[0].index
		switch {
		case i < l.first:
			return &raftReplayError{b.key, i, fmt.Sprintf("entry %d is below the log's first index %d", i, l.first)}
		case i > last+1:
			return &raftReplayError{b.key, i, fmt.Sprintf("a gap: entry %d follows the last index %d (entries %d..%d are missing)", i, last, last+1, i-1)}
		}
		if t, ok := l.term(i - 1); ok && b.ents[0].term < t {
			return &raftReplayError{b.key, i, fmt.Sprintf("the term goes down: entry %d has term %d, entry %d term %d", i, b.ents[0].term, i-1, t)}
		}
		last = b.ents[len(b.ents)-1].index
	}
	if b.hasHS {
		if l.hasHS && b.hs.term < l.hs.term {
			return &raftReplayError{b.key, last, fmt.Sprintf("the HardState's term goes down from %d to %d", l.hs.term, b.hs.term)}
		}
		if b.hs.commit > last {
			return &raftReplayError{b.key, b.hs.commit, fmt.Sprintf("the commit index %d passes the last index %d", b.hs.commit, last)}
		}
	}
	return nil
}

// applyBlock puts b into l (checked by checkBlock): a leader's overwrite drops
// the suffix from b's first index first. Entry i's data is at offset
// base+dataOff in segment seg; copyData says whether data must be copied to
// be cached (replay: it aliases a whole segment read into memory).
func (l *replicaLog) applyBlock(b *raftBlock, seg uint64, base int64, copyData bool) {
	if len(b.ents) > 0 {
		i := b.ents[0].index
		if i <= l.last() {
			for j := i - l.first; j < uint64(len(l.ents)); j++ {
				l.cached -= len(l.ents[j].data)
			}
			clear(l.ents[i-l.first:])
			l.ents = l.ents[:i-l.first]
			l.cacheFrom = min(l.cacheFrom, i)
		}
		for _, e := range b.ents {
			data := e.data
			if copyData {
				data = slices.Clone(data)
			}
			l.ents = append(l.ents, entryLoc{term: e.term, seg: seg, off: base + int64(e.dataOff), size: uint32(len(e.data)), typ: e.typ, data: data})
			l.cached += len(data)
		}
		l.evict()
	}
	if b.hasHS {
		l.hs, l.hasHS = b.hs, true
	}
}

// evict drops cached data, oldest first, until the cache is within budget.
func (l *replicaLog) evict() {
	for l.cached > raftCacheBytes && l.cacheFrom <= l.last() {
		if l.cacheFrom >= l.first {
			e := &l.ents[l.cacheFrom-l.first]
			l.cached -= len(e.data)
			e.data = nil
		}
		l.cacheFrom++
	}
}

// checkTruncate says why k's log cannot start at first.
func (l *replicaLog) checkTruncate(k raftKey, first, prevTerm uint64, conf logConf) *raftReplayError {
	switch {
	case first < l.first:
		return &raftReplayError{k, first, fmt.Sprintf("a truncation to first index %d goes back below %d", first, l.first)}
	case first > l.last()+1 && !conf.set:
		return &raftReplayError{k, first, fmt.Sprintf("a truncation to first index %d passes the last index %d without a configuration (only a snapshot's or a bootstrap's may)", first, l.last())}
	}
	if t, known := l.term(first - 1); known && t != prevTerm {
		return &raftReplayError{k, first - 1, fmt.Sprintf("a truncation to first index %d says entry %d has term %d; the log holds it with term %d", first, first-1, prevTerm, t)}
	}
	return nil
}

// truncate makes the log start at first, entry first-1 having term
// prevTerm (checked by checkTruncate), with configuration conf as of first-1
// if set. A first beyond the last index + 1 (a snapshot's or a bootstrap's
// point, which always comes with its configuration) empties the log.
func (l *replicaLog) truncate(first, prevTerm uint64, conf logConf) {
	l.snap = snapRef{}
	if conf.set {
		l.conf = conf
	}
	if first == l.first {
		l.prevTerm = prevTerm
		return
	}
	if first > l.last()+1 {
		l.ents, l.cached = nil, 0
		l.first, l.prevTerm, l.cacheFrom = first, prevTerm, first
		return
	}
	t := prevTerm
	n := first - l.first
	for j := uint64(0); j < n; j++ {
		l.cached -= len(l.ents[j].data)
	}
	// A new slice: the dropped prefix's backing array goes.
	l.ents = append([]entryLoc(nil), l.ents[n:]...)
	l.first, l.prevTerm = first, t
	l.cacheFrom = max(l.cacheFrom, first)
}

// state returns l as an op 6 replica state.
func (l *replicaLog) state(k raftKey) replicaState {
	last := l.last()
	lt, _ := l.term(last)
	return replicaState{key: k, hs: l.hs, first: l.first, prevTerm: l.prevTerm, last: last, lastTerm: lt, conf: l.conf, snap: l.snap}
}

// head returns the op 6 change a new segment's first record starts with, or
// nil when the node holds no raft log (a single node: nothing changes).
func (x *raftIndex) head() []byte {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.logs) == 0 {
		return nil
	}
	states := make([]replicaState, 0, len(x.logs))
	for k, l := range x.logs {
		l.mu.Lock()
		states = append(states, l.state(k))
		l.mu.Unlock()
	}
	slices.SortFunc(states, func(a, b replicaState) int {
		if c := cmp.Compare(a.key.group, b.key.group); c != 0 {
			return c
		}
		return cmp.Compare(a.key.replica, b.key.replica)
	})
	return appendRaftState(nil, states)
}

// noteSegment records that seg holds k's entries up to index (release pins).
// x.mu is held.
func (x *raftIndex) noteSegmentLocked(seg uint64, k raftKey, index uint64) {
	m := x.segMax[seg]
	if m == nil {
		m = map[raftKey]uint64{}
		x.segMax[seg] = m
	}
	m[k] = max(m[k], index)
}

// pinned reports whether a replica still needs entries in segment seg: its
// highest index there is at or above the replica's first index.
func (x *raftIndex) pinned(seg uint64) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	for k, maxIndex := range x.segMax[seg] {
		l := x.logs[k]
		if l == nil {
			continue
		}
		l.mu.Lock()
		first := l.first
		l.mu.Unlock()
		if maxIndex >= first {
			return true
		}
	}
	return false
}

// released forgets segment seg.
func (x *raftIndex) released(seg uint64) {
	x.mu.Lock()
	delete(x.segMax, seg)
	x.mu.Unlock()
}

// replayState applies an op 6 change at segment seg: a replica the index does
// not know yet starts from its state (entries first..last known by term only
// until later records or finishReplay say where they are); a known one must
// agree with it exactly, and every known one must be listed.
func (x *raftIndex) replayState(states []replicaState) *raftReplayError {
	x.mu.Lock()
	defer x.mu.Unlock()
	listed := make(map[raftKey]bool, len(states))
	for _, s := range states {
		listed[s.key] = true
		l := x.logs[s.key]
		if l == nil {
			l = &replicaLog{hs: s.hs, hasHS: s.hs != hardState{}, first: s.first, prevTerm: s.prevTerm, conf: s.conf, snap: s.snap, cacheFrom: s.last + 1}
			if s.last >= s.first {
				l.ents = make([]entryLoc, s.last-s.first+1)
				l.ents[len(l.ents)-1].term = s.lastTerm
			}
			x.logs[s.key] = l
			continue
		}
		l.mu.Lock()
		have := l.state(s.key)
		l.mu.Unlock()
		if have != s { // conf included: a state record never changes it
			return &raftReplayError{s.key, s.last, fmt.Sprintf("the state record (first %d after term %d, last %d term %d, HardState term %d vote %d commit %d, conf %q) disagrees with the log before it (first %d after term %d, last %d term %d, HardState term %d vote %d commit %d, conf %q)",
				s.first, s.prevTerm, s.last, s.lastTerm, s.hs.term, s.hs.vote, s.hs.commit, s.conf.cs, have.first, have.prevTerm, have.last, have.lastTerm, have.hs.term, have.hs.vote, have.hs.commit, have.conf.cs)}
		}
	}
	for k, l := range x.logs {
		if !listed[k] {
			l.mu.Lock()
			last := l.last()
			l.mu.Unlock()
			return &raftReplayError{k, last, "the replica is missing from the state record that starts the segment"}
		}
	}
	return nil
}

// replayBlock checks b against its log and applies it (replay; the block is
// at file offset base+dataOff of its entries in segment seg).
func (x *raftIndex) replayBlock(b *raftBlock, seg uint64, base int64) *raftReplayError {
	l := x.replica(b.key, true)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.checkBlock(b); err != nil {
		return err
	}
	l.applyBlock(b, seg, base, true)
	if len(b.ents) > 0 {
		x.mu.Lock()
		x.noteSegmentLocked(seg, b.key, b.ents[len(b.ents)-1].index)
		x.mu.Unlock()
	}
	return nil
}

// replayTruncate checks and applies an op 5 change.
func (x *raftIndex) replayTruncate(t raftTruncation) *raftReplayError {
	l := x.replica(t.key, true)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.checkTruncate(t.key, t.first, t.prevTerm, t.conf); err != nil {
		return err
	}
	l.truncate(t.first, t.prevTerm, t.conf)
	return nil
}

// finishReplay checks that every replica's entries are each in a retained
// segment: an entry known only from a state record was in a segment released
// since, which the release rule allows only below the first index.
func (x *raftIndex) finishReplay() *raftReplayError {
	x.mu.Lock()
	defer x.mu.Unlock()
	for k, l := range x.logs {
		for j := range l.ents {
			if l.ents[j].seg == 0 {
				i := l.first + uint64(j)
				return &raftReplayError{k, i, fmt.Sprintf("entry %d (the log holds %d..%d) is in no retained segment: a segment the replica still needed is missing", i, l.first, l.last())}
			}
		}
	}
	return nil
}

// raftReplay applies the raft changes of replayed records to the index,
// reusing its buffers from one change to the next.
type raftReplay struct {
	b      raftBlock
	states []replicaState
}

// change decodes the op at d and applies it to x; at is where the record is.
// A change that does not decode is errCorrupt, one that does not continue
// its log a *raftReplayError.
func (r *raftReplay) change(x *raftIndex, d *raftDecoder, op byte, at recordPlace) error {
	switch op {
	case opRaftBlock:
		if err := d.block(&r.b); err != nil {
			return err
		}
		if re := x.replayBlock(&r.b, at.seg, at.payloadAt); re != nil {
			return re
		}
	case opRaftTruncate:
		t, err := d.truncate()
		if err != nil {
			return err
		}
		if re := x.replayTruncate(t); re != nil {
			return re
		}
	case opRaftSnapshot:
		s, err := d.snapshot()
		if err != nil {
			return err
		}
		if re := x.replaySnapshot(&s); re != nil {
			return re
		}
	case opRaftState:
		var err error
		if r.states, err = d.state(r.states[:0]); err != nil {
			return err
		}
		if re := x.replayState(r.states); re != nil {
			return re
		}
	default:
		return errCorrupt
	}
	return nil
}
