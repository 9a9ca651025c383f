//go:build plantedraftbug

package replication

import (
	"errors"

	"go.etcd.io/raft/v3/raftpb"
)

// PlantedRaftBug: see plantedraftbug_off.go. A deliberate bug for the torture
// tool's own test. Never ship.
const PlantedRaftBug = true

// errPlantedAck is what a pending ProposeAsync proposal's callback gets when
// its leader's own append is durable: the Proposer acknowledges the write
// then, committed or not (the bug), and treats the later real outcome as the
// write's application only.
var errPlantedAck = errors.New("replication: plantedraftbug: acknowledged at the leader's own append")

// plantedAckAppended runs on the worker for the leader's MsgStorageAppendResp
// (its own entries are fsynced locally): every pending asynchronous proposal
// of this term whose entry is at or below the appended index is told
// errPlantedAck, before any follower may have it. The callback may hear it
// more than once (each later append covers it too) and must ignore repeats.
func (g *group) plantedAckAppended(m *raftpb.Message) {
	if m.GetIndex() == 0 || m.GetLogTerm() != g.term {
		return
	}
	for _, p := range g.pending {
		if p.cb != nil && p.index != 0 && p.index <= m.GetIndex() {
			p.cb(Result{Index: p.index, Term: g.term}, errPlantedAck)
		}
	}
}
