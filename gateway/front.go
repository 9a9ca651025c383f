package gateway

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/holdfast/holdfast/internal/owner"
	"github.com/valyala/fasthttp"
)

// Front serves a Server on a listener with two HTTP/1.1 servers.
//
// net/http costs 29 µs of CPU per request on this machine before the gateway
// does anything (docs/benchmarks.md, "the floor under a REST request"), a
// third of a REST increment; fasthttp answers the same request for 19 µs. So
// fasthttp reads every request of a connection, and serves the hot routes of
// the objects (fastRoutes: a slot's reads and writes, an object's state)
// itself, with the same code as the mux's routes behind a thin adapter; every
// other request hands its connection to net/http, which serves the request
// (replayed byte for byte: request line, header, the body's first bytes) and
// the connection's later requests, with the mux and its handlers unchanged.
// A connection that opens with a websocket upgrade (GET /socket/...) goes to
// net/http before fasthttp reads anything, so that a websocket never holds a
// fasthttp read buffer.
//
// Invariants:
//   - A request answered on fasthttp is one the mux would route to the same
//     pattern (fastroutes_test.go holds the two to it); anything else, and
//     any request that is not plain (a body not wholly read with the header,
//     an upgrade, a path that needs decoding or cleaning), goes to net/http.
//   - A connection moves from fasthttp to net/http at most once, at a request
//     boundary, with nothing of it answered twice: fasthttp wrote nothing for
//     the handed-off request and read nothing after its first body bytes.
//   - Every goroutine here is owned: the sniffers and the two servers' Serve
//     by the Front's group (owned), which Shutdown and Close stop and wait
//     for; the accept loop is Serve's caller's, and ends when they close the
//     listener. The servers' own goroutines end with their Shutdown.
type Front struct {
	s    *Server
	log  *slog.Logger
	fast *fasthttp.Server
	slow *http.Server
	// fastConns and slowConns are the listeners the two servers serve: the
	// accept loop (new connections) and hand-offs (fasthttp's hijacks) feed
	// them.
	fastConns, slowConns *connQueue
	headerTimeout        time.Duration
	ref                  *frontRef
	// served and handedOff count the requests served on fasthttp and those
	// handed to net/http (tests read them).
	served, handedOff atomic.Int64

	owned *owner.Group // the sniffers and the two servers' Serve

	mu sync.Mutex
	ln net.Listener
	// conns are the open connections accepted, whichever server has them:
	// Close closes them (fasthttp's Shutdown closes only the idle ones).
	conns map[*frontConn]struct{}
}

// MaxHeaderBytes bounds a request's line and header fields on the Front: it
// is fasthttp's read buffer (431 past it), which a connection keeps for its
// whole life (with streamed bodies fasthttp cannot give it back between
// requests), and so is kept small: 16 KiB is Node.js's limit, twice nginx's
// and Tomcat's defaults (net/http allows 1 MiB; its buffer is 4 KiB and
// grows). A connection that opens with a websocket upgrade never gets one.
const MaxHeaderBytes = 16 << 10

// fastBodyMax is the largest body a fast route takes: fasthttp reads at most
// this much of a body with its header (its streaming prefetch), and a fast
// route needs all of it at once. Larger bodies go to net/http, which counts
// them against MaxBodyBytesInFlight before reading them.
const fastBodyMax = 8 << 10

// NewFront returns the front of s. slow is the net/http server of the
// connections handed off; its Handler, when nil, is set to s.Handler() (one
// that serves more routes must send the gateway's to s.Handler()). Its
// timeouts and error log are kept, and the Front takes its ReadHeaderTimeout
// and IdleTimeout for fasthttp too.
func NewFront(s *Server, slow *http.Server) *Front {
	if slow.Handler == nil {
		slow.Handler = s.Handler()
	}
	f := &Front{s: s, log: s.log, slow: slow, fastConns: newConnQueue(), slowConns: newConnQueue(),
		headerTimeout: slow.ReadHeaderTimeout, conns: map[*frontConn]struct{}{}, owned: owner.New(nil)}
	if f.headerTimeout <= 0 {
		f.headerTimeout = 10 * time.Second
	}
	idle := slow.IdleTimeout
	if idle <= 0 {
		idle = 90 * time.Second
	}
	// fasthttp's worker pool keeps its Server for up to 10 s after it
	// stopped (its cleaner sleeps that long); the server reaches the Front
	// only through ref, which Close clears, so that a closed Front (and its
	// node) is not kept.
	ref := &frontRef{}
	ref.f.Store(f)
	f.ref = ref
	bodyTimeout := s.cfg.BodyTimeout
	f.fast = &fasthttp.Server{
		Handler:      ref.serve,
		ErrorHandler: parseError,
		// ReadTimeout bounds the header (as net/http's ReadHeaderTimeout);
		// HeaderReceived lifts it to BodyTimeout for a request with a body.
		ReadTimeout: f.headerTimeout,
		HeaderReceived: func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
			if h.ContentLength() != 0 {
				return fasthttp.RequestConfig{ReadTimeout: bodyTimeout}
			}
			return fasthttp.RequestConfig{}
		},
		IdleTimeout:    idle,
		ReadBufferSize: MaxHeaderBytes,
		// The bound on connections is the node's (maxConnections, a
		// LimitListener under the Front), not fasthttp's default of 262,144
		// served at once, past which it would answer a plain-text 503.
		Concurrency: math.MaxInt32,
		// Bodies stream: fasthttp reads at most 8 KiB of one before the
		// handler runs, so a large body is refused (memory budget, bodies in
		// flight) by net/http before it is read, as before the Front.
		StreamRequestBody:            true,
		MaxRequestBodySize:           MaxBodyBytes,
		DisablePreParseMultipartForm: true,
		// ReduceMemoryUsage stays off: it would return the reply's 4 KiB
		// buffer to a pool between requests (the read buffer stays either
		// way, see MaxHeaderBytes) at about 1 µs a request (increments-256,
		// three runs each way: 47.3-48.5 against 49.0-49.6 µs).
		// A handed-off connection stays open: net/http owns it from then on.
		KeepHijackedConns:     true,
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		CloseOnShutdown:       true,
		// What fasthttp logs is a client's doing (a malformed request, a
		// connection dropped mid-request; each already answered or closed):
		// debug, as net/http logs none of it, so that a client cannot fill
		// the node's log.
		Logger: slog.NewLogLogger(f.log.Handler(), slog.LevelDebug),
	}
	return f
}

// Serve accepts connections on ln until Shutdown or Close; it returns
// http.ErrServerClosed then, or the listener's error.
func (f *Front) Serve(ln net.Listener) error {
	// ln is set before the servers start, and stopAccepting stops the group
	// before it reads ln: either the group refuses them here, or ln is closed.
	f.mu.Lock()
	f.ln = ln
	f.fastConns.addr, f.slowConns.addr = ln.Addr(), ln.Addr()
	f.mu.Unlock()
	if !f.owned.Go(func(context.Context) { _ = f.fast.Serve(f.fastConns) }) || // returns once its queue closes
		!f.owned.Go(func(context.Context) { _ = f.slow.Serve(f.slowConns) }) {
		return http.ErrServerClosed
	}
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if f.owned.Context().Err() != nil {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				// As net/http: a temporary shortage (EMFILE) is waited out.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				f.log.Warn("accept failed; retrying", "err", err, "in", delay)
				time.Sleep(delay)
				continue
			}
			f.closeServers() // Close or Shutdown waits for them
			return err
		}
		delay = 0
		fc := &frontConn{Conn: c, f: f}
		// In conns before its sniffer starts: Close stops the group, then
		// closes every connection in conns.
		f.mu.Lock()
		f.conns[fc] = struct{}{}
		f.mu.Unlock()
		if !f.owned.Go(func(context.Context) { f.sniff(fc) }) {
			_ = fc.Close()
		}
	}
}

// websocketPrefix opens every websocket upgrade the gateway serves.
const websocketPrefix = "GET /socket/"

// sniff reads the first bytes of a new connection and gives it to net/http
// when it opens with a websocket upgrade, else to fasthttp; the bytes read
// are replayed to the server that gets it.
func (f *Front) sniff(c net.Conn) {
	var buf [len(websocketPrefix)]byte
	_ = c.SetReadDeadline(time.Now().Add(f.headerTimeout))
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if !bytes.HasPrefix([]byte(websocketPrefix), buf[:n]) {
			break // decided: not a websocket
		}
		if err != nil {
			_ = c.Close() // closed or silent before its first request's line
			return
		}
	}
	_ = c.SetReadDeadline(time.Time{})
	pc := &prefixConn{Conn: c, pending: bytes.Clone(buf[:n])}
	if string(buf[:n]) == websocketPrefix {
		f.slowConns.push(pc)
		return
	}
	f.fastConns.push(pc)
}

// frontRef is fasthttp's way to its Front, until the Front is closed.
type frontRef struct{ f atomic.Pointer[Front] }

// serve serves a request, or closes its connection once the Front is closed.
func (r *frontRef) serve(ctx *fasthttp.RequestCtx) {
	if f := r.f.Load(); f != nil {
		f.serve(ctx)
		return
	}
	ctx.SetConnectionClose()
	(&apiError{status: http.StatusServiceUnavailable, body: errBody("the server is shutting down", "unavailable")}).
		write(newFastWriter(ctx, randomHex(8)))
}

// parseError answers a request fasthttp could not read, as spec/errors.md
// says (fasthttp closes the connection after it).
func parseError(ctx *fasthttp.RequestCtx, err error) {
	var e *apiError
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.As(err, &small):
		e = &apiError{status: http.StatusRequestHeaderFieldsTooLarge,
			body: errBody("the request line and header fields are larger than the server accepts", "too_large")}
	case errors.As(err, &ne) && ne.Timeout():
		// The header within the header timeout, or the body within
		// BodyTimeout (HeaderReceived): as readBody answers on net/http. (fasthttp
		// has reset the request by now, so which of the two is not known.)
		e = badRequest("the request's header or body did not arrive in time")
	default:
		e = badRequest("the request is not valid HTTP/1.1")
	}
	ctx.Response.Reset()
	e.write(newFastWriter(ctx, randomHex(8)))
}

// serve is fasthttp's handler: a fast route, or the hand-off.
func (f *Front) serve(ctx *fasthttp.RequestCtx) {
	if rt, p, ok := f.s.fastRouteOf(ctx); ok {
		f.served.Add(1)
		f.s.serveFast(ctx, rt, p)
		return
	}
	f.handedOff.Add(1)
	f.handOff(ctx)
}

// handOff gives the request's connection to net/http, the request first:
// its line and header as they came (less an Expect: 100-continue that
// fasthttp has answered already) and the body bytes fasthttp read with them;
// the rest of the connection follows from fasthttp's reader.
func (f *Front) handOff(ctx *fasthttp.RequestCtx) {
	h := &ctx.Request.Header
	head := make([]byte, 0, 64+len(h.RawHeaders())+min(max(h.ContentLength(), 0), fastBodyMax))
	head = append(head, h.Method()...)
	head = append(head, ' ')
	head = append(head, h.RequestURI()...)
	head = append(head, ' ')
	head = append(head, h.Protocol()...)
	head = append(head, "\r\n"...)
	head = appendWithoutExpect(head, h.RawHeaders(), ctx.Request.MayContinue())
	if n := h.ContentLength(); n > 0 {
		// fasthttp read min(length, 8 KiB, MaxRequestBodySize) bytes.
		body, err := prefetched(ctx, min(n, fastBodyMax, MaxBodyBytes))
		if err != nil {
			ctx.SetConnectionClose()
			badRequest("cannot read the request body").write(newFastWriter(ctx, randomHex(8)))
			return
		}
		head = append(head, body...)
	}
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) { f.slowConns.push(&prefixConn{Conn: c, pending: head}) })
}

// appendWithoutExpect appends the raw header block raw to b, less its Expect
// field when drop.
func appendWithoutExpect(b, raw []byte, drop bool) []byte {
	if !drop {
		return append(b, raw...)
	}
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line = raw[:i+1]
		}
		raw = raw[len(line):]
		if len(line) >= 7 && bytes.EqualFold(line[:7], []byte("expect:")) {
			continue
		}
		b = append(b, line...)
	}
	return b
}

// Shutdown stops accepting, lets fasthttp's connections finish their
// requests, then net/http's (http.Server.Shutdown: the websockets, which it
// does not track, are the Server's to close). ctx bounds the wait.
func (f *Front) Shutdown(ctx context.Context) error {
	f.stopAccepting()
	err := f.fast.ShutdownWithContext(ctx)
	f.fastConns.Close() // in case fasthttp's Serve had not started yet
	// fasthttp's hijacks hand off until its connections are done; a hand-off
	// after this is closed by the queue.
	if e := f.slow.Shutdown(ctx); err == nil {
		err = e
	}
	if e := f.owned.Wait(ctx); err == nil {
		err = e
	}
	if err == nil {
		f.ref.f.Store(nil)
	}
	return err
}

// Close closes the listener and every connection at once.
func (f *Front) Close() error {
	f.stopAccepting()
	f.closeServers()
	f.mu.Lock()
	conns := make([]*frontConn, 0, len(f.conns))
	for c := range f.conns {
		conns = append(conns, c)
	}
	f.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	err := f.owned.Wait(context.Background()) // all closed: nothing blocks
	f.ref.f.Store(nil)
	return err
}

// frontConn is an accepted connection, in Front.conns until closed.
type frontConn struct {
	net.Conn
	f    *Front
	once sync.Once
}

func (c *frontConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.f.mu.Lock()
		delete(c.f.conns, c)
		c.f.mu.Unlock()
	})
	return err
}

// CloseWrite passes a half-close on to the connection accepted.
func (c *frontConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// stopAccepting stops the group (no sniffer or server starts after it) and
// closes the listener, which ends Serve's accept loop.
func (f *Front) stopAccepting() {
	f.owned.Stop()
	f.mu.Lock()
	ln := f.ln
	f.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
}

func (f *Front) closeServers() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no wait: close what is open
	_ = f.fast.ShutdownWithContext(ctx)
	_ = f.slow.Close()
	f.fastConns.Close()
	f.slowConns.Close()
}

// connQueue is a listener fed by the Front: its Accept returns the
// connections pushed to it.
type connQueue struct {
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
	addr      net.Addr
}

var _ net.Listener = (*connQueue)(nil)

func newConnQueue() *connQueue {
	return &connQueue{conns: make(chan net.Conn), done: make(chan struct{})}
}

// push gives c to the server accepting from q, or closes it if q is closed.
func (q *connQueue) push(c net.Conn) {
	select {
	case q.conns <- c:
	case <-q.done:
		_ = c.Close()
	}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) Close() error {
	q.closeOnce.Do(func() { close(q.done) })
	return nil
}

func (q *connQueue) Addr() net.Addr {
	if q.addr == nil {
		return &net.TCPAddr{}
	}
	return q.addr
}

// prefixConn is a connection whose first bytes were read already: they are
// read again first.
type prefixConn struct {
	net.Conn
	pending []byte
}

var _ net.Conn = (*prefixConn)(nil)

func (c *prefixConn) Read(b []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(b, c.pending)
		c.pending = c.pending[n:]
		if len(c.pending) == 0 {
			c.pending = nil
		}
		return n, nil
	}
	return c.Conn.Read(b)
}

// CloseWrite passes the half-close net/http uses after an error reply on
// (through fasthttp's hijacked connection, to the one it wraps).
func (c *prefixConn) CloseWrite() error {
	conn := c.Conn
	if u, ok := conn.(interface{ UnsafeConn() net.Conn }); ok {
		conn = u.UnsafeConn()
	}
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
