package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/internal/owner"
)

// Carrier moves frames between nodes: the network under a NetTransport,
// behind a small seam so that framing, batching and heartbeats are tested
// without it. TCPCarrier is the one the engine uses (tcpcarrier.go says why).
type Carrier interface {
	// Send delivers one frame to node to, blocking until the frame is handed
	// to the connection, or fails (unknown node, no connection, ctx ended).
	// It is called by one goroutine per destination (frames to one node keep
	// their order) and must not retain frame after it returns. Frames that
	// arrive go to the FrameHandler the carrier was made with.
	Send(ctx context.Context, to NodeID, frame []byte) error
}

// FrameHandler takes one frame that arrived; it must not retain frame.
type FrameHandler func(frame []byte)

// Receiver is what a NetTransport delivers to: the Engine.
type Receiver interface {
	Receive(batch []Envelope)
	ReportUnreachable(g GroupID, to ReplicaID)
}

var (
	_ Receiver  = (*Engine)(nil)
	_ Transport = (*NetTransport)(nil)
)

// NetConfig configures a NetTransport. Zero fields take the defaults.
type NetConfig struct {
	// Node is this node's id. Required.
	Node NodeID
	// Storage is this node's storage identity. Frames addressed to another
	// storage are dropped: a message for a replaced disk never reaches the
	// replica that took its place. Required.
	Storage string
	// MaxQueueBytes bounds each destination's queue of encoded messages and
	// beats; past it a message is dropped and its group told the peer is
	// unreachable. Default 64 MiB.
	MaxQueueBytes int
	// BeatInterval is how often the coalesced heartbeats of every node pair
	// are sent: half the engine's TickInterval. Default 50 ms.
	BeatInterval time.Duration
	// OnBeatAck, if set, is called for every heartbeat response that comes
	// back, with the group, the follower's replica and the time (on this
	// node's monotonic clock) the answered heartbeat left: the leader lease's
	// input. Called on the carrier's goroutine; it must not block.
	OnBeatAck func(g GroupID, from ReplicaID, sent time.Time)
	// Snapshots, if set, gives the data of the MsgSnaps this node sends:
	// they are then streamed in chunks (snapstream.go), not sent inline.
	Snapshots SnapshotSource
	// SnapshotSink, if set, takes the data of snapshots streamed to this
	// node; without it incoming streams are refused.
	SnapshotSink SnapshotSink
	// SnapshotWindow is how many chunks of one stream may be unacknowledged.
	// Default 4.
	SnapshotWindow int
	// SnapshotTimeout bounds the wait for the other side of a stream (an
	// acknowledgement, the next chunk). Default 10 s.
	SnapshotTimeout time.Duration
	// MaxSnapshotStreams bounds the snapshots this node sends at once (it
	// receives at most twice as many); past it a MsgSnap is reported
	// failed (raft tries again later). Default 2.
	MaxSnapshotStreams int
	// Logger; default slog.Default().
	Logger *slog.Logger
}

func (c NetConfig) withDefaults() (NetConfig, error) {
	if c.MaxQueueBytes == 0 {
		c.MaxQueueBytes = 64 << 20
	}
	if c.BeatInterval == 0 {
		c.BeatInterval = 50 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.SnapshotWindow == 0 {
		c.SnapshotWindow = 4
	}
	if c.SnapshotTimeout == 0 {
		c.SnapshotTimeout = 10 * time.Second
	}
	if c.MaxSnapshotStreams == 0 {
		c.MaxSnapshotStreams = 2
	}
	switch {
	case c.SnapshotWindow < 1 || c.SnapshotTimeout < 0 || c.MaxSnapshotStreams < 1:
		return c, fmt.Errorf("replication: transport: SnapshotWindow %d, SnapshotTimeout %v, MaxSnapshotStreams %d: want positive", c.SnapshotWindow, c.SnapshotTimeout, c.MaxSnapshotStreams)
	case c.Node == 0:
		return c, errors.New("replication: transport: Node must be set (non-zero)")
	case c.Storage == "" || len(c.Storage) > maxStorageIDLen:
		return c, fmt.Errorf("replication: transport: Storage must be 1 to %d bytes, got %d", maxStorageIDLen, len(c.Storage))
	case c.MaxQueueBytes < 1<<10:
		return c, fmt.Errorf("replication: transport: MaxQueueBytes %d: want at least 1 KiB", c.MaxQueueBytes)
	case c.BeatInterval < 0:
		return c, fmt.Errorf("replication: transport: BeatInterval %v: want positive", c.BeatInterval)
	}
	return c, nil
}

// NetTransport is the engine's Transport between nodes (design section 4):
// one queue per destination node, bounded in bytes, drained by one sender
// goroutine per destination into one frame per send; heartbeats coalesced per
// node pair (heartbeat.go); frames checked against this node's storage id on
// arrival.
//
// Goroutines: the beat loop and one sender per destination (started on the
// first Send to it), all owned by the transport: Close stops and waits for
// them. The carrier's goroutines are the carrier's.
type NetTransport struct {
	cfg     NetConfig
	carrier Carrier
	log     *slog.Logger
	epoch   time.Time // send times are ns since epoch (monotonic)

	recv atomic.Pointer[Receiver] // set by Start

	mu      sync.Mutex
	peers   map[NodeID]*peer
	storage map[NodeID]string // the storage id each peer node serves from
	owner   *owner.Group
	closed  bool
	// Snapshot streams (snapstream.go): outgoing by stream id (and by
	// group and follower, one at a time), incoming by sender and stream.
	outs    map[uint64]*outStream
	outKeys map[streamKey]bool
	ins     map[inKey]*inStream

	stats netStats
}

// netStats are counters for tests and metrics.
type netStats struct {
	frames      atomic.Uint64 // frames handed to the carrier
	beatFrames  atomic.Uint64 // of which carried beats
	sendErrors  atomic.Uint64 // frames the carrier failed to send
	dropped     atomic.Uint64 // messages and beats dropped on a full queue or unknown peer
	received    atomic.Uint64 // frames received and delivered
	refused     atomic.Uint64 // frames dropped on arrival: another storage, malformed
	beatsIn     atomic.Uint64 // beats and beat responses received
	messagesIn  atomic.Uint64 // messages received
	messagesOut atomic.Uint64 // messages sent (not beats)
	// Snapshot streams: frames sent, snapshots sent whole, chunks of those,
	// sends that failed, snapshots received whole.
	snapFrames, snapSent, snapChunks, snapFailed, snapReceived atomic.Uint64
}

// NetStats is a snapshot of a NetTransport's counters.
type NetStats struct {
	Frames, BeatFrames, SendErrors, Dropped uint64
	Received, Refused, BeatsIn, MessagesIn  uint64
	MessagesOut                             uint64
	SnapFrames, SnapsSent, SnapChunks       uint64
	SnapsFailed, SnapsReceived              uint64
}

// NewNetTransport returns a transport for cfg.Node over carrier. Nothing is
// sent or delivered before Start.
func NewNetTransport(cfg NetConfig, carrier Carrier) (*NetTransport, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if carrier == nil {
		return nil, errors.New("replication: transport: carrier is required")
	}
	return &NetTransport{
		cfg:     cfg,
		carrier: carrier,
		log:     cfg.Logger.With("node", uint64(cfg.Node)),
		epoch:   time.Now(),
		peers:   make(map[NodeID]*peer),
		storage: make(map[NodeID]string),
		owner:   owner.New(nil),
		outs:    make(map[uint64]*outStream),
		outKeys: make(map[streamKey]bool),
		ins:     make(map[inKey]*inStream),
	}, nil
}

// SetPeer records the storage id node serves from: frames to it are addressed
// to that storage, and frames from it that name another are dropped.
func (t *NetTransport) SetPeer(node NodeID, storage string) {
	t.mu.Lock()
	t.storage[node] = storage
	t.mu.Unlock()
}

// Start makes r (the engine) the receiver of arriving frames and starts the
// beat loop.
func (t *NetTransport) Start(r Receiver) error {
	if r == nil {
		return errors.New("replication: transport: Start: nil receiver")
	}
	if !t.recv.CompareAndSwap(nil, &r) {
		return errors.New("replication: transport: already started")
	}
	if !t.owner.Go(t.beatLoop) {
		return errors.New("replication: transport: closed")
	}
	return nil
}

// Close stops the beat loop and every sender and waits for them. What is
// still queued is dropped (raft retransmits). Close does not close the carrier.
func (t *NetTransport) Close() error {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	if err := t.owner.Close(context.Background()); err != nil {
		return fmt.Errorf("replication: transport: close: %w", err)
	}
	return nil
}

// Stats returns the transport's counters.
func (t *NetTransport) Stats() NetStats {
	s := &t.stats
	return NetStats{
		Frames: s.frames.Load(), BeatFrames: s.beatFrames.Load(), SendErrors: s.sendErrors.Load(),
		Dropped: s.dropped.Load(), Received: s.received.Load(), Refused: s.refused.Load(),
		BeatsIn: s.beatsIn.Load(), MessagesIn: s.messagesIn.Load(), MessagesOut: s.messagesOut.Load(),
		SnapFrames: s.snapFrames.Load(), SnapsSent: s.snapSent.Load(), SnapChunks: s.snapChunks.Load(),
		SnapsFailed: s.snapFailed.Load(), SnapsReceived: s.snapReceived.Load(),
	}
}

// target is a message's group and destination replica: whom to tell when it
// cannot be delivered.
type target struct {
	g  GroupID
	to ReplicaID
}

// peer is one destination node's queue. Its sender goroutine swaps the
// buffers out under mu and sends without it.
type peer struct {
	node NodeID
	wake chan struct{} // cap 1

	mu        sync.Mutex
	buf       []byte // frameReserve bytes, then encoded messages
	count     int    // messages in buf
	targets   []target
	beats     []beat // MsgHeartbeat, coalesced
	beatResps []beat // MsgHeartbeatResp, coalesced
	removed   []beat // removal notices (Envelope.Removed), sent with the beats
	msgBytes  int    // bytes of the queued messages
	beatBytes int    // bytes of the queued beats (bounded with the messages)
	beatsDue  bool   // the beat loop asked for the beats to go
	unreach   []target
	// snaps: the MsgSnaps queued (their senders hear SnapshotFinish or
	// SnapshotFailure once the frame is sent or not); snapsLost: those a
	// full queue dropped (SnapshotFailure). Told by the sender goroutine.
	snaps, snapsLost []target
	spare            []byte // the sender's previous buffer, reused
	// snapq: snapshot stream frames (snapstream.go), each sent alone.
	snapq []snapOut
}

// frameReserve is the room kept at the front of a queue buffer for the frame
// header, so that a frame is built without copying the messages.
const frameReserve = maxHeaderSize

// Send queues batch for node to (Transport). It never blocks on the network
// and never calls the engine: a message that does not fit the queue is
// dropped and its group is told by the sender goroutine.
func (t *NetTransport) Send(to NodeID, batch []Envelope) {
	p := t.peer(to)
	if p == nil {
		t.stats.dropped.Add(uint64(len(batch)))
		return
	}
	// Encode outside the lock: workers sending to one node do not wait on
	// each other's marshalling.
	var enc []byte
	var targets, snaps []target
	var beats, resps, removed []beat
	for _, env := range batch {
		m := env.Msg
		if env.Removed {
			removed = append(removed, beatOf(env.Group, m))
			continue
		}
		if isBeat(m.GetType()) {
			if m.GetType() == raftpb.MsgHeartbeat {
				beats = append(beats, beatOf(env.Group, m))
			} else {
				resps = append(resps, beatOf(env.Group, m))
			}
			continue
		}
		if m.GetType() == raftpb.MsgSnap && t.cfg.Snapshots != nil {
			t.startSnapshot(p, env.Group, m) // its data are streamed
			continue
		}
		var err error
		if enc, err = appendMessage(enc, env.Group, m); err != nil {
			t.log.Error("replication: cannot encode a raft message; dropped", "group", uint64(env.Group), "type", m.GetType().String(), "err", err)
			continue
		}
		targets = append(targets, target{env.Group, ReplicaID(m.GetTo())})
		if m.GetType() == raftpb.MsgSnap {
			snaps = append(snaps, target{env.Group, ReplicaID(m.GetTo())})
		}
	}
	size := len(enc)
	for i := range beats {
		size += beats[i].size()
	}
	for i := range resps {
		size += resps[i].size()
	}
	for i := range removed {
		size += removed[i].size()
	}
	p.mu.Lock()
	if p.msgBytes+p.beatBytes+size > t.cfg.MaxQueueBytes {
		// Full: drop it all. raft retransmits; telling the groups makes
		// their leaders probe instead of streaming into a full queue.
		p.unreach = append(p.unreach, targets...)
		p.snapsLost = append(p.snapsLost, snaps...)
		p.mu.Unlock()
		t.stats.dropped.Add(uint64(len(batch)))
		wake(p.wake)
		return
	}
	if p.buf == nil {
		p.buf = make([]byte, frameReserve, frameReserve+max(size, 4<<10))
	}
	p.buf = append(p.buf, enc...)
	p.count += len(targets)
	p.targets = append(p.targets, targets...)
	p.snaps = append(p.snaps, snaps...)
	p.beats = append(p.beats, beats...)
	p.beatResps = append(p.beatResps, resps...)
	p.removed = append(p.removed, removed...)
	p.msgBytes += len(enc)
	p.beatBytes += size - len(enc)
	p.mu.Unlock()
	if len(targets) > 0 {
		wake(p.wake) // beats alone wait for the beat loop
	}
}

// peer returns to's queue, starting its sender on first use; nil once closed.
func (t *NetTransport) peer(to NodeID) *peer {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil // nothing would drain the queue
	}
	if p := t.peers[to]; p != nil {
		return p
	}
	p := &peer{node: to, wake: make(chan struct{}, 1)}
	if !t.owner.Go(func(ctx context.Context) { t.sendLoop(ctx, p) }) {
		return nil
	}
	t.peers[to] = p
	return p
}

// beatLoop asks every destination's sender to send its beats once per
// BeatInterval. It also passes on the unreachable reports of messages dropped
// on a full queue: that queue's sender may be stuck in the carrier for a
// while, and the groups should hear of it within a beat.
func (t *NetTransport) beatLoop(ctx context.Context) {
	tk := time.NewTicker(t.cfg.BeatInterval)
	defer tk.Stop()
	var peers []*peer
	var unreach, seen []target
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
		t.mu.Lock()
		peers = peers[:0]
		for _, p := range t.peers {
			peers = append(peers, p)
		}
		t.mu.Unlock()
		for _, p := range peers {
			p.mu.Lock()
			due := len(p.beats)+len(p.beatResps)+len(p.removed) > 0
			p.beatsDue = p.beatsDue || due
			unreach = append(unreach[:0], p.unreach...)
			p.unreach = p.unreach[:0]
			p.mu.Unlock()
			seen = t.report(unreach, seen[:0])
			if due {
				wake(p.wake)
			}
		}
	}
}

// sendLoop is p's sender: it drains everything queued into one frame and
// hands it to the carrier, until ctx ends.
func (t *NetTransport) sendLoop(ctx context.Context, p *peer) {
	var (
		targets           []target
		beats, beatResps  []beat
		removed           []beat
		unreach, reported []target
		snaps, snapsLost  []target
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		p.mu.Lock()
		buf, count := p.buf, p.count
		targets = append(targets[:0], p.targets...)
		p.buf, p.count, p.targets = p.spare, 0, p.targets[:0]
		if p.buf != nil {
			p.buf = p.buf[:frameReserve]
		}
		p.spare = nil
		beats, beatResps, removed = beats[:0], beatResps[:0], removed[:0]
		if p.beatsDue {
			beats = append(beats, p.beats...)
			beatResps = append(beatResps, p.beatResps...)
			removed = append(removed, p.removed...)
			clear(p.beats)
			clear(p.beatResps)
			clear(p.removed)
			p.beats, p.beatResps, p.removed, p.beatsDue = p.beats[:0], p.beatResps[:0], p.removed[:0], false
			p.beatBytes = 0
		}
		p.msgBytes = 0
		unreach = append(unreach[:0], p.unreach...)
		p.unreach = p.unreach[:0]
		snaps, snapsLost = append(snaps[:0], p.snaps...), append(snapsLost[:0], p.snapsLost...)
		p.snaps, p.snapsLost = p.snaps[:0], p.snapsLost[:0]
		p.mu.Unlock()

		reported = t.report(unreach, reported[:0])
		t.reportSnaps(snapsLost, raft.SnapshotFailure)
		snapStatus := raft.SnapshotFinish
		if count > 0 || len(beats)+len(beatResps)+len(removed) > 0 {
			frame := t.buildFrame(p.node, buf, count, beats, beatResps, removed)
			if err := t.carrier.Send(ctx, p.node, frame); err != nil {
				t.stats.sendErrors.Add(1)
				if ctx.Err() == nil {
					t.log.Debug("replication: a frame was not sent", "to", uint64(p.node), "messages", count, "err", err)
				}
				reported = t.report(targets, reported[:0])
				snapStatus = raft.SnapshotFailure
			} else {
				t.stats.frames.Add(1)
				t.stats.messagesOut.Add(uint64(count))
				if len(beats)+len(beatResps) > 0 {
					t.stats.beatFrames.Add(1)
				}
			}
		}
		t.reportSnaps(snaps, snapStatus)
		if buf != nil && cap(buf) <= 8<<20 {
			p.mu.Lock()
			p.spare = buf[:frameReserve]
			p.mu.Unlock()
		}
		// One snapshot frame per round: raft frames and beats go between
		// two chunks.
		if t.sendSnapFrame(ctx, p) {
			wake(p.wake)
		}
	}
}

// report tells each group (once per distinct target) that the peer is
// unreachable. seen is scratch space.
func (t *NetTransport) report(ts []target, seen []target) []target {
	r := t.recv.Load()
	if r == nil || len(ts) == 0 {
		return seen
	}
next:
	for _, x := range ts {
		for _, s := range seen {
			if s == x {
				continue next
			}
		}
		seen = append(seen, x)
		(*r).ReportUnreachable(x.g, x.to)
	}
	return seen
}

// reportSnaps tells the engine how the sending of the MsgSnaps to ts ended
// (a receiver without ReportSnapshot is not told).
func (t *NetTransport) reportSnaps(ts []target, status raft.SnapshotStatus) {
	r := t.recv.Load()
	if r == nil || len(ts) == 0 {
		return
	}
	sr, ok := (*r).(interface {
		ReportSnapshot(GroupID, ReplicaID, raft.SnapshotStatus)
	})
	if !ok {
		return
	}
	for _, x := range ts {
		sr.ReportSnapshot(x.g, x.to, status)
	}
}

// buildFrame writes the header into buf's reserved front and appends the
// beats and the removal notices; buf (nil when no message is queued) holds
// count encoded messages after frameReserve bytes.
func (t *NetTransport) buildFrame(to NodeID, buf []byte, count int, beats, beatResps, removed []beat) []byte {
	if buf == nil {
		buf = make([]byte, frameReserve, frameReserve+64*(len(beats)+len(beatResps)+len(removed))+16)
	}
	t.mu.Lock()
	toStorage := t.storage[to]
	t.mu.Unlock()
	var hdrBuf [maxHeaderSize]byte
	hdr := appendHeader(hdrBuf[:0], frameHeader{
		From: t.cfg.Node, FromStorage: t.cfg.Storage, ToStorage: toStorage,
		Sent: uint64(time.Since(t.epoch)), Count: count,
	})
	start := frameReserve - len(hdr)
	copy(buf[start:], hdr)
	f := appendBeats(buf, beats)
	f = appendBeats(f, beatResps)
	if len(removed) > 0 {
		f = appendBeats(f, removed) // optional: a frame without notices ends at its beat responses
	}
	return f[start:]
}

// HandleFrame decodes a frame that arrived and hands its messages and rebuilt
// heartbeats to the receiver. Frames addressed to another storage, from a
// node whose known storage differs, or malformed, are dropped. It is the
// carrier's FrameHandler; safe from any goroutine; it does not retain b.
func (t *NetTransport) HandleFrame(b []byte) {
	r := t.recv.Load()
	if r == nil {
		t.stats.refused.Add(1)
		return
	}
	if k, n := binary.Uvarint(b); n > 0 && k == snapFrameKind {
		t.handleSnapFrame(b)
		return
	}
	f, err := decodeFrame(b)
	if err != nil {
		t.stats.refused.Add(1)
		t.log.Warn("replication: a malformed frame was dropped", "err", err)
		return
	}
	if f.ToStorage != t.cfg.Storage {
		t.stats.refused.Add(1)
		t.log.Debug("replication: a frame for another storage was dropped", "from", uint64(f.From), "to_storage", f.ToStorage)
		return
	}
	t.mu.Lock()
	known, ok := t.storage[f.From]
	t.mu.Unlock()
	if ok && known != f.FromStorage {
		t.stats.refused.Add(1)
		t.log.Debug("replication: a frame from another storage of a node was dropped", "from", uint64(f.From), "from_storage", f.FromStorage)
		return
	}
	batch := f.Msgs
	for i := range f.Beats {
		batch = append(batch, heartbeatOf(&f.Beats[i], f.Sent))
	}
	for i := range f.BeatResps {
		env, sent, ok := heartbeatRespOf(&f.BeatResps[i])
		if !ok {
			continue
		}
		if t.cfg.OnBeatAck != nil {
			t.cfg.OnBeatAck(env.Group, ReplicaID(env.Msg.GetFrom()), monoSince(t.epoch, sent))
		}
		batch = append(batch, env)
	}
	for i := range f.Removed {
		bt := &f.Removed[i]
		batch = append(batch, Envelope{Group: bt.Group, Removed: true, Msg: &raftpb.Message{
			From: new(uint64(bt.From)), To: new(uint64(bt.To)), Term: new(bt.Term),
		}})
	}
	t.stats.received.Add(1)
	t.stats.messagesIn.Add(uint64(len(f.Msgs)))
	t.stats.beatsIn.Add(uint64(len(f.Beats) + len(f.BeatResps)))
	if len(batch) > 0 {
		(*r).Receive(batch)
	}
}

// wake signals a capacity-1 channel without blocking.
func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
