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
func (w *WALPipeline) Forget(ctx context.Context, g GroupID, r ReplicaID) error {
	w.mu.Lock()
	current := w.replica[g] == r
	w.mu.Unlock()
	if err := w.p.Barrier(ctx); err != nil { // its last appends are in
		return err
	}
	s := w.db.RaftStorage(uint64(g), uint64(r), nil)
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	if first == 1 && last == 0 {
		return nil // no log
	}
	term, err := s.Term(last)
	if err != nil {
		return fmt.Errorf("replication: group %d replica %d: the term of its last entry %d: %w", g, r, last, err)
	}
	if current {
		// The pipeline's own truncations of g follow this one.
		w.mu.Lock()
		w.first[g] = last + 1
		delete(w.installed, g)
		w.mu.Unlock()
	}
	done := make(chan error, 1)
	w.p.TruncateRaft(uint64(g), uint64(r), last+1, term, nil, func(err error) { done <- err })
	if err := w.p.Barrier(ctx); err != nil {
		return err
	}
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("replication: group %d: end replica %d's log: %w", g, r, err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
