package persistence

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"

	"github.com/dgraph-io/badger/v4"
	"github.com/holdfast/holdfast/internal/durable"
)

// Replicated mode (docs/replication-design.md, 1.6): the database of a node
// whose partitions are raft groups. Raft entries are appended through the
// committer (raftappend.go) like writes, but they reach Badger only when they
// are committed, much later and in an order of their own, so a Badger version
// can no longer be a record's sequence number. In replicated mode:
//
//   - Every Badger version comes from the applier's own counter (DB.version),
//     strictly increasing: each apply batch takes the next one, whatever it
//     holds (local records, committed raft entries of any groups, or both).
//     Replay gives each replayed record the next one too. A key is written by
//     local records (node metadata: 'm' keys) or by raft applies (partition
//     keys), never by both, so replaying local records in log order over a
//     Badger that already holds some of them ends with the newest value.
//   - Each apply batch that takes records also writes, at its version, the
//     last of them (localAppliedKey): the log's floor at open (the oldest
//     record it may start with, recovery.go) is that record, not Badger's
//     newest version.
//   - Badger holds no raft state. A replica restarts from the start of its
//     log (its first index - 1) and re-applies every committed entry the log
//     still holds, as a single node replays every record: an entry's changes
//     are physical (keys and values the leader computed), so applying a run
//     of entries again ends in the same state. Nothing Badger kept only in
//     memtables, or in value-log bytes it never synced, is trusted: TRAPS.md
//     measured that a memtable's own log goes to the flusher unsynced, so
//     after a power cut a newer memtable can survive an older one.
//   - Releasing a segment needs its records in Badger's synced tables, as on a
//     single node, and every raft entry in it truncated away (raftlog.go,
//     pinned). A replica may truncate its log only up to RaftFlushed + 1:
//     the entries above what Badger holds in synced tables (and synced value
//     log) must stay in the log to be applied again.
//
// A single node never takes this path: its versions stay its sequence numbers.

// replicatedMarker is the file in a replicated database's directory that
// records its mode. It is made, and synced into the directory, before
// anything else of a new database, so that a database never changes mode.
const replicatedMarker = "replicated"

// ErrModeMismatch is returned by Open when the data directory was made for
// the other mode (single node, or replicated).
var ErrModeMismatch = errors.New("persistence: the data directory was made for another mode")

// Keys of replicated mode's state, under their own prefix (after every
// partition's 'p' keys, so outside every partition's range, and after every
// key of an apply batch: see apply).
const prefixRaft byte = 'r'

// localAppliedKey holds the sequence number of the last record an apply batch
// took (uvarint).
var localAppliedKey = []byte{prefixRaft, 'l'}

// checkMode makes dir's mode marker for a new replicated database, and
// refuses a directory made for the other mode. A directory is new when it has
// no Badger files and no log yet.
func checkMode(dir string, replicated bool) error {
	_, err := os.Stat(filepath.Join(dir, replicatedMarker))
	has := err == nil
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read the data directory's mode: %w", err)
	}
	switch {
	case has && !replicated:
		return fmt.Errorf("%w: %s holds a replicated node's data (a cluster node's); open it as one", ErrModeMismatch, dir)
	case has || !replicated:
		return nil
	}
	for _, sub := range []string{"badger", "wal"} {
		ents, err := os.ReadDir(filepath.Join(dir, sub))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("read the data directory: %w", err)
		}
		if len(ents) > 0 {
			return fmt.Errorf("%w: %s holds a single node's data; a replicated node needs a new data directory", ErrModeMismatch, dir)
		}
	}
	if err := durable.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create data directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, replicatedMarker), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("mark the data directory replicated: %w", err)
	}
	_, err = f.WriteString("this data directory belongs to a replicated Holdfast node\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = durable.SyncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("mark the data directory replicated: %w", err)
	}
	return nil
}

// Replicated reports whether the database is in replicated mode.
func (db *DB) Replicated() bool { return db.replicated }

// RaftAppliedState is a replica's applied state: the index and term of the
// last entry applied, and the configuration after it (a marshalled
// raftpb.ConfState, kept as given).
type RaftAppliedState struct {
	Index, Term uint64
	ConfState   []byte
}

// AppendChanges appends w's changes (its Sets and Deletes, in the log's
// encoding) to dst: the payload a replicated write carries in a raft entry,
// which RaftApply.Changes gives back to the applier.
func AppendChanges(dst []byte, w *Write) []byte { return appendWrite(dst, w) }

// RaftApply is one replica's committed entries for the applier (raft's
// MsgStorageApply).
type RaftApply struct {
	Group, Replica uint64
	// State is the replica's applied state once these entries are applied:
	// the last entry's index and term, and the configuration after it.
	State RaftAppliedState
	// Changes holds, in order, each entry's changes as AppendChanges encoded
	// them (entries without changes may be left out). Not modified after
	// ApplyRaft.
	Changes [][]byte
	// Waited says a caller waits for these entries to be applied (a
	// leader's proposal or read): the applier takes them at once instead of
	// waiting applyWait for more to batch with them.
	Waited bool
	// Done gets nil once Badger holds the changes, or why they will not be
	// applied (ErrClosed: the pipeline closed first; its failure; a change
	// that cannot be decoded). Called exactly once, in queue order, on the
	// applier's goroutine (or ApplyRaft's caller's, for a refusal); it must
	// not block.
	Done func(err error)
}

// raftApplyJob is a RaftApply with its changes decoded.
type raftApplyJob struct {
	key     raftKey
	state   RaftAppliedState
	changes []applyEntry // ord is set by apply
	done    func(error)
}

// ApplyRaft queues a's changes for Badger, behind every record committed
// before the call. It never waits. The database must be replicated.
func (p *Pipeline) ApplyRaft(a RaftApply) {
	fail := func(err error) {
		if a.Done != nil {
			a.Done(err)
		}
	}
	if !p.db.replicated {
		fail(errors.New("persistence: raft entries are applied only by a replicated database"))
		return
	}
	j := &raftApplyJob{key: raftKey{a.Group, a.Replica}, state: a.State, done: a.Done}
	size := 64
	for _, c := range a.Changes {
		err := decodeRecord(c,
			func(k, v []byte) error {
				j.changes = append(j.changes, applyEntry{key: k, value: v})
				size += len(k) + len(v)
				return nil
			},
			func(k []byte) error {
				j.changes = append(j.changes, applyEntry{key: k, del: true})
				size += len(k)
				return nil
			},
			func(_ *raftDecoder, op byte) error {
				return fmt.Errorf("a raft change (op %d) among an entry's writes", op)
			})
		if err != nil {
			fail(fmt.Errorf("persistence: apply of group %d replica %d up to index %d: %w", a.Group, a.Replica, a.State.Index, err))
			return
		}
	}
	p.mu.Lock()
	err := p.refusalLocked()
	if err == nil {
		// Under mu: Close refuses under it before it closes the queue, so
		// the applier takes (or fails) every job queued here.
		p.applies.push(applyJob{raft: j, size: size})
	}
	p.mu.Unlock()
	if err == nil && a.Waited {
		p.hurryApplier()
	}
	if err != nil {
		fail(err)
	}
}

// RaftFlushed returns the newest applied state of replica of group whose
// entries, and every earlier one, Badger holds in synced tables and a synced
// value log, as the releaser last found it: the replica may truncate its log
// up to one above its index, never further (a crash may lose what Badger
// holds only in memtables; the log must give it back). found is false until
// a batch of the replica's entries reached a table after the pipeline started.
func (p *Pipeline) RaftFlushed(group, replica uint64) (s RaftAppliedState, found bool) {
	p.batchMu.Lock()
	defer p.batchMu.Unlock()
	s, found = p.flushedApplied[raftKey{group, replica}]
	return s, found
}

// releasableReplicated is replicated mode's DB.releasable: the newest record
// Badger holds in synced tables. Every batch below the newest table version is
// wholly in tables (Badger flushes memtables in order, and a batch's version
// is above every earlier batch's); the batch at that version may be split
// across a flushed memtable and a live one (DB.releasable), so it does not
// count. The batches that count are folded into flushedSeq and
// flushedApplied, and forgotten.
//
// The replicas' applied states of those batches are published for
// RaftFlushed only after the value log is synced: a table may point into it.
func (p *Pipeline) releasableReplicated() (uint64, error) {
	p.releaseMu.Lock() // the releaser and Flush
	defer p.releaseMu.Unlock()
	v := p.db.newestTableVersion()
	p.batchMu.Lock()
	n, marks := 0, false
	for n < len(p.batches) && p.batches[n].version < v {
		marks = marks || len(p.batches[n].raft) > 0
		n++
	}
	p.batchMu.Unlock()
	if marks {
		if err := p.db.vlog.syncValueLog(); err != nil {
			return 0, fmt.Errorf("sync the value log: %w", err)
		}
	}
	// Only releaseMu's holder takes batches out: the first n are the same.
	p.batchMu.Lock()
	defer p.batchMu.Unlock()
	for _, b := range p.batches[:n] { // in apply order: the newest state wins
		p.flushedSeq = max(p.flushedSeq, b.lastSeq)
		for _, m := range b.raft {
			p.flushedApplied[m.key] = m.state
		}
	}
	p.batches = append(p.batches[:0], p.batches[n:]...)
	return p.flushedSeq, nil
}

// raftMark is one replica's applied state after a batch.
type raftMark struct {
	key   raftKey
	state RaftAppliedState
}

// readLocalApplied returns the last record Badger took in replicated mode
// (zero for a new database).
func readLocalApplied(bdb *badger.DB) (uint64, error) {
	txn := bdb.NewTransactionAt(math.MaxUint64, false)
	defer txn.Discard()
	item, err := txn.Get(localAppliedKey)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the last applied record: %w", err)
	}
	var seq uint64
	err = item.Value(func(v []byte) error {
		var n int
		if seq, n = binary.Uvarint(v); n <= 0 || n != len(v) {
			return &CorruptionError{File: bdb.Opts().Dir, Reason: fmt.Sprintf("the last applied record's key holds %d bad bytes", len(v))}
		}
		return nil
	})
	return seq, err
}

// Flush has Badger write its memtables to synced tables and waits for it;
// ErrClosed if the pipeline closes first. In replicated mode it then
// publishes the replicas' flushed states (RaftFlushed), so that their logs
// can be truncated at once; the releaser, which runs after commits (at most
// once a second), gives up the log segments. A replicated node whose log
// grows past its budget calls it, as do tests.
func (p *Pipeline) Flush() error {
	err := p.flushMemtables()
	if errors.Is(err, errGCStopped) {
		return ErrClosed
	}
	if err == nil && p.db.replicated {
		_, err = p.releasableReplicated()
	}
	return err
}

// RaftPinners returns the replicas whose entries keep the log's oldest
// segment (they hold entries in it at or above their first index), as
// (group, replica) pairs, and the log's size in segments. A replicated node
// whose log outgrows its budget has them truncate (replication.WALPipeline).
func (db *DB) RaftPinners() (pinners [][2]uint64, segments int) {
	w := db.wal
	w.mu.Lock()
	segments = len(w.full) + 1
	var oldest uint64
	if len(w.full) > 0 {
		oldest = w.full[0].id
	}
	w.mu.Unlock()
	if oldest == 0 {
		return nil, segments
	}
	x := db.raft
	x.mu.Lock()
	defer x.mu.Unlock()
	for k, maxIndex := range x.segMax[oldest] {
		if l := x.logs[k]; l != nil {
			l.mu.Lock()
			first := l.first
			l.mu.Unlock()
			if maxIndex >= first {
				pinners = append(pinners, [2]uint64{k.group, k.replica})
			}
		}
	}
	slices.SortFunc(pinners, func(a, b [2]uint64) int {
		if c := cmp.Compare(a[0], b[0]); c != 0 {
			return c
		}
		return cmp.Compare(a[1], b[1])
	})
	return pinners, segments
}
