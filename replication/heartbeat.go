package replication

import (
	"encoding/binary"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// Coalesced heartbeats (design section 4; the idea of Cockroach's
// coalescedHeartbeats). Every group's leader sends MsgHeartbeat to each
// follower once per HeartbeatTick, and each follower answers: with G groups
// that is G messages per node pair per tick. Instead, NetTransport.Send keeps
// a group's MsgHeartbeat and MsgHeartbeatResp out of the message queue and adds
// them to the node pair's beat lists; the beat loop (one goroutine per
// transport) sends every pair's lists once per BeatInterval (tick/2) in one
// frame. So the frames between a pair per tick are bounded by 2 plus the
// frames of real traffic, whatever the number of groups.
//
// A heartbeat carries {group, from, to, term, commit, ctx}, which is all raft
// puts in a MsgHeartbeat (sendHeartbeat: Commit, Context; send: From, Term)
// and a MsgHeartbeatResp (From, Term, Context); the receiver rebuilds the
// message and steps it.
//
// Send times for the leader lease (design section 3). A frame carries the
// sender's monotonic send time. The receiver of a beat rebuilds its
// MsgHeartbeat with Context = tag | uvarint(send time) | original context;
// raft echoes a heartbeat's Context in its response verbatim, so the response
// that comes back to the leader names the exact send time of the heartbeat it
// answers (never a later one: the lease is never overstated). The leader's
// transport strips the tag, reports (group, follower, send time) through
// NetConfig.OnBeatAck, and steps the response with the original context, so
// that ReadIndex rounds (ReadOnlySafe keys them by context) are untouched.

// beatCtxTag starts every heartbeat context the transport rebuilt.
const beatCtxTag = 0xb7

// isBeat reports whether m travels as a coalesced beat.
func isBeat(t raftpb.MessageType) bool {
	return t == raftpb.MsgHeartbeat || t == raftpb.MsgHeartbeatResp
}

// beatOf turns a MsgHeartbeat or MsgHeartbeatResp of group g into a beat.
func beatOf(g GroupID, m *raftpb.Message) beat {
	return beat{
		Group:  g,
		From:   ReplicaID(m.GetFrom()),
		To:     ReplicaID(m.GetTo()),
		Term:   m.GetTerm(),
		Commit: m.GetCommit(),
		Ctx:    m.GetContext(),
	}
}

// heartbeatOf rebuilds a received beat into the MsgHeartbeat its leader sent,
// its context tagged with the frame's send time.
func heartbeatOf(bt *beat, sent uint64) Envelope {
	ctx := make([]byte, 0, 1+binary.MaxVarintLen64+len(bt.Ctx))
	ctx = append(ctx, beatCtxTag)
	ctx = binary.AppendUvarint(ctx, sent)
	ctx = append(ctx, bt.Ctx...)
	return Envelope{Group: bt.Group, Msg: &raftpb.Message{
		Type:    raftpb.MsgHeartbeat.Enum(),
		From:    new(uint64(bt.From)),
		To:      new(uint64(bt.To)),
		Term:    new(bt.Term),
		Commit:  new(bt.Commit),
		Context: ctx,
	}}
}

// heartbeatRespOf rebuilds a received beat response into the
// MsgHeartbeatResp its follower sent, with the leader's original context, and
// returns the send time of the heartbeat it answers. ok is false when the
// context does not carry our tag (then the response is not stepped: every
// heartbeat a follower answers came through a transport, which tags it).
func heartbeatRespOf(bt *beat) (env Envelope, sent uint64, ok bool) {
	if len(bt.Ctx) == 0 || bt.Ctx[0] != beatCtxTag {
		return Envelope{}, 0, false
	}
	sent, n := binary.Uvarint(bt.Ctx[1:])
	if n <= 0 {
		return Envelope{}, 0, false
	}
	var ctx []byte
	if rest := bt.Ctx[1+n:]; len(rest) > 0 {
		ctx = rest
	}
	return Envelope{Group: bt.Group, Msg: &raftpb.Message{
		Type:    raftpb.MsgHeartbeatResp.Enum(),
		From:    new(uint64(bt.From)),
		To:      new(uint64(bt.To)),
		Term:    new(bt.Term),
		Context: ctx,
	}}, sent, true
}

// monoSince converts a send time (ns since epoch, on the local monotonic
// clock) back into a time.Time.
func monoSince(epoch time.Time, sent uint64) time.Time {
	return epoch.Add(time.Duration(sent))
}
