package replicationtest

import (
	"container/heap"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/holdfast/holdfast/internal/owner"
	"github.com/holdfast/holdfast/replication"
)

// Faults are the network's message faults, applied per message with the
// network's seeded random source. The zero value is a perfect network (every
// message delivered once, in order per link, at once).
type Faults struct {
	Drop      float64       // probability a message is lost
	Duplicate float64       // probability a message is delivered twice
	MaxDelay  time.Duration // each delivery waits uniformly in [0, MaxDelay]: reorders
}

// Receiver is what the network delivers to: an engine.
type Receiver interface {
	Receive(batch []replication.Envelope)
}

// BeatAcker is a Receiver that takes heartbeat acknowledgements for the
// leader lease: an engine (Engine.OnBeatAck).
type BeatAcker interface {
	OnBeatAck(g replication.GroupID, from replication.ReplicaID, sent time.Time)
}

// SnapshotReporter is told how the sending of a MsgSnap ended (an engine):
// SnapshotFinish once delivered, SnapshotFailure once dropped.
type SnapshotReporter interface {
	ReportSnapshot(g replication.GroupID, to replication.ReplicaID, status raft.SnapshotStatus)
}

// Network is a simulated network between engines in one process: it copies
// every message (marshal and unmarshal, as a wire would), and drops,
// duplicates, delays and reorders them as its Faults say, with a seeded
// source. Links can be cut (partitions) and nodes taken down (a crashed node
// neither sends nor receives). A link cut or a node down also drops messages
// already in flight on it.
//
// One delivery goroutine, owned by the network (Start/Close), hands messages
// to receivers; Send never calls a receiver.
//
// Heartbeat send times, for the leader lease, as NetTransport does them
// (replication/heartbeat.go): a MsgHeartbeat is stamped when it is sent, on
// the sending node's clock (SetClock; default time.Now), in its Context
// (tag | uvarint ns since the network's epoch | the original context). Raft
// echoes a heartbeat's Context in its MsgHeartbeatResp, so when a response
// is delivered the network strips the stamp, tells the receiver (a
// BeatAcker) which send time it acknowledges, and delivers the response with
// the original context (ReadIndex rounds key on it). The stamp is never later
// than the follower's receipt, so the lease is never overstated.
type Network struct {
	mu      sync.Mutex
	rng     *rand.Rand
	faults  Faults
	cut     map[[2]replication.NodeID]bool // directed links that drop everything
	down    map[replication.NodeID]bool
	nodes   map[replication.NodeID]Receiver
	flight  flightHeap
	seq     uint64
	wakeCh  chan struct{}
	owner   *owner.Group
	sent    uint64
	dropped uint64
	epoch   time.Time
	clocks  map[replication.NodeID]func() time.Time
	// observe, if set, sees every message sent (before faults), under mu.
	observe func(from replication.NodeID, env replication.Envelope)
	// snaps: the nodes whose snapshots' data travel beside their MsgSnaps
	// (SetSnapshots).
	snaps map[replication.NodeID]snapEnds
}

type snapEnds struct {
	source replication.SnapshotSource
	sink   replication.SnapshotSink
}

// SetSnapshots makes the network carry the data of node id's snapshots as
// NetTransport streams them: a MsgSnap from id is delivered only after its
// data (source's) went through the receiver's sink, with the Data the sink's
// Commit returned; a failure loses the message (SnapshotFailure). Both ends
// must have called it; nil sources a node's MsgSnaps inline again.
func (n *Network) SetSnapshots(id replication.NodeID, source replication.SnapshotSource, sink replication.SnapshotSink) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.snaps == nil {
		n.snaps = map[replication.NodeID]snapEnds{}
	}
	if source == nil {
		delete(n.snaps, id)
		return
	}
	n.snaps[id] = snapEnds{source, sink}
}

// relaySnaps carries the data of f's MsgSnaps (SetSnapshots), on the
// delivery goroutine; a snapshot that fails moves to f.lostSnaps.
func (n *Network) relaySnaps(f *flight) {
	n.mu.Lock()
	from, to := n.snaps[f.from], n.snaps[f.to]
	n.mu.Unlock()
	if from.source == nil || to.sink == nil {
		return
	}
	kept := f.batch[:0]
	for _, env := range f.batch {
		if env.Msg.GetType() == raftpb.MsgSnap {
			data, err := relaySnap(from.source, to.sink, env)
			if err != nil {
				f.lostSnaps = append(f.lostSnaps, env)
				continue
			}
			env.Msg.Snapshot.Data = data
		}
		kept = append(kept, env)
	}
	f.batch = kept
}

func relaySnap(src replication.SnapshotSource, sink replication.SnapshotSink, env replication.Envelope) ([]byte, error) {
	r, err := src.OpenSnapshot(env.Group, env.Msg.GetSnapshot())
	if err != nil {
		return nil, err
	}
	defer r.Close()
	w, err := sink.ReceiveSnapshot(env.Group, replication.ReplicaID(env.Msg.GetTo()))
	if err != nil {
		return nil, err
	}
	for {
		chunk, err := r.Next()
		if errors.Is(err, io.EOF) {
			return w.Commit()
		}
		if err == nil {
			err = w.Write(chunk)
		}
		if err != nil {
			w.Abort()
			return nil, err
		}
	}
}

// NewNetwork returns a perfect network seeded with seed.
func NewNetwork(seed uint64) *Network {
	return &Network{
		rng:    rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		cut:    make(map[[2]replication.NodeID]bool),
		down:   make(map[replication.NodeID]bool),
		nodes:  make(map[replication.NodeID]Receiver),
		wakeCh: make(chan struct{}, 1),
		owner:  owner.New(nil),
		epoch:  time.Now(),
		clocks: make(map[replication.NodeID]func() time.Time),
	}
}

// SetClock makes now node id's clock for stamping its heartbeats (the same
// clock its engine's lease uses; see Cluster.SkewClock).
func (n *Network) SetClock(id replication.NodeID, now func() time.Time) {
	n.mu.Lock()
	n.clocks[id] = now
	n.mu.Unlock()
}

// Cut cuts the directed link from -> to (messages already in flight on it
// are dropped). Partition and Heal clear it.
func (n *Network) Cut(from, to replication.NodeID) {
	n.mu.Lock()
	n.cut[[2]replication.NodeID{from, to}] = true
	n.mu.Unlock()
}

// Start starts the delivery goroutine.
func (n *Network) Start() { n.owner.Go(n.deliverLoop) }

// Close stops the delivery goroutine (messages in flight are dropped).
func (n *Network) Close() { _ = n.owner.Close(context.Background()) }

// Attach makes r the receiver of node id (replacing an earlier one: a restart).
func (n *Network) Attach(id replication.NodeID, r Receiver) {
	n.mu.Lock()
	n.nodes[id] = r
	n.mu.Unlock()
}

// SetFaults replaces the message faults.
func (n *Network) SetFaults(f Faults) {
	n.mu.Lock()
	n.faults = f
	n.mu.Unlock()
}

// SetDown takes node id down (nothing in or out, in-flight dropped) or up.
func (n *Network) SetDown(id replication.NodeID, down bool) {
	n.mu.Lock()
	n.down[id] = down
	n.mu.Unlock()
}

// Partition cuts every link between nodes of different sides; nodes in no
// side keep their links. It replaces any earlier partition.
func (n *Network) Partition(sides ...[]replication.NodeID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.cut)
	for i, a := range sides {
		for j, b := range sides {
			if i == j {
				continue
			}
			for _, x := range a {
				for _, y := range b {
					n.cut[[2]replication.NodeID{x, y}] = true
				}
			}
		}
	}
}

// Heal restores every link.
func (n *Network) Heal() {
	n.mu.Lock()
	clear(n.cut)
	n.mu.Unlock()
}

// Stats returns the messages sent and dropped so far.
func (n *Network) Stats() (sent, dropped uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sent, n.dropped
}

// Endpoint returns node id's transport.
func (n *Network) Endpoint(id replication.NodeID) replication.Transport {
	return endpoint{n: n, from: id}
}

type endpoint struct {
	n    *Network
	from replication.NodeID
}

func (e endpoint) Send(to replication.NodeID, batch []replication.Envelope) {
	e.n.send(e.from, to, batch)
}

// blockedLocked: may nothing pass from -> to now?
func (n *Network) blockedLocked(from, to replication.NodeID) bool {
	return n.down[from] || n.down[to] || n.cut[[2]replication.NodeID{from, to}]
}

func (n *Network) send(from, to replication.NodeID, batch []replication.Envelope) {
	n.mu.Lock()
	clock := n.clocks[from]
	n.mu.Unlock()
	if clock == nil {
		clock = time.Now
	}
	// Copy as a wire would, outside the lock: the receiver never shares the
	// sender's messages.
	copies := make([]replication.Envelope, len(batch))
	for i, env := range batch {
		b, err := proto.Marshal(env.Msg)
		if err != nil {
			panic(err)
		}
		m := new(raftpb.Message)
		if err := proto.Unmarshal(b, m); err != nil {
			panic(err)
		}
		if m.GetType() == raftpb.MsgHeartbeat {
			m.Context = stampBeat(m.GetContext(), clock().Sub(n.epoch))
		}
		copies[i] = replication.Envelope{Group: env.Group, Msg: m, Removed: env.Removed}
	}
	n.mu.Lock()
	n.sent += uint64(len(batch))
	if n.observe != nil {
		for _, env := range copies {
			n.observe(from, env)
		}
	}
	if n.blockedLocked(from, to) {
		n.dropped += uint64(len(batch))
		n.reportLostLocked(from, to, copies)
		n.mu.Unlock()
		return
	}
	now := time.Now()
	f := n.faults
	if f == (Faults{}) { // perfect: one delivery, in order
		n.pushLocked(flight{due: now, from: from, to: to, batch: copies})
	} else {
		for _, env := range copies {
			if f.Drop > 0 && n.rng.Float64() < f.Drop {
				n.dropped++
				n.reportLostLocked(from, to, []replication.Envelope{env})
				continue
			}
			copiesOf := 1
			if f.Duplicate > 0 && n.rng.Float64() < f.Duplicate {
				copiesOf = 2
			}
			for range copiesOf {
				var d time.Duration
				if f.MaxDelay > 0 {
					d = time.Duration(n.rng.Int64N(int64(f.MaxDelay) + 1))
				}
				n.pushLocked(flight{due: now.Add(d), from: from, to: to, batch: []replication.Envelope{env}})
			}
		}
	}
	n.mu.Unlock()
	wake(n.wakeCh)
}

// reportLostLocked queues a SnapshotFailure for the sender of every MsgSnap
// in envs (delivered by the delivery goroutine: Send never calls back).
func (n *Network) reportLostLocked(from, to replication.NodeID, envs []replication.Envelope) {
	var lost []replication.Envelope
	for _, env := range envs {
		if env.Msg.GetType() == raftpb.MsgSnap {
			lost = append(lost, env)
		}
	}
	if len(lost) > 0 {
		n.pushLocked(flight{due: time.Now(), from: from, to: to, lostSnaps: lost})
	}
}

// reportSnaps tells the sender how its MsgSnaps in envs ended.
func reportSnaps(sender Receiver, envs []replication.Envelope, status raft.SnapshotStatus) {
	r, ok := sender.(SnapshotReporter)
	if !ok {
		return
	}
	for _, env := range envs {
		if env.Msg.GetType() == raftpb.MsgSnap {
			r.ReportSnapshot(env.Group, replication.ReplicaID(env.Msg.GetTo()), status)
		}
	}
}

func (n *Network) pushLocked(f flight) {
	n.seq++
	f.seq = n.seq
	heap.Push(&n.flight, f)
}

func (n *Network) deliverLoop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var ready []flight
	for {
		n.mu.Lock()
		now := time.Now()
		ready = ready[:0]
		for len(n.flight) > 0 && !n.flight[0].due.After(now) {
			f := heap.Pop(&n.flight).(flight)
			f.sender = n.nodes[f.from]
			if n.down[f.from] {
				f.sender = nil // a crashed sender hears nothing
			}
			if len(f.lostSnaps) > 0 {
				ready = append(ready, f)
				continue
			}
			if n.blockedLocked(f.from, f.to) || n.nodes[f.to] == nil {
				n.dropped += uint64(len(f.batch))
				f.lostSnaps, f.batch = f.batch, nil
				ready = append(ready, f)
				continue
			}
			f.recv = n.nodes[f.to]
			ready = append(ready, f)
		}
		wait := time.Hour
		if len(n.flight) > 0 {
			wait = n.flight[0].due.Sub(now)
		}
		n.mu.Unlock()
		for _, f := range ready {
			if f.recv != nil {
				n.relaySnaps(&f)
				f.recv.Receive(n.unstampAcks(f.recv, f.batch))
			}
			if f.sender != nil {
				// The receiver has the snapshot (stepping it is its
				// business), or it was lost.
				reportSnaps(f.sender, f.batch, raft.SnapshotFinish)
				reportSnaps(f.sender, f.lostSnaps, raft.SnapshotFailure)
			}
		}
		if len(ready) > 0 {
			continue
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-n.wakeCh:
		case <-timer.C:
		}
	}
}

// beatTag starts a heartbeat context the network stamped.
const beatTag = 0xb7

// stampBeat returns a heartbeat's context carrying its send time.
func stampBeat(ctx []byte, sent time.Duration) []byte {
	out := make([]byte, 0, 1+binary.MaxVarintLen64+len(ctx))
	out = append(out, beatTag)
	out = binary.AppendUvarint(out, uint64(sent))
	return append(out, ctx...)
}

// unstampAcks reports the send time each stamped MsgHeartbeatResp in batch
// acknowledges to r (if it takes acks) and replaces the response by one with
// the original context (a new message: a duplicated delivery shares the
// stamped one). Responses without a stamp are dropped: every heartbeat a
// follower answers came through this network, which stamped it.
func (n *Network) unstampAcks(r Receiver, batch []replication.Envelope) []replication.Envelope {
	var out []replication.Envelope // nil until a response is replaced
	for i, env := range batch {
		m := env.Msg
		if m.GetType() != raftpb.MsgHeartbeatResp {
			if out != nil {
				out = append(out, env)
			}
			continue
		}
		if out == nil {
			out = append(make([]replication.Envelope, 0, len(batch)), batch[:i]...)
		}
		ctx := m.GetContext()
		if len(ctx) == 0 || ctx[0] != beatTag {
			continue
		}
		sent, k := binary.Uvarint(ctx[1:])
		if k <= 0 {
			continue
		}
		var orig []byte
		if rest := ctx[1+k:]; len(rest) > 0 {
			orig = rest
		}
		if a, ok := r.(BeatAcker); ok {
			a.OnBeatAck(env.Group, replication.ReplicaID(m.GetFrom()), n.epoch.Add(time.Duration(sent)))
		}
		out = append(out, replication.Envelope{Group: env.Group, Msg: &raftpb.Message{
			Type:    raftpb.MsgHeartbeatResp.Enum(),
			From:    new(m.GetFrom()),
			To:      new(m.GetTo()),
			Term:    new(m.GetTerm()),
			Context: orig,
		}})
	}
	if out == nil {
		return batch
	}
	return out
}

type flight struct {
	due      time.Time
	seq      uint64 // FIFO among equal due times
	from, to replication.NodeID
	batch    []replication.Envelope
	recv     Receiver
	sender   Receiver
	// lostSnaps: MsgSnaps dropped on the way, to report to the sender.
	lostSnaps []replication.Envelope
}

type flightHeap []flight

func (h flightHeap) Len() int { return len(h) }
func (h flightHeap) Less(i, j int) bool {
	if !h[i].due.Equal(h[j].due) {
		return h[i].due.Before(h[j].due)
	}
	return h[i].seq < h[j].seq
}
func (h flightHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *flightHeap) Push(x any)   { *h = append(*h, x.(flight)) }
func (h *flightHeap) Pop() any {
	old := *h
	f := old[len(old)-1]
	old[len(old)-1] = flight{}
	*h = old[:len(old)-1]
	return f
}
