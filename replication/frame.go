package replication

import (
	"encoding/binary"
	"errors"
	"fmt"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// A frame is one batch of raft traffic from one node to another (design
// section 4, "Message format"). All integers are uvarints:
//
//	version (frameVersion)
//	from node
//	from storage: length, bytes
//	to storage:   length, bytes
//	sent: the sender's monotonic clock when it sent the frame (ns since its
//	      transport started); the receiver ties it to the heartbeats inside
//	count, then count messages: group, length, raftpb.Message bytes
//	beats:     count, then {group, from, to, term, commit, ctx length, ctx}
//	beatResps: count, then the same
//	removed:   only when there are any: count, then the same (commit 0, no
//	           ctx): removal notices (Envelope.Removed)
//
// A message's From and To are replica ids of its group; raftpb.Message has no
// group field, so the group goes before it. Heartbeats (MsgHeartbeat,
// MsgHeartbeatResp) of every group between a node pair travel as beats, not
// as messages (heartbeat.go). Nothing may follow the last beat response but
// removal notices, and nothing them. The notices came after version 1 was
// first written: a frame without them is what it was, so only the rare frame
// that carries one is refused by a node that does not know them.
const frameVersion = 1

// Decoding limits: a frame is untrusted input.
const (
	maxStorageIDLen = 256
	maxFrameItems   = 1 << 24
)

// errFrame is wrapped by every decoding error.
var errFrame = errors.New("replication: malformed frame")

// frameHeader is a frame's fixed part.
type frameHeader struct {
	From        NodeID
	FromStorage string
	ToStorage   string
	Sent        uint64
	Count       int // messages that follow
}

// maxHeaderSize bounds an encoded header with storage ids of at most
// maxStorageIDLen bytes.
const maxHeaderSize = 1 + 4*binary.MaxVarintLen64 + 2*(binary.MaxVarintLen64+maxStorageIDLen)

func appendHeader(b []byte, h frameHeader) []byte {
	b = binary.AppendUvarint(b, frameVersion)
	b = binary.AppendUvarint(b, uint64(h.From))
	b = binary.AppendUvarint(b, uint64(len(h.FromStorage)))
	b = append(b, h.FromStorage...)
	b = binary.AppendUvarint(b, uint64(len(h.ToStorage)))
	b = append(b, h.ToStorage...)
	b = binary.AppendUvarint(b, h.Sent)
	return binary.AppendUvarint(b, uint64(h.Count))
}

// appendMessage appends one message (group, length, bytes).
func appendMessage(b []byte, g GroupID, m *raftpb.Message) ([]byte, error) {
	n := proto.Size(m)
	b = binary.AppendUvarint(b, uint64(g))
	b = binary.AppendUvarint(b, uint64(n))
	return proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(b, m)
}

// beat is one coalesced heartbeat or heartbeat response.
type beat struct {
	Group  GroupID
	From   ReplicaID
	To     ReplicaID
	Term   uint64
	Commit uint64
	Ctx    []byte
}

func (bt *beat) size() int { return 6*binary.MaxVarintLen64 + len(bt.Ctx) }

func appendBeats(b []byte, beats []beat) []byte {
	b = binary.AppendUvarint(b, uint64(len(beats)))
	for i := range beats {
		bt := &beats[i]
		b = binary.AppendUvarint(b, uint64(bt.Group))
		b = binary.AppendUvarint(b, uint64(bt.From))
		b = binary.AppendUvarint(b, uint64(bt.To))
		b = binary.AppendUvarint(b, bt.Term)
		b = binary.AppendUvarint(b, bt.Commit)
		b = binary.AppendUvarint(b, uint64(len(bt.Ctx)))
		b = append(b, bt.Ctx...)
	}
	return b
}

// frame is a decoded frame.
type frame struct {
	frameHeader
	Msgs      []Envelope
	Beats     []beat
	BeatResps []beat
	Removed   []beat // removal notices
}

// decoder reads uvarints and byte strings off a frame, remembering the first
// error.
type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s at offset %d", errFrame, what, d.off)
	}
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.off:])
	if n <= 0 {
		d.fail("bad " + what)
		return 0
	}
	d.off += n
	return v
}

// bytes returns the next length-prefixed byte string (aliasing the frame), at
// most limit bytes long.
func (d *decoder) bytes(what string, limit int) []byte {
	n := d.uvarint(what + " length")
	if d.err != nil {
		return nil
	}
	if n > uint64(limit) || n > uint64(len(d.b)-d.off) {
		d.fail(what + " too long")
		return nil
	}
	s := d.b[d.off : d.off+int(n)]
	d.off += int(n)
	return s
}

// count reads an item count that cannot exceed what the rest of the frame
// could hold at minItem bytes per item.
func (d *decoder) count(what string, minItem int) int {
	n := d.uvarint(what)
	if d.err != nil {
		return 0
	}
	if n > maxFrameItems || n*uint64(minItem) > uint64(len(d.b)-d.off) {
		d.fail(what + " too large")
		return 0
	}
	return int(n)
}

func (d *decoder) beats(what string) []beat {
	n := d.count(what, 6) // six uvarints of at least a byte each
	if n == 0 {
		return nil
	}
	out := make([]beat, 0, n)
	for range n {
		bt := beat{
			Group:  GroupID(d.uvarint("beat group")),
			From:   ReplicaID(d.uvarint("beat from")),
			To:     ReplicaID(d.uvarint("beat to")),
			Term:   d.uvarint("beat term"),
			Commit: d.uvarint("beat commit"),
		}
		if ctx := d.bytes("beat context", len(d.b)); len(ctx) > 0 {
			bt.Ctx = append([]byte(nil), ctx...)
		}
		if d.err != nil {
			return nil
		}
		out = append(out, bt)
	}
	return out
}

// decodeFrame decodes a whole frame. The result shares nothing with b (the
// carrier may reuse it). Any defect, including trailing bytes, is an error
// wrapping errFrame; it never panics on any input.
func decodeFrame(b []byte) (frame, error) {
	d := &decoder{b: b}
	var f frame
	if v := d.uvarint("version"); d.err == nil && v != frameVersion {
		return f, fmt.Errorf("%w: version %d, want %d", errFrame, v, frameVersion)
	}
	f.From = NodeID(d.uvarint("from node"))
	f.FromStorage = string(d.bytes("from storage", maxStorageIDLen))
	f.ToStorage = string(d.bytes("to storage", maxStorageIDLen))
	f.Sent = d.uvarint("sent")
	f.Count = d.count("message count", 2)
	if d.err != nil {
		return frame{}, d.err
	}
	if f.Count > 0 {
		f.Msgs = make([]Envelope, 0, f.Count)
	}
	for range f.Count {
		g := GroupID(d.uvarint("message group"))
		body := d.bytes("message", len(b))
		if d.err != nil {
			return frame{}, d.err
		}
		m := new(raftpb.Message)
		if err := proto.Unmarshal(body, m); err != nil {
			return frame{}, fmt.Errorf("%w: message %d: %w", errFrame, len(f.Msgs), err)
		}
		f.Msgs = append(f.Msgs, Envelope{Group: g, Msg: m})
	}
	f.Beats = d.beats("beat count")
	f.BeatResps = d.beats("beat response count")
	if d.err == nil && d.off < len(b) {
		f.Removed = d.beats("removal notice count")
	}
	if d.err != nil {
		return frame{}, d.err
	}
	if d.off != len(b) {
		return frame{}, fmt.Errorf("%w: %d trailing bytes", errFrame, len(b)-d.off)
	}
	return f, nil
}
