package persistence

import (
	"fmt"
	"os"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// Raft appends through the committer (docs/replication-design.md, 1.3): a
// replica's MsgStorageAppend is queued like a write; everything queued goes
// into one record and one sync; right after the sync, on the goroutine that
// committed, the raft index takes the record's raft changes (the entries
// become readable through RaftStorage); then, in queue order, each job's Done
// runs on the completion goroutine.

// RaftAppend is one replica's append for the committer: a MsgStorageAppend's
// entries and HardState.
type RaftAppend struct {
	Group, Replica uint64
	// Entries continue the log, or overwrite its suffix from their first
	// index (a new leader's). Consecutive indexes; terms that do not go down.
	// Neither they nor their Data may change after AppendRaft.
	Entries []*raftpb.Entry
	// HardState, if set, is the replica's new HardState.
	HardState *raftpb.HardState
	// Snapshot, if set, is installed first (raftsnapshot.go): the log is
	// reset to start after it (Entries, if any, must start right after
	// it), and once the record is durable the applier installs its data
	// into Badger ahead of every later apply. Done does not wait for that.
	Snapshot *RaftSnapshot
	// Sync says the append must be durable before Done (raft's MustSync). An
	// append without it does not make the committer commit: it rides in the
	// next record (raft: a commit-only HardState change).
	Sync bool
	// Done gets nil once the append is durable and visible through the
	// replica's RaftStorage, or why it was not written. Called once, in the
	// order the appends were queued, on a goroutine of the pipeline; it
	// must not block.
	Done func(err error)
}

// raftJob is one queued raft change: an append (block) or a truncation.
type raftJob struct {
	block    raftBlock
	truncate uint64 // above zero: an op 5 change, the new first index
	prevTerm uint64 // with truncate: the term of entry truncate-1
	conf     logConf
	snap     *raftSnapshot // an op 8 change before the block
	install  func(error)   // the snapshot's Installed
	sync     bool
	size     int
	done     func(error)
	err      error
}

// AppendRaft queues a. It never waits for disk.
func (p *Pipeline) AppendRaft(a RaftAppend) {
	j := &raftJob{block: raftBlock{key: raftKey{a.Group, a.Replica}}, sync: a.Sync, done: a.Done}
	if a.HardState != nil {
		j.block.hasHS = true
		j.block.hs = hardState{a.HardState.GetTerm(), a.HardState.GetVote(), a.HardState.GetCommit()}
	}
	j.size = 32
	if len(a.Entries) > 0 {
		j.block.ents = make([]raftEntry, len(a.Entries))
		for i, e := range a.Entries {
			j.block.ents[i] = raftEntry{index: e.GetIndex(), term: e.GetTerm(), typ: uint8(e.GetType()), data: e.GetData()}
			j.size += 24 + len(e.GetData())
		}
	}
	if err := checkRaftAppend(&j.block); err != nil {
		j.err = err
	}
	if s := a.Snapshot; s != nil && j.err == nil {
		j.snap = &raftSnapshot{key: j.block.key, index: s.Index, term: s.Term, conf: logConf{set: true, cs: string(s.ConfState)},
			ref: snapRef{id: s.Ref.ID, size: s.Ref.Size, chunks: s.Ref.Chunks}}
		j.install, j.sync = s.Installed, true
		j.err = p.checkRaftSnapshot(j)
	}
	p.submitRaft(j)
}

// checkRaftSnapshot is what a snapshot must pass before op 8 names it:
// index and term set, a configuration, entries right after it, and a staged
// file of exactly the size its ref says (it is synced: StagedSnapshot).
func (p *Pipeline) checkRaftSnapshot(j *raftJob) error {
	s := j.snap
	bad := func(f string, a ...any) error {
		return fmt.Errorf("persistence: snapshot of group %d replica %d at index %d: %s", s.key.group, s.key.replica, s.index, fmt.Sprintf(f, a...))
	}
	switch {
	case s.index == 0 || s.term == 0:
		return bad("index and term must be set (term %d)", s.term)
	case len(s.conf.cs) == 0:
		return bad("no configuration")
	case s.ref.id == 0:
		return bad("no staged data")
	case len(j.block.ents) > 0 && j.block.ents[0].index != s.index+1:
		return bad("entry %d does not follow it", j.block.ents[0].index)
	}
	fi, err := os.Stat(p.db.stagedPath(s.key, s.ref.id))
	if err != nil {
		return bad("staged data: %v", err)
	}
	if uint64(fi.Size()) != s.ref.size {
		return bad("the staged file holds %d bytes, not %d", fi.Size(), s.ref.size)
	}
	return nil
}

// TruncateRaft queues a truncation of a replica's log: it starts at first
// from then on (entries below it are given up, and so are the log segments
// that only they kept). first may be at most one above the last index,
// unless confState is set: a snapshot's point, or a new group's bootstrap
// point, may lie beyond the log, which is then emptied.
// prevTerm is the term of entry first-1 (0 for first 1), which the log
// records: replay may not know it otherwise (raftrecord.go); a term that
// disagrees with an entry the log holds is refused. confState, if not nil,
// is the replica's configuration as of first-1 (a
// marshalled raftpb.ConfState), which RaftStorage gives from then on; nil
// keeps the one the log has. A truncation to first 1 of an empty log with a
// configuration starts a new replica's log (its bootstrap). It never forces
// a sync of its own: it rides in the next record. done, if not nil, is
// called as AppendRaft's Done.
func (p *Pipeline) TruncateRaft(group, replica, first, prevTerm uint64, confState []byte, done func(error)) {
	j := &raftJob{block: raftBlock{key: raftKey{group, replica}}, truncate: first, prevTerm: prevTerm, size: 24 + len(confState), done: done}
	if confState != nil {
		j.conf = logConf{set: true, cs: string(confState)}
	}
	switch {
	case first == 0 || replica == 0:
		j.err = fmt.Errorf("persistence: truncation of group %d replica %d to first index %d: raft ids and indexes start at 1", group, replica, first)
	case (first == 1) != (prevTerm == 0):
		j.err = fmt.Errorf("persistence: truncation of group %d replica %d to first index %d: entry %d cannot have term %d", group, replica, first, first-1, prevTerm)
	}
	p.submitRaft(j)
}

// checkRaftAppend is the checks a block must pass on its own (the decoder's,
// raftDecoder.block), so that nothing is logged that replay would refuse.
func checkRaftAppend(b *raftBlock) error {
	bad := func(f string, a ...any) error {
		return fmt.Errorf("persistence: raft append of group %d replica %d: %s", b.key.group, b.key.replica, fmt.Sprintf(f, a...))
	}
	if b.key.replica == 0 {
		return bad("replica id 0")
	}
	for i, e := range b.ents {
		switch {
		case e.index == 0 || e.term == 0:
			return bad("entry with index %d term %d", e.index, e.term)
		case e.typ > raftMaxEntryType:
			return bad("entry %d of unknown type %d", e.index, e.typ)
		case i > 0 && e.index != b.ents[i-1].index+1:
			return bad("entry %d follows entry %d", e.index, b.ents[i-1].index)
		case i > 0 && e.term < b.ents[i-1].term:
			return bad("entry %d's term %d is below the one before it (%d)", e.index, e.term, b.ents[i-1].term)
		}
	}
	return nil
}

func (p *Pipeline) submitRaft(j *raftJob) {
	p.mu.Lock()
	if err := p.refusalLocked(); err != nil {
		p.mu.Unlock()
		if j.done != nil {
			j.done(err)
		}
		return
	}
	size := j.size
	if j.err == nil && p.queuedBytes+size > p.cfg.MaxQueuedBytes && (len(p.queue) > 0 || len(p.rqueue) > 0) {
		j.err = unavailableErr(fmt.Errorf("%d MiB of writes wait for the disk (at most %d MiB)",
			p.queuedBytes>>20, p.cfg.MaxQueuedBytes>>20))
	}
	if j.err != nil {
		size = 0
	}
	if len(p.queue) == 0 && len(p.rqueue) == 0 {
		p.queuedAt = time.Now()
	}
	p.rqueue = append(p.rqueue, j)
	p.queuedBytes += size
	if j.sync || j.err != nil {
		p.rsync++
		p.wakeLocked()
	}
	p.mu.Unlock()
}

// raftPending is a replica's log bounds as the jobs of one record leave them,
// before the record is written: later jobs of the same replica in the record
// are checked against it.
type raftPending struct {
	first, last uint64
	from        uint64 // the lowest index this record appends (0: none yet)
}

// encodeRaft appends the raft changes of jobs to payload and returns the jobs
// it logged. A job that cannot follow its log (its entries would leave a gap
// or start below the first index, a truncation past the last index) fails
// alone: logging it would make the log unreadable at the next start.
func (p *Pipeline) encodeRaft(payload []byte, jobs []*raftJob, failErr error) ([]byte, []*raftJob) {
	var live []*raftJob
	pending := map[raftKey]raftPending{}
	for _, j := range jobs {
		if j.err != nil {
			continue
		}
		if failErr != nil {
			j.err = failErr
			continue
		}
		k := j.block.key
		pd, ok := pending[k]
		l := p.db.raft.replica(k, false)
		if !ok {
			pd = raftPending{first: 1}
			if l != nil {
				l.mu.Lock()
				pd = raftPending{first: l.first, last: l.last()}
				l.mu.Unlock()
			}
		}
		if j.snap != nil {
			if j.snap.index+1 < pd.first {
				j.err = fmt.Errorf("persistence: snapshot of group %d replica %d at index %d: below the log's first index %d", k.group, k.replica, j.snap.index, pd.first)
				continue
			}
			payload = appendRaftSnapshot(payload, j.snap)
			pd = raftPending{first: j.snap.index + 1, last: j.snap.index}
		}
		if j.truncate > 0 {
			if j.truncate < pd.first || (j.truncate > pd.last+1 && !j.conf.set) {
				j.err = fmt.Errorf("persistence: truncation of group %d replica %d to first index %d: the log holds %d..%d", k.group, k.replica, j.truncate, pd.first, pd.last)
				continue
			}
			if l != nil {
				// The term of an entry this record appends is not in the
				// index yet: only a term the index holds is checked.
				l.mu.Lock()
				t, known := l.term(j.truncate - 1)
				l.mu.Unlock()
				if known && (pd.from == 0 || j.truncate-1 < pd.from) && t != j.prevTerm {
					j.err = fmt.Errorf("persistence: truncation of group %d replica %d to first index %d: entry %d has term %d, not %d", k.group, k.replica, j.truncate, j.truncate-1, t, j.prevTerm)
					continue
				}
			}
			pd.first = j.truncate
			pd.last = max(pd.last, j.truncate-1) // a reset empties the log
			payload = appendRaftTruncate(payload, raftTruncation{key: k, first: j.truncate, prevTerm: j.prevTerm, conf: j.conf})
		} else {
			if len(j.block.ents) > 0 {
				i := j.block.ents[0].index
				if i < pd.first || i > pd.last+1 {
					j.err = fmt.Errorf("persistence: raft append of group %d replica %d: entry %d does not continue the log (it holds %d..%d)", k.group, k.replica, i, pd.first, pd.last)
					continue
				}
				pd.last = j.block.ents[len(j.block.ents)-1].index
				if pd.from == 0 || i < pd.from {
					pd.from = i
				}
			}
			if j.block.hasHS && j.block.hs.commit > pd.last {
				j.err = fmt.Errorf("persistence: raft append of group %d replica %d: commit index %d past the last index %d", k.group, k.replica, j.block.hs.commit, pd.last)
				continue
			}
			if len(j.block.ents) == 0 && !j.block.hasHS && j.snap == nil {
				live = append(live, j) // nothing to log; done with the record
				continue
			}
			if len(j.block.ents) > 0 || j.block.hasHS {
				payload = appendRaftBlock(payload, &j.block) // sets the entries' dataOff
			}
		}
		pending[k] = pd
		live = append(live, j)
	}
	return payload, live
}

// indexCommitted puts the raft changes of live, just made durable in segment
// seg with the payload at file offset payloadAt, into the raft index, in
// order. The committer calls it before the jobs are done.
func (p *Pipeline) indexCommitted(live []*raftJob, seg uint64, payloadAt int64) {
	x := p.db.raft
	for _, j := range live {
		l := x.replica(j.block.key, true)
		l.mu.Lock()
		old := l.snap
		if j.snap != nil {
			l.reset(j.snap)
		}
		if j.truncate > 0 {
			l.truncate(j.truncate, j.prevTerm, j.conf)
		} else {
			l.applyBlock(&j.block, seg, payloadAt, false)
		}
		cur := l.snap
		l.mu.Unlock()
		if old.id != 0 && old.id != cur.id {
			// Durable now: the log no longer needs the old staged file
			// (Badger flushed it, or a newer snapshot replaced it).
			p.db.removeStaged(j.block.key, old.id)
		}
		if s := j.snap; s != nil {
			// Behind every apply queued so far; raft queues the entries
			// after the snapshot only once this job is done.
			p.applies.push(applyJob{install: &snapInstallJob{key: s.key, ref: s.ref, done: j.install,
				state: RaftAppliedState{Index: s.index, Term: s.term, ConfState: []byte(s.conf.cs)}}, size: 1})
		}
		if len(j.block.ents) > 0 && j.truncate == 0 {
			x.mu.Lock()
			x.noteSegmentLocked(seg, j.block.key, j.block.ents[len(j.block.ents)-1].index)
			x.mu.Unlock()
		}
		j.block.ents = nil // the index holds what it needs
	}
}

// completeRaft runs the jobs' Done in order.
func completeRaft(jobs []*raftJob) {
	for _, j := range jobs {
		if j.done != nil {
			j.done(j.err)
		}
	}
}
