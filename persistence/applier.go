package persistence

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/pb"
)

// The applier: writes durable records into Badger, off the acknowledgement
// path, merging the ones that wait for it.

// applyJob is one committed record for the applier.
type applyJob struct {
	seq    uint64
	writes []*Write
	size   int // estimate()
	// raft, if set, is a replica's committed entries (replicated mode); seq
	// and writes are then unset.
	raft *raftApplyJob
	// install and capture (raftsnapshot.go) are taken alone, never merged
	// with other jobs.
	install *snapInstallJob
	capture *captureJob
}

// alone reports whether j is taken as a batch of its own.
func (j *applyJob) alone() bool { return j.install != nil || j.capture != nil }

// applyQueue holds the committed records the applier has not taken yet.
type applyQueue struct {
	mu     sync.Mutex
	jobs   []applyJob
	closed bool
	signal chan struct{} // cap 1: something was pushed, or the queue closed
	bytes  atomic.Int64  // the estimated bytes of the records not yet applied
}

func (q *applyQueue) push(j applyJob) {
	if j.raft == nil && !j.alone() {
		j.size = j.estimate()
	}
	q.bytes.Add(int64(j.size))
	q.mu.Lock()
	q.jobs = append(q.jobs, j)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

func (q *applyQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// take appends to jobs the queued records, oldest first, while their bytes
// stay under limit (at least one), and reports whether the queue is closed
// and empty.
func (q *applyQueue) take(jobs []applyJob, size, limit int) ([]applyJob, int, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for n < len(q.jobs) && (len(jobs) == 0 || size < limit) {
		if q.jobs[n].alone() && len(jobs) > 0 {
			break // an installation or a capture goes alone
		}
		jobs = append(jobs, q.jobs[n])
		size += q.jobs[n].size
		n++
		if jobs[len(jobs)-1].alone() {
			break
		}
	}
	rest := copy(q.jobs, q.jobs[n:])
	clear(q.jobs[rest:])
	q.jobs = q.jobs[:rest]
	return jobs, size, q.closed && len(q.jobs) == 0
}

// appliedBatch is one batch the applier wrote into Badger: the records first
// to version, all at version (see DB.releasable). In replicated mode version
// is the counter's, lastSeq the last record in the batch (zero: none), and
// raft the replicas whose entries it applied, with their new applied index
// (see releasableReplicated).
type appliedBatch struct {
	first, version uint64
	lastSeq        uint64
	raft           []raftMark
}

// applyLoop applies committed records to Badger in order and marks their
// tickets applied. When records wait for it (Badger falls behind the log), it
// applies them together, as one batch at the newest one's sequence number
// (applyMergeBytes bounds it): a key written by several of them
// goes to Badger once, with its newest value, so that Badger's work shrinks
// when it is the bottleneck. Reads are always at the newest version, and a
// version is only ever compared with an older mark ("changed after"), which a
// higher version still passes, so nothing can tell the records apart.
//
// When its first record is small (under applySmall), it waits applyWait before
// it takes the records queued behind it: a serial writer's records then reach
// Badger several per batch. Each batch costs several goroutine hand-offs (the
// applier, Badger's writer, its value-size tracker). WaitApplied cuts the wait
// short.
//
// A batch Badger refuses is tried again: for as long as the cause is a
// resource that may come back (descriptors, space, memory; the write-ahead
// log holds the records meanwhile, and overlays serve their reads), or
// applyAttempts times for anything else, after which the pipeline fails.
// Neither the batch's tickets nor the applied mark move until it is in Badger.
func (p *Pipeline) applyLoop() {
	defer p.done.Done()
	var jobs []applyJob
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-p.applies.signal:
		case reply := <-p.flushes:
			reply <- p.flushBadger()
			continue
		}
		for {
			select { // between two batches: a flush the GC loop asked for
			case reply := <-p.flushes:
				reply <- p.flushBadger()
			default:
			}
			var size int
			var drained bool
			jobs, size, drained = p.applies.take(jobs[:0], 0, 1)
			if len(jobs) == 0 {
				if drained {
					p.finishApplied()
					return
				}
				break
			}
			if size < applySmall {
				timer.Reset(applyWait)
				select {
				case <-timer.C:
				case <-p.hurry:
					timer.Stop()
				}
			}
			if c := jobs[0].capture; c != nil {
				p.capture(c)
				p.applies.bytes.Add(-int64(size))
				clear(jobs)
				continue
			}
			if !jobs[0].alone() {
				jobs, size, _ = p.applies.take(jobs, size, applyMergeBytes)
			}
			if !p.applyJobs(jobs) {
				p.failQueuedRaft()
				p.finishApplied()
				return
			}
			p.applies.bytes.Add(-int64(size))
			clear(jobs) // do not keep the writes alive
		}
	}
}

// applyJobs writes jobs into Badger, retrying as applyLoop says, and marks
// them applied. It returns false once the pipeline failed.
func (p *Pipeline) applyJobs(jobs []applyJob) bool {
	// The records of the batch, first to last (replicated mode: zero when it
	// holds raft entries only), and the version it goes to Badger at.
	var first, last uint64
	for _, j := range jobs {
		if j.raft == nil && j.install == nil {
			first = cmp.Or(first, j.seq)
			last = j.seq
		}
	}
	version := last
	if p.db.replicated {
		version = p.db.version + 1
	}
	if h := p.cfg.Hooks; h != nil && h.BeforeApply != nil {
		for _, j := range jobs {
			if j.raft == nil {
				h.BeforeApply(j.seq)
			}
		}
	}
	for attempt := 1; ; attempt++ {
		err := p.apply(jobs, version, last)
		if err == nil {
			break
		}
		if p.Failed() != nil {
			return false
		}
		if !transient(err) && attempt >= applyAttempts {
			// The records are durable in the log; Badger lags behind it until
			// the node restarts and replays them.
			p.fatal(fmt.Errorf("apply seq %d..%d to badger (%d attempts): %w", first, last, attempt, err))
			p.failRaftApplies(jobs, p.Failed())
			return false
		}
		if attempt == 1 || attempt%100 == 0 {
			p.cfg.Logger.Warn("could not apply durable writes to Badger; trying again", "seq_from", first, "seq_to", last, "attempt", attempt, "err", err)
		}
		p.applyUnavailable.Store(&unavailableAt{err: unavailableErr(fmt.Errorf("the database cannot take writes: %w", err)), at: time.Now()})
		select {
		case <-time.After(applyBackoff(attempt)):
		case <-p.stopGC:
			// Closing: the log keeps these records (DB.Close sees that
			// Badger lacks some), and the next start replays them.
			p.failRaftApplies(jobs, ErrClosed)
			return false
		}
	}
	if p.applyUnavailable.Load() != nil {
		p.applyUnavailable.Store(nil)
		p.cfg.Logger.Info("Badger takes the durable writes again", "seq_to", last)
	}
	b := appliedBatch{first: first, version: version, lastSeq: last}
	if p.db.replicated {
		p.db.version = version
		for _, j := range jobs {
			switch {
			case j.raft != nil:
				b.raft = append(b.raft, raftMark{j.raft.key, j.raft.state})
				p.lastApplied[j.raft.key] = j.raft.state
			case j.install != nil:
				b.raft = append(b.raft, raftMark{j.install.key, j.install.state})
				p.lastApplied[j.install.key] = j.install.state
			}
		}
	}
	p.batchMu.Lock()
	p.batches = append(p.batches, b)
	p.batchMu.Unlock()
	p.holdMu.Lock()
	p.discardAbove = version
	p.updateDiscardLocked()
	p.holdMu.Unlock()
	for _, j := range jobs {
		for _, w := range j.writes {
			w.ticket.applied.Store(true)
		}
		if j.raft != nil && j.raft.done != nil {
			j.raft.done(nil)
		}
		if j.install != nil && j.install.done != nil {
			j.install.done(nil)
		}
	}
	if last > 0 {
		p.applyMu.Lock()
		p.applied.Store(last)
		p.applyCond.Broadcast()
		p.applyMu.Unlock()
	}
	return true
}

// failQueuedRaft tells the raft jobs still queued, once the applier stops
// early (closing while Badger refuses, or failed), that they will not be
// applied.
func (p *Pipeline) failQueuedRaft() {
	err := p.Failed()
	if err == nil {
		err = ErrClosed
	}
	for {
		jobs, _, _ := p.applies.take(nil, 0, math.MaxInt)
		if len(jobs) == 0 {
			return
		}
		p.failRaftApplies(jobs, err)
	}
}

// failRaftApplies tells the raft jobs of a batch that will not be applied why.
func (p *Pipeline) failRaftApplies(jobs []applyJob, err error) {
	for _, j := range jobs {
		if j.raft != nil && j.raft.done != nil {
			j.raft.done(err)
		}
		if j.install != nil && j.install.done != nil {
			j.install.done(err)
		}
		if j.capture != nil {
			j.capture.done(RaftCapture{}, err)
		}
	}
}

// applyAttempts is how often the applier tries a batch Badger refuses for a
// reason other than a missing resource.
const applyAttempts = 3

// applyBackoff is the wait before attempt+1: 10 ms, doubling, at most 1 s.
func applyBackoff(attempt int) time.Duration {
	return min(10*time.Millisecond<<min(attempt-1, 7), time.Second)
}

// finishApplied releases every waiter once nothing more will be applied: the
// pipeline closed, or failed (WaitApplied then reports the failure).
func (p *Pipeline) finishApplied() {
	p.applyMu.Lock()
	p.applyDone = true
	p.applyCond.Broadcast()
	p.applyMu.Unlock()
}

// applyWait is how long the applier waits for more records after a first one
// of fewer than applySmall bytes. A single node's writer never waits for it:
// it was acknowledged once durable, and the object's overlay serves its reads
// until Badger shows it. A replicated leader's writer does (a proposal returns
// once its entry is applied), so such applies come with RaftApply.Waited,
// which cuts the wait short: with the wait, one writer's RF=3 writes took
// 3.16 ms at the median (docs/benchmarks.md, "a second run"), 2 of them here.
var applyWait = 2 * time.Millisecond

const applySmall = 64 << 10

// hurryApplier cuts the applier's applyWait short (WaitApplied, and a
// replicated apply someone waits for); it never blocks.
func (p *Pipeline) hurryApplier() {
	select {
	case p.hurry <- struct{}{}:
	default:
	}
}

// applyMergeBytes bounds the records the applier merges into one batch, far
// below Badger's limit for one write request (15% of a memtable). A variable
// for tests.
var applyMergeBytes = 4 << 20

func (j applyJob) estimate() int {
	n := 0
	for _, w := range j.writes {
		n += w.size
	}
	return n
}

// WaitApplied waits until Badger shows every write acknowledged before the
// call. An object activation calls it before reading its state, so that it
// never misses a write of an earlier activation that is durable but not yet
// applied. It fails when ctx ends first, and when the pipeline stopped before
// Badger got those writes (a failed or closed pipeline): reads of Badger would
// then miss acknowledged writes.
func (p *Pipeline) WaitApplied(ctx context.Context) error {
	target := p.committed.Load()
	if p.applied.Load() >= target {
		return nil
	}
	p.hurryApplier() // the applier need not wait for more records
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			p.applyMu.Lock()
			p.applyCond.Broadcast()
			p.applyMu.Unlock()
		})
		defer stop()
	}
	p.applyMu.Lock()
	defer p.applyMu.Unlock()
	for p.applied.Load() < target {
		if p.applyDone {
			if err := p.Failed(); err != nil {
				return err
			}
			return ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		p.applyCond.Wait()
	}
	return nil
}

// WaitPartition is WaitApplied: on a single node every partition shares
// one log (replication.Proposer waits for the partition's own group).
func (p *Pipeline) WaitPartition(ctx context.Context, _ uint32) error { return p.WaitApplied(ctx) }

// apply writes the changes of jobs (records in sequence order, and in
// replicated mode committed raft entries) to Badger at version (a single
// node's: the last record's sequence number, last), each key once with its
// newest value.
//
// A large batch goes to Badger in key order, through its KVLoader, which
// writes the entries as given, without a transaction. Key order is what makes
// it cheap: Badger inserts every key into its memtable's skiplist by a search
// from the top, and keys in order walk almost the same path one after the
// other, through memory the previous search just touched, where a
// transaction's keys come out of a map in random order (measured against
// transactions: 1,000 objects 1.16x the writes per second, single records over
// 1,000 logs 1.06x–1.07x). A small batch goes in one transaction: below a few
// hundred keys the two ways cost the same, and a transaction is cheaper for a
// handful (BenchmarkApply, after HOLDFAST PATCH 4: 3 keys 19-21 µs through a
// transaction, 22-29 µs through a loader; 60 and 300 keys equal within the
// noise; 600 keys 2.7 against 3.0 µs per key, median of 3; 1,200 keys 2.6-3.2
// against 4.1-4.2). Before that patch a loader allocated two buffers of
// Badger's largest request count (1.6 MiB each at 128 MiB memtables, zeroed)
// and only batches over 1,024 keys went through one.
//
// Badger may split a large batch into several of its write requests, and so
// across two memtables: DB.releasable accounts for that. Atomicity across a
// crash comes from the log, not from Badger: every record here is durable in
// the log already, and a restart replays the log over whatever part of it
// Badger kept.
func (p *Pipeline) apply(jobs []applyJob, version, last uint64) error {
	if testApplyFault != nil {
		if err := testApplyFault(); err != nil {
			return err
		}
	}
	if len(jobs) == 1 && jobs[0].install != nil {
		in := jobs[0].install
		if p.db.raft.hasNewer(in.key.group, in.key.replica) {
			// A newer replica of the group has a log here (the snapshot
			// that ends a removed replica's data, ForgetAndDelete, raced
			// the group's next replica on the node): the partition's keys
			// are that replica's, put there by its own snapshot (installed
			// before or after this one) or, for a recovery's replica
			// (Reseed), already in Badger.
			p.cfg.Logger.Info("not installing the snapshot of a replica the group replaced on this node", "group", in.key.group, "replica", in.key.replica, "index", in.state.Index)
			return nil
		}
		return p.db.installStaged(in.key, in.ref, in.state.Index, version)
	}
	entries := p.sorted[:0]
	for _, job := range jobs {
		if r := job.raft; r != nil {
			for _, c := range r.changes {
				c.ord = len(entries)
				entries = append(entries, c)
			}
			continue
		}
		for _, w := range job.writes {
			for _, kv := range w.Sets {
				entries = append(entries, applyEntry{key: kv.Key, value: kv.Value, ord: len(entries)})
			}
			for _, k := range w.Deletes {
				entries = append(entries, applyEntry{key: k, del: true, ord: len(entries)})
			}
		}
	}
	slices.SortFunc(entries, func(a, b applyEntry) int {
		if c := bytes.Compare(a.key, b.key); c != 0 {
			return c
		}
		return cmp.Compare(a.ord, b.ord)
	})
	// Keep the last change of each key.
	n := 0
	for i, e := range entries {
		if i+1 < len(entries) && bytes.Equal(entries[i+1].key, e.key) {
			continue
		}
		entries[n] = e
		n++
	}
	if p.db.replicated && last > 0 {
		// Sorts after every change above ('m' and 'p' keys), so a KVLoader
		// that splits the batch writes it in its last request: Badger never
		// holds it without the batch's records.
		entries = append(entries[:n], applyEntry{key: localAppliedKey, value: binary.AppendUvarint(nil, last)})
		n++
	}
	defer func() {
		clear(entries) // do not keep the writes alive
		p.sorted = entries[:0]
	}()
	if n < applyLoaderEntries {
		err := p.applyTxn(entries[:n], version)
		if !errors.Is(err, badger.ErrTxnTooBig) {
			return err
		}
	}
	return p.applyLoader(entries[:n], version)
}

// applyLoaderEntries is the smallest batch, in keys, that the applier sends
// through a KVLoader rather than a transaction (see apply).
const applyLoaderEntries = 512

// applyTxn writes entries as one Badger transaction at version, or nothing and
// badger.ErrTxnTooBig when they do not fit in one.
func (p *Pipeline) applyTxn(entries []applyEntry, version uint64) error {
	txn := p.db.bdb.NewTransactionAt(math.MaxUint64, true)
	defer txn.Discard()
	for _, e := range entries {
		var err error
		if e.del {
			err = txn.Delete(e.key)
		} else {
			err = txn.Set(e.key, e.value)
		}
		if err != nil {
			return err
		}
	}
	return txn.CommitAt(version, nil)
}

// applyLoader writes entries, in their order, through a KVLoader at version,
// in as many write requests as Badger needs.
func (p *Pipeline) applyLoader(entries []applyEntry, version uint64) error {
	kvs := p.kvs[:0]
	defer func() {
		clear(kvs) // do not keep the writes alive
		p.kvs = kvs[:0]
	}()
	for _, e := range entries {
		var meta []byte
		if e.del {
			meta = badgerDeleteMeta
		}
		kvs = append(kvs, pb.KV{Key: e.key, Value: e.value, Version: version, Meta: meta})
	}
	loader := p.db.bdb.NewKVLoader(4)
	for i := range kvs {
		if err := loader.Set(&kvs[i]); err != nil {
			_ = loader.Finish()
			return err
		}
	}
	return loader.Finish()
}

// applyEntry is one change of a batch the applier sends to Badger; ord is its
// place in the batch, so that the later of two changes of a key wins.
type applyEntry struct {
	key, value []byte
	del        bool
	ord        int
}

// badgerDeleteMeta is the meta byte of a Badger entry that deletes its key
// (badger's bitDelete, part of its on-disk format), which a KVLoader entry
// carries in pb.KV.Meta.
var badgerDeleteMeta = []byte{1}
