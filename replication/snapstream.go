package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Snapshot streaming (design section 6). A MsgSnap carries only metadata
// (Storage.Snapshot(): index, term, ConfState, and in Data whatever the
// source needs to find the data); the data go out of band, over the same
// carrier, as a stream of chunk frames with their own flow control:
//
//  1. the sending transport opens the snapshot at its SnapshotSource and
//     sends chunks (about 1 MiB each, the source's), at most SnapshotWindow
//     unacknowledged; each chunk frame travels alone, between raft frames,
//     so a catch-up never holds heartbeats behind a large frame;
//  2. the receiving transport hands each chunk to its SnapshotSink's writer
//     and acknowledges it once the writer says it is durable;
//  3. after the last chunk the sender sends the end frame with the MsgSnap;
//     the receiver commits the writer, puts what Commit returns into the
//     message's Snapshot.Data, steps the message into its engine (raft then
//     hands the snapshot to the Pipeline's append job, which installs it) and
//     acknowledges the end;
//  4. the sender reports raft.SnapshotFinish on that acknowledgement, or
//     raft.SnapshotFailure on any error, refusal, or SnapshotTimeout without
//     an acknowledgement (raft then probes and sends a snapshot again).
//
// The transport never looks inside a chunk. WALPipeline is both a source and
// a sink (walsnapshot.go).

// SnapshotSource gives the data of the snapshots its Storage.Snapshot()
// described (the sending side).
type SnapshotSource interface {
	// OpenSnapshot returns a reader of snap's data: snap is the metadata
	// a MsgSnap of group g carries (from the local replica's Storage). An
	// error ends the send with SnapshotFailure. Safe from any goroutine.
	OpenSnapshot(g GroupID, snap *raftpb.Snapshot) (SnapshotReader, error)
}

// SnapshotReader is one snapshot's data, in chunks; one goroutine uses it.
type SnapshotReader interface {
	// Next returns the next chunk (which the caller may keep), or io.EOF
	// after the last one.
	Next() ([]byte, error)
	// Close ends the read (whether or not every chunk was read).
	Close()
}

// SnapshotSink takes the data of snapshots sent to local replicas (the
// receiving side).
type SnapshotSink interface {
	// ReceiveSnapshot starts receiving a snapshot for replica to of group g.
	// An error refuses the stream. Safe from any goroutine.
	ReceiveSnapshot(g GroupID, to ReplicaID) (SnapshotWriter, error)
}

// SnapshotWriter stores one incoming snapshot; one goroutine uses it.
type SnapshotWriter interface {
	// Write stores the next chunk; it is durable when Write returns nil.
	Write(chunk []byte) error
	// Commit ends a stream whose every chunk was written and returns the
	// Snapshot.Data the MsgSnap is stepped with (the pipeline finds the
	// data by it).
	Commit() ([]byte, error)
	// Abort drops what was written (not after Commit).
	Abort()
}

// snapFrameKind is the first uvarint of a snapshot stream frame (a raft
// batch frame starts with frameVersion):
//
//	kind (2) | from node | from storage | to storage | type | stream |
//	group | from replica | to replica | seq | payload length | payload
//
// type: chunk (seq = its number from 0, payload = the chunk), end (seq = the
// number of chunks, payload = the MsgSnap), ack (seq = the chunk
// acknowledged), done (the end acknowledged), abort (payload = why).
const snapFrameKind = 2

const (
	snapChunk byte = 1 + iota
	snapEnd
	snapAck
	snapDone
	snapAbort
)

// snapFrame is a decoded snapshot frame.
type snapFrame struct {
	from                 NodeID
	fromStorage          string
	toStorage            string
	typ                  byte
	stream               uint64
	group                GroupID
	fromReplica, replica ReplicaID
	seq                  uint64
	payload              []byte // aliases the frame
}

func appendSnapFrame(b []byte, f *snapFrame) []byte {
	b = binary.AppendUvarint(b, snapFrameKind)
	b = binary.AppendUvarint(b, uint64(f.from))
	b = binary.AppendUvarint(b, uint64(len(f.fromStorage)))
	b = append(b, f.fromStorage...)
	b = binary.AppendUvarint(b, uint64(len(f.toStorage)))
	b = append(b, f.toStorage...)
	b = append(b, f.typ)
	for _, v := range [...]uint64{f.stream, uint64(f.group), uint64(f.fromReplica), uint64(f.replica), f.seq, uint64(len(f.payload))} {
		b = binary.AppendUvarint(b, v)
	}
	return append(b, f.payload...)
}

// decodeSnapFrame decodes a snapshot frame; any defect is an error wrapping
// errFrame. The payload aliases b.
func decodeSnapFrame(b []byte) (snapFrame, error) {
	d := &decoder{b: b}
	var f snapFrame
	if k := d.uvarint("kind"); d.err == nil && k != snapFrameKind {
		return f, fmt.Errorf("%w: kind %d, want %d", errFrame, k, snapFrameKind)
	}
	f.from = NodeID(d.uvarint("from node"))
	f.fromStorage = string(d.bytes("from storage", maxStorageIDLen))
	f.toStorage = string(d.bytes("to storage", maxStorageIDLen))
	if d.err == nil {
		if d.off >= len(b) {
			d.fail("no type")
		} else {
			f.typ = b[d.off]
			d.off++
		}
	}
	f.stream = d.uvarint("stream")
	f.group = GroupID(d.uvarint("group"))
	f.fromReplica = ReplicaID(d.uvarint("from replica"))
	f.replica = ReplicaID(d.uvarint("to replica"))
	f.seq = d.uvarint("seq")
	f.payload = d.bytes("payload", len(b))
	if d.err != nil {
		return snapFrame{}, d.err
	}
	if f.typ < snapChunk || f.typ > snapAbort {
		return snapFrame{}, fmt.Errorf("%w: snapshot frame type %d", errFrame, f.typ)
	}
	if d.off != len(b) {
		return snapFrame{}, fmt.Errorf("%w: %d trailing bytes", errFrame, len(b)-d.off)
	}
	return f, nil
}

// snapOut is a snapshot frame queued for a peer's sender; failed, if set,
// learns that the carrier could not send it.
type snapOut struct {
	frame  []byte
	failed func(error)
}

// outStream is one snapshot this node sends; in is fed by HandleFrame.
type outStream struct {
	to NodeID
	in chan snapFrame
}

// inStream is one snapshot this node receives.
type inStream struct {
	in chan snapFrame
}

type inKey struct {
	from   NodeID
	stream uint64
}

// streamKey dedupes outgoing streams: one per group and follower.
type streamKey struct {
	g  GroupID
	to ReplicaID
}

// startSnapshot starts streaming m (a MsgSnap of group g) to node to, or,
// when too many streams run, reports it lost. Called by Send.
func (t *NetTransport) startSnapshot(p *peer, g GroupID, m *raftpb.Message) {
	sk := streamKey{g, ReplicaID(m.GetTo())}
	t.mu.Lock()
	ok := !t.closed && len(t.outs) < t.cfg.MaxSnapshotStreams && !t.outKeys[sk]
	var id uint64
	var os *outStream
	if ok {
		id = rand.Uint64() | 1
		os = &outStream{to: p.node, in: make(chan snapFrame, t.cfg.SnapshotWindow+4)}
		t.outs[id] = os
		t.outKeys[sk] = true
	}
	t.mu.Unlock()
	if ok && t.owner.Go(func(ctx context.Context) { t.sendSnapshot(ctx, p, id, os, g, m) }) {
		return
	}
	if ok {
		t.mu.Lock()
		delete(t.outs, id)
		delete(t.outKeys, sk)
		t.mu.Unlock()
	}
	p.mu.Lock()
	p.snapsLost = append(p.snapsLost, target{g, sk.to})
	p.mu.Unlock()
	wake(p.wake)
}

// sendSnapshot is one outgoing stream (see the top of this file).
func (t *NetTransport) sendSnapshot(ctx context.Context, p *peer, id uint64, os *outStream, g GroupID, m *raftpb.Message) {
	to := ReplicaID(m.GetTo())
	status := raft.SnapshotFailure
	var err error
	defer func() {
		t.mu.Lock()
		delete(t.outs, id)
		delete(t.outKeys, streamKey{g, to})
		t.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			t.log.Warn("replication: a snapshot was not sent", "group", uint64(g), "to", uint64(to), "node", uint64(p.node), "err", err)
			t.stats.snapFailed.Add(1)
			t.queueSnap(p, &snapFrame{typ: snapAbort, stream: id, group: g, fromReplica: ReplicaID(m.GetFrom()), replica: to, payload: []byte(err.Error())}, nil)
		}
		t.reportSnaps([]target{{g, to}}, status)
	}()
	r, err := t.cfg.Snapshots.OpenSnapshot(g, m.GetSnapshot())
	if err != nil {
		return
	}
	defer r.Close()
	hdr := snapFrame{stream: id, group: g, fromReplica: ReplicaID(m.GetFrom()), replica: to}
	failed := func(e error) {
		select {
		case os.in <- snapFrame{typ: snapAbort, payload: []byte(e.Error())}:
		default:
		}
	}
	timer := time.NewTimer(t.cfg.SnapshotTimeout)
	defer timer.Stop()
	// wait takes the next frame from the receiver (or the carrier's failure).
	wait := func() (snapFrame, error) {
		timer.Reset(t.cfg.SnapshotTimeout)
		select {
		case f := <-os.in:
			if f.typ == snapAbort {
				return f, fmt.Errorf("the receiver (or the carrier) gave up: %s", f.payload)
			}
			return f, nil
		case <-timer.C:
			return snapFrame{}, fmt.Errorf("no acknowledgement within %v", t.cfg.SnapshotTimeout)
		case <-ctx.Done():
			return snapFrame{}, ctx.Err()
		}
	}
	var sent, acked uint64
	var bytes uint64
	eof := false
	for !eof || acked < sent {
		for !eof && sent-acked < uint64(t.cfg.SnapshotWindow) {
			chunk, rerr := r.Next()
			if rerr == io.EOF {
				eof = true
				break
			}
			if rerr != nil {
				err = fmt.Errorf("read chunk %d: %w", sent, rerr)
				return
			}
			f := hdr
			f.typ, f.seq, f.payload = snapChunk, sent, chunk
			t.queueSnap(p, &f, failed)
			sent++
			bytes += uint64(len(chunk))
		}
		if acked == sent {
			continue // eof with everything acknowledged
		}
		var f snapFrame
		if f, err = wait(); err != nil {
			return
		}
		if f.typ != snapAck || f.seq != acked {
			err = fmt.Errorf("acknowledgement of chunk %d (type %d), expected chunk %d", f.seq, f.typ, acked)
			return
		}
		acked++
	}
	mb, err := proto.Marshal(m)
	if err != nil {
		return
	}
	end := hdr
	end.typ, end.seq, end.payload = snapEnd, sent, mb
	t.queueSnap(p, &end, failed)
	f, err := wait()
	if err != nil {
		return
	}
	if f.typ != snapDone {
		err = fmt.Errorf("the end acknowledged with frame type %d", f.typ)
		return
	}
	status = raft.SnapshotFinish
	t.stats.snapSent.Add(1)
	t.stats.snapChunks.Add(sent)
	t.log.Info("replication: snapshot sent", "group", uint64(g), "to", uint64(to), "node", uint64(p.node),
		"index", m.GetSnapshot().GetMetadata().GetIndex(), "chunks", sent, "bytes", bytes)
}

// queueSnap queues a snapshot frame for p's sender.
func (t *NetTransport) queueSnap(p *peer, f *snapFrame, failed func(error)) {
	t.mu.Lock()
	f.from, f.fromStorage, f.toStorage = t.cfg.Node, t.cfg.Storage, t.storage[p.node]
	t.mu.Unlock()
	b := appendSnapFrame(make([]byte, 0, 64+len(f.fromStorage)+len(f.toStorage)+len(f.payload)), f)
	p.mu.Lock()
	p.snapq = append(p.snapq, snapOut{frame: b, failed: failed})
	p.mu.Unlock()
	wake(p.wake)
}

// sendSnapFrame sends the oldest queued snapshot frame of p, if any, and
// says whether more wait (sender goroutine).
func (t *NetTransport) sendSnapFrame(ctx context.Context, p *peer) bool {
	p.mu.Lock()
	if len(p.snapq) == 0 {
		p.mu.Unlock()
		return false
	}
	o := p.snapq[0]
	p.snapq[0] = snapOut{}
	p.snapq = p.snapq[1:]
	more := len(p.snapq) > 0
	p.mu.Unlock()
	if err := t.carrier.Send(ctx, p.node, o.frame); err != nil {
		t.stats.sendErrors.Add(1)
		if o.failed != nil {
			o.failed(err)
		}
	} else {
		t.stats.snapFrames.Add(1)
	}
	return more
}

// handleSnapFrame takes a snapshot frame that arrived (HandleFrame).
func (t *NetTransport) handleSnapFrame(b []byte) {
	f, err := decodeSnapFrame(b)
	if err != nil {
		t.stats.refused.Add(1)
		t.log.Warn("replication: a malformed snapshot frame was dropped", "err", err)
		return
	}
	t.mu.Lock()
	known, ok := t.storage[f.from]
	t.mu.Unlock()
	if f.toStorage != t.cfg.Storage || (ok && known != f.fromStorage) {
		t.stats.refused.Add(1)
		return
	}
	switch f.typ {
	case snapAck, snapDone, snapAbort:
		t.mu.Lock()
		os := t.outs[f.stream]
		t.mu.Unlock()
		if os != nil && os.to == f.from {
			select {
			case os.in <- f:
			default: // more than the window: the stream fails on its own
			}
		}
		if os != nil || f.typ != snapAbort {
			return
		}
		fallthrough // an abort from the sender: for an incoming stream
	default:
		t.handleIncoming(f)
	}
}

// handleIncoming routes a chunk, end or abort to its incoming stream,
// starting the stream on its first frame.
func (t *NetTransport) handleIncoming(f snapFrame) {
	k := inKey{f.from, f.stream}
	f.payload = append([]byte(nil), f.payload...) // the carrier reuses b
	t.mu.Lock()
	in := t.ins[k]
	start := in == nil && f.typ != snapAbort && (f.typ == snapEnd || f.seq == 0) && !t.closed
	refuse := ""
	switch {
	case start && t.cfg.SnapshotSink == nil:
		refuse, start = "this node takes no snapshots (no SnapshotSink)", false
	case start && len(t.ins) >= 2*t.cfg.MaxSnapshotStreams:
		refuse, start = "too many incoming snapshots", false
	}
	if start {
		in = &inStream{in: make(chan snapFrame, t.cfg.SnapshotWindow+4)}
		t.ins[k] = in
	}
	t.mu.Unlock()
	if refuse != "" {
		t.replySnap(f, snapAbort, 0, refuse)
		return
	}
	if in == nil {
		return // a stream this node dropped: its sender times out or was told
	}
	if start && !t.owner.Go(func(ctx context.Context) { t.receiveSnapshot(ctx, k, in, f) }) {
		t.mu.Lock()
		delete(t.ins, k)
		t.mu.Unlock()
		return
	}
	if !start {
		select {
		case in.in <- f:
		default:
			// Past the window: a misbehaving sender. Its stream ends at
			// the receiver's next frame check (a gap in seq).
		}
	}
}

// replySnap sends a frame back to f's sender about f's stream.
func (t *NetTransport) replySnap(f snapFrame, typ byte, seq uint64, reason string) {
	p := t.peer(f.from)
	if p == nil {
		return
	}
	t.queueSnap(p, &snapFrame{typ: typ, stream: f.stream, group: f.group, fromReplica: f.replica, replica: f.fromReplica, seq: seq, payload: []byte(reason)}, nil)
}

// receiveSnapshot is one incoming stream; first is its first frame.
func (t *NetTransport) receiveSnapshot(ctx context.Context, k inKey, in *inStream, first snapFrame) {
	defer func() {
		t.mu.Lock()
		delete(t.ins, k)
		t.mu.Unlock()
	}()
	g, to := first.group, first.replica
	w, err := t.cfg.SnapshotSink.ReceiveSnapshot(g, to)
	if err != nil {
		t.replySnap(first, snapAbort, 0, err.Error())
		return
	}
	committed := false
	defer func() {
		if !committed {
			w.Abort()
		}
	}()
	fail := func(f snapFrame, err error) {
		t.log.Warn("replication: an incoming snapshot was dropped", "group", uint64(g), "replica", uint64(to), "from", uint64(k.from), "err", err)
		t.replySnap(f, snapAbort, 0, err.Error())
	}
	timer := time.NewTimer(t.cfg.SnapshotTimeout)
	defer timer.Stop()
	var next uint64
	f := first
	for {
		if f.group != g || f.replica != to {
			fail(f, fmt.Errorf("a frame of group %d replica %d in a stream of group %d replica %d", f.group, f.replica, g, to))
			return
		}
		switch f.typ {
		case snapAbort:
			return
		case snapChunk:
			if f.seq != next {
				fail(f, fmt.Errorf("chunk %d, expected %d", f.seq, next))
				return
			}
			if err := w.Write(f.payload); err != nil {
				fail(f, err)
				return
			}
			t.replySnap(f, snapAck, next, "")
			next++
		case snapEnd:
			if f.seq != next {
				fail(f, fmt.Errorf("the end says %d chunks, %d arrived", f.seq, next))
				return
			}
			m := new(raftpb.Message)
			if err := proto.Unmarshal(f.payload, m); err != nil || m.GetType() != raftpb.MsgSnap || ReplicaID(m.GetTo()) != to || m.GetSnapshot() == nil {
				fail(f, fmt.Errorf("the end does not carry a MsgSnap for replica %d", to))
				return
			}
			data, err := w.Commit()
			committed = true
			if err != nil {
				fail(f, err)
				return
			}
			m.Snapshot.Data = data
			r := t.recv.Load()
			if r == nil {
				fail(f, errors.New("the transport has no receiver"))
				return
			}
			(*r).Receive([]Envelope{{Group: g, Msg: m}})
			t.stats.snapReceived.Add(1)
			t.replySnap(f, snapDone, next, "")
			return
		}
		timer.Reset(t.cfg.SnapshotTimeout)
		select {
		case f = <-in.in:
		case <-timer.C:
			fail(f, fmt.Errorf("no frame within %v", t.cfg.SnapshotTimeout))
			return
		case <-ctx.Done():
			return
		}
	}
}
