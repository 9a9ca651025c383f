package replication

import (
	"context"
	"fmt"
	"math"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/holdfast/holdfast/persistence"
)

// Recovery of a group that lost its majority, and the end of a replica's log
// (docs/replication-design.md, section 5, recover-partition).
//
// Raft has no way to shrink a group whose majority is gone: a config change
// needs a quorum to commit. The recovery therefore starts a NEW group
// incarnation on the surviving replica's node (etcd's --force-new-cluster is
// the model): a new replica id, whose log is a copy of the survivor's log
// with one voter, itself. The copy keeps every entry the survivor holds,
// committed or not (one of them may be a write the lost majority
// acknowledged), and blanks the configuration changes among them (they would
// bring the lost voters back). The new replica elects itself at a higher term
// and commits the whole copy with its first entry; the cluster then grows the
// group again by adding replicas, filled by snapshot. The old replica ids are
// never used again: messages from or for them find no replica.

// Reseed starts replica to's log of group g as a copy of replica from's log
// on this node, with {to} as its only voter, for recover-partition. from must
// not run (its owner stopped it) and to must not run yet. It is idempotent:
// a log already seeded (its HardState has a term) is kept; a seeding a crash
// interrupted is done again. It waits until the copy is durable.
//
// The new replica's HardState term is at least minTerm: the lost replicas
// may have elected leaders at terms the survivor never heard of, and the
// recovered group's leaders must not serve at one of those terms again (the
// term is the serving epoch clients see).
//
// It returns the index of the last entry copied (the log's end).
func (w *WALPipeline) Reseed(ctx context.Context, g GroupID, from, to ReplicaID, minTerm uint64) (uint64, error) {
	if from == to || from == 0 || to == 0 {
		return 0, fmt.Errorf("replication: group %d: reseed of replica %d from %d: two different replicas are needed", g, to, from)
	}
	dst := w.db.RaftStorage(uint64(g), uint64(to), nil)
	if hs, _, err := dst.InitialState(); err != nil {
		return 0, err
	} else if hs.GetTerm() > 0 {
		last, _ := dst.LastIndex()
		return last, nil // seeded before
	}
	// Whatever the old replica queued before it stopped is in its log once
	// this returns.
	if err := w.p.Barrier(ctx); err != nil {
		return 0, err
	}
	// The new log starts where the old one does; if that is a snapshot
	// Badger has not flushed yet, only the old log's snapshot record makes
	// Open install it again, and Forget is about to end that log. Badger's
	// synced tables hold it once this returns.
	if err := w.p.Flush(); err != nil {
		return 0, err
	}
	src := w.db.RaftStorage(uint64(g), uint64(from), nil)
	first, _ := src.FirstIndex()
	last, _ := src.LastIndex()
	hs, _, err := src.InitialState()
	if err != nil {
		return 0, err
	}
	if first == 1 && last == 0 {
		return 0, fmt.Errorf("replication: group %d: replica %d has no log on this node to recover from", g, from)
	}
	prevTerm, err := src.Term(first - 1)
	if err != nil {
		return 0, fmt.Errorf("replication: group %d replica %d: the term of its log's start %d: %w", g, from, first-1, err)
	}
	var ents []*raftpb.Entry
	if last >= first {
		if ents, err = src.Entries(first, last+1, math.MaxUint64); err != nil {
			return 0, fmt.Errorf("replication: group %d replica %d: read its log %d..%d: %w", g, from, first, last, err)
		}
	}
	term := max(hs.GetTerm(), prevTerm, minTerm)
	copied := make([]*raftpb.Entry, len(ents))
	for i, e := range ents {
		term = max(term, e.GetTerm())
		c := &raftpb.Entry{Index: new(e.GetIndex()), Term: new(e.GetTerm()), Type: new(raftpb.EntryNormal)}
		if e.GetType() == raftpb.EntryNormal {
			c.Data = e.GetData()
		}
		// A configuration change becomes an empty entry: applied, it would
		// name the lost replicas again.
		copied[i] = c
	}
	cs, err := proto.Marshal(&raftpb.ConfState{Voters: []uint64{uint64(to)}})
	if err != nil {
		return 0, err
	}
	done := make(chan error, 2)
	if first == 1 {
		// A log never truncated (no bootstrap point): a new log at 1.
		w.p.TruncateRaft(uint64(g), uint64(to), 1, 0, cs, func(err error) { done <- err })
	} else {
		w.p.TruncateRaft(uint64(g), uint64(to), first, prevTerm, cs, func(err error) { done <- err })
	}
	// The HardState comes last, with the entries: a seeding cut short by a
	// crash has none, and is done again.
	w.p.AppendRaft(persistence.RaftAppend{
		Group: uint64(g), Replica: uint64(to), Entries: copied, Sync: true,
		HardState: &raftpb.HardState{Term: new(term), Vote: new(uint64(0)), Commit: new(first - 1)},
		Done:      func(err error) { done <- err },
	})
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				return 0, fmt.Errorf("replication: group %d: seed replica %d from replica %d: %w", g, to, from, err)
			}
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	w.log.Warn("recovery: a new replica's log copied from a surviving one", "group", uint64(g), "from", uint64(from), "to", uint64(to), "first", first, "last", last, "term", term)
	return last, nil
}

// Forget ends the log of replica r of group g, a replica that left the group
// for good (removed, or replaced by a recovery) and no longer runs: its
// entries are given up (they no longer pin log segments) and so is a
// snapshot it still named (Open would install that again over the data of
// the group's later replicas on this node). The replica must not run, and
// never run again. Idempotent. It waits for the change to be durable.
//
// The partition's data stays in Badger: a recovery's new replica (Reseed)
// starts on it. ForgetAndDelete deletes it too.
func (w *WALPipeline) Forget(ctx context.Context, g GroupID, r ReplicaID) error {
	return w.forget(ctx, []Retired{{g, r}}, false)
}

// Retired names a replica that left its group for good.
type Retired struct {
	Group   GroupID
	Replica ReplicaID
}

// ForgetAndDelete is Forget for each of rs, and deletes each one's partition
// keys from Badger, crash-safe, unless the node holds a newer replica of its
// group (a recovery's, which starts on the data the old one left, or the
// group's next replica here, which brings its own snapshot). For replicas
// that left their groups while the node holds no other replica of them.
//
// The deletion goes the way of a snapshot install: each log ends with an
// empty snapshot at its last index (the committer's op 8), which the applier
// installs (every key of the partition deleted, at one version, in order with
// every other apply and install; skipped if a newer replica of the group has
// a log here by then), and which every Open installs again while the log
// names it. Once every one is installed, Badger flushes its memtables, and
// the logs' truncations clear the snapshots (a crash before that only has
// Open delete the keys again). One memtable flush per call: the cluster hands
// it the replicas that left since its last call (moves, repairs, a node's
// return), a few at a time.
func (w *WALPipeline) ForgetAndDelete(ctx context.Context, rs []Retired) error {
	return w.forget(ctx, rs, true)
}

// forgotten is one replica's log end, for forget.
type forgotten struct {
	Retired
	last, term uint64
	conf       []byte // the configuration an empty snapshot records; nil: data kept
}

func (w *WALPipeline) forget(ctx context.Context, rs []Retired, del bool) error {
	if len(rs) == 0 {
		return nil
	}
	if err := w.p.Barrier(ctx); err != nil { // their last appends are in
		return err
	}
	var ends []forgotten
	for _, r := range rs {
		s := w.db.RaftStorage(uint64(r.Group), uint64(r.Replica), nil)
		first, _ := s.FirstIndex()
		last, _ := s.LastIndex()
		if first == 1 && last == 0 {
			continue // no log
		}
		term, err := s.Term(last)
		if err != nil {
			return fmt.Errorf("replication: group %d replica %d: the term of its last entry %d: %w", r.Group, r.Replica, last, err)
		}
		f := forgotten{Retired: r, last: last, term: term}
		if del && !w.db.HasNewerReplica(uint64(r.Group), uint64(r.Replica)) {
			_, cs, err := s.InitialState()
			if err != nil {
				return err
			}
			// Empty for a log that never had a configuration: nothing of it
			// was ever applied (and op 8 needs one).
			if f.conf, err = proto.Marshal(cs); err != nil {
				return err
			}
		}
		ends = append(ends, f)
		w.mu.Lock()
		if w.replica[r.Group] == r.Replica {
			// The pipeline's own truncations of the group follow this one.
			w.first[r.Group] = last + 1
			delete(w.installed, r.Group)
		}
		w.mu.Unlock()
	}
	if err := w.drop(ctx, ends); err != nil {
		return fmt.Errorf("replication: delete the data of replicas that left their groups: %w", err)
	}
	done := make(chan error, len(ends))
	for _, f := range ends {
		w.p.TruncateRaft(uint64(f.Group), uint64(f.Replica), f.last+1, f.term, nil, func(err error) {
			if err != nil {
				err = fmt.Errorf("replication: group %d: end replica %d's log: %w", f.Group, f.Replica, err)
			}
			done <- err
		})
	}
	if err := w.p.Barrier(ctx); err != nil {
		return err
	}
	return wait(ctx, done, len(ends))
}

// drop ends the logs of ends that have a conf with an empty snapshot, waits
// until the applier installed them, and has Badger flush (ForgetAndDelete).
func (w *WALPipeline) drop(ctx context.Context, ends []forgotten) error {
	durable, installed := make(chan error, len(ends)), make(chan error, len(ends))
	n := 0
	for _, f := range ends {
		if len(f.conf) == 0 {
			continue
		}
		st, err := w.db.StageRaftSnapshot(uint64(f.Group), uint64(f.Replica))
		if err != nil {
			return err
		}
		ref, err := st.Finish() // no chunks: no key stays
		if err != nil {
			st.Abort()
			return err
		}
		w.p.AppendRaft(persistence.RaftAppend{
			Group: uint64(f.Group), Replica: uint64(f.Replica), Sync: true,
			Snapshot: &persistence.RaftSnapshot{Index: f.last, Term: f.term, ConfState: f.conf, Ref: ref,
				Installed: func(err error) { installed <- err }},
			Done: func(err error) { durable <- err },
		})
		n++
	}
	if n == 0 {
		return nil
	}
	// Every Installed is called once its append is durable; an append
	// that fails is never installed.
	if err := wait(ctx, durable, n); err != nil {
		return err
	}
	if err := wait(ctx, installed, n); err != nil {
		return err
	}
	if err := w.p.Flush(); err != nil {
		return err
	}
	for _, f := range ends {
		if len(f.conf) > 0 {
			w.log.Info("deleted the data of a replica that left its group", "partition", uint64(f.Group), "replica", uint64(f.Replica), "index", f.last)
		}
	}
	return nil
}

// wait takes n results from ch and returns the first error among them.
func wait(ctx context.Context, ch chan error, n int) error {
	var first error
	for range n {
		select {
		case err := <-ch:
			if first == nil {
				first = err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return first
}
