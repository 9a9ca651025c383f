package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/persistence"
)

// A handoff moves partition p from its owner A to a target B:
//
//  1. A tells B to expect p; B deletes whatever stale data of p it has.
//  2. A streams p's keyspace (a prefix scan) to B while still serving p, then
//     the changes made meanwhile, round after round, while Badger keeps every
//     version above the first round's start (Pipeline.HoldVersions).
//  3. A stops serving p: new requests wait, the activations go, and a pipeline
//     barrier makes sure no write of p is still on its way to disk. It sends the
//     last changes. Every chunk is durable on B before B answers it.
//  4. A switches the table by compare-and-swap: owner B, same epoch, no lease. B
//     takes p up under its own lease at the next epoch. A deletes its copy.
//
// If anything fails before A stops writes, A goes on serving p and B drops what
// it got. If it fails after, A never serves p again at the old epoch (a write an
// old activation raced past the freeze would commit under it): it retires the
// entry's revision, so that a switch still on its way to etcd can no longer
// land, tells B to drop what it got, and takes p up again at the next epoch.
// While A cannot tell whether the switch landed, it tells B nothing: B takes p
// up if the table says so, and gives the import up after importTimeout if not.

// handoffMsg is the body of the handoff requests.
type handoffMsg struct {
	Partition uint32
	MoveID    string
	Changes   []persistence.Change
	Commit    bool // opHandoffEnd: the table switched (else: given up)
}

// importState is B's side of one handoff.
type importState struct {
	moveID string
	from   string
	last   time.Time
}

// handoffChunkBytes bounds one chunk of a handoff.
const handoffChunkBytes = 4 << 20

// handoffRounds is how many catch-up rounds run before the owner stops writes.
const handoffRounds = 4

// handoff runs on A (this node) for partition p, whose entry e asks for a move.
func (m *member) handoff(p uint32, e PartEntry) {
	start := time.Now()
	err := m.handOff(p, e)
	if mt := m.n.cfg.Metrics; mt != nil {
		if err != nil {
			mt.Handoff("failed")
		} else {
			mt.Handoff("ok")
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.retryAt[p] = time.Now().Add(time.Second)
		if m.state[p] == stHandoff {
			// Still serving if it failed before the freeze. After it, reconcile
			// takes p up again at the next epoch (or sees that B owns it).
			if m.n.table.epochs[p].Load() != 0 {
				m.state[p] = stServing
			} else {
				// If the switch did land, this copy is stale (a cleanup reads
				// etcd before it deletes anything); a take-up clears the mark.
				m.state[p] = stIdle
				m.stale[p] = true
				m.poke()
			}
		}
		if m.ctx.Err() == nil {
			m.log.Warn("partition handoff failed; the partition stays here", "partition", p, "to", e.Target, "err", err)
		}
		return
	}
	m.state[p] = stIdle
	m.stale[p] = true
	m.events.handedOff.add(e.Target, "handed a partition off", "partition", p, "to", e.Target, "took", time.Since(start).Round(time.Millisecond))
	m.poke()
}

func (m *member) handOff(p uint32, e PartEntry) error {
	target, ok := m.view.node(e.Target)
	if !ok {
		return fmt.Errorf("target node %s is not live", e.Target)
	}
	ctx := m.ctx
	moveID := newBoot()
	send := func(op int, msg *handoffMsg) error {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		reply, err := m.tr.call(cctx, target, &wireRequest{Op: op, From: m.id, Handoff: msg})
		if err != nil {
			return err
		}
		return reply.Err.err()
	}
	abort := func(err error) error {
		_ = send(opHandoffEnd, &handoffMsg{Partition: p, MoveID: moveID})
		return err
	}
	// abortFrozen ends a handoff that failed after writes stopped (see the
	// package comment above): B hears of it only once the switch cannot land.
	abortFrozen := func(err error) error {
		switched, rerr := m.retireSwitch(ctx, p, e)
		switch {
		case rerr != nil:
			return fmt.Errorf("%w; whether the table switched is unknown (%v): the target is not told to drop the partition", err, rerr)
		case switched:
			_ = send(opHandoffEnd, &handoffMsg{Partition: p, MoveID: moveID, Commit: true})
			return nil
		}
		return abort(err)
	}
	if err := send(opHandoffBegin, &handoffMsg{Partition: p, MoveID: moveID}); err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	since := m.n.pipe.Committed()
	release := m.n.pipe.HoldVersions(since)
	defer release()
	if err := m.n.pipe.WaitApplied(ctx); err != nil {
		return abort(fmt.Errorf("wait for the database: %w", err))
	}
	prefix := persistence.PartitionPrefix(p)
	stream := func(since uint64) (int, error) {
		var chunk []persistence.Change
		size, total := 0, 0
		flush := func() error {
			if len(chunk) == 0 {
				return nil
			}
			err := send(opHandoffChunk, &handoffMsg{Partition: p, MoveID: moveID, Changes: chunk})
			chunk, size = nil, 0
			return err
		}
		_, err := m.n.db.Export(ctx, prefix, since, func(c persistence.Change) error {
			chunk = append(chunk, c)
			size += len(c.Key) + len(c.Value) + 16
			total++
			if size >= handoffChunkBytes {
				return flush()
			}
			return nil
		})
		if err == nil {
			err = flush()
		}
		return total, err
	}
	// Round 0 copies everything (since 0); later rounds the changes after the
	// previous round's start.
	prev := uint64(0)
	next := since
	for round := 0; round < handoffRounds; round++ {
		n, err := stream(prev)
		if err != nil {
			return abort(fmt.Errorf("stream: %w", err))
		}
		prev = next
		next = m.n.pipe.Committed()
		if err := m.n.pipe.WaitApplied(ctx); err != nil {
			return abort(fmt.Errorf("wait for the database: %w", err))
		}
		if round > 0 && n < 1000 {
			break
		}
	}
	// Stop writes: from here the fence refuses p's writes at the old epoch.
	m.mu.Lock()
	m.n.table.epochs[p].Store(0)
	m.n.host.DropPartition(p)
	m.mu.Unlock()
	frozen := time.Now()
	bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := m.n.pipe.Barrier(bctx)
	cancel()
	if err != nil {
		return abortFrozen(fmt.Errorf("barrier: %w", err))
	}
	if err := m.n.pipe.WaitApplied(ctx); err != nil {
		return abortFrozen(fmt.Errorf("wait for the database: %w", err))
	}
	if _, err := stream(prev); err != nil {
		return abortFrozen(fmt.Errorf("final stream: %w", err))
	}
	// Switch the table.
	cur, err := readPart(ctx, m.cli, m.k, p)
	if err != nil {
		return abortFrozen(err)
	}
	if cur.Owner != m.id || cur.Epoch != e.Epoch || cur.Target != e.Target {
		return abortFrozen(errors.New("the partition's entry changed during the handoff"))
	}
	if hook := m.beforeSwitch.Load(); hook != nil {
		if err := (*hook)(p, cur); err != nil {
			return abortFrozen(fmt.Errorf("switch: %w", err))
		}
	}
	// The target's storage ID as it was when the handoff began: if the target
	// restarted on another data directory since, it refuses p (the data went
	// to the directory named here).
	if err := casPart(ctx, m.cli, m.k, p, cur, PartEntry{Owner: e.Target, Epoch: e.Epoch, Storage: target.Storage, Losses: e.Losses}); err != nil {
		// On a transport error the switch may have landed, or may still land.
		return abortFrozen(fmt.Errorf("switch: %w", err))
	}
	if err := send(opHandoffEnd, &handoffMsg{Partition: p, MoveID: moveID, Commit: true}); err != nil {
		m.log.Debug("the handoff's end did not reach the target; it takes the partition up from the table", "err", err)
	}
	m.log.Debug("partition writes paused for the switch", "partition", p, "paused", time.Since(frozen).Round(time.Millisecond))
	return nil
}

// retireSwitch, after a handoff of p (entry e) failed past the freeze, finds out
// whether the table switched to e.Target; if it did not, it rewrites p's entry
// unchanged, which moves its revision on, so that a switch still on its way to
// etcd fails its compare from then on. An error means it could not tell.
func (m *member) retireSwitch(ctx context.Context, p uint32, e PartEntry) (switched bool, err error) {
	for attempt := 0; ; attempt++ {
		var cur PartEntry
		cur, err = readPart(ctx, m.cli, m.k, p)
		if err == nil {
			if cur.Owner == e.Target && cur.Epoch == e.Epoch && cur.Lease == 0 {
				return true, nil
			}
			if cur.Owner != m.id || cur.Epoch != e.Epoch {
				// Someone else changed it: the switch's compare fails for good.
				return false, nil
			}
			if err = casPart(ctx, m.cli, m.k, p, cur, cur); err == nil {
				return false, nil
			}
		}
		if attempt == 4 {
			return false, err
		}
		select {
		case <-ctx.Done():
			return false, err
		case <-time.After(time.Duration(200<<attempt) * time.Millisecond):
		}
	}
}

// serveHandoff is B's side.
func (m *member) serveHandoff(ctx context.Context, req *wireRequest) *wireReply {
	h := req.Handoff
	if h == nil || int(h.Partition) >= len(m.state) {
		return &wireReply{Err: toWireError(&actors.Error{Kind: actors.KindBadRequest, Msg: "malformed handoff"})}
	}
	p := h.Partition
	fail := func(format string, a ...any) *wireReply {
		return &wireReply{Err: toWireError(&actors.Error{Kind: actors.KindUnavailable, Msg: fmt.Sprintf(format, a...)})}
	}
	switch req.Op {
	case opHandoffBegin:
		m.mu.Lock()
		switch m.state[p] {
		case stServing, stHandoff:
			m.mu.Unlock()
			return fail("node %s serves partition %d", m.id, p)
		case stImporting:
			m.endImport(p)
		}
		aux := m.nextAux()
		m.aux[p].Store(aux)
		m.state[p] = stImporting // a running cleanup sees this and stops
		m.stale[p] = false       // what is there is deleted right below
		m.imports[p] = &importState{moveID: h.MoveID, from: req.From, last: time.Now()}
		m.mu.Unlock()
		// Stale data of an earlier ownership goes first.
		if err := m.deletePartition(ctx, p, aux, func() bool { return m.importing(p, h.MoveID) }); err != nil {
			return fail("cannot clear partition %d for the handoff: %v", p, err)
		}
		return &wireReply{}
	case opHandoffChunk:
		// The import's epoch is read with its check: a chunk of an earlier
		// attempt still on its way must not carry the next attempt's epoch (the
		// fence refuses it once a new attempt began).
		m.mu.Lock()
		st := m.imports[p]
		ok := m.state[p] == stImporting && st != nil && st.moveID == h.MoveID
		aux := m.aux[p].Load()
		m.mu.Unlock()
		if !ok {
			return fail("no handoff %s of partition %d in progress", h.MoveID, p)
		}
		w := &persistence.Write{Partition: p, Epoch: aux}
		for _, c := range h.Changes {
			if c.Deleted {
				w.Deletes = append(w.Deletes, c.Key)
			} else {
				w.Sets = append(w.Sets, persistence.KV{Key: c.Key, Value: c.Value})
			}
		}
		if err := m.n.pipe.Submit(w).Wait(ctx); err != nil {
			return fail("cannot store a handoff chunk: %v", err)
		}
		m.mu.Lock()
		if st := m.imports[p]; st != nil {
			st.last = time.Now()
		}
		m.mu.Unlock()
		return &wireReply{}
	case opHandoffEnd:
		m.mu.Lock()
		defer m.mu.Unlock()
		if st := m.imports[p]; st == nil || st.moveID != h.MoveID || m.state[p] != stImporting {
			return &wireReply{}
		}
		m.endImport(p)
		m.stale[p] = !h.Commit // given up: cleaned by the next reconcile
		m.poke()
		return &wireReply{}
	}
	return fail("unknown handoff request")
}

// importing reports whether handoff moveID of p is in progress here.
func (m *member) importing(p uint32, moveID string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.imports[p]
	return m.state[p] == stImporting && st != nil && st.moveID == moveID
}

// endImport ends p's import (caller holds m.mu).
func (m *member) endImport(p uint32) {
	delete(m.imports, p)
	m.aux[p].Store(0)
	m.state[p] = stIdle
}

func zapNop() *zap.Logger { return zap.NewNop() }
