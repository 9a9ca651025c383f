package cluster

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/persistence"
)

// Live feeds across nodes. A websocket on node S subscribes to an object owned
// by node O: S keeps the socket's subscriber under a subscription id and asks O
// to subscribe a stand-in (remoteSub) in its place. The stand-in sends every
// event to S's router, in the feed's order, one-way; S's router hands them to
// the subscriber on its own goroutine, in arrival order (the transport keeps
// the order of one sender to one address: one connection). When O's activation drops its
// subscribers (a failed write, a handoff), the stand-in sends Lost and the
// socket's client joins again, resuming after its last log_id, wherever the
// object lives now. Each side also drops the other's subscriptions when the
// other node is no longer live.
//
// One-way messages can be lost (what is queued on a connection that breaks, a
// restarted subscriber node's). So every message of events
// carries its number in the subscription, and the stand-in tells the
// subscriber's node, about once a second while events flow, how many it sent.
// A subscriber that misses a number is told Lost and joins again as above: a
// gap in the feed is never silent. A lost Lost would leave a subscriber waiting
// for events that never come, so every few seconds the subscriber's node asks
// each owner which of its subscriptions it still holds (opSubsCheck).

// feedMsg carries events of one remote subscription, or its end.
type feedMsg struct {
	SubID  uint64
	After  *uint64 // opSubscribe: resume after this log_id
	Events []actors.Event
	// Seq numbers the messages of events of one subscription: 1, 2, ...; 0
	// in the other messages.
	Seq uint64
	// Sent, in a message without events, is the number of messages of events
	// the stand-in has sent so far (a check for the ones lost at the end).
	Sent uint64
	Lost *wireError // the subscription ended (last message)
	// SubIDs, in opSubsCheck, are the subscriptions the asking node holds at
	// the owner.
	SubIDs []uint64
}

// remoteSubs is both sides' bookkeeping.
type remoteSubs struct {
	mu   sync.Mutex
	next uint64
	// subscriber side: our subscribers at other nodes, by id and by subscriber
	out   map[uint64]*outSub
	outBy map[actors.Subscriber]uint64
	// owner side: stand-ins for other nodes' subscribers
	in map[inKey]*remoteSub
	// checking: owners (by address) with an opSubsCheck in flight; lastCheck:
	// when the last round of them started.
	checking  map[string]bool
	lastCheck time.Time
}

// subsCheckEvery is how often a subscriber's node asks each owner which of its
// subscriptions it still holds.
const subsCheckEvery = 5 * time.Second

type outSub struct {
	sub       actors.Subscriber
	node      string // the owner it subscribed at
	boot      string
	addr      string
	partition uint32
	got       uint64 // messages of events received (the last Seq)
	ready     bool   // the owner answered the subscription: checks may ask about it
}

type inKey struct {
	node string
	id   uint64
}

func newRemoteSubs() *remoteSubs {
	return &remoteSubs{out: map[uint64]*outSub{}, outBy: map[actors.Subscriber]uint64{}, in: map[inKey]*remoteSub{}, checking: map[string]bool{}}
}

// remoteSub stands in, at the owner, for a subscriber on another node.
type remoteSub struct {
	m    *member
	key  inKey
	boot string // the subscriber node's run
	addr string
	obj  actors.ObjectID
	once sync.Once
	// sent counts the messages of events sent; checked is the count the last
	// check told. mu keeps a count and its message in the same order on the
	// wire: Deliver runs on the object's actor, check on the sweep.
	mu            sync.Mutex
	sent, checked uint64
}

func (r *remoteSub) Deliver(ev actors.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent++
	r.m.tr.send(r.addr, &wireRequest{Op: opFeed, From: r.m.id, Feed: &feedMsg{SubID: r.key.id, Events: []actors.Event{ev}, Seq: r.sent}})
}

// check tells the subscriber's node how many messages of events were sent, if
// any were since the last check.
func (r *remoteSub) check() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.checked != r.sent {
		r.checked = r.sent
		r.m.tr.send(r.addr, &wireRequest{Op: opFeed, From: r.m.id, Feed: &feedMsg{SubID: r.key.id, Sent: r.sent}})
	}
}

func (r *remoteSub) Lost(err error) {
	r.once.Do(func() {
		r.m.subs.mu.Lock()
		delete(r.m.subs.in, r.key)
		r.m.subs.mu.Unlock()
		r.m.tr.send(r.addr, &wireRequest{Op: opFeed, From: r.m.id, Feed: &feedMsg{SubID: r.key.id, Lost: toWireError(err)}})
	})
}

// subscribeRemote subscribes sub to object id at the owner at addr.
func (m *member) subscribeRemote(ctx context.Context, owner NodeInfo, id actors.ObjectID, msg actors.KVSubscribe) (any, Served, error, bool) {
	m.subs.mu.Lock()
	if _, dup := m.subs.outBy[msg.Sub]; dup {
		m.subs.mu.Unlock()
		return nil, Served{}, &actors.Error{Kind: actors.KindInvalid, Msg: "already subscribed"}, false
	}
	m.subs.next++
	subID := m.subs.next
	m.subs.out[subID] = &outSub{sub: msg.Sub, node: owner.ID, boot: owner.Boot, addr: owner.Addr, partition: persistence.Partition(id, len(m.state))}
	m.subs.outBy[msg.Sub] = subID
	m.subs.mu.Unlock()
	forget := func() {
		m.subs.mu.Lock()
		m.subs.forget(subID, msg.Sub)
		m.subs.mu.Unlock()
	}
	reply, err := m.tr.call(ctx, owner, &wireRequest{Op: opSubscribe, ID: id, From: m.id, Feed: &feedMsg{SubID: subID, After: msg.After}})
	if err != nil {
		forget()
		return nil, Served{}, &actors.Error{Kind: actors.KindUnavailable, Msg: "no reply from the object's node in time", RetryAfter: time.Second}, false
	}
	if reply.Err != nil {
		forget()
		return nil, Served{}, reply.Err.err(), reply.Err.NotOwner
	}
	m.subs.mu.Lock()
	if o := m.subs.out[subID]; o != nil {
		o.ready = true
	}
	m.subs.mu.Unlock()
	return reply.Val, reply.Served, nil, false
}

// forget drops subscription id of sub from this node's side; mu is held.
func (r *remoteSubs) forget(id uint64, sub actors.Subscriber) {
	delete(r.out, id)
	delete(r.outBy, sub)
}

// unsubscribeAt asks the owner o subscribed at to drop its stand-in for
// subscription id.
func (m *member) unsubscribeAt(ctx context.Context, o *outSub, id uint64) {
	_, _ = m.tr.call(ctx, NodeInfo{Addr: o.addr, Boot: o.boot}, &wireRequest{Op: opUnsubscribe, From: m.id, Feed: &feedMsg{SubID: id}})
}

// unsubscribeRemote ends sub's subscription at another node; ok is false when
// sub has none (it may be subscribed here).
func (m *member) unsubscribeRemote(ctx context.Context, sub actors.Subscriber) bool {
	m.subs.mu.Lock()
	subID, ok := m.subs.outBy[sub]
	var o *outSub
	if ok {
		o = m.subs.out[subID]
		m.subs.forget(subID, sub)
	}
	m.subs.mu.Unlock()
	if !ok {
		return false
	}
	m.unsubscribeAt(ctx, o, subID)
	return true
}

// serveSubscribe is the owner's side of opSubscribe and opUnsubscribe.
func (m *member) serveSubscribe(ctx context.Context, req *wireRequest) *wireReply {
	if req.Feed == nil {
		return &wireReply{Err: toWireError(&actors.Error{Kind: actors.KindBadRequest, Msg: "malformed subscription"})}
	}
	key := inKey{node: req.From, id: req.Feed.SubID}
	if req.Op == opUnsubscribe {
		m.subs.mu.Lock()
		rs := m.subs.in[key]
		delete(m.subs.in, key)
		m.subs.mu.Unlock()
		if rs != nil {
			_, _ = m.n.host.Request(ctx, rs.obj, actors.KVUnsubscribe{Sub: rs})
		}
		return &wireReply{}
	}
	info, live := m.view.node(req.From)
	if !live {
		return &wireReply{Err: toWireError(&actors.Error{Kind: actors.KindUnavailable, Msg: fmt.Sprintf("node %s is not live", req.From)})}
	}
	p := persistence.Partition(req.ID, len(m.state))
	e := m.servingEpoch(p)
	if e == 0 {
		return &wireReply{Err: toWireError(&notOwnerError{msg: fmt.Sprintf("node %s does not serve partition %d now", m.id, p)})}
	}
	rs := &remoteSub{m: m, key: key, boot: info.Boot, addr: info.Addr, obj: req.ID}
	m.subs.mu.Lock()
	m.subs.in[key] = rs
	m.subs.mu.Unlock()
	v, err := m.n.host.Request(ctx, req.ID, actors.KVSubscribe{Sub: rs, After: req.Feed.After})
	if err != nil {
		m.subs.mu.Lock()
		delete(m.subs.in, key)
		m.subs.mu.Unlock()
		if actors.NotServed(err) {
			return &wireReply{Err: toWireError(&notOwnerError{msg: err.Error()})}
		}
		return &wireReply{Err: toWireError(err)}
	}
	return &wireReply{Val: v, Served: Served{Node: m.id, Partition: p, Epoch: e}}
}

// serveFeed is the subscriber node's side of opFeed: it runs on the router's
// goroutine, in arrival order, and must not block.
func (m *member) serveFeed(req *wireRequest) {
	f := req.Feed
	if f == nil {
		return
	}
	m.subs.mu.Lock()
	o := m.subs.out[f.SubID]
	if o == nil || o.node != req.From {
		m.subs.mu.Unlock()
		return // unsubscribed meanwhile
	}
	gap := false
	switch {
	case f.Lost != nil:
	case len(f.Events) > 0 && f.Seq != 0: // 0: an owner that does not number them
		gap = f.Seq != o.got+1
		o.got = f.Seq
	case len(f.Events) == 0 && f.Sent != 0:
		gap = f.Sent != o.got
	}
	if f.Lost != nil || gap {
		m.subs.forget(f.SubID, o.sub)
	}
	m.subs.mu.Unlock()
	if gap {
		m.log.Warn("events of a live feed were lost between nodes; the subscriber resumes", "node", o.node, "sub", f.SubID)
		o.sub.Lost(errFeedGap)
		// The owner's stand-in must go too; serveFeed must not block.
		m.goOwned(func() {
			ctx, cancel := context.WithTimeout(m.ctx, 5*time.Second)
			defer cancel()
			m.unsubscribeAt(ctx, o, f.SubID)
		})
		return
	}
	for _, ev := range f.Events {
		o.sub.Deliver(ev)
	}
	if f.Lost != nil {
		o.sub.Lost(f.Lost.err())
	}
}

// errFeedGap ends a remote subscription that missed events: its client joins
// again, resuming after the last log_id it got.
var errFeedGap = &actors.Error{Kind: actors.KindUnavailable, Msg: "events of the live feed were lost between nodes; subscribe again after the last log_id received", RetryAfter: 100 * time.Millisecond}

// sweepSubs drops the subscriptions whose other side is gone: here, stand-ins
// for subscribers on nodes that are no longer live (or restarted); there,
// subscriptions at owners that are no longer live or no longer own the
// object's partition (their Lost may never come).
func (m *member) sweepSubs() {
	nodes, parts, _, _ := m.view.snapshot()
	var drop []*remoteSub
	var lost []*outSub
	var live []*remoteSub
	m.subs.mu.Lock()
	for k, rs := range m.subs.in {
		if n, ok := nodes[k.node]; !ok || n.Boot != rs.boot {
			delete(m.subs.in, k)
			drop = append(drop, rs)
			continue
		}
		live = append(live, rs)
	}
	for id, o := range m.subs.out {
		n, ok := nodes[o.node]
		if !ok || n.Boot != o.boot || m.movedFrom(parts, o.partition, o.node) {
			m.subs.forget(id, o.sub)
			lost = append(lost, o)
		}
	}
	m.subs.mu.Unlock()
	for _, rs := range live {
		rs.check()
	}
	for _, rs := range drop {
		rs.once.Do(func() {})
		ctx, cancel := context.WithTimeout(m.ctx, 5*time.Second)
		_, _ = m.n.host.Request(ctx, rs.obj, actors.KVUnsubscribe{Sub: rs})
		cancel()
	}
	for _, o := range lost {
		o.sub.Lost(&actors.Error{Kind: actors.KindUnavailable, Msg: "the object's node is gone", RetryAfter: time.Second})
	}
	m.checkSubs()
}

// movedFrom reports whether partition p is served by another node than node
// now: its owner, or in a replicated cluster its known leader (an election
// under way moves nothing yet).
func (m *member) movedFrom(parts []PartEntry, p uint32, node string) bool {
	if m.r != nil {
		l := m.r.leader(p)
		return l != "" && l != node
	}
	return parts[p].Owner != node
}

// checkSubs asks, every subsCheckEvery, each owner holding subscriptions of
// this node's subscribers which of them it still holds, and tells the
// subscribers of the others Lost. An owner from an older version does not know
// the request; its subscriptions are left as they are.
func (m *member) checkSubs() {
	type owner struct{ node, boot, addr string }
	byOwner := map[owner][]uint64{}
	m.subs.mu.Lock()
	if time.Since(m.subs.lastCheck) < subsCheckEvery {
		m.subs.mu.Unlock()
		return
	}
	m.subs.lastCheck = time.Now()
	for id, o := range m.subs.out {
		if k := (owner{o.node, o.boot, o.addr}); o.ready && !m.subs.checking[o.addr] {
			byOwner[k] = append(byOwner[k], id)
		}
	}
	for k := range byOwner {
		m.subs.checking[k.addr] = true
	}
	m.subs.mu.Unlock()
	for k, ids := range byOwner {
		started := m.owned.Go(func(context.Context) {
			ctx, cancel := context.WithTimeout(m.ctx, 5*time.Second)
			defer cancel()
			reply, err := m.tr.call(ctx, NodeInfo{ID: k.node, Addr: k.addr, Boot: k.boot}, &wireRequest{Op: opSubsCheck, From: m.id, Feed: &feedMsg{SubIDs: ids}})
			var lost []*outSub
			m.subs.mu.Lock()
			delete(m.subs.checking, k.addr)
			if err == nil && reply.Err == nil {
				for _, id := range reply.Unknown {
					if o := m.subs.out[id]; o != nil && o.node == k.node && o.boot == k.boot {
						m.subs.forget(id, o.sub)
						lost = append(lost, o)
					}
				}
			}
			m.subs.mu.Unlock()
			for _, o := range lost {
				m.log.Warn("a live feed's owner no longer holds it; the subscriber resumes", "node", k.node)
				o.sub.Lost(errSubGone)
			}
		})
		if !started { // stopping: no check now
			m.subs.mu.Lock()
			delete(m.subs.checking, k.addr)
			m.subs.mu.Unlock()
		}
	}
}

// errSubGone ends a remote subscription that its owner no longer holds (its
// Lost was lost on the way).
var errSubGone = &actors.Error{Kind: actors.KindUnavailable, Msg: "the object's node no longer holds this live feed; subscribe again after the last log_id received", RetryAfter: 100 * time.Millisecond}

// serveSubsCheck is the owner's side of opSubsCheck.
func (m *member) serveSubsCheck(req *wireRequest) *wireReply {
	if req.Feed == nil {
		return &wireReply{Err: toWireError(&actors.Error{Kind: actors.KindBadRequest, Msg: "malformed subscription check"})}
	}
	var unknown []uint64
	m.subs.mu.Lock()
	for _, id := range req.Feed.SubIDs {
		if m.subs.in[inKey{node: req.From, id: id}] == nil {
			unknown = append(unknown, id)
		}
	}
	m.subs.mu.Unlock()
	return &wireReply{Unknown: unknown}
}
