package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"

	"github.com/holdfast/holdfast/actors"
)

const objectBase = "/api/v1/objects/{app}/{type}/{key}"

func (s *Server) objectRoutes() {
	for _, base := range []string{objectBase, objectBase + "/{$}"} {
		s.handle("GET "+base, s.object(s.getState))
		s.handle("PATCH "+base, s.object(s.patch))
		s.handle("DELETE "+base, s.object(s.purge))
	}
	s.handle("GET "+objectBase+"/log", s.object(s.readLog))
	s.handle("POST "+objectBase+"/transaction", s.object(s.transaction))
	s.handle("GET "+objectBase+"/{slot}", s.object(s.getSlot))
	s.handle("PUT "+objectBase+"/{slot}", s.object(s.slotWriteRoute(setWrite)))
	s.handle("DELETE "+objectBase+"/{slot}", s.object(s.deleteSlot))
	s.handle("POST "+objectBase+"/{slot}/increment", s.object(s.slotWriteRoute(incrementWrite)))
	s.handle("POST "+objectBase+"/{slot}/append", s.object(s.slotWriteRoute(appendWrite)))
	s.handle("POST "+objectBase+"/events", s.object(s.publish))
}

// publish serves POST .../events {"event": "run:...", "payload": {...}}: an
// ephemeral event relayed to the object's subscribers, not stored. Reply 202
// {"subscribers": N}, the subscribers it was sent to.
func (s *Server) publish(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	body, aerr := readBody(w, r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	var req struct {
		Event   *string         `json:"event"`
		Payload json.RawMessage `json:"payload"`
	}
	if err := strictJSON(body, &req); err != nil || req.Event == nil {
		badRequest(`the body must be {"event": "run:...", "payload": {...}}`).write(w)
		return
	}
	if reply, ok := s.call(w, r, id, actors.Publish{Name: *req.Event, Payload: req.Payload}); ok {
		writeJSON(w, http.StatusAccepted, reply)
	}
}

type objectHandler func(w http.ResponseWriter, r *http.Request, id actors.ObjectID)

// object authenticates and names the object before h runs.
func (s *Server) object(h objectHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		app := s.authApp(w, r)
		if app == nil {
			return
		}
		// The object's name is checked where every caller's is: in the actor host.
		h(w, r, actors.ObjectID{App: app.ID, Type: r.PathValue("type"), Key: r.PathValue("key")})
	}
}

func (s *Server) getState(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	if reply, ok := s.call(w, r, id, actors.KVGet{}); ok {
		st := reply.(*actors.KVState)
		writeJSON(w, http.StatusOK, st)
	}
}

func (s *Server) getSlot(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	if reply, ok := s.call(w, r, id, actors.KVGetSlot{Slot: r.PathValue("slot")}); ok {
		writeJSON(w, http.StatusOK, map[string]json.RawMessage{"value": reply.(json.RawMessage)})
	}
}

func (s *Server) readLog(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	q := r.URL.Query()
	after, err := queryUint(q.Get("after"), 0)
	if err != nil {
		badRequest("after must be a non-negative integer").write(w)
		return
	}
	limit, err := queryUint(q.Get("limit"), actors.DefaultLogLimit)
	if err != nil || limit < 1 {
		badRequest("limit must be a positive integer").write(w)
		return
	}
	if limit > actors.MaxLogLimit {
		limit = actors.MaxLogLimit
	}
	if reply, ok := s.call(w, r, id, actors.KVReadLog{After: after, Limit: int(limit)}); ok {
		writeJSON(w, http.StatusOK, reply.(*actors.LogPage))
	}
}

// queryUint parses a non-negative integer; one too large for uint64 is taken as
// the largest uint64 (after: nothing that far; limit: capped anyway).
func queryUint(s string, def uint64) (uint64, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		return math.MaxUint64, nil
	}
	return n, err
}

// write runs a KV write built from the request and writes its reply.
func (s *Server) write(w http.ResponseWriter, r *http.Request, id actors.ObjectID, m *actors.KVWrite, noContent bool) {
	var key *string
	if vals, present := r.Header["Idempotency-Key"]; present {
		key = &vals[0]
	}
	s.writeKV(w, r, id, m, key, noContent)
}

// writeKV runs m with the idempotency key (nil: none) and writes its reply;
// r is the request it serves (its context, its id in errors).
func (s *Server) writeKV(w http.ResponseWriter, r *http.Request, id actors.ObjectID, m *actors.KVWrite, key *string, noContent bool) {
	if e := withIdempotencyKey(m, key); e != nil {
		e.write(w)
		return
	}
	reply, ok := s.call(w, r, id, m)
	if !ok {
		return
	}
	if noContent {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	writeResult(w, reply.(*actors.WriteResult))
}

// withIdempotencyKey sets key (nil: none) on m, or refuses it.
func withIdempotencyKey(m *actors.KVWrite, key *string) *apiError {
	if key != nil {
		k := *key
		if k == "" || len(k) > actors.MaxIdempotencyKey {
			return badRequest(fmt.Sprintf("Idempotency-Key must be 1 to %d bytes", actors.MaxIdempotencyKey))
		}
		m.IdempotencyKey = k
	}
	return nil
}

// writeResult writes a write's reply, {"log_id": N} and the incremented
// value, by hand: encoding/json's reflection took 1.1 µs of each (bench/
// holdfast-http/batch-increments-16x100). The value is the object's own JSON.
func writeResult(w http.ResponseWriter, res *actors.WriteResult) {
	b := append(appendWriteResult(make([]byte, 0, 32+len(res.Value)), res), '\n')
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// appendWriteResult appends a write's reply body to b.
func appendWriteResult(b []byte, res *actors.WriteResult) []byte {
	b = append(b, `{"log_id":`...)
	b = strconv.AppendUint(b, res.LogID, 10)
	if len(res.Value) > 0 {
		b = append(b, `,"value":`...)
		b = append(b, res.Value...)
	}
	return append(b, '}')
}

// decodeFields reads a JSON object body into its top-level members. An empty
// body is an empty object when emptyOK.
func decodeFields(w http.ResponseWriter, r *http.Request, emptyOK bool) (map[string]json.RawMessage, *apiError) {
	body, e := readBody(w, r)
	if e != nil {
		return nil, e
	}
	return parseFields(body, emptyOK)
}

// parseFields reads a JSON object body (checked as text already) into its
// top-level members. An empty body is an empty object when emptyOK.
func parseFields(body []byte, emptyOK bool) (map[string]json.RawMessage, *apiError) {
	if emptyOK && len(bytes.TrimSpace(body)) == 0 {
		return map[string]json.RawMessage{}, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return nil, badRequest("the body must be a JSON object")
	}
	return fields, nil
}

// slotWrite is a write route on one slot: how its body's fields make the
// write (the route's validation), shared by the route and the batch's
// operation of the same name (batch.go).
type slotWrite struct {
	emptyOK bool // an empty body is {}
	build   func(slot string, fields map[string]json.RawMessage) (*actors.KVWrite, *apiError)
}

var (
	setWrite       = slotWrite{build: valueBuild(actors.RoutePut, "set")}
	appendWrite    = slotWrite{build: valueBuild(actors.RouteAppend, "append")}
	incrementWrite = slotWrite{emptyOK: true, build: func(slot string, fields map[string]json.RawMessage) (*actors.KVWrite, *apiError) {
		by, ok := fields["by"]
		if ok && !isJSONNumber(by) {
			return nil, badRequest(`"by" must be a number`)
		}
		return &actors.KVWrite{Route: actors.RouteIncrement, Ops: []actors.Op{{Op: "increment", Key: slot, By: by}}}, nil
	}}
	// deleteWrite has no body (the route reads none).
	deleteWrite = slotWrite{build: func(slot string, _ map[string]json.RawMessage) (*actors.KVWrite, *apiError) {
		return &actors.KVWrite{Route: actors.RouteDelete, Ops: []actors.Op{{Op: "delete", Key: slot}}}, nil
	}}
)

// valueBuild builds a one-slot op whose body is {"value": ...}.
func valueBuild(route, op string) func(string, map[string]json.RawMessage) (*actors.KVWrite, *apiError) {
	return func(slot string, fields map[string]json.RawMessage) (*actors.KVWrite, *apiError) {
		v, ok := fields["value"]
		if !ok {
			return nil, badRequest(`the body needs a "value"`)
		}
		return &actors.KVWrite{Route: route, Ops: []actors.Op{{Op: op, Key: slot, Value: v}}}, nil
	}
}

// slotWriteRoute serves a slotWrite's route.
func (s *Server) slotWriteRoute(sw slotWrite) objectHandler {
	return func(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
		fields, e := decodeFields(w, r, sw.emptyOK)
		if e != nil {
			e.write(w)
			return
		}
		m, e := sw.build(r.PathValue("slot"), fields)
		if e != nil {
			e.write(w)
			return
		}
		s.write(w, r, id, m, false)
	}
}

// isJSONNumber reports whether raw, a valid JSON value (a member that
// encoding/json decoded), is a number: a valid value that starts with a digit
// or '-' is one. (A json.Decoder here cost about 2 µs per increment.)
func isJSONNumber(raw json.RawMessage) bool {
	return len(raw) > 0 && (raw[0] == '-' || '0' <= raw[0] && raw[0] <= '9')
}

func (s *Server) deleteSlot(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	m, _ := deleteWrite.build(r.PathValue("slot"), nil)
	s.write(w, r, id, m, false)
}

func (s *Server) purge(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	s.write(w, r, id, &actors.KVWrite{Route: actors.RoutePurge, Purge: true}, true)
}

func (s *Server) patch(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	s.opsWrite(w, r, id, ParsePatch, &actors.KVWrite{Route: actors.RoutePatch})
}

func (s *Server) transaction(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	s.opsWrite(w, r, id, ParseTransaction, &actors.KVWrite{Route: actors.RouteTransaction, Transaction: true})
}

// opsWrite runs a write whose ops come from the whole body, parsed by parse.
func (s *Server) opsWrite(w http.ResponseWriter, r *http.Request, id actors.ObjectID, parse func([]byte) ([]actors.Op, error), m *actors.KVWrite) {
	body, e := readBody(w, r)
	if e != nil {
		e.write(w)
		return
	}
	ops, err := parse(body)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	m.Ops = ops
	s.write(w, r, id, m, false)
}
