package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/internal/owner"
)

// MaxBodyBytes bounds a request body (spec/README.md); larger bodies get 413.
const MaxBodyBytes = 8 << 20

// Node is what the gateway needs of a Holdfast node.
type Node interface {
	actors.Requester
	// Ready reports whether the node serves requests (started, not closing,
	// storage working).
	Ready() bool
	// StorageHealth reports the node's storage: fatal is non-nil once it failed
	// in a way only a restart repairs; unavailable is non-nil while it cannot
	// take writes, for whatever reason (fatal included). Neither text reaches a
	// client.
	StorageHealth() (fatal, unavailable error)
}

// Config configures a Server.
type Config struct {
	Node Node
	Apps *Apps
	// RequestTimeout bounds how long a request waits for its object; zero means 30s.
	RequestTimeout time.Duration
	// SocketBuffer bounds the bytes of frames owed to one websocket (replies,
	// replay pages, snapshots, live events) behind the one being written; a
	// socket whose live events or replies would go over it is closed. Zero means
	// 8 MiB.
	SocketBuffer int
	// SocketIdleTimeout closes a websocket that sent nothing (not even a
	// heartbeat) for this long. Zero means 60s.
	SocketIdleTimeout time.Duration
	// Logger is the gateway's logger; nil means slog.Default().
	Logger *slog.Logger
	// Metrics, if set, observes every request; MetricsHandler, if set, serves
	// GET /metrics.
	Metrics        Metrics
	MetricsHandler http.Handler
	// ServedHeader adds X-Holdfast-Served-By: node/partition/epoch to every
	// reply an object gave, for the cluster's ownership tests. Off in production.
	ServedHeader bool
	// BodyTimeout bounds the time from a request's arrival to the end of its
	// body (a client that stops sending holds a connection and a goroutine no
	// longer); zero means 60s. Once the body is read the connection has no
	// read deadline, so long polls and slow objects are not cut off, and
	// websockets (hijacked) have none either.
	BodyTimeout time.Duration
	// MaxBodyBytesInFlight bounds the bytes of the write bodies of the
	// requests being served at once (by Content-Length; a body of unknown
	// length counts as MaxBodyBytes). A write that would pass it gets 503 with
	// retryAfterMs before its body is read; one request is always taken.
	// Zero means 256 MiB. Each body lives in several copies while its write is
	// decoded, applied and committed: the node's memory budget does not see
	// it until it is there (serve sets an eighth of the budget).
	MaxBodyBytesInFlight int64
}

// maxIdleBatchWorkers bounds the batch workers kept idle: one batch of 1,000
// operations on 1,000 objects uses 1,000.
const maxIdleBatchWorkers = 1024

// Metrics is what the gateway reports to the node's metrics.
type Metrics interface {
	// Request observes one request: its behaviour, method, route (the path
	// pattern, without the method), status and time.
	Request(behaviour, method, route string, code int, d time.Duration)
	// SlowSocketClosed counts a websocket closed for falling behind.
	SlowSocketClosed()
}

// Server is the HTTP API of one node.
type Server struct {
	cfg   Config
	log   *slog.Logger
	mux   *http.ServeMux
	clock atomic.Pointer[func() time.Time] // of token expiry; a test may replace it
	hub   *hub                             // the open websockets
	// bodies is the bytes of write bodies being served (MaxBodyBytesInFlight).
	bodies atomic.Int64
	// deadlines are the fast routes' request contexts (fastroutes.go).
	deadlines sharedDeadline
	// owned owns the websockets' goroutines (socket.go): readers, writers,
	// closes and unsubscribes. Close stops and waits for them.
	owned *owner.Group
	// workers runs the operations of batches (batch.go) on reused
	// goroutines, owned by owned.
	workers *owner.Pool
	// sockStats are the websockets' counters that tests read (socket.go).
	sockStats socketStats
	// patterns are the mux's patterns, in the order handle registered them:
	// the routes served, which openapi_test.go holds docs/openapi.yaml to.
	// Written by New only.
	patterns []string
	// slotLits are the patterns' fixed names where a fast route has its
	// slot (fastroutes.go). Written by New only.
	slotLits map[string]bool
}

// New returns a server; serve it with Handler.
func New(cfg Config) *Server {
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.SocketBuffer <= 0 {
		cfg.SocketBuffer = 8 << 20
	}
	if cfg.SocketIdleTimeout <= 0 {
		cfg.SocketIdleTimeout = 60 * time.Second
	}
	if cfg.MaxBodyBytesInFlight <= 0 {
		cfg.MaxBodyBytesInFlight = 256 << 20
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = 60 * time.Second
	}
	s := &Server{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(), hub: newHub(), owned: owner.New(nil)}
	s.deadlines.timeout = cfg.RequestTimeout
	s.workers = owner.NewPool(s.owned, maxIdleBatchWorkers)
	s.routes()
	s.slotLits = slotLiterals(s.patterns)
	return s
}

func (s *Server) routes() {
	s.handle("GET /healthz", s.healthz)
	s.handle("GET /readyz", s.readyz)
	s.objectRoutes()
	s.logRoutes()
	s.alarmRoutes()
	s.queueRoutes()
	s.batchRoutes()
	s.listRoutes()
	s.handle("POST /api/v1/tokens/{app}", s.mintToken)
	s.handle("GET /socket/websocket", s.serveSocket)
	if s.cfg.MetricsHandler != nil {
		s.handle("GET /metrics", s.cfg.MetricsHandler.ServeHTTP)
	}
}

// handle registers h on the mux for pattern and records the pattern: every
// route goes through it, so that patterns lists them all.
func (s *Server) handle(pattern string, h http.HandlerFunc) {
	s.patterns = append(s.patterns, pattern)
	s.mux.HandleFunc(pattern, h)
}

// healthz answers 503 only when the node can be repaired by a restart alone
// (its storage failed: a restart replays the log); anything that passes on its
// own (starting, a handoff, a transient storage outage) is 200, so that a
// supervisor does not restart a node that would recover.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	if fatal, _ := s.cfg.Node.StorageHealth(); fatal != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "failed",
			"error": "the node's storage failed; only a restart repairs it", "code": "unavailable"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz answers 503 with the cause while the node cannot take writes.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	fatal, unavailable := s.cfg.Node.StorageHealth()
	var msg string
	switch {
	case fatal != nil:
		msg = "the node's storage failed; only a restart repairs it"
	case unavailable != nil:
		msg = "the node's storage is temporarily unavailable"
	case !s.cfg.Node.Ready():
		msg = "the node is not ready: starting or shutting down"
	default:
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
		return
	}
	writeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": msg, "code": "unavailable"})
}

// now is the clock of token expiry: time.Now unless a test set another.
func (s *Server) now() time.Time {
	if f := s.clock.Load(); f != nil {
		return (*f)()
	}
	return time.Now()
}

// Handler returns the server's root handler.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

type ctxKey int

const requestIDKey ctxKey = 0

func requestID(r *http.Request) string {
	id, _ := r.Context().Value(requestIDKey).(string)
	return id
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	// A body must arrive within BodyTimeout. net/http lifts the deadline when
	// the body reaches its end (it then watches the connection for a close
	// without one), and readBody does too. A request without a body gets none:
	// net/http is already watching its connection, and the deadline would
	// cancel a slow handler. On the raw writer: net/http's own, before any wrapper.
	if r.Body != nil && r.Body != http.NoBody {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
	}
	id := randomHex(8)
	w.Header().Set("X-Request-Id", id)
	r = r.WithContext(context.WithValue(r.Context(), requestIDKey, id))
	if s.refusesBody(r) {
		// Before the body is read: reading it only to refuse it would add
		// to the memory the node is short of (bench/overload: 240 writers of
		// 1 MiB bodies held 240 MiB of a 384 MiB budget). net/http closes the
		// connection when the unread rest is large.
		s.fail(w, r, errWritesRefused)
		return
	}
	if n := bodySize(r); n > 0 {
		if !s.admitBody(n) {
			s.fail(w, r, errBodiesInFlight)
			return
		}
		defer s.bodies.Add(-n)
	}
	if s.cfg.ServedHeader && r.URL.Path != "/socket/websocket" {
		ctx, served := actors.WithServedRecord(r.Context())
		r = r.WithContext(ctx)
		w = &servedWriter{ResponseWriter: w, served: served}
	}
	// Checked as sent and as decoded: %2F or %2E can make an empty or dot segment.
	bad := badSegment(r.URL.EscapedPath())
	if bad == "" {
		bad = badSegment(r.URL.Path)
	}
	if bad != "" {
		// The mux would redirect to a cleaned path, i.e. to another object.
		badRequest("the path has " + bad + " segment").write(w)
		return
	}
	h, pattern := s.mux.Handler(r)
	if m := s.cfg.Metrics; m != nil && pattern != "GET /socket/websocket" {
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		w = sw
		start := time.Now()
		method, route := metricLabels(pattern, r.Method)
		defer func() { m.Request(behaviourOf(pattern), method, route, sw.code, time.Since(start)) }()
	}
	if pattern == "" {
		s.unmatched(w, r, h)
		return
	}
	s.mux.ServeHTTP(w, r) // sets the path values that Handler does not

}

// badSegment describes the first empty, "." or ".." segment of an escaped path
// (a trailing slash is fine), or returns "".
func badSegment(p string) string {
	// Segment by segment without splitting: this runs on every request (its
	// strings.Split was 2% of a REST increment's server CPU).
	p = strings.TrimPrefix(p, "/")
	for {
		seg, rest, more := strings.Cut(p, "/")
		switch {
		case seg == "" && more:
			return "an empty"
		case seg == "." || seg == "..":
			return "a dot"
		}
		if !more {
			return ""
		}
		p = rest
	}
}

// unmatched turns the mux's plain-text 404 and 405 into spec/errors.md bodies,
// keeping the Allow header of a 405.
func (s *Server) unmatched(w http.ResponseWriter, r *http.Request, h http.Handler) {
	rec := &recorder{header: http.Header{}, code: http.StatusOK}
	h.ServeHTTP(rec, r)
	switch rec.code {
	case http.StatusMethodNotAllowed:
		w.Header().Set("Allow", rec.header.Get("Allow"))
		(&apiError{status: http.StatusMethodNotAllowed, body: errBody("method "+r.Method+" is not allowed here", "method_not_allowed")}).write(w)
	case http.StatusNotFound:
		notFound("no route for " + r.Method + " " + r.URL.Path).write(w)
	default:
		// The mux redirects to a cleaned path when a segment decodes to something
		// empty or dotted (such as %2F or %2E): never follow it to another object.
		badRequest("the path has an empty or dot segment once decoded").write(w)
	}
}

// authApp authenticates r and checks that the path's app is the authenticated
// app (by ID or App Key). It writes the 401 itself and returns nil on failure.
func (s *Server) authApp(w http.ResponseWriter, r *http.Request) *App {
	app, ok := s.cfg.Apps.Authenticate(r.Header.Get("X-App-Key"), r.Header.Get("X-App-Secret"))
	if !ok {
		writeUnauthorized(w)
		return nil
	}
	if p := r.PathValue("app"); p != app.ID && p != app.Key {
		writeUnauthorized(w)
		return nil
	}
	return app
}

// writeRefuser is what a Node that can refuse writes for now offers
// (cluster.Node: over its memory budget, or its storage short of a resource).
type writeRefuser interface{ RefusesWrites() bool }

// refuseBodyFrom is the smallest body (by Content-Length; a body of unknown
// length counts as large) that refusesBody refuses unread: small writes are
// cheap to read, and the node's own refusal says more (a delete, an ack).
const refuseBodyFrom = 64 << 10

// errWritesRefused is the refusal of a write the gateway did not read.
var errWritesRefused = &actors.Error{Kind: actors.KindUnavailable,
	Msg: "the node is over its memory budget or short of storage and refuses writes for now; retry", RetryAfter: time.Second}

// errBodiesInFlight refuses a write whose body would pass
// MaxBodyBytesInFlight.
var errBodiesInFlight = &actors.Error{Kind: actors.KindUnavailable,
	Msg: "the node is serving as many write bodies as it holds at once; retry", RetryAfter: 500 * time.Millisecond}

// bodySize is the bytes r's body counts against MaxBodyBytesInFlight: its
// length for a write (POST, PUT, PATCH) with a body, MaxBodyBytes when the
// length is unknown, else 0.
func bodySize(r *http.Request) int64 {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
	default:
		return 0
	}
	switch {
	case r.Body == nil || r.Body == http.NoBody:
		return 0
	case r.ContentLength < 0:
		return MaxBodyBytes
	}
	return min(r.ContentLength, MaxBodyBytes)
}

// admitBody counts a write body of n bytes against MaxBodyBytesInFlight, or
// reports false (counting nothing) when it would pass it; one body is always
// taken. The caller takes n off s.bodies once the request is served.
func (s *Server) admitBody(n int64) bool {
	if in := s.bodies.Add(n); in > s.cfg.MaxBodyBytesInFlight && in != n {
		s.bodies.Add(-n)
		return false
	}
	return true
}

// refusesBody reports whether r is a write with a large body that the node
// refuses now, so that it is answered before its body is read.
func (s *Server) refusesBody(r *http.Request) bool {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
	default:
		return false
	}
	if r.Body == nil || r.Body == http.NoBody || (r.ContentLength >= 0 && r.ContentLength < refuseBodyFrom) {
		return false
	}
	wr, ok := s.cfg.Node.(writeRefuser)
	return ok && wr.RefusesWrites()
}

// readBody reads the whole body, at most MaxBodyBytes, then lifts the read
// deadline serveHTTP set (BodyTimeout): what the handler does next (a long
// poll, a slow object) is bounded by its own timeouts. (net/http lifts it at
// the body's end already; this does not depend on that.) Every body is JSON:
// one that is not Unicode text is refused here (checkText), for every route.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			return nil, tooLarge("the request body is over 8 MiB")
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, badRequest("the request body did not arrive in time")
		}
		return nil, badRequest("cannot read the request body")
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	if e := checkText(b); e != nil {
		return nil, e
	}
	return b, nil
}

// call sends msg to the object and writes an error reply if it fails.
func (s *Server) call(w http.ResponseWriter, r *http.Request, id actors.ObjectID, msg any) (any, bool) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	reply, err := s.cfg.Node.Request(ctx, id, msg)
	if err != nil {
		s.fail(w, r, err)
		return nil, false
	}
	return reply, true
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	s.failAt(w, requestID(r), r.Method, r.URL.Path, err)
}

// failAt writes err's reply to the request (its id, method and path) and
// logs what an operator needs to see.
func (s *Server) failAt(w http.ResponseWriter, requestID, method, path string, err error) {
	e := toAPIError(err, requestID)
	switch {
	case e.status >= 500 && e.body["retryAfterMs"] != nil:
		// A refusal the client is told to retry (overload, a resource short
		// for now): the node logs the cause itself, once, when its state
		// changes; one line per refused request would flood the log (9,217
		// lines in 60 s of the overload run).
		s.log.Debug("request refused", "request_id", requestID, "method", method, "path", path, "status", e.status, "err", err)
	case e.status >= 500:
		s.log.Error("request failed", "request_id", requestID, "method", method, "path", path, "status", e.status, "err", err)
	}
	e.write(w)
}

// trimSlash lets the base route be written with or without a trailing slash.
func trimSlash(p string) string { return strings.TrimSuffix(p, "/") }

// recorder keeps the status and headers of the mux's own 404 and 405 replies.
type recorder struct {
	header http.Header
	code   int
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *recorder) WriteHeader(code int)        { r.code = code }

// servedWriter adds the X-Holdfast-Served-By header as the reply starts.
type servedWriter struct {
	http.ResponseWriter
	served  func() actors.Served
	written bool
}

func (w *servedWriter) WriteHeader(code int) {
	if !w.written {
		w.written = true
		if s := w.served(); s.Epoch != 0 {
			w.Header().Set("X-Holdfast-Served-By", servedBy(s))
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *servedWriter) Write(b []byte) (int, error) {
	if !w.written {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (websockets).
func (w *servedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// servedBy is the X-Holdfast-Served-By header's value: node/partition/epoch.
func servedBy(s actors.Served) string {
	return fmt.Sprintf("%s/%d/%d", s.Node, s.Partition, s.Epoch)
}

// statusWriter remembers the status of a reply, for the metrics.
type statusWriter struct {
	http.ResponseWriter
	code    int
	written bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.written {
		w.code, w.written = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.written = true
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// metricLabels splits a route pattern ("PUT /api/v1/...") into the method
// and route labels of the request metrics. A request no pattern matched is
// route "unmatched"; its method label is the request's when it is one of
// HTTP's, else "other" (a client must not grow the series without bound).
func metricLabels(pattern, method string) (string, string) {
	if m, route, ok := strings.Cut(pattern, " "); ok {
		return m, route
	}
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
	default:
		method = "other"
	}
	if pattern == "" {
		return method, "unmatched"
	}
	return method, pattern
}

// behaviourOf names the behaviour a route pattern serves (a metrics label).
func behaviourOf(pattern string) string {
	_, path, _ := strings.Cut(pattern, " ")
	switch {
	case strings.HasPrefix(path, "/api/v1/objects/"):
		if strings.Contains(path, "/alarms") {
			return "alarms"
		}
		return "kv"
	case strings.HasPrefix(path, "/api/v1/logs/"):
		return "log"
	case strings.HasPrefix(path, "/api/v1/queues/"):
		return "queue"
	case strings.HasPrefix(path, "/api/v1/batch/"):
		return "batch"
	case strings.HasPrefix(path, "/api/v1/tokens/"):
		return "tokens"
	case strings.HasPrefix(path, "/api/v1/admin/"):
		return "admin"
	case path == "":
		return "none"
	}
	return "node"
}
