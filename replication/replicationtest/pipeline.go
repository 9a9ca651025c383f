package replicationtest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/internal/owner"
	"github.com/holdfast/holdfast/replication"
)

// ApplyFunc is the state machine of a MemPipeline: called on its apply
// goroutine for every committed entry of every group, in log order per group.
type ApplyFunc func(g replication.GroupID, ent *raftpb.Entry)

// MemPipeline is the step-1 replication.Pipeline over a MemDisk: one append
// goroutine that takes every queued append job (all groups) as one batch,
// "syncs" it (waits SyncDelay, then writes it to the disk's storages), then
// calls the jobs' Done in order; one apply goroutine that applies jobs in
// order and calls Done after each. Both goroutines are owned by the pipeline
// (Start/Crash/Close).
//
// Crash stops it at once: jobs not written to the disk are lost, as a node's
// page cache is lost in a power cut. Nothing is written after Crash returns.
type MemPipeline struct {
	disk      *MemDisk
	apply     ApplyFunc
	syncDelay time.Duration

	// ackBeforeSync is a planted bug: Done (and so raft's "durable"
	// responses) before the batch reaches the disk.
	ackBeforeSync bool

	// Log compaction (SetCompaction): once the applied index is compactEvery
	// past the log's snapshot, the snapshot moves to the applied index and
	// the log keeps compactKeep entries below it. 0: never.
	compactEvery, compactKeep uint64

	// Observers for the Cluster's checker (nil: none). observe sees every
	// applied entry with the state machine after it (digest, config, or the
	// error computing the config); restored every snapshot installed. r is
	// the replica whose job it was (the job message's From): the Cluster's
	// record of the node's replica may already be gone (a removed replica
	// applies the entries of its last jobs while its removal is handled).
	observe  func(g replication.GroupID, r replication.ReplicaID, ent *raftpb.Entry, d Digest, cs *raftpb.ConfState, err error)
	restored func(g replication.GroupID, r replication.ReplicaID, snap *raftpb.Snapshot)
	// onApplyJob, if set, sees every job Apply queues (Config.OnApplyJob).
	onApplyJob func(job replication.Job)

	mu       sync.Mutex // guards the queues, stopped; held while writing to the disk
	appendQ  []replication.Job
	applyQ   []replication.Job
	appendCh chan struct{} // cap 1: wakes the append goroutine
	applyCh  chan struct{} // cap 1: wakes the apply goroutine
	stopped  bool
	owner    *owner.Group
	syncs    int // batches synced, for tests
}

var _ replication.Pipeline = (*MemPipeline)(nil)

// NewMemPipeline returns a pipeline writing to disk and applying with apply
// (nil: entries are only counted as applied). syncDelay models fdatasync.
func NewMemPipeline(disk *MemDisk, apply ApplyFunc, syncDelay time.Duration) *MemPipeline {
	return &MemPipeline{
		disk:      disk,
		apply:     apply,
		syncDelay: syncDelay,
		appendCh:  make(chan struct{}, 1),
		applyCh:   make(chan struct{}, 1),
		owner:     owner.New(nil),
	}
}

// SetCompaction makes the pipeline truncate each group's log as it applies:
// every `every` applied entries, the log's snapshot moves to the applied
// index (the state machine's digest and config there) and entries more than
// keep below it are dropped, so that a replica behind that point needs a
// snapshot. Call before Start.
func (p *MemPipeline) SetCompaction(every, keep uint64) {
	p.compactEvery, p.compactKeep = every, keep
}

// Start starts the append and apply goroutines.
func (p *MemPipeline) Start() {
	p.owner.Go(p.appendLoop)
	p.owner.Go(p.applyLoop)
}

// Append implements replication.Pipeline.
func (p *MemPipeline) Append(job replication.Job) {
	p.mu.Lock()
	if !p.stopped {
		p.appendQ = append(p.appendQ, job)
	}
	p.mu.Unlock()
	wake(p.appendCh)
}

// Apply implements replication.Pipeline.
func (p *MemPipeline) Apply(job replication.Job) {
	if p.onApplyJob != nil {
		p.onApplyJob(job)
	}
	p.mu.Lock()
	if !p.stopped {
		p.applyQ = append(p.applyQ, job)
	}
	p.mu.Unlock()
	wake(p.applyCh)
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Crash stops the pipeline at this instant: queued and in-flight jobs that
// are not on the disk are lost, and their Done is never called. It waits for
// the goroutines.
func (p *MemPipeline) Crash() {
	p.mu.Lock()
	p.stopped = true
	p.appendQ, p.applyQ = nil, nil
	p.mu.Unlock()
	_ = p.owner.Close(context.Background())
}

// Close is Crash: a clean close of a pipeline whose disk is memory loses the
// same (the caller quiesces first if it wants everything synced).
func (p *MemPipeline) Close() { p.Crash() }

// Syncs returns the number of batches synced so far.
func (p *MemPipeline) Syncs() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.syncs
}

func (p *MemPipeline) appendLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.appendCh:
		}
		p.mu.Lock()
		batch := p.appendQ
		p.appendQ = nil
		p.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		if p.ackBeforeSync {
			// The planted bug: the batch is visible (written to the page
			// cache) and acknowledged before its sync; a crash before the
			// sync reverts the disk to its durable copy.
			p.mu.Lock()
			for _, j := range batch {
				if err := p.write(j, false); err != nil {
					p.mu.Unlock()
					panic(err)
				}
			}
			p.mu.Unlock()
			for _, j := range batch {
				j.Done()
			}
		}
		if p.syncDelay > 0 {
			t := time.NewTimer(p.syncDelay)
			select {
			case <-ctx.Done():
				t.Stop()
				return // crashed mid-sync: the batch is lost
			case <-t.C:
			}
		}
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			return
		}
		for _, j := range batch {
			if err := p.write(j, p.ackBeforeSync); err != nil {
				p.mu.Unlock()
				panic(err) // the engine broke the append contract: a bug, not a fault
			}
		}
		p.syncs++
		p.mu.Unlock()
		if !p.ackBeforeSync {
			for _, j := range batch {
				j.Done()
			}
		}
	}
}

// write puts one MsgStorageAppend on the disk: snapshot, entries (a leader's
// overwrite truncates the suffix: MemoryStorage.Append does), HardState.
//
// With durable set (the planted bug only) it writes the disk's durable copy.
func (p *MemPipeline) write(j replication.Job, durable bool) error {
	dg := p.disk.group(j.Group)
	if dg == nil {
		return fmt.Errorf("replicationtest: append for unknown group %d", j.Group)
	}
	if p.disk.stale(dg, j) {
		return nil
	}
	st := dg.storage
	if durable {
		p.disk.mu.Lock()
		if dg.durable == nil {
			var err error
			if dg.durable, err = cloneStorage(dg.storage); err != nil {
				p.disk.mu.Unlock()
				return err
			}
			// The clone already holds the batch just made visible; writing
			// it again below is idempotent (a snapshot it holds is skipped).
		}
		st = dg.durable
		p.disk.mu.Unlock()
	}
	m := j.Msg
	if snap := m.GetSnapshot(); !raft.IsEmptySnap(snap) && !(durable && holdsSnapshot(st, snap)) {
		if err := st.ApplySnapshot(snap); err != nil {
			return fmt.Errorf("replicationtest: group %d: apply snapshot: %w", j.Group, err)
		}
		if !durable {
			// Install: the state machine becomes the snapshot's, at its
			// index, atomically with the log (one lock).
			var d Digest
			if len(snap.GetData()) != len(d) {
				return fmt.Errorf("replicationtest: group %d: snapshot data of %d bytes, want a %d-byte digest", j.Group, len(snap.GetData()), len(d))
			}
			copy(d[:], snap.GetData())
			p.disk.mu.Lock()
			dg.applied, dg.digest = snap.GetMetadata().GetIndex(), d
			dg.conf = raftpb.EnsureConfState(snap.GetMetadata().GetConfState())
			dg.installs++
			p.disk.mu.Unlock()
			if p.restored != nil {
				p.restored(j.Group, replication.ReplicaID(j.Msg.GetFrom()), snap)
			}
		}
	}
	if err := st.Append(m.GetEntries()); err != nil {
		return fmt.Errorf("replicationtest: group %d: append: %w", j.Group, err)
	}
	if m.Term != nil { // Term, Vote and Commit are set together or not at all
		if err := st.SetHardState(&raftpb.HardState{Term: new(m.GetTerm()), Vote: new(m.GetVote()), Commit: new(m.GetCommit())}); err != nil {
			return err
		}
	}
	return nil
}

// holdsSnapshot says whether st's snapshot is snap already (the planted
// bug's durable copy, cloned from storage after snap was written to it).
func holdsSnapshot(st *raft.MemoryStorage, snap *raftpb.Snapshot) bool {
	have, err := st.Snapshot()
	return err == nil && have.GetMetadata().GetIndex() == snap.GetMetadata().GetIndex() &&
		have.GetMetadata().GetTerm() == snap.GetMetadata().GetTerm()
}

func (p *MemPipeline) applyLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.applyCh:
		}
		p.mu.Lock()
		batch := p.applyQ
		p.applyQ = nil
		p.mu.Unlock()
		for _, j := range batch {
			p.mu.Lock()
			if p.stopped {
				p.mu.Unlock()
				return
			}
			dg := p.disk.group(j.Group)
			if p.disk.stale(dg, j) {
				p.mu.Unlock()
				continue
			}
			for _, ent := range j.Msg.GetEntries() {
				p.disk.mu.Lock()
				if dg.removed || ent.GetIndex() <= dg.applied {
					// Removed, or covered by a snapshot installed since
					// raft handed out this job: nothing to apply.
					p.disk.mu.Unlock()
					continue
				}
				d := dg.digest.next(ent)
				cs, err := replication.NextConfState(dg.conf, ent)
				if err != nil {
					cs = dg.conf
				}
				p.disk.mu.Unlock()
				if p.apply != nil {
					p.apply(j.Group, ent)
				}
				if p.observe != nil {
					p.observe(j.Group, replication.ReplicaID(j.Msg.GetFrom()), ent, d, cs, err)
				}
				p.disk.mu.Lock()
				dg.applied, dg.digest, dg.conf = ent.GetIndex(), d, cs
				p.disk.mu.Unlock()
				p.maybeCompact(j.Group, dg)
			}
			p.mu.Unlock()
			j.Done()
		}
	}
}

// maybeCompact moves group g's log snapshot to the applied index and drops
// the log below it but compactKeep entries (apply goroutine, under p.mu).
func (p *MemPipeline) maybeCompact(g replication.GroupID, dg *diskGroup) {
	if p.compactEvery == 0 || dg.durable != nil { // the planted bug's two copies are never compacted
		return
	}
	p.disk.mu.Lock()
	applied, d, cs := dg.applied, dg.digest, dg.conf
	p.disk.mu.Unlock()
	snap, err := dg.storage.Snapshot()
	if err != nil || applied < snap.GetMetadata().GetIndex()+p.compactEvery {
		return
	}
	if _, err := dg.storage.CreateSnapshot(applied, cs, d[:]); err != nil {
		panic(fmt.Errorf("replicationtest: group %d: snapshot at %d: %w", g, applied, err))
	}
	if applied > p.compactKeep {
		if first, _ := dg.storage.FirstIndex(); applied-p.compactKeep >= first {
			if err := dg.storage.Compact(applied - p.compactKeep); err != nil {
				panic(fmt.Errorf("replicationtest: group %d: compact to %d: %w", g, applied-p.compactKeep, err))
			}
		}
	}
}
