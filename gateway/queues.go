package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/holdfast/holdfast/actors"
)

// The write-ahead queue's routes (spec/queue.md, "HTTP").
const queueBase = "/api/v1/queues/{app}/{type}/{key}"

// maxWaitMs bounds a receive's long-poll.
const maxWaitMs = 20_000

func (s *Server) queueRoutes() {
	s.handle("POST "+queueBase+"/messages", s.object(s.queueEnqueue))
	s.handle("GET "+queueBase+"/messages/{id}", s.object(func(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
		s.logSimple(actors.QueueMessageGet{ID: r.PathValue("id")})(w, r, id)
	}))
	s.handle("POST "+queueBase+"/receive", s.object(s.queueReceive))
	s.handle("POST "+queueBase+"/ack", s.object(s.queueAck))
	s.handle("POST "+queueBase+"/nack", s.object(s.queueNack))
	s.handle("POST "+queueBase+"/dead", s.object(s.queueDead))
	s.handle("GET "+queueBase+"/stats", s.object(s.logSimple(actors.QueueStatsGet{})))
	s.handle("POST "+queueBase+"/replay", s.object(s.queueReplay))
	s.handle("GET "+queueBase+"/dead-letters", s.object(s.queueDeadLetters))
	s.handle("POST "+queueBase+"/dead-letters/redrive", s.object(s.queueRedrive))
	s.handle("DELETE "+queueBase+"/dead-letters/{id}", s.object(func(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
		if _, ok := s.call(w, r, id, actors.QueueDeadLetterDelete{ID: r.PathValue("id")}); ok {
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	s.handle("GET /api/v1/admin/replay", s.adminReplay)
}

// replayer is a node that replays queues when it starts (cluster.Node).
type replayer interface {
	ReplaySummary(app string) (actors.ReplaySummary, bool)
}

// adminReplay serves GET /api/v1/admin/replay: the summary of the queue replay
// the node ran at start, of the caller's app's queues only (issue 26: an app
// never learns another's counts); 503 until it has finished.
func (s *Server) adminReplay(w http.ResponseWriter, r *http.Request) {
	app, ok := s.cfg.Apps.Authenticate(r.Header.Get("X-App-Key"), r.Header.Get("X-App-Secret"))
	if !ok {
		writeUnauthorized(w)
		return
	}
	rp, ok := s.cfg.Node.(replayer)
	if !ok {
		writeJSON(w, http.StatusOK, actors.ReplaySummary{Errors: []string{}})
		return
	}
	sum, done := rp.ReplaySummary(app.ID)
	if !done {
		retryable(http.StatusServiceUnavailable, "the replay after start is still running", "unavailable", time.Second).write(w)
		return
	}
	writeJSON(w, http.StatusOK, sum)
}

func (s *Server) queueReplay(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	var req struct {
		Topics *[]string `json:"topics"`
	}
	if !readJSON(w, r, &req, true, `empty or {"topics": ["...", ...]}`, nil) {
		return
	}
	m := actors.QueueReplay{}
	if req.Topics != nil {
		m.Topics = *req.Topics
	}
	if reply, ok := s.call(w, r, id, m); ok {
		writeJSON(w, http.StatusOK, reply)
	}
}

// readJSON reads r's body into v, refusing unknown fields; an empty body is
// allowed when optional, and valid (nil: always) checks the required fields.
// On failure it writes the error, a 400 naming shape, and returns false.
func readJSON(w http.ResponseWriter, r *http.Request, v any, optional bool, shape string, valid func() bool) bool {
	body, aerr := readBody(w, r)
	if aerr != nil {
		aerr.write(w)
		return false
	}
	if optional && len(bytes.TrimSpace(body)) == 0 {
		return true
	}
	if err := strictJSON(body, v); err != nil || (valid != nil && !valid()) {
		badRequest("the body must be " + shape).write(w)
		return false
	}
	return true
}

type enqueueMessage struct {
	ID        *string         `json:"id"`
	Topic     *string         `json:"topic"`
	Payload   json.RawMessage `json:"payload"`
	DeliverAt *int64          `json:"deliverAt"`
	DelayMs   json.RawMessage `json:"delayMs"`
}

// maxDelayMs is the longest delay a message or a nack may ask for: the
// longest time.Duration, in whole milliseconds (about 292 years).
const maxDelayMs = math.MaxInt64 / int64(time.Millisecond)

// parseDelayMs reads a "delayMs" member (absent or null: zero, false). A value
// that is not a non-negative integer is a bad request; an integer past
// maxDelayMs, however many digits it has, is refused (422) with the maximum:
// taken as it was, it would overflow the duration and be delivered at once.
func parseDelayMs(raw json.RawMessage) (time.Duration, bool, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, false, nil
	}
	// Out of int64's range, ParseInt returns its bound with the sign of the digits.
	n, err := strconv.ParseInt(string(raw), 10, 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange):
		return 0, false, badRequest("delayMs must be an integer number of milliseconds")
	case n < 0:
		return 0, false, badRequest("delayMs cannot be negative")
	case err != nil || n > maxDelayMs:
		return 0, false, invalid(fmt.Sprintf("delayMs is over its maximum, %d (the longest duration, about 292 years)", maxDelayMs))
	}
	return time.Duration(n) * time.Millisecond, true, nil
}

func (s *Server) queueEnqueue(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	var req struct {
		Messages *[]enqueueMessage `json:"messages"`
	}
	if !readJSON(w, r, &req, false, `{"messages": [{"id"?, "topic"?, "payload", "deliverAt"? or "delayMs"?}]}`, func() bool { return req.Messages != nil }) {
		return
	}
	in := make([]actors.QueueMessageIn, len(*req.Messages))
	for i, m := range *req.Messages {
		delay, hasDelay, aerr := parseDelayMs(m.DelayMs)
		if aerr != nil {
			aerr.write(w)
			return
		}
		if m.DeliverAt != nil && hasDelay {
			badRequest("a message has deliverAt or delayMs, not both").write(w)
			return
		}
		if m.ID != nil {
			// The object checks the id (1 to 128 bytes, ...), as every name;
			// an empty one must not pass for an absent one.
			in[i].ID = *m.ID
			if *m.ID == "" {
				invalid("a message id must not be empty: leave it out for a generated one").write(w)
				return
			}
		}
		if m.Topic != nil {
			in[i].Topic = *m.Topic
			if *m.Topic == "" {
				invalid("a topic must not be empty: leave it out for the default one").write(w)
				return
			}
		}
		if len(m.Payload) == 0 {
			badRequest("every message needs a payload").write(w)
			return
		}
		in[i].Payload = m.Payload
		if m.DeliverAt != nil {
			in[i].DeliverAt = *m.DeliverAt
			if *m.DeliverAt < 0 {
				badRequest("deliverAt cannot be negative").write(w)
				return
			}
		}
		in[i].Delay = delay
	}
	if reply, ok := s.call(w, r, id, actors.QueueEnqueue{Messages: in}); ok {
		writeJSON(w, http.StatusOK, reply)
	}
}

// queueReceive serves POST .../receive. A long-poll (waitMs) asks again, more
// slowly each time, until something is due or the wait is over.
func (s *Server) queueReceive(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	var req struct {
		Target       *string `json:"target"`
		Topic        *string `json:"topic"`
		Max          *int    `json:"max"`
		VisibilityMs *int64  `json:"visibilityMs"`
		WaitMs       *int64  `json:"waitMs"`
	}
	if !readJSON(w, r, &req, true, `{"target"?, "topic"?, "max"?, "visibilityMs"?, "waitMs"?}`, nil) {
		return
	}
	m := actors.QueueReceive{}
	if req.Target != nil {
		m.Target = *req.Target
	}
	if req.Topic != nil {
		m.Topic = *req.Topic
	}
	if req.Max != nil {
		if *req.Max < 1 {
			badRequest("max must be at least 1").write(w)
			return
		}
		m.Max = *req.Max
	}
	if req.VisibilityMs != nil {
		if *req.VisibilityMs < 1 {
			badRequest("visibilityMs must be at least 1").write(w)
			return
		}
		m.Visibility = time.Duration(*req.VisibilityMs) * time.Millisecond
	}
	var wait time.Duration
	if req.WaitMs != nil {
		if *req.WaitMs < 0 || *req.WaitMs > maxWaitMs {
			badRequest("waitMs is 0 to 20000").write(w)
			return
		}
		wait = time.Duration(*req.WaitMs) * time.Millisecond
	}
	deadline := time.Now().Add(wait)
	pause := 10 * time.Millisecond
	for {
		reply, ok := s.call(w, r, id, m)
		if !ok {
			return
		}
		got, _ := reply.(*actors.QueueReceived)
		left := time.Until(deadline)
		if got == nil || len(got.Messages) > 0 || left <= 0 {
			writeJSON(w, http.StatusOK, reply)
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(min(pause, left)):
		}
		pause = min(2*pause, 250*time.Millisecond)
	}
}

func (s *Server) queueAck(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	var req struct {
		Receipts *[]string `json:"receipts"`
	}
	if !readJSON(w, r, &req, false, `{"receipts": ["...", ...]}`, func() bool { return req.Receipts != nil }) {
		return
	}
	if len(*req.Receipts) == 0 {
		invalid("no receipts to ack: a batch holds at least one").write(w)
		return
	}
	reply, ok := s.call(w, r, id, actors.QueueAck{Receipts: *req.Receipts})
	if !ok {
		return
	}
	acked := reply.(*actors.QueueAcked)
	if acked.NotHeld > 0 {
		// The others are acked all the same; the reply says how many.
		e := &apiError{status: http.StatusConflict, body: errBody(actors.ErrReceiptNotHeld.Msg, actors.ErrReceiptNotHeld.Code)}
		e.body["acked"], e.body["notHeld"] = acked.Acked, acked.NotHeld
		e.write(w)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"acked": acked.Acked})
}

func (s *Server) queueNack(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	var req struct {
		Receipt *string         `json:"receipt"`
		DelayMs json.RawMessage `json:"delayMs"`
		Error   *string         `json:"error"`
	}
	if !readJSON(w, r, &req, false, `{"receipt": "...", "delayMs"?, "error"?}`, func() bool { return req.Receipt != nil }) {
		return
	}
	m := actors.QueueNack{Receipt: *req.Receipt}
	delay, _, aerr := parseDelayMs(req.DelayMs)
	if aerr != nil {
		aerr.write(w)
		return
	}
	m.Delay = delay
	if req.Error != nil {
		m.Error = *req.Error
	}
	if reply, ok := s.call(w, r, id, m); ok {
		writeJSON(w, http.StatusOK, reply)
	}
}

func (s *Server) queueDead(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	var req struct {
		Receipt *string `json:"receipt"`
		Reason  *string `json:"reason"`
	}
	if !readJSON(w, r, &req, false, `{"receipt": "...", "reason"?}`, func() bool { return req.Receipt != nil }) {
		return
	}
	m := actors.QueueDead{Receipt: *req.Receipt}
	if req.Reason != nil {
		m.Reason = *req.Reason
	}
	if _, ok := s.call(w, r, id, m); ok {
		writeJSON(w, http.StatusOK, map[string]any{})
	}
}

func (s *Server) queueDeadLetters(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	q := r.URL.Query()
	limit, err := queryUint(q.Get("limit"), 100)
	if err != nil || limit < 1 {
		badRequest("limit must be a positive integer").write(w)
		return
	}
	m := actors.QueueDeadLettersGet{Target: q.Get("target"), Topic: q.Get("topic"), Limit: int(min(limit, 1000))}
	if reply, ok := s.call(w, r, id, m); ok {
		writeJSON(w, http.StatusOK, reply)
	}
}

func (s *Server) queueRedrive(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	var req struct {
		IDs *[]string `json:"ids"`
	}
	if !readJSON(w, r, &req, true, `empty or {"ids": ["...", ...]}`, nil) {
		return
	}
	m := actors.QueueRedrive{}
	if req.IDs != nil {
		if len(*req.IDs) == 0 {
			writeJSON(w, http.StatusOK, actors.QueueRedriven{})
			return
		}
		m.IDs = *req.IDs
	}
	if reply, ok := s.call(w, r, id, m); ok {
		writeJSON(w, http.StatusOK, reply)
	}
}
