package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/valyala/fasthttp"
)

// The routes the Front serves on fasthttp (front.go): an object's state and
// a slot's reads and writes, the REST calls of a KV object's every request.
// Each is the mux's route of the same pattern, run by the same code
// (slotWrite's builders, withIdempotencyKey, toAPIError, writeJSON,
// appendWriteResult) behind fastWriter; serveFast does what serveHTTP does
// around a handler (request id, bodies in flight, the served-by header,
// metrics). Everything else stays on the mux.

// fastRoute is one route served on fasthttp.
type fastRoute struct {
	pattern           string // the mux's pattern of the route
	method, route     string // its metric labels
	behaviour         string
	body              bool // the route reads a body
	serve             func(s *Server, w *fastWriter, c *fastCall)
	slotted, withVerb bool // its path: .../{key}/{slot}, .../{key}/{slot}/{verb}
	verb              string
}

// fastCall is a request on a fast route: its object, slot and body.
type fastCall struct {
	ctx  context.Context
	req  *fasthttp.RequestCtx
	id   actors.ObjectID
	slot string
	body []byte
	idem *string // the Idempotency-Key, nil when none
}

// failFast writes err's reply and logs it as fail does on the mux.
func (s *Server) failFast(w *fastWriter, c *fastCall, err error) {
	path := string(c.req.Request.Header.RequestURI())
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	s.failAt(w, w.id, string(c.req.Request.Header.Method()), path, err)
}

const objectsPrefix = "/api/v1/objects/"

var fastRoutes = func() []*fastRoute {
	slotWriter := func(sw slotWrite) func(*Server, *fastWriter, *fastCall) {
		return func(s *Server, w *fastWriter, c *fastCall) {
			if e := checkText(c.body); e != nil {
				e.write(w)
				return
			}
			fields, e := parseFields(c.body, sw.emptyOK)
			if e != nil {
				e.write(w)
				return
			}
			m, e := sw.build(c.slot, fields)
			if e != nil {
				e.write(w)
				return
			}
			s.fastWrite(w, c, m)
		}
	}
	rs := []*fastRoute{
		{pattern: "GET " + objectBase, serve: func(s *Server, w *fastWriter, c *fastCall) {
			if reply, ok := s.fastRequest(w, c, actors.KVGet{}); ok {
				writeJSON(w, http.StatusOK, reply.(*actors.KVState))
			}
		}},
		{pattern: "GET " + objectBase + "/{slot}", slotted: true, serve: func(s *Server, w *fastWriter, c *fastCall) {
			if reply, ok := s.fastRequest(w, c, actors.KVGetSlot{Slot: c.slot}); ok {
				writeJSON(w, http.StatusOK, map[string]json.RawMessage{"value": reply.(json.RawMessage)})
			}
		}},
		{pattern: "PUT " + objectBase + "/{slot}", slotted: true, body: true, serve: slotWriter(setWrite)},
		{pattern: "DELETE " + objectBase + "/{slot}", slotted: true, serve: func(s *Server, w *fastWriter, c *fastCall) {
			m, _ := deleteWrite.build(c.slot, nil)
			s.fastWrite(w, c, m)
		}},
		{pattern: "POST " + objectBase + "/{slot}/increment", slotted: true, withVerb: true, verb: "increment", body: true,
			serve: slotWriter(incrementWrite)},
		{pattern: "POST " + objectBase + "/{slot}/append", slotted: true, withVerb: true, verb: "append", body: true,
			serve: slotWriter(appendWrite)},
	}
	for _, r := range rs {
		r.method, r.route = metricLabels(r.pattern, "")
		r.behaviour = behaviourOf(r.pattern)
	}
	return rs
}()

// slotLiterals are the fixed names the mux's patterns have where a fast
// route has its slot (as "GET log", "POST events"), per method: a request
// whose slot is one of them goes to the mux, which may route it elsewhere.
func slotLiterals(patterns []string) map[string]bool {
	lits := map[string]bool{}
	for _, p := range patterns {
		method, path, _ := strings.Cut(p, " ")
		rest, ok := strings.CutPrefix(path, objectBase+"/")
		if !ok {
			continue
		}
		seg, _, _ := strings.Cut(rest, "/")
		if !strings.Contains(seg, "{") {
			lits[method+" "+seg] = true
		}
	}
	return lits
}

// fastRouteOf returns the fast route of a plain request (see Front) and its
// path's segments (app, type, key, slot), or false.
func (s *Server) fastRouteOf(ctx *fasthttp.RequestCtx) (*fastRoute, [4]string, bool) {
	var segs [4]string
	h := &ctx.Request.Header
	// -1 is chunked; -2 is no length, i.e. no body (a GET's, as a rule).
	if n := h.ContentLength(); n == -1 || n > fastBodyMax || h.Peek("Upgrade") != nil {
		return nil, segs, false // chunked, large, or an upgrade
	}
	uri := h.RequestURI()
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		uri = uri[:i]
	}
	rest, ok := bytes.CutPrefix(uri, []byte(objectsPrefix))
	if !ok {
		return nil, segs, false
	}
	var parts [5][]byte
	n := 0
	for {
		seg, tail, more := bytes.Cut(rest, []byte("/"))
		if n == len(parts) || !plainSegment(seg) {
			return nil, segs, false
		}
		parts[n] = seg
		n++
		if !more {
			break
		}
		rest = tail
	}
	method := h.Method()
	for _, r := range fastRoutes {
		want := 3
		if r.slotted {
			want = 4
		}
		if r.withVerb {
			want = 5
		}
		if n != want || r.method != string(method) || r.withVerb && string(parts[4]) != r.verb {
			continue
		}
		if r.slotted {
			var kb [128]byte
			key := append(append(append(kb[:0], method...), ' '), parts[3]...)
			if s.slotLits[string(key)] {
				return nil, segs, false
			}
		}
		for i := range min(n, 4) {
			segs[i] = string(parts[i])
		}
		return r, segs, true
	}
	return nil, segs, false
}

// plainSegment reports whether a raw path segment is one the mux takes as
// it is: not empty, not a dot segment, and of printable ASCII without '%'
// (nothing to decode; anything else goes to net/http, which decodes,
// refuses or redirects it as it always did).
func plainSegment(seg []byte) bool {
	if len(seg) == 0 || string(seg) == "." || string(seg) == ".." {
		return false
	}
	for _, c := range seg {
		if c <= ' ' || c >= 0x7f || c == '%' {
			return false
		}
	}
	return true
}

// serveFast serves a request on a fast route as serveHTTP and the route's
// mux handler would.
func (s *Server) serveFast(ctx *fasthttp.RequestCtx, r *fastRoute, segs [4]string) {
	var start time.Time
	if s.cfg.Metrics != nil {
		start = time.Now()
	}
	h := &ctx.Request.Header
	w := newFastWriter(ctx, randomHex(8))
	c := &fastCall{ctx: s.deadlines.context(), req: ctx, slot: segs[3]}
	var served func() actors.Served
	if s.cfg.ServedHeader {
		c.ctx, served = actors.WithServedRecord(c.ctx)
	}
	s.serveFastCall(w, h, r, c, segs)
	if served != nil {
		if sv := served(); sv.Epoch != 0 {
			ctx.Response.Header.Set("X-Holdfast-Served-By", servedBy(sv))
		}
	}
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if m := s.cfg.Metrics; m != nil {
		m.Request(r.behaviour, r.method, r.route, ctx.Response.StatusCode(), time.Since(start))
	}
}

func (s *Server) serveFastCall(w *fastWriter, h *fasthttp.RequestHeader, r *fastRoute, c *fastCall, segs [4]string) {
	// A body's bytes count against MaxBodyBytesInFlight as on the mux (a
	// fast route's body is at most 8 KiB, below refuseBodyFrom: a write the
	// node refuses is refused by the node).
	if n := int64(h.ContentLength()); r.body && n > 0 {
		if !s.admitBody(n) {
			s.failFast(w, c, errBodiesInFlight)
			return
		}
		defer s.bodies.Add(-n)
	}
	app, ok := s.cfg.Apps.Authenticate(string(h.Peek("X-App-Key")), string(h.Peek("X-App-Secret")))
	if !ok || segs[0] != app.ID && segs[0] != app.Key {
		writeUnauthorized(w)
		return
	}
	c.id = actors.ObjectID{App: app.ID, Type: segs[1], Key: segs[2]}
	if n := h.ContentLength(); r.body && n > 0 {
		b, err := prefetched(w.ctx, n)
		if err != nil {
			badRequest("cannot read the request body").write(w)
			return
		}
		c.body = b
	}
	if vals := h.PeekAll("Idempotency-Key"); len(vals) > 0 {
		k := string(vals[0])
		c.idem = &k
	}
	r.serve(s, w, c)
}

// prefetched returns the first n bytes of the request's body, which fasthttp
// read with its header (at most fastBodyMax: its streaming prefetch). They
// come from the body stream, which gives them before it reads the
// connection (the Front always streams bodies).
func prefetched(ctx *fasthttp.RequestCtx, n int) ([]byte, error) {
	b := make([]byte, n)
	_, err := io.ReadFull(ctx.RequestBodyStream(), b)
	return b, err
}

// fastRequest sends msg to the call's object and writes an error reply if it
// fails (as call does on the mux). The call's context carries its deadline
// already (sharedDeadline).
func (s *Server) fastRequest(w *fastWriter, c *fastCall, msg any) (any, bool) {
	reply, err := s.cfg.Node.Request(c.ctx, c.id, msg)
	if err != nil {
		s.failFast(w, c, err)
		return nil, false
	}
	return reply, true
}

// fastWrite runs a KV write and writes its reply (as writeKV does).
func (s *Server) fastWrite(w *fastWriter, c *fastCall, m *actors.KVWrite) {
	if e := withIdempotencyKey(m, c.idem); e != nil {
		e.write(w)
		return
	}
	reply, ok := s.fastRequest(w, c, m)
	if !ok {
		return
	}
	var a [64]byte
	b := append(appendWriteResult(a[:0], reply.(*actors.WriteResult)), '\n')
	w.ctx.Response.Header.SetContentType("application/json")
	w.WriteHeader(http.StatusOK)
	w.ctx.Response.AppendBody(b)
}

// fastWriter is an http.ResponseWriter on a fasthttp reply, so that the
// mux's writers (writeJSON, apiError.write) serve the fast routes too. The
// request's id (X-Request-Id) is in its header from the start, as on the
// mux; the header map is made only when a writer asks for it.
type fastWriter struct {
	ctx   *fasthttp.RequestCtx
	id    string
	h     http.Header
	wrote bool
}

var _ http.ResponseWriter = (*fastWriter)(nil)

func newFastWriter(ctx *fasthttp.RequestCtx, id string) *fastWriter {
	return &fastWriter{ctx: ctx, id: id}
}

func (w *fastWriter) Header() http.Header {
	if w.h == nil {
		w.h = http.Header{"X-Request-Id": {w.id}}
	}
	return w.h
}

func (w *fastWriter) WriteHeader(code int) {
	if w.wrote {
		return
	}
	w.wrote = true
	w.ctx.SetStatusCode(code)
	if w.h == nil {
		w.ctx.Response.Header.Set("X-Request-Id", w.id)
		return
	}
	for k, vs := range w.h {
		for i, v := range vs {
			if i == 0 {
				w.ctx.Response.Header.Set(k, v)
			} else {
				w.ctx.Response.Header.Add(k, v)
			}
		}
	}
}

func (w *fastWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	w.ctx.Response.AppendBody(b)
	return len(b), nil
}

// sharedDeadline gives the fast routes' requests their RequestTimeout: one
// context for all the requests that start within the same second, which ends
// RequestTimeout after that second's end, so a request waits RequestTimeout
// to a second more. A context and its timer per request were 3.4% of a REST
// increment's server CPU (context.WithTimeout, bench/holdfast-http/
// increments-256); a fast route's request has no other reason for one (no
// client disconnect ends it, unlike net/http's).
type sharedDeadline struct {
	timeout time.Duration
	cur     atomic.Pointer[secondDeadline]
}

type secondDeadline struct {
	sec    int64 // the second (Unix time) whose requests it serves
	ctx    context.Context
	cancel context.CancelFunc // never called: the context ends at its deadline
}

// context returns the context of a request that starts now.
func (d *sharedDeadline) context() context.Context {
	sec := time.Now().Unix()
	if c := d.cur.Load(); c != nil && c.sec == sec {
		return c.ctx
	}
	// Two requests may make this second's context at once: both end at the
	// same deadline, and the one not kept serves the request that made it.
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(sec+1, 0).Add(d.timeout))
	d.cur.Store(&secondDeadline{sec: sec, ctx: ctx, cancel: cancel})
	return ctx
}
