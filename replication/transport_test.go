package replication

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func sampleMessages() []Envelope {
	return []Envelope{
		{Group: 7, Msg: &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: new(uint64(1)), To: new(uint64(2)), Term: new(uint64(3)), Index: new(uint64(10)), LogTerm: new(uint64(3)), Commit: new(uint64(9)),
			Entries: []*raftpb.Entry{{Term: new(uint64(3)), Index: new(uint64(11)), Data: []byte("hello")}}}},
		{Group: 1 << 40, Msg: &raftpb.Message{Type: raftpb.MsgVote.Enum(), From: new(uint64(3)), To: new(uint64(2)), Term: new(uint64(4))}},
	}
}

func sampleBeats() ([]beat, []beat) {
	return []beat{{Group: 300, From: 4, To: 9, Term: 1 << 33, Commit: 0, Ctx: []byte("read-1")}, {Group: 1, From: 1, To: 2, Term: 5, Commit: 17}},
		[]beat{{Group: 2, From: 2, To: 1, Term: 5, Ctx: []byte{beatCtxTag, 1, 'x'}}, {Group: 1, From: 2, To: 1, Term: 1}}
}

// encodeTestFrame builds a frame the way the sender does.
func encodeTestFrame(t testing.TB, h frameHeader, msgs []Envelope, beats, resps []beat, removed ...beat) []byte {
	t.Helper()
	var body []byte
	for _, env := range msgs {
		var err error
		if body, err = appendMessage(body, env.Group, env.Msg); err != nil {
			t.Fatal(err)
		}
	}
	h.Count = len(msgs)
	b := appendHeader(nil, h)
	b = append(b, body...)
	b = appendBeats(b, beats)
	b = appendBeats(b, resps)
	if len(removed) > 0 {
		b = appendBeats(b, removed)
	}
	return b
}

func framesEqual(a, b frame) bool {
	if a.frameHeader != b.frameHeader || len(a.Msgs) != len(b.Msgs) || len(a.Beats) != len(b.Beats) || len(a.BeatResps) != len(b.BeatResps) ||
		len(a.Removed) != len(b.Removed) {
		return false
	}
	for i := range a.Msgs {
		if a.Msgs[i].Group != b.Msgs[i].Group || !proto.Equal(a.Msgs[i].Msg, b.Msgs[i].Msg) {
			return false
		}
	}
	eq := func(x, y []beat) bool {
		for i := range x {
			if x[i].Group != y[i].Group || x[i].From != y[i].From || x[i].To != y[i].To || x[i].Term != y[i].Term ||
				x[i].Commit != y[i].Commit || !bytes.Equal(x[i].Ctx, y[i].Ctx) {
				return false
			}
		}
		return true
	}
	return eq(a.Beats, b.Beats) && eq(a.BeatResps, b.BeatResps) && eq(a.Removed, b.Removed)
}

// TestFrame_RoundTrip: a frame decodes to what was encoded, and every
// truncation of it is an error, never a panic or a shorter frame.
func TestFrame_RoundTrip(t *testing.T) {
	h := frameHeader{From: 3, FromStorage: "aaaa", ToStorage: "bbbbbb", Sent: 123456789}
	msgs := sampleMessages()
	beats, resps := sampleBeats()
	b := encodeTestFrame(t, h, msgs, beats, resps)
	f, err := decodeFrame(b)
	if err != nil {
		t.Fatal(err)
	}
	want := frame{frameHeader: h, Msgs: msgs, Beats: beats, BeatResps: resps}
	want.Count = len(msgs)
	if !framesEqual(f, want) {
		t.Fatalf("decoded %+v, want %+v", f, want)
	}
	// The decoded frame shares nothing with the bytes (the carrier reuses them).
	for i := range b {
		b[i] = 0xff
	}
	if !framesEqual(f, want) {
		t.Fatal("the decoded frame changed when its bytes were overwritten")
	}
	// Beats only, the last one as small as a beat gets.
	small := []beat{{Group: 1, From: 2, To: 1, Term: 1}}
	f, err = decodeFrame(encodeTestFrame(t, h, nil, small, small))
	if err != nil {
		t.Fatalf("a frame of minimal beats: %v", err)
	}
	if want := (frame{frameHeader: h, Beats: small, BeatResps: small}); !framesEqual(f, want) {
		t.Fatalf("decoded %+v, want %+v", f, want)
	}
	b = encodeTestFrame(t, h, msgs, beats, resps)
	for n := range len(b) {
		if _, err := decodeFrame(b[:n]); !errors.Is(err, errFrame) {
			t.Fatalf("a frame cut to %d of %d bytes: err %v, want errFrame", n, len(b), err)
		}
	}
	if _, err := decodeFrame(append(b, 0)); err != nil {
		t.Fatalf("a frame with an empty list of removal notices: %v", err)
	}
	if _, err := decodeFrame(append(b, 0, 0)); !errors.Is(err, errFrame) {
		t.Fatalf("trailing byte: err %v, want errFrame", err)
	}
	// Removal notices follow the beat responses, only when there are any:
	// the frame without them is unchanged (a node that does not know them
	// reads it), so a cut at that boundary is the frame without them.
	removed := []beat{{Group: 300, From: 4, To: 9, Term: 1 << 33}, {Group: 1, From: 1, To: 2, Term: 5}}
	b = encodeTestFrame(t, h, msgs, beats, resps, removed...)
	f, err = decodeFrame(b)
	if err != nil {
		t.Fatal(err)
	}
	want.Removed = removed
	if !framesEqual(f, want) {
		t.Fatalf("decoded %+v, want %+v", f, want)
	}
	boundary := len(encodeTestFrame(t, h, msgs, beats, resps))
	for n := range len(b) {
		_, err := decodeFrame(b[:n])
		if n == boundary {
			if err != nil {
				t.Fatalf("the frame without its notices: %v", err)
			}
			continue
		}
		if !errors.Is(err, errFrame) {
			t.Fatalf("a frame with notices cut to %d of %d bytes: err %v, want errFrame", n, len(b), err)
		}
	}
	if _, err := decodeFrame(append(b, 0)); !errors.Is(err, errFrame) {
		t.Fatalf("a byte after the notices: err %v, want errFrame", err)
	}
	bad := append([]byte{2}, b[1:]...)
	if _, err := decodeFrame(bad); !errors.Is(err, errFrame) {
		t.Fatalf("version 2: err %v, want errFrame", err)
	}
}

// FuzzDecodeFrame: the decoder never panics, and what it accepts re-encodes
// to a frame that decodes the same.
func FuzzDecodeFrame(f *testing.F) {
	beats, resps := sampleBeats()
	f.Add(encodeTestFrame(f, frameHeader{From: 1, FromStorage: "s1", ToStorage: "s2", Sent: 5}, sampleMessages(), beats, resps))
	f.Add(encodeTestFrame(f, frameHeader{From: 2, FromStorage: "s", ToStorage: "t"}, nil, nil, nil))
	f.Add(encodeTestFrame(f, frameHeader{From: 2, FromStorage: "s", ToStorage: "t"}, nil, nil, nil, beat{Group: 3, From: 1, To: 2, Term: 7}))
	f.Add([]byte{1, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := decodeFrame(b)
		if err != nil {
			if !errors.Is(err, errFrame) {
				t.Fatalf("error %v does not wrap errFrame", err)
			}
			return
		}
		again, err := decodeFrame(encodeTestFrame(t, fr.frameHeader, fr.Msgs, fr.Beats, fr.BeatResps, fr.Removed...))
		if err != nil {
			t.Fatalf("re-encoded frame: %v", err)
		}
		if !framesEqual(fr, again) {
			t.Fatalf("re-encoded frame decodes to %+v, want %+v", again, fr)
		}
	})
}

// memNet is an in-process Carrier between NetTransports: Send hands the frame
// (copied) to the destination's HandleFrame on the sender's goroutine.
type memNet struct {
	mu    sync.Mutex
	nodes map[NodeID]*NetTransport
	// block, when set, makes Send to that node wait until it is closed.
	block map[NodeID]chan struct{}
	fail  map[NodeID]bool
	sent  int
}

type memCarrier struct {
	n    *memNet
	from NodeID
}

func (c memCarrier) Send(ctx context.Context, to NodeID, frame []byte) error {
	c.n.mu.Lock()
	dst, block, fail := c.n.nodes[to], c.n.block[to], c.n.fail[to]
	c.n.sent++
	c.n.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if fail || dst == nil {
		return errors.New("memnet: unreachable")
	}
	dst.HandleFrame(append([]byte(nil), frame...))
	return nil
}

// recorder is a fake engine.
type recorder struct {
	mu      sync.Mutex
	got     []Envelope
	unreach []target
	ch      chan struct{}
}

func newRecorder() *recorder { return &recorder{ch: make(chan struct{}, 1)} }

func (r *recorder) Receive(batch []Envelope) {
	r.mu.Lock()
	r.got = append(r.got, batch...)
	r.mu.Unlock()
	wake(r.ch)
}

func (r *recorder) ReportUnreachable(g GroupID, to ReplicaID) {
	r.mu.Lock()
	r.unreach = append(r.unreach, target{g, to})
	r.mu.Unlock()
	wake(r.ch)
}

// waitFor polls cond (under r.mu) until it holds or 10 s pass.
func (r *recorder) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		select {
		case <-r.ch:
		case <-time.After(5 * time.Millisecond):
		}
	}
}

type memPair struct {
	net    *memNet
	tr     [3]*NetTransport // index 1, 2
	rec    [3]*recorder
	acks   chan beatAck
	before time.Time
}

type beatAck struct {
	g    GroupID
	from ReplicaID
	sent time.Time
}

func newMemPair(t *testing.T, maxQueue int) *memPair {
	t.Helper()
	p := &memPair{net: &memNet{nodes: map[NodeID]*NetTransport{}, block: map[NodeID]chan struct{}{}, fail: map[NodeID]bool{}},
		acks: make(chan beatAck, 16)}
	for i := NodeID(1); i <= 2; i++ {
		cfg := NetConfig{Node: i, Storage: string(rune('a' + i)), MaxQueueBytes: maxQueue, BeatInterval: 5 * time.Millisecond, Logger: quietLog()}
		if i == 1 {
			cfg.OnBeatAck = func(g GroupID, from ReplicaID, sent time.Time) { p.acks <- beatAck{g, from, sent} }
		}
		tr, err := NewNetTransport(cfg, memCarrier{n: p.net, from: i})
		if err != nil {
			t.Fatal(err)
		}
		p.tr[i], p.rec[i] = tr, newRecorder()
		p.net.nodes[i] = tr
	}
	p.tr[1].SetPeer(2, "c")
	p.tr[2].SetPeer(1, "b")
	for i := 1; i <= 2; i++ {
		if err := p.tr[i].Start(p.rec[i]); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.tr[i].Close() })
	}
	return p
}

// TestNetTransport_RemovalNotices: a removal notice reaches the other node as
// one (Removed, with its group, from, to and term), beside an ordinary
// message of the same group, which stays a message.
func TestNetTransport_RemovalNotices(t *testing.T) {
	p := newMemPair(t, 0)
	p.tr[1].Send(2, []Envelope{
		{Group: 5, Removed: true, Msg: &raftpb.Message{From: new(uint64(3)), To: new(uint64(8)), Term: new(uint64(6))}},
		{Group: 5, Msg: &raftpb.Message{Type: raftpb.MsgVote.Enum(), From: new(uint64(3)), To: new(uint64(2)), Term: new(uint64(6))}},
	})
	r := p.rec[2]
	r.waitFor(t, "the notice and the message", func() bool { return len(r.got) == 2 })
	var notices, votes int
	for _, env := range r.got {
		switch {
		case env.Removed:
			notices++
			if env.Group != 5 || env.Msg.GetFrom() != 3 || env.Msg.GetTo() != 8 || env.Msg.GetTerm() != 6 {
				t.Fatalf("notice %d %v", env.Group, env.Msg)
			}
		case env.Msg.GetType() == raftpb.MsgVote && env.Group == 5 && env.Msg.GetTo() == 2:
			votes++
		default:
			t.Fatalf("unexpected %+v", env)
		}
	}
	if notices != 1 || votes != 1 {
		t.Fatalf("%d notices and %d votes, want one of each", notices, votes)
	}
}

// TestNetTransport_DeliversInOrder: messages reach the other node's engine
// whole, in the order sent.
func TestNetTransport_DeliversInOrder(t *testing.T) {
	p := newMemPair(t, 0)
	const n = 200
	for i := range n {
		p.tr[1].Send(2, []Envelope{{Group: GroupID(i % 7), Msg: &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: new(uint64(1)), To: new(uint64(2)), Index: new(uint64(i))}}})
	}
	r := p.rec[2]
	r.waitFor(t, "every message", func() bool { return len(r.got) == n })
	for i, env := range r.got {
		if env.Group != GroupID(i%7) || env.Msg.GetIndex() != uint64(i) || env.Msg.GetType() != raftpb.MsgApp {
			t.Fatalf("message %d: group %d %v", i, env.Group, env.Msg)
		}
	}
	// The sender counts a frame once Send returns, which the in-memory
	// carrier does after delivering it: poll for the last count.
	r.waitFor(t, "the sender's stats", func() bool { return p.tr[1].Stats().MessagesOut == n })
	if st := p.tr[1].Stats(); st.Frames == 0 || st.Frames > n || st.MessagesOut != n {
		t.Fatalf("stats %+v", st)
	}
}

// TestNetTransport_OtherStorageDropped: a frame addressed to another storage
// id (a replaced disk), or from a node under a storage id other than the one
// recorded for it, is dropped.
func TestNetTransport_OtherStorageDropped(t *testing.T) {
	p := newMemPair(t, 0)
	msg := func() []Envelope {
		return []Envelope{{Group: 1, Msg: &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: new(uint64(1)), To: new(uint64(2))}}}
	}
	p.tr[1].SetPeer(2, "old-disk")
	p.tr[1].Send(2, msg())
	waitStat(t, func() bool { return p.tr[2].Stats().Refused == 1 })
	p.tr[2].SetPeer(1, "someone-else")
	p.tr[1].SetPeer(2, "c")
	p.tr[1].Send(2, msg())
	waitStat(t, func() bool { return p.tr[2].Stats().Refused == 2 })
	p.tr[2].SetPeer(1, "b")
	p.tr[1].Send(2, msg())
	r := p.rec[2]
	r.waitFor(t, "the well-addressed message", func() bool { return len(r.got) == 1 })
}

func waitStat(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestNetTransport_FullQueueDropsAndReports: while the carrier is stuck, the
// queue fills to its byte bound; what does not fit is dropped and its groups
// are told the peer is unreachable; once the carrier moves, new messages go
// through again.
func TestNetTransport_FullQueueDropsAndReports(t *testing.T) {
	p := newMemPair(t, 4<<10)
	release := make(chan struct{})
	p.net.mu.Lock()
	p.net.block[2] = release
	p.net.mu.Unlock()
	big := func(g GroupID) []Envelope {
		return []Envelope{{Group: g, Msg: &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: new(uint64(1)), To: new(uint64(2)),
			Entries: []*raftpb.Entry{{Data: make([]byte, 1000)}}}}}
	}
	// The first goes to the (stuck) carrier; then the queue takes about 4.
	for g := range GroupID(12) {
		p.tr[1].Send(2, big(g+1))
		if g == 0 {
			waitStat(t, func() bool { p.net.mu.Lock(); defer p.net.mu.Unlock(); return p.net.sent == 1 })
		}
	}
	r1 := p.rec[1]
	r1.waitFor(t, "unreachable reports", func() bool { return len(r1.unreach) > 0 })
	st := p.tr[1].Stats()
	if st.Dropped == 0 || st.Dropped > 10 {
		t.Fatalf("dropped %d of 12 with room for about 4", st.Dropped)
	}
	r1.mu.Lock()
	for _, u := range r1.unreach {
		if u.to != 2 || u.g < 2 {
			t.Errorf("unreachable report %+v: want replica 2 of a group after the first", u)
		}
	}
	r1.mu.Unlock()
	close(release)
	p.net.mu.Lock()
	delete(p.net.block, 2)
	p.net.mu.Unlock()
	r2 := p.rec[2]
	want := 12 - int(st.Dropped)
	r2.waitFor(t, "the queued messages", func() bool { return len(r2.got) == want })
	p.tr[1].Send(2, big(99))
	r2.waitFor(t, "a message after the queue drained", func() bool { return len(r2.got) == want+1 })
}

// TestNetTransport_SendFailureReports: a frame the carrier cannot send makes
// each of its groups hear that the peer is unreachable.
func TestNetTransport_SendFailureReports(t *testing.T) {
	p := newMemPair(t, 0)
	p.net.mu.Lock()
	p.net.fail[2] = true
	p.net.mu.Unlock()
	p.tr[1].Send(2, []Envelope{
		{Group: 5, Msg: &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: new(uint64(1)), To: new(uint64(2))}},
		{Group: 5, Msg: &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: new(uint64(1)), To: new(uint64(2))}},
		{Group: 6, Msg: &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: new(uint64(1)), To: new(uint64(3))}},
	})
	r := p.rec[1]
	r.waitFor(t, "two reports", func() bool { return len(r.unreach) >= 2 })
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.unreach) != 2 || r.unreach[0] != (target{5, 2}) || r.unreach[1] != (target{6, 3}) {
		t.Fatalf("reports %+v, want group 5 replica 2 and group 6 replica 3, once each", r.unreach)
	}
}

// TestNetTransport_BeatsRoundTrip: heartbeats travel as beats and arrive as
// the MsgHeartbeat raft sent (with the send time in the context); the
// response comes back with the leader's original context restored, and
// OnBeatAck reports the send time of the heartbeat it answers.
func TestNetTransport_BeatsRoundTrip(t *testing.T) {
	p := newMemPair(t, 0)
	for _, orig := range [][]byte{nil, []byte("read-index-ctx")} {
		p.rec[2].mu.Lock()
		p.rec[2].got = nil
		p.rec[2].mu.Unlock()
		p.rec[1].mu.Lock()
		p.rec[1].got = nil
		p.rec[1].mu.Unlock()
		before := time.Now()
		p.tr[1].Send(2, []Envelope{{Group: 9, Msg: &raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), From: new(uint64(1)), To: new(uint64(2)),
			Term: new(uint64(4)), Commit: new(uint64(33)), Context: orig}}})
		r2 := p.rec[2]
		r2.waitFor(t, "the heartbeat", func() bool { return len(r2.got) == 1 })
		hb := r2.got[0]
		if hb.Group != 9 || hb.Msg.GetType() != raftpb.MsgHeartbeat || hb.Msg.GetFrom() != 1 || hb.Msg.GetTo() != 2 ||
			hb.Msg.GetTerm() != 4 || hb.Msg.GetCommit() != 33 || len(hb.Msg.GetContext()) == 0 {
			t.Fatalf("rebuilt heartbeat %v", hb.Msg)
		}
		after := time.Now()
		// raft answers with the heartbeat's context, verbatim.
		p.tr[2].Send(1, []Envelope{{Group: 9, Msg: &raftpb.Message{Type: raftpb.MsgHeartbeatResp.Enum(), From: new(uint64(2)), To: new(uint64(1)),
			Term: new(uint64(4)), Context: hb.Msg.GetContext()}}})
		r1 := p.rec[1]
		r1.waitFor(t, "the response", func() bool { return len(r1.got) == 1 })
		resp := r1.got[0]
		if resp.Group != 9 || resp.Msg.GetType() != raftpb.MsgHeartbeatResp || resp.Msg.GetFrom() != 2 || resp.Msg.GetTerm() != 4 ||
			!bytes.Equal(resp.Msg.GetContext(), orig) {
			t.Fatalf("rebuilt response %v, want context %q", resp.Msg, orig)
		}
		select {
		case a := <-p.acks:
			if a.g != 9 || a.from != 2 || a.sent.Before(before) || a.sent.After(after) {
				t.Fatalf("ack %+v: want group 9 from 2 sent in [%v, %v]", a, before, after)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no beat ack")
		}
		if st := p.tr[1].Stats(); st.MessagesOut != 0 {
			t.Fatalf("heartbeats went as messages: %+v", st)
		}
	}
}
