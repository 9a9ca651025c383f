package gateway

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/holdfast/holdfast/actors"
)

// The live feed: Phoenix Channels v2 over a websocket (spec/objects.md, "Channel").
//
// Each socket has one reader goroutine, which handles the client's frames (joins,
// leaves, heartbeats, refused pushes) one at a time, and one writer goroutine,
// which sends the socket's outgoing queue in order. Everything the socket sends
// goes through that queue: replies from the reader, and the objects' events,
// which the objects deliver without blocking (actors.Subscriber). The live events
// queued on a socket are bounded by Config.SocketBuffer; a socket that falls
// behind that far is closed, and its client resumes with after_log_id.

const (
	maxChannelsPerSocket = 100
	maxSocketFrame       = 1 << 20 // bytes of one client frame
	socketWriteTimeout   = 10 * time.Second
	// closeSlowConsumer is the close status of a socket whose queue overflowed:
	// 1013 "try again later".
	closeSlowConsumer = websocket.StatusTryAgainLater
)

// hub tracks the open sockets, so that Close can end them.
type hub struct {
	mu      sync.Mutex
	sockets map[*socket]struct{}
	closed  bool
}

func newHub() *hub { return &hub{sockets: map[*socket]struct{}{}} }

func (h *hub) add(s *socket) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.sockets[s] = struct{}{}
	return true
}

func (h *hub) remove(s *socket) {
	h.mu.Lock()
	delete(h.sockets, s)
	h.mu.Unlock()
}

// Sockets returns the number of open websockets.
func (s *Server) Sockets() int {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	return len(s.hub.sockets)
}

// Subscriptions returns the number of channels joined on the open websockets.
func (s *Server) Subscriptions() int {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	n := 0
	for sk := range s.hub.sockets {
		n += int(sk.nchans.Load())
	}
	return n
}

// Close closes every websocket (status 1001, going away) and refuses new ones,
// and waits for their goroutines. Call it when the node stops, after the HTTP
// server stopped accepting, and before the node closes.
func (s *Server) Close() {
	s.hub.mu.Lock()
	s.hub.closed = true
	socks := make([]*socket, 0, len(s.hub.sockets))
	for sk := range s.hub.sockets {
		socks = append(socks, sk)
	}
	s.hub.mu.Unlock()
	for _, sk := range socks {
		sk.shut(websocket.StatusGoingAway, "the server is shutting down")
	}
	for _, sk := range socks {
		<-sk.done
	}
	// What the readers left running: close handshakes (bounded by the
	// websocket library), writers of closed sockets, and unsubscribes, which
	// the group's context cancels.
	_ = s.owned.Close(context.Background())
}

// serveSocket serves GET /socket/websocket?app_key=...&vsn=2.0.0.
func (s *Server) serveSocket(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if vsn := q.Get("vsn"); !strings.HasPrefix(vsn, "2.") {
		(&apiError{status: http.StatusForbidden, body: errBody("vsn must be 2.x (Phoenix Channels v2 JSON frames)", "forbidden")}).write(w)
		return
	}
	app, ok := s.cfg.Apps.ByKey(q.Get("app_key"))
	if !ok {
		(&apiError{status: http.StatusForbidden, body: errBody("unknown app_key", "forbidden")}).write(w)
		return
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		Subprotocols: []string{"phoenix"},
		// Channels authenticate with the App Secret or a capability token in the
		// join, never with cookies: pages of any origin may connect.
		InsecureSkipVerify: true,
	})
	if err != nil {
		return // Accept wrote the error reply
	}
	conn.SetReadLimit(maxSocketFrame)
	ctx, cancel := context.WithCancel(context.Background())
	sk := &socket{
		srv: s, id: randomHex(12), app: app, conn: conn, ctx: ctx, cancel: cancel,
		done:  make(chan struct{}),
		chans: map[string]*channel{},
	}
	if !s.hub.add(sk) {
		conn.Close(websocket.StatusGoingAway, "the server is shutting down")
		return
	}
	// The handler returns: the hijacked connection lives on in the reader, whose
	// fresh goroutine starts with a small stack (the handler's has grown in
	// net/http's request parsing, and idle sockets would keep it).
	if !s.owned.Go(func(context.Context) { sk.readLoop() }) {
		// Close is past waiting for its sockets: not a socket after all.
		sk.shut(websocket.StatusGoingAway, "the server is shutting down")
		s.hub.remove(sk)
		close(sk.done)
	}
}

// frame is one queued text frame: head, then body (shared between sockets, never
// changed), then "]".
type frame struct {
	head []byte
	body []byte
	live bool // a live event: counts against the socket's buffer
}

func (f *frame) size() int { return len(f.head) + len(f.body) + 1 }

type socket struct {
	srv    *Server
	id     string
	app    *App
	conn   *websocket.Conn
	ctx    context.Context // ends when the socket closes
	cancel context.CancelFunc
	done   chan struct{} // closed when the reader and writer are gone

	mu       sync.Mutex
	queue    []frame
	queued   int  // bytes of live frames queued or being written
	closed   bool // nothing more is queued
	writing  bool // a drain goroutine is running
	shutOnce sync.Once

	// Only the reader goroutine touches chans.
	chans map[string]*channel
	// nchans is len(chans), for the metrics (read from other goroutines).
	nchans atomic.Int32
}

// enqueue adds f to the queue. A live frame that would take the socket's queued
// live bytes over the buffer closes the socket instead.
func (sk *socket) enqueue(f frame) {
	sk.mu.Lock()
	if sk.closed {
		sk.mu.Unlock()
		return
	}
	if f.live {
		// One frame is always accepted: a change larger than the whole buffer
		// must not close every subscriber.
		if sk.queued > 0 && sk.queued+f.size() > sk.srv.cfg.SocketBuffer {
			sk.mu.Unlock()
			sk.srv.log.Warn("closing a slow websocket: its outgoing buffer is full", "socket_id", sk.id, "buffer_bytes", sk.srv.cfg.SocketBuffer)
			if m := sk.srv.cfg.Metrics; m != nil {
				m.SlowSocketClosed()
			}
			sk.shut(closeSlowConsumer, "slow consumer: outgoing buffer full; rejoin with after_log_id")
			return
		}
		sk.queued += f.size()
	}
	sk.queue = append(sk.queue, f)
	start := !sk.writing
	sk.writing = true
	sk.mu.Unlock()
	if start {
		// A writer runs only while there is something to send: an idle socket
		// keeps no writer goroutine (and no stack).
		if !sk.srv.owned.Go(func(context.Context) { sk.drain() }) {
			sk.shut(websocket.StatusGoingAway, "the server is shutting down")
		}
	}
}

// shut closes the socket with code and reason, dropping whatever is queued. Safe
// from any goroutine, more than once.
func (sk *socket) shut(code websocket.StatusCode, reason string) {
	sk.shutOnce.Do(func() {
		sk.mu.Lock()
		sk.closed = true
		sk.queue = nil
		sk.mu.Unlock()
		sk.cancel()
		// Close waits for the client's close frame (up to 5s): not on the caller's
		// goroutine, which may be an object's turn or the commit pipeline. (A
		// Read or Write whose ctx ends would drop the connection without the close
		// frame, so they never get sk.ctx.)
		if !sk.srv.owned.Go(func(context.Context) { _ = sk.conn.Close(code, reason) }) {
			_ = sk.conn.CloseNow()
		}
	})
}

// drain sends the queue in order until it is empty, then exits.
func (sk *socket) drain() {
	var batch []frame
	for {
		sk.mu.Lock()
		if len(sk.queue) == 0 || sk.closed {
			sk.writing = false
			sk.queue = nil // an idle socket keeps no queue memory
			sk.mu.Unlock()
			return
		}
		batch, sk.queue = sk.queue, batch[:0]
		sk.mu.Unlock()
		for i := range batch {
			if err := sk.write(&batch[i]); err != nil {
				sk.shut(websocket.StatusInternalError, "write failed")
				return
			}
			if batch[i].live {
				sk.mu.Lock()
				sk.queued -= batch[i].size()
				sk.mu.Unlock()
			}
			batch[i] = frame{}
		}
	}
}

func (sk *socket) write(f *frame) error {
	ctx, cancel := context.WithTimeout(context.Background(), socketWriteTimeout)
	defer cancel()
	w, err := sk.conn.Writer(ctx, websocket.MessageText)
	if err != nil {
		return err
	}
	if _, err := w.Write(f.head); err != nil {
		return err
	}
	if _, err := w.Write(f.body); err != nil {
		return err
	}
	if _, err := w.Write([]byte{']'}); err != nil {
		return err
	}
	return w.Close()
}

// readLoop handles the client's frames until the socket closes, then leaves
// every channel.
func (sk *socket) readLoop() {
	defer func() {
		sk.shut(websocket.StatusNormalClosure, "")
		for _, ch := range sk.chans {
			sk.leave(ch)
		}
		sk.srv.hub.remove(sk)
		close(sk.done)
	}()
	timeout := sk.srv.cfg.SocketIdleTimeout
	idle := time.AfterFunc(timeout, func() {
		sk.shut(websocket.StatusPolicyViolation, "no message for "+timeout.String())
	})
	defer idle.Stop()
	for {
		typ, data, err := sk.conn.Read(context.Background())
		if err != nil {
			return
		}
		idle.Reset(timeout)
		if typ == websocket.MessageBinary {
			sk.binaryPush(data)
			continue
		}
		sk.handle(data)
	}
}

// inMsg is a client frame [join_ref, ref, topic, event, payload]. Refs are kept
// as sent (a JSON string or null) and echoed exactly.
type inMsg struct {
	joinRef json.RawMessage
	ref     json.RawMessage
	topic   string
	event   string
	payload json.RawMessage
}

var jsonNull = json.RawMessage("null")

func parseFrame(data []byte) (inMsg, bool) {
	var parts []json.RawMessage
	if err := json.Unmarshal(data, &parts); err != nil || len(parts) != 5 {
		return inMsg{}, false
	}
	m := inMsg{joinRef: parts[0], ref: parts[1], payload: parts[4]}
	if !isRef(m.joinRef) || !isRef(m.ref) {
		return inMsg{}, false
	}
	if json.Unmarshal(parts[2], &m.topic) != nil || json.Unmarshal(parts[3], &m.event) != nil {
		return inMsg{}, false
	}
	return m, true
}

// isRef reports whether b is a JSON string or null.
func isRef(b json.RawMessage) bool {
	if bytes.Equal(b, jsonNull) {
		return true
	}
	var s string
	return json.Unmarshal(b, &s) == nil
}

// head encodes `[joinRef,ref,"topic","event",` (refs are JSON already).
func head(joinRef, ref json.RawMessage, topic, event string) []byte {
	b := make([]byte, 0, len(joinRef)+len(ref)+len(topic)+len(event)+16)
	b = append(b, '[')
	b = append(b, joinRef...)
	b = append(b, ',')
	b = append(b, ref...)
	b = append(b, ',')
	b = appendString(b, topic)
	b = append(b, ',')
	b = appendString(b, event)
	return append(b, ',')
}

func appendString(b []byte, s string) []byte {
	q, _ := json.Marshal(s)
	return append(b, q...)
}

// reply queues a phx_reply to (joinRef, ref, topic).
func (sk *socket) reply(joinRef, ref json.RawMessage, topic, status string, response any) {
	body, _ := json.Marshal(map[string]any{"status": status, "response": response})
	sk.enqueue(frame{head: head(joinRef, ref, topic, "phx_reply"), body: body})
}

func (sk *socket) replyError(m inMsg, reason string) {
	sk.reply(m.joinRef, m.ref, m.topic, "error", map[string]string{"reason": reason})
}

func (sk *socket) handle(data []byte) {
	m, ok := parseFrame(data)
	if !ok {
		sk.srv.log.Debug("ignoring a malformed websocket frame", "socket_id", sk.id)
		return
	}
	switch {
	case m.topic == "phoenix" && m.event == "heartbeat":
		sk.reply(jsonNull, m.ref, "phoenix", "ok", struct{}{})
	case m.event == "phx_join":
		sk.join(m)
	case m.event == "phx_leave":
		if ch := sk.chans[m.topic]; ch != nil {
			delete(sk.chans, m.topic)
			sk.nchans.Store(int32(len(sk.chans)))
			sk.leave(ch)
		}
		sk.reply(m.joinRef, m.ref, m.topic, "ok", struct{}{})
		sk.enqueue(frame{head: head(m.joinRef, m.joinRef, m.topic, "phx_close"), body: []byte("{}")})
	case sk.chans[m.topic] != nil:
		sk.replyError(m, "read-only channel")
	default:
		sk.replyError(m, "unmatched topic")
	}
}

// binaryPush answers a Phoenix binary push (kind 0: join_ref, ref, topic and
// event sizes, the four strings, then the payload): channels are read-only.
func (sk *socket) binaryPush(data []byte) {
	if len(data) < 5 || data[0] != 0 {
		return
	}
	n := 5 + int(data[1]) + int(data[2]) + int(data[3]) + int(data[4])
	if len(data) < n {
		return
	}
	p := data[5:]
	joinRef, p := string(p[:data[1]]), p[data[1]:]
	ref, p := string(p[:data[2]]), p[data[2]:]
	topic := string(p[:data[3]])
	jr, _ := json.Marshal(joinRef)
	rf, _ := json.Marshal(ref)
	reason := "read-only channel"
	if sk.chans[topic] == nil {
		reason = "unmatched topic"
	}
	sk.reply(jr, rf, topic, "error", map[string]string{"reason": reason})
}

// joinParams are a durable join's parameters.
type joinParams struct {
	Auth       *string         `json:"auth"`
	AppSecret  *string         `json:"app_secret"`
	AfterLogID json.RawMessage `json:"after_log_id"`
}

func (sk *socket) join(m inMsg) {
	if m.topic == "socket" {
		if sk.chans[m.topic] == nil && len(sk.chans) >= maxChannelsPerSocket {
			sk.replyError(m, "too many channels joined")
			return
		}
		sk.replaceChannel(m.topic, &channel{sk: sk, topic: m.topic, joinRef: m.joinRef})
		sk.reply(m.joinRef, m.ref, m.topic, "ok", map[string]string{"socket_id": sk.id})
		return
	}
	rest, ok := strings.CutPrefix(m.topic, "durable:")
	if !ok {
		sk.replyError(m, "unmatched topic")
		return
	}
	parts := strings.SplitN(rest, ":", 3)
	if len(parts) != 3 || parts[0] != sk.app.Key {
		sk.replyError(m, "invalid topic format")
		return
	}
	id := actors.ObjectID{App: sk.app.ID, Type: parts[1], Key: parts[2]}
	if actors.ValidateID(id) != nil {
		sk.replyError(m, "invalid topic format")
		return
	}
	if sk.chans[m.topic] == nil && len(sk.chans) >= maxChannelsPerSocket {
		sk.replyError(m, "too many channels joined")
		return
	}
	var p joinParams
	if len(m.payload) > 0 && !bytes.Equal(m.payload, jsonNull) {
		if err := json.Unmarshal(m.payload, &p); err != nil {
			sk.replyError(m, "invalid join parameters")
			return
		}
	}
	if reason := sk.authorize(p, id); reason != "" {
		sk.replyError(m, reason)
		return
	}
	var after *uint64
	if len(p.AfterLogID) > 0 && !bytes.Equal(p.AfterLogID, jsonNull) {
		n, err := strconv.ParseUint(string(p.AfterLogID), 10, 64)
		if err != nil {
			sk.replyError(m, "after_log_id must be a non-negative integer")
			return
		}
		after = &n
	}
	// A second join of a topic closes the first. The new channel is in chans
	// before it subscribes, so that a socket closing meanwhile unsubscribes it.
	ch := &channel{sk: sk, topic: m.topic, joinRef: m.joinRef, ref: m.ref, id: id}
	sk.replaceChannel(m.topic, ch)
	ctx, cancel := context.WithTimeout(sk.ctx, sk.srv.cfg.RequestTimeout)
	_, err := sk.srv.cfg.Node.Request(ctx, id, actors.KVSubscribe{Sub: ch, After: after})
	cancel()
	if err != nil {
		delete(sk.chans, m.topic)
		sk.nchans.Store(int32(len(sk.chans)))
		sk.leave(ch)
		sk.replyError(m, userMessage(err))
	}
	// On success the object sends the join reply, then the replay and the snapshot.
}

// replaceChannel ends the channel joined on topic, if any (sending phx_close on
// its join_ref), and installs ch (nil: none).
func (sk *socket) replaceChannel(topic string, ch *channel) {
	if old := sk.chans[topic]; old != nil {
		delete(sk.chans, topic)
		sk.leave(old)
		sk.enqueue(frame{head: head(old.joinRef, old.joinRef, topic, "phx_close"), body: []byte("{}")})
	}
	if ch != nil {
		sk.chans[topic] = ch
	}
	sk.nchans.Store(int32(len(sk.chans)))
}

// authorize checks a durable join's credentials and returns the refusal reason,
// or "" if the join may proceed.
func (sk *socket) authorize(p joinParams, id actors.ObjectID) string {
	switch {
	case p.Auth == nil && p.AppSecret == nil:
		return "auth required for durable object channels"
	case p.Auth != nil && p.AppSecret != nil:
		return "exactly one of auth or app_secret is required"
	case p.AppSecret != nil:
		if subtle.ConstantTimeCompare([]byte(*p.AppSecret), []byte(sk.app.Secret)) != 1 {
			return "invalid app_secret"
		}
		return ""
	}
	caps, err := sk.srv.verifyToken(sk.app, sk.id, *p.Auth)
	if err != nil {
		return "invalid token"
	}
	if !grants(caps, id.Type, id.Key) {
		return "forbidden: missing object:read:" + id.Type + "/" + id.Key
	}
	return ""
}

// leave unsubscribes ch from its object, if it is a durable channel.
func (sk *socket) leave(ch *channel) {
	ch.mu.Lock()
	ch.gone = true
	ch.mu.Unlock()
	if ch.id.App == "" {
		return
	}
	// Best effort and off the reader's path: an object that cannot be reached
	// (or the server closed) drops the subscriber when its next delivery finds
	// the socket closed.
	sk.srv.owned.Go(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, sk.srv.cfg.RequestTimeout)
		defer cancel()
		_, _ = sk.srv.cfg.Node.Request(ctx, ch.id, actors.KVUnsubscribe{Sub: ch})
	})
}

// channel is one joined topic of a socket; as an actors.Subscriber it turns the
// object's events into frames.
type channel struct {
	sk      *socket
	topic   string
	joinRef json.RawMessage
	ref     json.RawMessage // the join's ref: the join reply echoes it
	id      actors.ObjectID // zero for the "socket" topic

	mu    sync.Mutex
	gone  bool      // left, replaced or lost: deliver nothing more
	heads [2][]byte // frame heads of "change" and "batch", made once
}

// Deliver implements actors.Subscriber.
func (ch *channel) Deliver(ev actors.Event) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.gone {
		return
	}
	sk := ch.sk
	switch ev.Kind {
	case actors.EventJoined:
		body, _ := json.Marshal(map[string]any{"status": "ok", "response": map[string]string{"socket_id": sk.id}})
		sk.enqueue(frame{head: head(ch.joinRef, ch.ref, ch.topic, "phx_reply"), body: body})
	case actors.EventLive:
		if i := liveHeadIndex(ev.Name); i >= 0 {
			if ch.heads[i] == nil {
				ch.heads[i] = head(ch.joinRef, jsonNull, ch.topic, ev.Name)
			}
			sk.enqueue(frame{head: ch.heads[i], body: ev.Payload, live: true})
			return
		}
		sk.enqueue(frame{head: head(ch.joinRef, jsonNull, ch.topic, ev.Name), body: ev.Payload, live: true})
	default: // replay, log_truncated, snapshot
		sk.enqueue(frame{head: head(ch.joinRef, jsonNull, ch.topic, ev.Name), body: ev.Payload})
	}
}

// Lost implements actors.Subscriber: the object's activation failed. phx_error
// makes the client join again (phoenix.js does so with its params function, so
// it resumes after the last log_id it saw).
func (ch *channel) Lost(error) {
	ch.mu.Lock()
	if ch.gone {
		ch.mu.Unlock()
		return
	}
	ch.gone = true
	ch.mu.Unlock()
	ch.sk.enqueue(frame{head: head(ch.joinRef, ch.joinRef, ch.topic, "phx_error"), body: []byte("{}")})
}

func liveHeadIndex(name string) int {
	switch name {
	case "change":
		return 0
	case "batch":
		return 1
	}
	return -1
}
