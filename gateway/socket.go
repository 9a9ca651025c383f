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
// which the objects deliver without blocking (actors.Subscriber).
//
// Every frame owed to a socket counts against Config.SocketBuffer: replies, the
// join's replay and snapshot, live events, and the live events a channel holds
// while it catches up. What is owed behind the frame being written stays within
// the buffer, so that one frame larger than the whole buffer (a snapshot of a
// big object) still goes out, alone. A live event or a reply that would go over
// closes the socket (slow consumer, counted), and its client resumes with
// after_log_id. The replay and the snapshot never do: a channel produces them
// itself (pump), fetching each replay page from the object only once the queue
// has drained below half the buffer and queueing it once it fits.

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

	mu    sync.Mutex
	queue []frame
	// queued is the bytes owed to the client: frames queued or being written,
	// and live events held by channels that catch up (channel.stash).
	queued int
	// head is the size of the frame being written, or next to be: the buffer
	// bounds what is owed behind it.
	head     int
	closed   bool          // nothing more is queued
	writing  bool          // a drain goroutine is running
	drained  chan struct{} // if not nil, closed when queued goes down or the socket closes
	shutOnce sync.Once

	// Only the reader goroutine touches chans.
	chans map[string]*channel
	// nchans is len(chans), for the metrics (read from other goroutines).
	nchans atomic.Int32
}

// socketStats are counters for tests.
type socketStats struct {
	peakQueued  atomic.Int64 // the most bytes any socket owed behind its head frame
	replayPages atomic.Int64 // replay pages fetched from objects
	stashed     atomic.Int64 // live events held while their channel caught up
}

// fits reports whether n more bytes may be owed: nothing is owed, or what is
// owed behind the head frame stays within the buffer. mu is held.
func (sk *socket) fits(n int) bool {
	return sk.queued == 0 || sk.queued-sk.head+n <= sk.srv.cfg.SocketBuffer
}

// notePeak records what is owed behind the head frame, for tests. mu is held.
func (sk *socket) notePeak() {
	n := int64(sk.queued - sk.head)
	for p := &sk.srv.sockStats.peakQueued; ; {
		old := p.Load()
		if n <= old || p.CompareAndSwap(old, n) {
			return
		}
	}
}

// enqueue adds f to the queue. A frame that does not fit closes the socket
// instead (slow consumer).
func (sk *socket) enqueue(f frame) {
	sk.mu.Lock()
	if sk.closed {
		sk.mu.Unlock()
		return
	}
	if !sk.fits(f.size()) {
		sk.mu.Unlock()
		sk.overflow()
		return
	}
	sk.queued += f.size()
	start := sk.push(f)
	sk.mu.Unlock()
	sk.startWriter(start)
}

// offer queues frames, all or none: only if they fit now. It reports whether
// they were queued, and false for closed once the socket is closed.
func (sk *socket) offer(frames []frame) (ok, closed bool) {
	n := 0
	for i := range frames {
		n += frames[i].size()
	}
	sk.mu.Lock()
	if sk.closed {
		sk.mu.Unlock()
		return false, true
	}
	if !sk.fits(n) {
		sk.mu.Unlock()
		return false, false
	}
	sk.queued += n
	start := false
	for _, f := range frames {
		start = sk.push(f) || start
	}
	sk.mu.Unlock()
	sk.startWriter(start)
	return true, false
}

// charge counts n bytes held outside the queue (a channel's stash); if they do
// not fit it closes the socket and returns false.
func (sk *socket) charge(n int) bool {
	sk.mu.Lock()
	if sk.closed {
		sk.mu.Unlock()
		return false
	}
	if !sk.fits(n) {
		sk.mu.Unlock()
		sk.overflow()
		return false
	}
	sk.queued += n
	sk.notePeak()
	sk.mu.Unlock()
	return true
}

// settle queues frames whose bytes were charged already, and releases drop
// charged bytes that will not be sent.
func (sk *socket) settle(frames []frame, drop int) {
	sk.mu.Lock()
	if sk.closed {
		sk.mu.Unlock()
		return
	}
	sk.queued -= drop
	start := false
	for _, f := range frames {
		start = sk.push(f) || start
	}
	sk.signal()
	sk.mu.Unlock()
	sk.startWriter(start)
}

// push appends f, counted already, and reports whether a writer must start. mu
// is held.
func (sk *socket) push(f frame) bool {
	if !sk.writing {
		sk.head = f.size() // the queue was empty: f is written next
	}
	sk.queue = append(sk.queue, f)
	sk.notePeak()
	start := !sk.writing
	sk.writing = true
	return start
}

func (sk *socket) startWriter(start bool) {
	if start {
		// A writer runs only while there is something to send: an idle socket
		// keeps no writer goroutine (and no stack).
		if !sk.srv.owned.Go(func(context.Context) { sk.drain() }) {
			sk.shut(websocket.StatusGoingAway, "the server is shutting down")
		}
	}
}

// overflow closes a socket that is owed more than its buffer.
func (sk *socket) overflow() {
	sk.srv.log.Warn("closing a slow websocket: its outgoing buffer is full", "socket_id", sk.id, "buffer_bytes", sk.srv.cfg.SocketBuffer)
	if m := sk.srv.cfg.Metrics; m != nil {
		m.SlowSocketClosed()
	}
	sk.shut(closeSlowConsumer, "slow consumer: outgoing buffer full; rejoin with after_log_id")
}

// signal wakes the goroutines waiting for the queue to go down. mu is held.
func (sk *socket) signal() {
	if sk.drained != nil {
		close(sk.drained)
		sk.drained = nil
	}
}

// waitUntil waits until cond (called with mu held) holds, and reports false if
// the socket closed or ctx ended first.
func (sk *socket) waitUntil(ctx context.Context, cond func() bool) bool {
	for {
		sk.mu.Lock()
		if sk.closed {
			sk.mu.Unlock()
			return false
		}
		if cond() {
			sk.mu.Unlock()
			return true
		}
		if sk.drained == nil {
			sk.drained = make(chan struct{})
		}
		c := sk.drained
		sk.mu.Unlock()
		select {
		case <-c:
		case <-ctx.Done():
			return false
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
		sk.signal()
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
			sk.mu.Lock()
			sk.queued -= batch[i].size()
			switch {
			case i+1 < len(batch):
				sk.head = batch[i+1].size()
			case len(sk.queue) > 0:
				sk.head = sk.queue[0].size()
			default:
				sk.head = 0
			}
			sk.signal()
			sk.mu.Unlock()
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
	ch := newChannel(sk, m, id, after)
	sk.replaceChannel(m.topic, ch)
	// The object is asked for no replay: the channel pages it itself (pump).
	ctx, cancel := context.WithTimeout(sk.ctx, sk.srv.cfg.RequestTimeout)
	v, err := sk.srv.cfg.Node.Request(ctx, id, actors.KVSubscribe{Sub: ch})
	cancel()
	if err != nil {
		delete(sk.chans, m.topic)
		sk.nchans.Store(int32(len(sk.chans)))
		sk.leave(ch)
		sk.replyError(m, userMessage(err))
		return
	}
	// The object sends the join reply (EventJoined) and the snapshot; with
	// after_log_id the channel replays first and fetches its own snapshot.
	if after != nil {
		sub := v.(*actors.Subscribed)
		ch.startPump(sub.LogID, sub.Oldest)
	}
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
	ch.drop()
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
//
// A durable channel starts catching up: it owes the client the join reply, the
// replay after after_log_id (if any), then the snapshot, then the live events.
// It subscribes at the object's log_id M (the Subscribed reply) without a
// replay, so the object sends only the join reply, a snapshot at M and live
// events after M. Until the channel has queued its snapshot, live events wait
// in its stash, charged against the socket's buffer. Without after_log_id the
// object's snapshot is queued as it arrives if it fits; if not, or with
// after_log_id, the pump replays (after, M] page by page, then fetches a fresh
// snapshot at some M2 >= M, queues it, and then the stashed events after M2,
// dropping those up to M2 (the snapshot holds them). So the client sees every
// log_id after its resume point once, in order: as a replay item up to M, in
// the snapshot up to M2, as a live event after M2. (Every write after M lists
// the channel among its receivers, and the object delivers its event before it
// answers a later request, so the stash holds every event after M that the
// snapshot does not.)
type channel struct {
	sk      *socket
	topic   string
	joinRef json.RawMessage
	ref     json.RawMessage // the join's ref: the join reply echoes it
	id      actors.ObjectID // zero for the "socket" topic
	after   *uint64         // the join's after_log_id
	// ctx ends when the channel is left or the socket closes: it stops the pump.
	ctx    context.Context
	cancel context.CancelFunc
	joined chan struct{} // closed at EventJoined: the join reply is queued

	mu       sync.Mutex
	gone     bool      // left, replaced or lost: deliver nothing more
	heads    [2][]byte // frame heads of "change" and "batch", made once
	catching bool      // the snapshot is not queued yet: live events wait in stash
	pumping  bool      // the pump runs (or ran)
	stash    []stashed
	stashed  int // bytes of stash, charged to the socket
	// snapAt is the log_id of the snapshot the pump queued (0: the object's
	// own, at the subscription's log_id). A live event at or below it is in
	// the snapshot and is dropped even when it arrives after the catch-up: the
	// object hands a write's event to its subscribers when the write is
	// durable, and the reply to the pump's KVGet that already saw the write
	// can be released first (seen in CI: "live change with log_id 1160, want
	// 1161 (snapshot at 1160)").
	snapAt uint64
}

// stashed is a live event held while its channel catches up.
type stashed struct {
	f     frame
	logID uint64 // 0 for an event without one (run:*)
}

func newChannel(sk *socket, m inMsg, id actors.ObjectID, after *uint64) *channel {
	ctx, cancel := context.WithCancel(sk.ctx)
	return &channel{sk: sk, topic: m.topic, joinRef: m.joinRef, ref: m.ref, id: id, after: after,
		ctx: ctx, cancel: cancel, joined: make(chan struct{}), catching: true}
}

// drop ends the channel: nothing more is delivered, the pump stops, and the
// stash's bytes are released. It reports whether the channel was still live.
func (ch *channel) drop() bool {
	ch.mu.Lock()
	first := !ch.gone
	ch.gone = true
	n := ch.stashed
	ch.stash, ch.stashed = nil, 0
	ch.mu.Unlock()
	if ch.cancel != nil {
		ch.cancel()
	}
	if n > 0 {
		ch.sk.settle(nil, n)
	}
	return first
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
		if ch.joined != nil {
			close(ch.joined)
			ch.joined = nil
		}
	case actors.EventLive:
		var f frame
		if i := liveHeadIndex(ev.Name); i >= 0 {
			if ch.heads[i] == nil {
				ch.heads[i] = head(ch.joinRef, jsonNull, ch.topic, ev.Name)
			}
			f = frame{head: ch.heads[i], body: ev.Payload}
		} else {
			f = frame{head: head(ch.joinRef, jsonNull, ch.topic, ev.Name), body: ev.Payload}
		}
		if !ch.catching {
			if ev.LogID != 0 && ev.LogID <= ch.snapAt {
				return // the snapshot has it
			}
			sk.enqueue(f)
			return
		}
		if sk.charge(f.size()) {
			ch.stash = append(ch.stash, stashed{f: f, logID: ev.LogID})
			ch.stashed += f.size()
			sk.srv.sockStats.stashed.Add(1)
		}
	case actors.EventSnapshot:
		if !ch.catching || ch.after != nil {
			return // the pump fetches the snapshot after the replay
		}
		f := frame{head: head(ch.joinRef, jsonNull, ch.topic, ev.Name), body: ev.Payload}
		if ok, _ := sk.offer([]frame{f}); ok {
			// The snapshot is at the subscription's log_id: live events
			// come after it, and none came before it.
			ch.catching = false
			ch.settleStash(0)
			return
		}
		// Too big to queue now: fetch one later, when it fits.
		ch.startPumpLocked(0, 0)
	default: // replay, log_truncated: not asked for, passed on as they come
		sk.enqueue(frame{head: head(ch.joinRef, jsonNull, ch.topic, ev.Name), body: ev.Payload})
	}
}

// settleStash ends the catch-up: it queues the stashed events after snap and
// releases the others. mu is held.
func (ch *channel) settleStash(snap uint64) {
	var keep []frame
	drop := 0
	for _, s := range ch.stash {
		if s.logID != 0 && s.logID <= snap {
			drop += s.f.size()
			continue
		}
		keep = append(keep, s.f)
	}
	ch.stash, ch.stashed = nil, 0
	ch.catching = false
	ch.snapAt = snap
	if len(keep) > 0 || drop > 0 {
		ch.sk.settle(keep, drop)
	}
}

// Lost implements actors.Subscriber: the object's activation failed. phx_error
// makes the client join again (phoenix.js does so with its params function, so
// it resumes after the last log_id it saw).
func (ch *channel) Lost(error) {
	if !ch.drop() {
		return
	}
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
