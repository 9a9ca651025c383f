package cluster

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	protocluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/remote"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/replication"
)

// The design (section 4, risk 2) proposed carrying raft frames over the
// existing protoactor remote, one-way, to a holdfast-raft actor. This file
// keeps that carrier as a benchmark-only prototype, measured against the
// replication package's TCPCarrier (the one the engine uses; tcpcarrier.go
// says why) with the same NetTransport on both ends.

const raftActorName = "holdfast-raft"

// actorCarrier is the protoactor prototype: Send is a one-way Root.Send of a
// GrainRequest holding the frame to the peer's holdfast-raft actor.
type actorCarrier struct {
	system *actor.ActorSystem
	mu     sync.Mutex
	addrs  map[replication.NodeID]string
}

var _ replication.Carrier = (*actorCarrier)(nil)

func newActorCarrier(system *actor.ActorSystem, handle replication.FrameHandler) (*actorCarrier, error) {
	props := actor.PropsFromFunc(func(ctx actor.Context) {
		if req, ok := ctx.Message().(*protocluster.GrainRequest); ok {
			handle(req.MessageData)
		}
	})
	if _, err := system.Root.SpawnNamed(props, raftActorName); err != nil {
		return nil, err
	}
	return &actorCarrier{system: system, addrs: map[replication.NodeID]string{}}, nil
}

func (c *actorCarrier) SetAddr(n replication.NodeID, addr string) {
	c.mu.Lock()
	c.addrs[n] = addr
	c.mu.Unlock()
}

// Send never blocks and never fails: the remote serialises the message later,
// on its endpoint writer, so the frame must be copied (the transport reuses
// its buffer).
func (c *actorCarrier) Send(_ context.Context, to replication.NodeID, frame []byte) error {
	c.mu.Lock()
	addr, ok := c.addrs[to]
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("no address for node %d", to)
	}
	c.system.Root.Send(actor.NewPID(addr, raftActorName), &protocluster.GrainRequest{MessageData: append([]byte(nil), frame...)})
	return nil
}

// countingReceiver counts the messages delivered to it.
type countingReceiver struct {
	msgs atomic.Int64
	ch   chan struct{}
}

func (r *countingReceiver) Receive(batch []replication.Envelope) {
	r.msgs.Add(int64(len(batch)))
	select {
	case r.ch <- struct{}{}:
	default:
	}
}
func (r *countingReceiver) ReportUnreachable(replication.GroupID, replication.ReplicaID) {}

// carrierPair is node 1 sending to node 2 over some carrier.
type carrierPair struct {
	send, recv *replication.NetTransport
	got        *countingReceiver
	close      func()
}

func newTransports(b *testing.B, c1, c2 replication.Carrier) (*replication.NetTransport, *replication.NetTransport) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	t1, err := replication.NewNetTransport(replication.NetConfig{Node: 1, Storage: "s1", Logger: log}, c1)
	if err != nil {
		b.Fatal(err)
	}
	t2, err := replication.NewNetTransport(replication.NetConfig{Node: 2, Storage: "s2", Logger: log}, c2)
	if err != nil {
		b.Fatal(err)
	}
	t1.SetPeer(2, "s2")
	t2.SetPeer(1, "s1")
	return t1, t2
}

func tcpPair(b *testing.B) *carrierPair {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c1, err := replication.ListenTCP(replication.TCPConfig{Bind: "127.0.0.1:0", Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	c2, err := replication.ListenTCP(replication.TCPConfig{Bind: "127.0.0.1:0", Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	t1, t2 := newTransports(b, c1, c2)
	c1.SetHandler(t1.HandleFrame)
	c2.SetHandler(t2.HandleFrame)
	c1.SetAddr(2, c2.Addr())
	p := &carrierPair{send: t1, recv: t2, got: &countingReceiver{ch: make(chan struct{}, 1)}}
	p.close = func() { _ = t1.Close(); _ = t2.Close(); _ = c1.Close(); _ = c2.Close() }
	return p
}

func actorPair(b *testing.B) *carrierPair {
	plog := slog.New(slog.NewTextHandler(io.Discard, nil))
	start := func() (*actor.ActorSystem, *remote.Remote) {
		sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return plog }))
		r := remote.NewRemote(sys, remote.Configure("127.0.0.1", 0))
		r.Start()
		return sys, r
	}
	s1, r1 := start()
	s2, r2 := start()
	var t1, t2 *replication.NetTransport
	var h1, h2 atomic.Pointer[replication.NetTransport]
	c1, err := newActorCarrier(s1, func(f []byte) {
		if t := h1.Load(); t != nil {
			t.HandleFrame(f)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	c2, err := newActorCarrier(s2, func(f []byte) {
		if t := h2.Load(); t != nil {
			t.HandleFrame(f)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	t1, t2 = newTransports(b, c1, c2)
	h1.Store(t1)
	h2.Store(t2)
	c1.SetAddr(2, s2.Address())
	p := &carrierPair{send: t1, recv: t2, got: &countingReceiver{ch: make(chan struct{}, 1)}}
	p.close = func() {
		_ = t1.Close()
		_ = t2.Close()
		r1.Shutdown(true)
		r2.Shutdown(true)
		s1.Shutdown()
		s2.Shutdown()
	}
	return p
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRaftCarrier: one-way batches of 64 KiB (16 MsgApps of one 4 KiB
// entry each, 16 groups) from one NetTransport to another, at most 8 batches
// in flight; per batch: wall time, and the process's CPU time (both ends).
//
//	go test ./cluster/ -run '^$' -bench RaftCarrier -benchtime 3000x
func BenchmarkRaftCarrier(b *testing.B) {
	for _, c := range []struct {
		name string
		make func(*testing.B) *carrierPair
	}{{"tcp", tcpPair}, {"protoactor", actorPair}} {
		b.Run(c.name, func(b *testing.B) {
			p := c.make(b)
			defer p.close()
			if err := p.send.Start(p.got); err != nil {
				b.Fatal(err)
			}
			if err := p.recv.Start(p.got); err != nil {
				b.Fatal(err)
			}
			const perBatch, window = 16, 8
			batch := func(i int) []replication.Envelope {
				out := make([]replication.Envelope, perBatch)
				for j := range out {
					out[j] = replication.Envelope{Group: replication.GroupID(j + 1), Msg: &raftpb.Message{
						Type: raftpb.MsgApp.Enum(), From: new(uint64(1)), To: new(uint64(2)), Term: new(uint64(1)), Index: new(uint64(i)),
						Entries: []*raftpb.Entry{{Term: new(uint64(1)), Index: new(uint64(i + 1)), Data: make([]byte, 4<<10)}}}}
				}
				return out
			}
			waitFor := func(n int64) {
				deadline := time.Now().Add(30 * time.Second)
				for p.got.msgs.Load() < n {
					select {
					case <-p.got.ch:
					case <-time.After(time.Millisecond):
					}
					if time.Now().After(deadline) {
						b.Fatalf("only %d of %d messages arrived", p.got.msgs.Load(), n)
					}
				}
			}
			// Warm up: connect.
			p.send.Send(2, batch(0))
			waitFor(perBatch)
			p.got.msgs.Store(0)
			b.SetBytes(perBatch * (4 << 10))
			b.ResetTimer()
			cpu0 := cpuTime()
			for i := range b.N {
				if i >= window {
					waitFor(int64(i-window+1) * perBatch)
				}
				p.send.Send(2, batch(i+1))
			}
			waitFor(int64(b.N) * perBatch)
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N)/1e3, "cpu-µs/batch")
			if st := p.send.Stats(); st.Dropped > 0 {
				b.Fatalf("%d messages dropped", st.Dropped)
			}
		})
	}
}
