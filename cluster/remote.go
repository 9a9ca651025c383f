package cluster

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/internal/owner"
)

// The transport between members (nodes and client members): requests and
// their replies, and one-way messages (feeds), over plain TCP.
//
// Each member listens on its cluster address and dials the others on first
// use: one connection per destination carries this member's requests and
// one-way messages to it, and the replies come back on the same connection.
// A connection's frames are queued and written by one writer goroutine, every
// frame queued meanwhile in one write: under load a write carries many
// requests (or replies), and the reader on the other side takes them from one
// buffered read, as nats-server's routes do. Each frame is
//
//	length uint32 (of what follows) | kind byte | id uint64 | payload
//
// and a connection starts with preamble, so that a stray client (an older
// node, a port scanner) is turned away at once.
//
// Why not protoactor-go's remote, which carried these until issue 28: every
// request went through a gRPC stream's message, a protobuf envelope, a future
// with its own goroutine and a ticker per call for the pings, and the forward
// through a node that does not own the object got 0.19x-0.34x of what asking
// the owner did (bench -case cluster-latency). It also kept what was sent
// while it reconnected and delivered it later to whatever listened at the
// address (internal/torture/cluster.go), and its shut-down raced with itself
// (TRAPS.md). Here a request is written on a live connection or not at all,
// and a connection that breaks fails every call waiting on it at once.
//
// # Liveness and lost replies
//
// A call waits for its reply however long its context allows (a long poll is
// fine), but once it has waited probeAfter, its connection's next probe asks
// the other member about it; a connection sends at most one probe at a time,
// naming every call that has waited that long. The other member answers from
// its reader, before anything else it reads: the calls of the probe it is not
// running. A reply is queued before its call stops running, on the same
// queue as the probe's answer, so a call that is not running and whose reply
// did not arrive before the answer lost its reply (or its request): it fails
// at once with an unknown outcome. A probe not answered within probeTimeout
// means the member is down or cut off: the connection fails, and every call on
// it.
//
// # Goroutines
//
// The accept loop, each connection's reader and writer, and the prober are
// owned by the transport's owned group; requests from other members run on
// servers (reused goroutines owned by serving). stop ends them all and waits.

// maxWireMessage bounds one message between nodes (a handoff chunk, the largest
// write the API accepts and its reply).
const maxWireMessage = 80 << 20

// preamble starts every connection between members.
var preamble = []byte("holdfast-cluster/1\n")

// Frame kinds.
const (
	frameRequest    byte = iota + 1 // id: the call; payload: a wireRequest; a frameReply answers it
	frameSend                       // a one-way wireRequest (a feed's events); id 0
	frameReply                      // id: the call it answers; payload: a wireReply
	frameProbe                      // id: the probe; payload: call ids (8 bytes each) the prober waits for
	frameProbeReply                 // id: the probe answered; payload: those of its calls not running
)

// frameHeader is the bytes before a frame's payload: its length, kind and id.
const frameHeader = 4 + 1 + 8

const (
	// probeAfter is how long a call waits for its reply before its
	// connection's probe asks about it, and then between probes.
	probeAfter = 500 * time.Millisecond
	// probeTimeout is how long a probe waits for its answer before the
	// connection is taken for dead.
	probeTimeout = time.Second
	// maxProbeCalls bounds the calls one probe names; the others wait for
	// the next.
	maxProbeCalls = 4096
	// dialTimeout bounds a connection's dial and its preamble.
	dialTimeout = 2 * time.Second
	// writeTimeout bounds one write of a connection's queued frames (up to
	// a few maxWireMessage ones): a member that does not read for that long
	// is taken for dead.
	writeTimeout = 30 * time.Second
	// maxQueued bounds the bytes queued on one connection: a member that
	// cannot keep up with what is sent to it (one-way messages; calls are
	// bounded by their callers) fails the connection rather than this
	// member's memory.
	maxQueued = 4 * maxWireMessage
	// keepBuffer bounds a write buffer kept for reuse.
	keepBuffer = 1 << 20
	// readBuffer is each connection's read buffer: many frames per read.
	readBuffer = 64 << 10
)

// downFor is how long an address whose connection failed is taken for down:
// requests for it get 503 at once instead of waiting for a reply that cannot
// come. By then a crashed node's lease has expired and it shows as down anyway.
var downFor = 2 * time.Second

// maxIdleServers bounds the goroutines kept idle for requests from other
// nodes.
const maxIdleServers = 1024

// handler serves one request that arrived from another member.
type handler func(ctx context.Context, req *wireRequest) *wireReply

// asyncHandler serves a request that arrived from another member without
// holding the goroutine until its reply, when it takes the request's op: it
// reports false for the others (handler serves those). reply must be called
// once, on any goroutine, and does not block.
type asyncHandler func(req *wireRequest, reply func(*wireReply)) bool

// errUnreachable is a request that got no reply from the other node: its
// outcome is unknown.
var errUnreachable = errors.New("cluster: no reply from the node")

// errNotSent is a request that certainly did not reach the other node (no
// connection to it, or its connection ended before the request was queued):
// it may be sent again.
var errNotSent = errors.New("cluster: the request was not sent")

// errStopped is a transport's refusal once it stopped.
var errStopped = errors.New("cluster: the transport stopped")

// transport is a member's end of the connections between members.
type transport struct {
	ln    net.Listener
	addr  string // the address other members reach this one at
	serve handler
	async asyncHandler // nil: serve takes every request
	feed  func(*wireRequest)
	log   *slog.Logger

	owned *owner.Group // accept loop, connections' readers and writers, prober
	// serving owns the goroutines of requests from other members; stop
	// cancels and waits for them before it closes the connections.
	serving *owner.Group
	// servers are serving's goroutines, reused (owner.Pool): the object's
	// turn runs on the goroutine that sends to it, tens of KiB deep, and a new
	// goroutine per request spent 9% of the forward's CPU growing its stack
	// (bench -case cluster-latency, other-64).
	servers *owner.Pool

	mu      sync.Mutex
	out     map[string]*conn // by the address dialled
	in      map[*conn]struct{}
	stopped bool

	downMu sync.Mutex
	// down holds the addresses whose connection failed, and when it last
	// did; an entry goes when the address connects again or its node
	// registers again (clearDown).
	down map[string]time.Time

	// dropReply, when set (tests), says whether to drop the reply of a request
	// of this op instead of sending it, as a lost reply would be.
	dropReply atomic.Pointer[func(op int) bool]
	// dropSend, when set (tests), says whether to drop a one-way message
	// instead of sending it.
	dropSend atomic.Pointer[func(*wireRequest) bool]
	// wrapConn, when set (tests, before the first call), wraps each
	// connection this transport dials.
	wrapConn func(net.Conn) net.Conn
}

// startTransport starts a member's transport listening on bind and known to
// the others as advertise (host:port each; an empty bind means advertise, and
// then port 0 picks a free port). serve answers requests from other members,
// but those async takes (nil: none); feed, called on a connection's reader in
// arrival order, takes one-way messages (they must not be reordered, and it
// must not block).
func startTransport(advertise, bind string, serve handler, async asyncHandler, feed func(*wireRequest), log *slog.Logger) (*transport, error) {
	listen, apart, err := bindAddr(advertise, bind)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("cluster: listen on %s: %w", listen, err)
	}
	t := &transport{
		ln: ln, addr: advertise, serve: serve, async: async, feed: feed, log: log,
		owned: owner.New(nil), serving: owner.New(nil),
		out: map[string]*conn{}, in: map[*conn]struct{}{}, down: map[string]time.Time{},
	}
	if !apart {
		t.addr = ln.Addr().String() // the port picked
	}
	t.servers = owner.NewPool(t.serving, maxIdleServers)
	t.owned.Go(func(context.Context) { t.accept() })
	t.owned.Go(t.probe)
	return t, nil
}

// bindAddr returns the address to listen on and whether it is apart from the
// advertised one (cluster.bind: other members dial advertise, which forwards
// to it).
func bindAddr(advertise, bind string) (listen string, apart bool, err error) {
	if _, port, err := net.SplitHostPort(advertise); err != nil {
		return "", false, fmt.Errorf("cluster advertise %q: %w", advertise, err)
	} else if _, err := strconv.Atoi(port); err != nil {
		return "", false, fmt.Errorf("cluster advertise %q: bad port", advertise)
	}
	if bind == "" || bind == advertise {
		return advertise, false, nil
	}
	_, port, err := net.SplitHostPort(bind)
	if err != nil {
		return "", false, fmt.Errorf("cluster bind %q: %w", bind, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return "", false, fmt.Errorf("cluster bind %q: bad port", bind)
	}
	if _, aport, _ := net.SplitHostPort(advertise); aport == "0" {
		return "", false, fmt.Errorf("cluster advertise %q: port 0 only works when bind is empty or the same (the port is picked at listen)", advertise)
	}
	return bind, true, nil
}

// accept takes the connections of other members until the listener closes.
func (t *transport) accept() {
	for {
		nc, err := t.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				t.log.Warn("cluster transport: accept failed; no more connections from other members", "err", err)
			}
			return
		}
		c := newConn(t, nc, nc.RemoteAddr().String(), false)
		t.mu.Lock()
		if t.stopped {
			t.mu.Unlock()
			_ = nc.Close()
			continue
		}
		t.in[c] = struct{}{}
		t.mu.Unlock()
		c.start()
	}
}

// conn returns the open connection to addr, dialling it if there is none.
// Concurrent callers share one dial.
func (t *transport) conn(ctx context.Context, addr string) (*conn, error) {
	t.mu.Lock()
	if t.stopped {
		t.mu.Unlock()
		return nil, errStopped
	}
	c, ok := t.out[addr]
	if !ok {
		c = newConn(t, nil, addr, true)
		t.out[addr] = c
	}
	t.mu.Unlock()
	if !ok {
		c.dial()
	}
	select {
	case <-c.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err := c.failed(); err != nil {
		return nil, err
	}
	return c, nil
}

// call sends req to the member at n.Addr and waits for its reply until ctx
// ends. A reply slower than probeAfter is fine (a long poll), but a call whose
// reply was lost, or whose member stopped answering, fails within about
// probeAfter+probeTimeout (see the liveness section above). An error wraps
// errNotSent when the request certainly did not reach the member, errUnreachable
// when its outcome is unknown.
func (t *transport) call(ctx context.Context, n NodeInfo, req *wireRequest) (*wireReply, error) {
	addr := n.Addr
	wait := time.Minute
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	if wait <= 0 {
		// The deadline passed before ctx's own timer marked it done: ctx.Err()
		// may still be nil, and a nil error with no reply crashed the caller.
		return nil, fmt.Errorf("%w to %s: %w", errNotSent, addr, context.DeadlineExceeded)
	}
	req.Wait = wait
	data, err := encodeRequest(req)
	if err != nil {
		return nil, err
	}
	c, err := t.conn(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("%w to %s: %w", errNotSent, addr, err)
	}
	id, done, err := c.request(data)
	if err != nil {
		return nil, fmt.Errorf("%w to %s: %w", errNotSent, addr, err)
	}
	var res callResult
	select {
	case res = <-done:
	case <-ctx.Done():
		c.forget(id)
		return nil, fmt.Errorf("%w %s: %w", errUnreachable, addr, ctx.Err())
	}
	if res.err != nil {
		return nil, fmt.Errorf("%w %s: %w", errUnreachable, addr, res.err)
	}
	var reply wireReply
	if err := decodeReply(res.data, &reply); err != nil {
		return nil, err
	}
	return &reply, nil
}

// send sends req to the member at addr without waiting for a reply. It may be
// lost (the member is down, or its connection breaks); messages to one member
// that arrive arrive in order.
func (t *transport) send(addr string, req *wireRequest) {
	if drop := t.dropSend.Load(); drop != nil && (*drop)(req) {
		return
	}
	data, err := encodeRequest(req)
	if err != nil {
		t.log.Error("cannot encode a message for another node", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	c, err := t.conn(ctx, addr)
	if err != nil {
		t.log.Debug("a one-way message to another member was not sent", "to", addr, "err", err)
		return
	}
	c.queue(frameSend, 0, data)
}

// ping reports whether the member at addr answers within a second, with the
// boot (the run) of the node that answered.
func (t *transport) ping(addr string) (pong *wireReply, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	reply, err := t.call(ctx, NodeInfo{Addr: addr}, &wireRequest{Op: opPing})
	return reply, err == nil
}

// isDown reports whether the connection to addr failed lately: routing then
// answers 503 "does not answer" at once. Past downFor it tries again, but the
// address stays unreachable (for cluster status) until it connects again.
func (t *transport) isDown(addr string) bool {
	t.downMu.Lock()
	defer t.downMu.Unlock()
	at, ok := t.down[addr]
	return ok && time.Since(at) <= downFor
}

// unreachable reports whether the last connection to addr failed and none
// succeeded since (nor did the node there register again).
func (t *transport) unreachable(addr string) bool {
	t.downMu.Lock()
	defer t.downMu.Unlock()
	_, ok := t.down[addr]
	return ok
}

// clearDown forgets that addr's connection failed (it connected, or the node
// there registered again: a new run).
func (t *transport) clearDown(addr string) {
	t.downMu.Lock()
	delete(t.down, addr)
	t.downMu.Unlock()
}

func (t *transport) markDown(addr string) {
	t.downMu.Lock()
	t.down[addr] = time.Now()
	t.downMu.Unlock()
}

// serveRequest decodes a request that arrived on c, on c's reader (which
// registered the call as running), and starts it: one async takes (an
// object's message) here, any other on one of the servers; its reply is
// queued when it comes.
//
// Why on the reader: async does not block (Host.RequestAsync never runs a
// commit itself), and handing each request to a server first cost a
// goroutine wake, and a core, per forwarded write.
func (t *transport) serveRequest(c *conn, id uint64, payload []byte) {
	var w wireRequest
	if err := decodeRequest(payload, &w); err != nil {
		t.log.Error("cannot decode a request from another node", "err", err)
		c.reply(id, encodeReply(t.log, &wireReply{Err: &wireError{Kind: actors.KindInternal, Msg: "cannot decode a request from another node"}}))
		return
	}
	send := func(reply *wireReply) {
		if drop := t.dropReply.Load(); drop != nil && (*drop)(w.Op) {
			c.reply(id, nil)
			return
		}
		c.reply(id, encodeReply(t.log, reply))
	}
	stopping := func() {
		c.reply(id, encodeReply(t.log, &wireReply{Err: toWireError(&actors.Error{Kind: actors.KindUnavailable, Msg: "the node is shutting down", RetryAfter: time.Second})}))
	}
	if t.serving.Context().Err() != nil {
		stopping()
		return
	}
	if t.async != nil && t.async(&w, send) {
		return
	}
	if !t.servers.Go(func() {
		wait := w.Wait
		if wait <= 0 || wait > time.Minute {
			wait = time.Minute
		}
		ctx, cancel := context.WithTimeout(t.serving.Context(), wait)
		reply := t.serve(ctx, &w)
		cancel()
		send(reply)
	}) {
		stopping()
	}
}

func encodeReply(log *slog.Logger, reply *wireReply) []byte {
	data, err := encodeReplyData(reply)
	if err != nil {
		log.Error("cannot encode a reply for another node", "err", err)
		data, _ = encodeReplyData(&wireReply{Err: &wireError{Kind: actors.KindInternal, Msg: "internal error: the reply cannot cross between nodes"}})
	}
	return data
}

// probe, every probeAfter, asks each outgoing connection's member about its
// calls that waited that long, and fails the connections whose last probe
// went unanswered for probeTimeout.
func (t *transport) probe(ctx context.Context) {
	tick := time.NewTicker(probeAfter)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		t.mu.Lock()
		conns := make([]*conn, 0, len(t.out))
		for _, c := range t.out {
			conns = append(conns, c)
		}
		t.mu.Unlock()
		now := time.Now()
		for _, c := range conns {
			c.probe(now)
		}
	}
}

// stop ends the transport: requests from other members end first (their
// contexts end; their replies still leave), then every connection is flushed
// (for at most a second) and closed, and every goroutine has returned when it
// does.
func (t *transport) stop() {
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := t.serving.Close(sctx); err != nil {
		t.log.Warn("requests from other nodes did not end when told to; leaving them behind", "err", err)
	}
	t.mu.Lock()
	t.stopped = true
	conns := make([]*conn, 0, len(t.out)+len(t.in))
	for _, c := range t.out {
		conns = append(conns, c)
	}
	for c := range t.in {
		conns = append(conns, c)
	}
	t.mu.Unlock()
	_ = t.ln.Close()
	flushed := time.After(time.Second)
	for _, c := range conns {
		c.drain()
	}
	for _, c := range conns {
		select {
		case <-c.closed:
		case <-flushed:
		}
		c.fail(errStopped)
	}
	if err := t.owned.Close(sctx); err != nil {
		t.log.Warn("the cluster transport's goroutines did not end; leaving them behind", "err", err)
	}
}

// callResult is what a call gets: its reply's payload, or why none came.
type callResult struct {
	data []byte
	err  error
}

// call is a request waiting for its reply on an outgoing connection.
type pendingCall struct {
	done chan callResult // buffered: the one result is never blocked on
	sent time.Time
}

// conn is one connection between two members. An outgoing one (dialled by
// this member) carries requests, one-way messages and probes out and replies
// and probes' answers in; an incoming one the other way round.
type conn struct {
	t    *transport
	nc   net.Conn // nil until an outgoing one is dialled
	addr string   // the address dialled (outgoing) or the remote one (incoming)
	out  bool

	ready  chan struct{} // closed once dialled (or failed): outgoing only
	closed chan struct{} // closed when it failed or ended
	wake   chan struct{} // the writer has frames to write (buffered 1)

	mu       sync.Mutex
	err      error  // why it ended; nil while open
	buf      []byte // frames queued for the writer
	spare    []byte // the writer's last buffer, for reuse
	writing  bool   // a goroutine is writing (writeOut): one at a time
	draining bool   // stop: the writer closes it once buf is written
	overflow bool   // more than maxQueued was queued: the writer fails it
	// outgoing
	next      uint64                  // the last call id given out
	calls     map[uint64]*pendingCall // the calls waiting for replies
	probeID   uint64                  // the probe in flight (0: none)
	probeSent time.Time
	// incoming
	running map[uint64]struct{} // calls read whose reply is not queued yet
}

func newConn(t *transport, nc net.Conn, addr string, out bool) *conn {
	c := &conn{t: t, nc: nc, addr: addr, out: out, closed: make(chan struct{}), wake: make(chan struct{}, 1)}
	if out {
		c.ready = make(chan struct{})
		c.calls = map[uint64]*pendingCall{}
		c.buf = append(c.buf, preamble...)
	} else {
		c.running = map[uint64]struct{}{}
	}
	return c
}

// dial connects an outgoing connection and starts it, or fails it (the
// address is then down). Its ready closes either way.
func (c *conn) dial() {
	defer close(c.ready)
	d := net.Dialer{Timeout: dialTimeout}
	nc, err := d.DialContext(c.t.owned.Context(), "tcp", c.addr)
	if err != nil {
		c.fail(fmt.Errorf("dial: %w", err))
		return
	}
	if c.t.wrapConn != nil {
		nc = c.t.wrapConn(nc)
	}
	c.mu.Lock()
	ended := c.err != nil // the transport stopped meanwhile
	if !ended {
		c.nc = nc
	}
	c.mu.Unlock()
	if ended {
		_ = nc.Close()
		return
	}
	c.t.clearDown(c.addr)
	c.start()
}

// start runs the connection's reader and writer.
func (c *conn) start() {
	if !c.t.owned.Go(func(context.Context) { c.read() }) || !c.t.owned.Go(func(context.Context) { c.write() }) {
		c.fail(errStopped)
		return
	}
	c.kick() // what was queued while it dialled
}

// failed returns why the connection ended, or nil.
func (c *conn) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// fail ends the connection (once): every call waiting on it gets err, and an
// outgoing one's address is down for a while unless the transport stopped.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	calls := c.calls
	c.calls = nil
	c.buf, c.spare = nil, nil
	nc := c.nc
	c.mu.Unlock()
	close(c.closed)
	if nc != nil {
		_ = nc.Close()
	}
	t := c.t
	t.mu.Lock()
	if t.out[c.addr] == c {
		delete(t.out, c.addr)
	}
	delete(t.in, c)
	stopped := t.stopped
	t.mu.Unlock()
	for _, p := range calls {
		p.done <- callResult{err: err}
	}
	if c.out && !stopped {
		t.markDown(c.addr)
		t.log.Debug("connection to another member ended", "to", c.addr, "err", err, "calls", len(calls))
	}
}

// queue appends a frame for the writer; false if the connection ended.
func (c *conn) queue(kind byte, id uint64, payload []byte) bool {
	c.mu.Lock()
	ok := c.queueLocked(kind, id, payload)
	c.mu.Unlock()
	if ok {
		c.kick()
	}
	return ok
}

// flush has what is queued written: on the calling goroutine when alone (it
// is the connection's only call in flight, or reply being served) and nobody
// is writing, else by the writer. Alone, writing at once saves the hand-off
// to the writer and its yield; with others in flight the writer's yield
// gathers their frames into one write (see write).
func (c *conn) flush(alone bool) {
	if !alone || c.writeOut(1) {
		c.kick()
	}
}

// kick wakes the writer.
func (c *conn) kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// queueLocked appends a frame for the next write; false if the connection
// ended or too much is queued already (the writer then fails it).
func (c *conn) queueLocked(kind byte, id uint64, payload []byte) bool {
	if c.err != nil {
		return false
	}
	if len(c.buf)+frameHeader+len(payload) > maxQueued {
		c.overflow = true // the writer fails the connection (fail takes c.mu)
		c.kick()
		return false
	}
	var h [frameHeader]byte
	binary.BigEndian.PutUint32(h[0:4], uint32(1+8+len(payload)))
	h[4] = kind
	binary.BigEndian.PutUint64(h[5:], id)
	c.buf = append(append(c.buf, h[:]...), payload...)
	return true
}

// request queues a request frame and returns its call id and where its result
// will come.
func (c *conn) request(payload []byte) (uint64, chan callResult, error) {
	p := &pendingCall{done: make(chan callResult, 1), sent: time.Now()}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, nil, err
	}
	c.next++
	id := c.next
	if !c.queueLocked(frameRequest, id, payload) {
		c.mu.Unlock()
		return 0, nil, errors.New("the connection ended")
	}
	c.calls[id] = p
	alone := len(c.calls) == 1
	c.mu.Unlock()
	c.flush(alone)
	return id, p.done, nil
}

// forget drops a call its caller gave up; its reply, if one comes, is dropped.
func (c *conn) forget(id uint64) {
	c.mu.Lock()
	delete(c.calls, id)
	c.mu.Unlock()
}

// settle delivers a call's result, once: false if the call was not waiting.
func (c *conn) settle(id uint64, res callResult) bool {
	c.mu.Lock()
	p, ok := c.calls[id]
	delete(c.calls, id)
	c.mu.Unlock()
	if ok {
		p.done <- res
	}
	return ok
}

// reply queues the reply of call id (nil: none, a test's lost reply) and then
// marks it not running, in that order (the probe's answer relies on it).
func (c *conn) reply(id uint64, payload []byte) {
	c.mu.Lock()
	if payload != nil {
		c.queueLocked(frameReply, id, payload)
	}
	delete(c.running, id)
	alone := len(c.running) == 0
	c.mu.Unlock()
	c.flush(alone)
}

// probe sends a probe naming the calls that waited probeAfter, unless one is
// in flight; one in flight for probeTimeout fails the connection.
func (c *conn) probe(now time.Time) {
	c.mu.Lock()
	if c.err != nil || c.nc == nil {
		c.mu.Unlock()
		return
	}
	if c.probeID != 0 {
		late := now.Sub(c.probeSent) > probeTimeout
		c.mu.Unlock()
		if late {
			c.fail(errors.New("it does not answer a probe"))
		}
		return
	}
	var ids []byte
	for id, p := range c.calls {
		if now.Sub(p.sent) >= probeAfter {
			ids = binary.BigEndian.AppendUint64(ids, id)
			if len(ids) >= 8*maxProbeCalls {
				break
			}
		}
	}
	if len(ids) > 0 {
		c.next++
		c.probeID, c.probeSent = c.next, now
		c.queueLocked(frameProbe, c.probeID, ids)
		c.kick()
	}
	c.mu.Unlock()
}

// probed takes a probe's answer: the calls it names that still wait lost
// their reply or their request.
func (c *conn) probed(id uint64, payload []byte) error {
	c.mu.Lock()
	if id != c.probeID {
		c.mu.Unlock()
		return fmt.Errorf("the answer of probe %d, which was not asked", id)
	}
	c.probeID = 0
	c.mu.Unlock()
	for ; len(payload) >= 8; payload = payload[8:] {
		c.settle(binary.BigEndian.Uint64(payload), callResult{err: errors.New("it is not running the request; the reply was lost or the request never arrived")})
	}
	return nil
}

// answerProbe queues the answer of a probe: those of its calls not running.
func (c *conn) answerProbe(id uint64, payload []byte) {
	var idle []byte
	c.mu.Lock()
	for ; len(payload) >= 8; payload = payload[8:] {
		if _, ok := c.running[binary.BigEndian.Uint64(payload)]; !ok {
			idle = append(idle, payload[:8]...)
		}
	}
	c.queueLocked(frameProbeReply, id, idle)
	c.kick()
	c.mu.Unlock()
}

// read takes the connection's frames until it ends.
func (c *conn) read() {
	br := bufio.NewReaderSize(c.nc, readBuffer)
	if !c.out {
		// The dialling side's preamble first; one that does not come in
		// time, or differs, is not a member.
		_ = c.nc.SetReadDeadline(time.Now().Add(dialTimeout))
		got := make([]byte, len(preamble))
		if _, err := io.ReadFull(br, got); err != nil || string(got) != string(preamble) {
			c.t.log.Warn("a connection to the cluster port is not from a member of this version; closed", "from", c.addr, "err", err)
			c.fail(errors.New("bad preamble"))
			return
		}
		_ = c.nc.SetReadDeadline(time.Time{})
	}
	var h [frameHeader]byte
	for {
		if _, err := io.ReadFull(br, h[:]); err != nil {
			c.fail(readErr(err))
			return
		}
		n := int(binary.BigEndian.Uint32(h[0:4])) - 9
		kind, id := h[4], binary.BigEndian.Uint64(h[5:])
		if n < 0 || n > maxWireMessage+1<<20 {
			c.fail(fmt.Errorf("a frame of %d bytes", n))
			return
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(br, payload); err != nil {
			c.fail(readErr(err))
			return
		}
		var err error
		switch {
		case c.out && kind == frameReply:
			c.settle(id, callResult{data: payload})
		case c.out && kind == frameProbeReply:
			err = c.probed(id, payload)
		case !c.out && kind == frameRequest:
			c.mu.Lock()
			c.running[id] = struct{}{}
			c.mu.Unlock()
			c.t.serveRequest(c, id, payload)
		case !c.out && kind == frameProbe:
			c.answerProbe(id, payload)
		case !c.out && kind == frameSend:
			var w wireRequest
			if derr := decodeRequest(payload, &w); derr != nil {
				c.t.log.Error("cannot decode a message from another node", "err", derr)
				continue
			}
			c.t.feed(&w)
		default:
			err = fmt.Errorf("unexpected frame kind %d", kind)
		}
		if err != nil {
			c.t.log.Warn("a connection between members broke its protocol; closed", "peer", c.addr, "err", err)
			c.fail(err)
			return
		}
	}
}

func readErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("the connection was closed")
	}
	return err
}

// write is the connection's writer: woken when frames are queued, it writes
// them (writeOut) until the connection ends (or, draining, has nothing left
// to write).
func (c *conn) write() {
	for {
		select {
		case <-c.wake:
		case <-c.closed:
			return
		}
		// One yield first: the goroutines that are about to queue a frame
		// (callers, a server's replies) get to, and their frames share this
		// write. A write on loopback costs about 10 µs here (the receiver's
		// TCP processing runs in it); the yield took BenchmarkTransport_Call
		// from 15 to 9.7 µs per call, more yields did no better.
		runtime.Gosched()
		c.writeOut(-1)
		c.mu.Lock()
		overflow, drained := c.overflow, c.draining && len(c.buf) == 0 && !c.writing
		c.mu.Unlock()
		if overflow {
			c.fail(fmt.Errorf("more than %d MiB queued for the member: it does not keep up", maxQueued>>20))
			return
		}
		if drained {
			c.fail(errStopped)
			return
		}
	}
}

// writeOut writes what is queued, all of it in one write, unless someone is
// writing already; then again what was queued meanwhile, at most rounds
// writes in all (negative: until nothing is queued). It reports whether
// frames are left for the writer.
func (c *conn) writeOut(rounds int) (left bool) {
	c.mu.Lock()
	for ; rounds != 0; rounds-- {
		if c.writing || len(c.buf) == 0 || c.err != nil || c.nc == nil || c.overflow {
			c.mu.Unlock()
			return false
		}
		b := c.buf
		c.buf, c.spare, c.writing = c.spare[:0], nil, true
		c.mu.Unlock()
		_ = c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
		_, err := c.nc.Write(b)
		if err != nil {
			c.fail(fmt.Errorf("write: %w", err))
		}
		c.mu.Lock()
		c.writing = false
		if cap(b) <= keepBuffer && c.err == nil {
			c.spare = b[:0]
		}
		if err != nil {
			c.mu.Unlock()
			return false
		}
	}
	left = len(c.buf) > 0
	c.mu.Unlock()
	return left
}

// drain makes the writer close the connection once what is queued is written.
func (c *conn) drain() {
	c.mu.Lock()
	c.draining = true
	dialled := c.nc != nil
	c.mu.Unlock()
	if !dialled {
		c.fail(errStopped)
		return
	}
	c.kick()
}
