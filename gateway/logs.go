package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/holdfast/holdfast/actors"
)

// The retained log's routes (spec/log.md, "HTTP").
const logBase = "/api/v1/logs/{app}/{type}/{key}"

func (s *Server) logRoutes() {
	s.handle("POST "+logBase+"/append", s.object(s.logAppend))
	s.handle("GET "+logBase+"/records", s.object(s.logRecords))
	s.handle("GET "+logBase+"/bounds", s.object(s.logSimple(actors.LogBoundsGet{})))
	s.handle("GET "+logBase+"/cursors", s.object(s.logSimple(actors.LogCursorsGet{})))
	s.handle("GET "+logBase+"/cursors/{consumer}", s.object(s.logCursor))
	s.handle("PUT "+logBase+"/cursors/{consumer}", s.object(s.logCommit))
	s.handle("GET "+logBase+"/load", s.object(s.logSimple(actors.LogLoadGet{})))
	s.handle("POST "+logBase+"/trim", s.object(s.logSimple(actors.LogTrim{})))
	s.handle("POST "+logBase+"/forget-cold", s.object(s.logForgetCold))
	s.handle("POST "+logBase+"/consumers/{consumer}/lease", s.object(s.logLease))
	s.handle("POST "+logBase+"/consumers/{consumer}/ack", s.object(s.logSettle(true)))
	s.handle("POST "+logBase+"/consumers/{consumer}/nack", s.object(s.logSettle(false)))
	s.handle("GET "+logBase+"/consumers/{consumer}/leases", s.object(func(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
		s.logSimple(actors.LogLeasesGet{Consumer: r.PathValue("consumer")})(w, r, id)
	}))
	s.handle("GET "+logBase+"/consumers/{consumer}/dead-letters", s.object(func(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
		s.logSimple(actors.LogDeadLettersGet{Consumer: r.PathValue("consumer")})(w, r, id)
	}))
}

// logLease serves POST .../consumers/{consumer}/lease {"limit": N} (optional):
// 200 with the lease, or 204 when nothing is available now.
func (s *Server) logLease(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	body, aerr := readBody(w, r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	var req struct {
		Limit *uint64 `json:"limit"`
	}
	if len(bytes.TrimSpace(body)) > 0 {
		if err := strictJSON(body, &req); err != nil || (req.Limit != nil && *req.Limit < 1) {
			badRequest(`the body must be empty or {"limit": N} with N at least 1`).write(w)
			return
		}
	}
	limit := 0
	if req.Limit != nil {
		limit = int(min(*req.Limit, 1<<30))
	}
	reply, ok := s.call(w, r, id, actors.LogLease{Consumer: r.PathValue("consumer"), Limit: limit})
	if !ok {
		return
	}
	lease, _ := reply.(*actors.Lease)
	if lease == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	page := &actors.RecordPage{Records: lease.Records}
	// The records are written by hand (bodies byte for byte), the rest by encoding/json.
	head, _ := json.Marshal(struct {
		BatchID     string `json:"batchId"`
		Consumer    string `json:"consumer"`
		FirstOffset uint64 `json:"firstOffset"`
		LastOffset  uint64 `json:"lastOffset"`
		Attempt     int    `json:"attempt"`
		ExpiresAt   int64  `json:"expiresAt"`
	}{lease.BatchID, lease.Consumer, lease.FirstOffset, lease.LastOffset, lease.Attempt, lease.ExpiresAt})
	b := append(head[:len(head)-1], `,"records":`...)
	b = appendRecords(b, page.Records)
	b = append(b, "}\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// logSettle serves ack and nack: {"batchId": "..."}.
func (s *Server) logSettle(ack bool) objectHandler {
	return func(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
		body, aerr := readBody(w, r)
		if aerr != nil {
			aerr.write(w)
			return
		}
		var req struct {
			BatchID *string `json:"batchId"`
		}
		if err := strictJSON(body, &req); err != nil || req.BatchID == nil {
			badRequest(`the body must be {"batchId": "..."}`).write(w)
			return
		}
		var msg any = actors.LogNack{Consumer: r.PathValue("consumer"), BatchID: *req.BatchID}
		if ack {
			msg = actors.LogAck{Consumer: r.PathValue("consumer"), BatchID: *req.BatchID}
		}
		if reply, ok := s.call(w, r, id, msg); ok {
			writeJSON(w, http.StatusOK, reply)
		}
	}
}

func (s *Server) logForgetCold(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	body, aerr := readBody(w, r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	var req struct {
		Before *uint64 `json:"before"`
	}
	if err := strictJSON(body, &req); err != nil || req.Before == nil {
		badRequest(`the body must be {"before": N} with N a non-negative integer`).write(w)
		return
	}
	if reply, ok := s.call(w, r, id, actors.LogForgetCold{Before: *req.Before}); ok {
		writeJSON(w, http.StatusOK, reply)
	}
}

// logSimple serves a route whose reply is msg's reply as JSON.
func (s *Server) logSimple(msg any) objectHandler {
	return func(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
		if reply, ok := s.call(w, r, id, msg); ok {
			writeJSON(w, http.StatusOK, reply)
		}
	}
}

type appendBody struct {
	Records *[]appendRecord `json:"records"`
}

type appendRecord struct {
	Body             json.RawMessage  `json:"body"`
	DeduplicationKey *json.RawMessage `json:"deduplicationKey"`
}

func (s *Server) logAppend(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	body, aerr := readBody(w, r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	var req appendBody
	if err := strictJSON(body, &req); err != nil || req.Records == nil {
		badRequest(`the body must be {"records": [{"body": ..., "deduplicationKey": "..."}]}`).write(w)
		return
	}
	in := make([]actors.LogInput, len(*req.Records))
	for i, rec := range *req.Records {
		if len(rec.Body) == 0 {
			badRequest("record " + strconv.Itoa(i) + " has no body").write(w)
			return
		}
		in[i].Body = rec.Body
		if rec.DeduplicationKey != nil && !bytes.Equal(*rec.DeduplicationKey, []byte("null")) {
			var k string
			if err := json.Unmarshal(*rec.DeduplicationKey, &k); err != nil {
				badRequest("record " + strconv.Itoa(i) + ": deduplicationKey must be a string").write(w)
				return
			}
			in[i].DeduplicationKey = &k
		}
	}
	if reply, ok := s.call(w, r, id, actors.LogAppend{Records: in, Validated: true}); ok {
		writeJSON(w, http.StatusOK, reply)
	}
}

// uintParam parses a non-negative integer query parameter; absent is def.
func uintParam(r *http.Request, name string, def uint64) (uint64, *apiError) {
	v := r.URL.Query().Get(name)
	if !r.URL.Query().Has(name) {
		return def, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, badRequest(name + " must be a non-negative integer")
	}
	return n, nil
}

func (s *Server) logRecords(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	from, aerr := uintParam(r, "from", 0)
	if aerr != nil {
		aerr.write(w)
		return
	}
	limit, aerr := uintParam(r, "limit", 0)
	if aerr != nil {
		aerr.write(w)
		return
	}
	if r.URL.Query().Has("limit") && limit < 1 {
		badRequest("limit must be at least 1").write(w)
		return
	}
	limit = min(limit, 1<<30) // capped at the type's maxBatchSize by the object
	if reply, ok := s.call(w, r, id, actors.LogRead{From: from, Limit: int(limit)}); ok {
		writePage(w, reply.(*actors.RecordPage))
	}
}

// writePage writes a page by hand: encoding/json would compact the bodies, which
// are returned byte for byte as they were appended.
func writePage(w http.ResponseWriter, p *actors.RecordPage) {
	n := 64
	for _, r := range p.Records {
		n += len(r.Body) + len(r.DeduplicationKey) + 96
	}
	b := make([]byte, 0, n)
	b = append(b, `{"records":`...)
	b = appendRecords(b, p.Records)
	b = append(b, `,"nextOffset":`...)
	b = strconv.AppendUint(b, p.NextOffset, 10)
	b = append(b, `,"lag":`...)
	b = strconv.AppendUint(b, p.Lag, 10)
	b = append(b, "}\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// appendRecords appends records as a JSON array, bodies byte for byte.
func appendRecords(b []byte, records []actors.LogRecord) []byte {
	b = append(b, '[')
	for i, r := range records {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"offset":`...)
		b = strconv.AppendUint(b, r.Offset, 10)
		b = append(b, `,"body":`...)
		b = append(b, r.Body...)
		b = append(b, `,"deduplicationKey":`...)
		b = appendString(b, r.DeduplicationKey)
		b = append(b, `,"appendedAt":`...)
		b = strconv.AppendInt(b, r.AppendedAt, 10)
		b = append(b, '}')
	}
	return append(b, ']')
}

func (s *Server) logCursor(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	if reply, ok := s.call(w, r, id, actors.LogCursorGet{Consumer: r.PathValue("consumer")}); ok {
		writeJSON(w, http.StatusOK, reply)
	}
}

func (s *Server) logCommit(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	body, aerr := readBody(w, r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	var req struct {
		Offset *uint64 `json:"offset"`
	}
	if err := strictJSON(body, &req); err != nil || req.Offset == nil {
		badRequest(`the body must be {"offset": N} with N a non-negative integer`).write(w)
		return
	}
	msg := actors.LogCommit{Consumer: r.PathValue("consumer"), Offset: *req.Offset}
	if reply, ok := s.call(w, r, id, msg); ok {
		writeJSON(w, http.StatusOK, reply)
	}
}
