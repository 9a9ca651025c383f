package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/holdfast/holdfast/actors"
)

// POST /api/v1/batch/{app} (spec/batch.md): up to MaxBatchOps operations on
// any objects of the app in one request.
//
// Each operation runs as its own route would, by the route's own code: the
// one-slot writes (set, increment, append, delete) through the function their
// route builds its write with (slotWrite, objects.go) and the route's
// writeKV; every other operation through the very handler of its route
// (objects.go, logs.go, queues.go), handed a request built from the
// operation: the route's body fields become its body, "slot" its path value,
// "idempotencyKey" its Idempotency-Key header, and log.read's fields its
// query. So validation, idempotency, durability and the reply's body are the
// route's own by construction, and a route's change reaches the batch without
// a second parser to keep in step. Each operation writes into a batchResult
// instead of the connection; the batch's reply lists them in order.
//
// Ordering: the operations of one object run one after the other, in the order
// they appear; different objects run concurrently. An object's leading
// one-slot writes are sent to its mailbox one after the other by the batch's
// handler itself, with no goroutine waiting for each (Node.RequestAsync, on the
// node that serves the object's partition: startBatchWrites); the rest of its
// operations, or all of them when this node does not serve the object
// (they are forwarded), run one after the other on
// one goroutine per object, from the server's pool of reused workers
// (owner.Pool), waited for by the batch's handler. A reply is only written once
// every operation has replied, and every write's reply comes after it is
// durable (the route's own gate), so the batch's reply does too.

// MaxBatchOps is the most operations one batch may carry.
const MaxBatchOps = 1000

// batchOp is how one operation name maps onto its route.
type batchOp struct {
	method string
	// slot: the route names a slot, which the operation must give (the slot
	// is then not a body field).
	slot bool
	// body: how the rest of the operation's fields make the route's body.
	body batchBody
	// idempotent: the route takes an Idempotency-Key header.
	idempotent bool
	// handler is the route's handler, given a request built from the
	// operation; write, for the one-slot writes, is what the route builds its
	// write with (objects.go), run here without building a request: the hot
	// operations skip the request, the body's second parse and the recorder
	// (about 4 µs of a batched increment's 33).
	handler func(s *Server) objectHandler
	write   *slotWrite
}

type batchBody int

const (
	bodyNone   batchBody = iota // no body: any other field is refused
	bodyFields                  // the other fields, in order, are the body object
	bodyOps                     // the "ops" field's value is the body (transaction)
	bodyQuery                   // the other fields are query parameters (log.read)
)

// batchOps maps each operation of spec/batch.md to its route. "get" without a
// slot reads the whole state (GET on the object); "delete" needs a slot: a
// batch never purges a whole object (docs/batch.md).
var batchOps = map[string]batchOp{
	"get":           {method: http.MethodGet, handler: func(s *Server) objectHandler { return s.getState }},
	"set":           {method: http.MethodPut, slot: true, body: bodyFields, idempotent: true, write: &setWrite},
	"delete":        {method: http.MethodDelete, slot: true, idempotent: true, write: &deleteWrite},
	"increment":     {method: http.MethodPost, slot: true, body: bodyFields, idempotent: true, write: &incrementWrite},
	"append":        {method: http.MethodPost, slot: true, body: bodyFields, idempotent: true, write: &appendWrite},
	"patch":         {method: http.MethodPatch, body: bodyFields, idempotent: true, handler: func(s *Server) objectHandler { return s.patch }},
	"transaction":   {method: http.MethodPost, body: bodyOps, idempotent: true, handler: func(s *Server) objectHandler { return s.transaction }},
	"log.append":    {method: http.MethodPost, body: bodyFields, handler: func(s *Server) objectHandler { return s.logAppend }},
	"log.read":      {method: http.MethodGet, body: bodyQuery, handler: func(s *Server) objectHandler { return s.logRecords }},
	"queue.enqueue": {method: http.MethodPost, body: bodyFields, handler: func(s *Server) objectHandler { return s.queueEnqueue }},
}

func (s *Server) batchRoutes() {
	s.handle("POST /api/v1/batch/{app}", s.batch)
}

// plannedOp is one operation, parsed: the object it runs on and the request
// its route's handler is given (nil with fail set when the operation's own
// fields are refused: that result stands alone, like any other).
type plannedOp struct {
	id      actors.ObjectID
	handler objectHandler
	write   *slotWrite                 // with fields, instead of handler
	fields  map[string]json.RawMessage // write's body fields
	method  string
	body    []byte
	query   string
	slot    string
	idemKey *string
	fail    *apiError
}

// batchResult is one operation's reply: the status and body its route gave.
type batchResult struct {
	reqID  string
	header http.Header // made on first use (most results never need one)
	status int
	body   bytes.Buffer
	wrote  bool
	// waiting: started with RequestAsync and not answered yet (batchWaits,
	// under its lock).
	waiting bool
}

var _ http.ResponseWriter = (*batchResult)(nil)

func (b *batchResult) Header() http.Header {
	if b.header == nil {
		// An error's body repeats the request's id from here (apiError.write).
		b.header = http.Header{"X-Request-Id": {b.reqID}}
	}
	return b.header
}

// writeResult is writeResult (objects.go) for a batch: the body only, since
// the batch's reply carries no operation's headers.
func (b *batchResult) writeResult(res *actors.WriteResult) {
	b.WriteHeader(http.StatusOK)
	b.body.Grow(32 + len(res.Value))
	b.body.Write(appendWriteResult(b.body.AvailableBuffer(), res))
}

func (b *batchResult) WriteHeader(code int) {
	if !b.wrote {
		b.status, b.wrote = code, true
	}
}

func (b *batchResult) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	return b.body.Write(p)
}

func (s *Server) batch(w http.ResponseWriter, r *http.Request) {
	app := s.authApp(w, r)
	if app == nil {
		return
	}
	body, aerr := readBody(w, r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	ops, aerr := planBatch(s, app.ID, body)
	if aerr != nil {
		aerr.write(w)
		return
	}
	results := make([]batchResult, len(ops))
	reqID := requestID(r)
	for i := range results {
		results[i].reqID = reqID
	}
	// One goroutine per object, running its operations in their order.
	byObject := map[actors.ObjectID][]int{}
	var order []actors.ObjectID
	for i, op := range ops {
		if op.fail != nil {
			op.fail.write(&results[i])
			continue
		}
		if _, ok := byObject[op.id]; !ok {
			order = append(order, op.id)
		}
		byObject[op.id] = append(byObject[op.id], i)
	}
	var wg sync.WaitGroup
	async, _ := s.cfg.Node.(asyncNode)
	waits := &batchWaits{left: 1, all: make(chan struct{})}
	for _, id := range order {
		idx := byObject[id]
		if async != nil {
			idx = s.startBatchWrites(async, r, ops, results, idx, waits)
			if len(idx) == 0 {
				continue
			}
		}
		wg.Add(1)
		run := func() {
			defer wg.Done()
			for _, i := range idx {
				s.runBatchOp(r, &ops[i], &results[i])
			}
		}
		if !s.workers.Go(run) {
			go run() // the server is closing: still waited for below
		}
	}
	wg.Wait()
	waits.wait(s, r, results)
	writeBatchReply(w, results)
}

// asyncNode is a Node that can start a request without a goroutine waiting
// for it (cluster.Node.RequestAsync); it reports false when it cannot.
type asyncNode interface {
	RequestAsync(ctx context.Context, id actors.ObjectID, msg any, done func(any, error)) bool
}

// startBatchWrites starts the leading one-slot writes of an object's
// operations idx (in order, each sent to the object's mailbox before the next,
// so they run in their order) without a goroutine each, and returns the
// operations left to run on a worker: from the first that is not such a
// write, or that the node could not start that way. Measured: a batch of 100
// increments on 100 objects held 100 workers, each with its own timeout
// context and woken by its reply.
func (s *Server) startBatchWrites(node asyncNode, r *http.Request, ops []plannedOp, results []batchResult, idx []int, waits *batchWaits) []int {
	for k, i := range idx {
		op, res := &ops[i], &results[i]
		if op.write == nil {
			return idx[k:]
		}
		m, e := op.write.build(op.slot, op.fields)
		if e == nil {
			e = withIdempotencyKey(m, op.idemKey)
		}
		if e != nil {
			e.write(res)
			continue
		}
		waits.add(res)
		started := node.RequestAsync(r.Context(), op.id, m, func(v any, err error) {
			waits.done(res, func() {
				if err != nil {
					s.fail(res, r, err)
					return
				}
				res.writeResult(v.(*actors.WriteResult))
			})
		})
		if !started {
			waits.forget(res)
			return idx[k:]
		}
	}
	return nil
}

// batchWaits collects the replies of a batch's writes started with
// RequestAsync. Its counter starts at one, held by the batch's handler until
// it has started them all (wait).
type batchWaits struct {
	mu       sync.Mutex
	left     int           // results waiting, and one while the handler starts them
	all      chan struct{} // closed when left reaches zero
	timedOut bool          // set by wait: replies after it are dropped
}

func (b *batchWaits) add(res *batchResult) {
	b.mu.Lock()
	defer b.mu.Unlock()
	res.waiting = true
	b.left++
}

// forget undoes add for a request that was not started.
func (b *batchWaits) forget(res *batchResult) {
	b.mu.Lock()
	defer b.mu.Unlock()
	res.waiting = false
	b.left--
}

// done writes res with write, unless the batch stopped waiting for it.
func (b *batchWaits) done(res *batchResult, write func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.timedOut {
		return
	}
	write()
	res.waiting = false
	b.release()
}

func (b *batchWaits) release() {
	if b.left--; b.left == 0 {
		close(b.all)
	}
}

// wait waits for every reply, at most the request timeout (as each
// operation's own request would) or until the client is gone; an operation
// still without a reply then gets the timeout's error, and its reply, when it
// comes, is dropped.
func (b *batchWaits) wait(s *Server, r *http.Request, results []batchResult) {
	b.mu.Lock()
	b.release()
	left := b.left
	b.mu.Unlock()
	if left == 0 {
		return
	}
	t := time.NewTimer(s.cfg.RequestTimeout)
	defer t.Stop()
	select {
	case <-b.all:
		return
	case <-t.C:
	case <-r.Context().Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.timedOut = true
	why := context.DeadlineExceeded
	if r.Context().Err() != nil {
		why = r.Context().Err()
	}
	for i := range results {
		if results[i].waiting {
			toAPIError(actors.TimedOut(why), results[i].reqID).write(&results[i])
		}
	}
	// One log line for the batch, not one per operation (s.fail's): a batch
	// carries up to MaxBatchOps of them.
	s.log.Error("batch operations got no reply in time", "request_id", results[0].reqID, "operations", b.left, "timeout", s.cfg.RequestTimeout, "client_gone", r.Context().Err() != nil)
}

// runBatchOp runs one operation through its route's handler, or its route's
// write.
func (s *Server) runBatchOp(outer *http.Request, op *plannedOp, res *batchResult) {
	if op.write != nil {
		if m, e := op.write.build(op.slot, op.fields); e != nil {
			e.write(res)
		} else {
			s.writeKV(res, outer, op.id, m, op.idemKey, false)
		}
		return
	}
	req, err := http.NewRequestWithContext(outer.Context(), op.method, "/", bytes.NewReader(op.body))
	if err != nil { // a method or URL we built: cannot fail
		internalError(requestID(outer)).write(res)
		return
	}
	req.URL.RawQuery = op.query
	if op.slot != "" {
		req.SetPathValue("slot", op.slot)
	}
	if op.idemKey != nil {
		req.Header["Idempotency-Key"] = []string{*op.idemKey}
	}
	op.handler(res, req, op.id)
	if !res.wrote {
		res.WriteHeader(http.StatusOK)
	}
}

// writeBatchReply writes {"results": [{"status": N, "body": ...}, ...]}; a
// result without a body (204) has none.
func writeBatchReply(w http.ResponseWriter, results []batchResult) {
	n := 16
	for i := range results {
		n += results[i].body.Len() + 32
	}
	b := make([]byte, 0, n)
	b = append(b, `{"results":[`...)
	for i := range results {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"status":`...)
		b = strconv.AppendInt(b, int64(results[i].status), 10)
		if body := bytes.TrimSpace(results[i].body.Bytes()); len(body) > 0 {
			b = append(b, `,"body":`...)
			b = append(b, body...)
		}
		b = append(b, '}')
	}
	b = append(b, "]}\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// planBatch parses a batch's body. A body that is not {"ops": [...]}, an
// operation that is not an object or lacks a string "object" (type/key) or
// "op", an unknown op, or more than MaxBatchOps operations refuse the whole
// batch (400). Anything else wrong with one operation is that operation's
// result.
func planBatch(s *Server, app string, body []byte) ([]plannedOp, *apiError) {
	shape := badRequest(`the body must be {"ops": [{"object": "type/key", "op": "...", ...}, ...]}`)
	if !json.Valid(body) {
		return nil, shape
	}
	top, err := objectMembers(body)
	if err != nil || len(top) != 1 || top[0].name != "ops" {
		return nil, shape
	}
	raw, err := arrayElements(top[0].value)
	if err != nil {
		return nil, shape
	}
	if len(raw) > MaxBatchOps {
		return nil, badRequest(fmt.Sprintf("a batch carries at most %d operations; this one has %d", MaxBatchOps, len(raw)))
	}
	ops := make([]plannedOp, len(raw))
	for i, el := range raw {
		if e := planOp(s, app, i, el, &ops[i]); e != nil {
			return nil, e
		}
	}
	return ops, nil
}

// planOp parses operation i into op. Its error refuses the whole batch; what
// refuses only this operation is op.fail.
func planOp(s *Server, app string, i int, el json.RawMessage, op *plannedOp) *apiError {
	fields, err := objectMembers(el)
	if err != nil {
		return badRequest(fmt.Sprintf("operation %d: not a JSON object", i))
	}
	var object, name string
	var rest []member
	var idem *string
	var slotRaw json.RawMessage
	for _, f := range fields {
		switch f.name {
		case "object":
			if object, err = decodeJSONString(f.value); err != nil {
				return badRequest(fmt.Sprintf(`operation %d: "object" must be a string "type/key"`, i))
			}
		case "op":
			if name, err = decodeJSONString(f.value); err != nil {
				return badRequest(fmt.Sprintf(`operation %d: "op" must be a string`, i))
			}
		case "idempotencyKey":
			k, err := decodeJSONString(f.value)
			if err != nil {
				op.fail = badRequest("idempotencyKey must be a string")
			}
			idem = &k
		case "slot":
			slotRaw = f.value
			rest = append(rest, f) // a body field of the routes without a slot (patch)
		default:
			rest = append(rest, f)
		}
	}
	typ, key, ok := strings.Cut(object, "/")
	if object == "" || !ok {
		return badRequest(fmt.Sprintf(`operation %d: needs "object": "type/key"`, i))
	}
	route, known := batchOps[name]
	if !known {
		if name == "" {
			return badRequest(fmt.Sprintf(`operation %d: needs "op"`, i))
		}
		return badRequest(fmt.Sprintf("operation %d: unknown op %q (one of get, set, delete, increment, append, patch, transaction, log.append, log.read, queue.enqueue)", i, name))
	}
	op.id = actors.ObjectID{App: app, Type: typ, Key: key}
	if route.handler != nil {
		op.handler = route.handler(s)
	}
	op.write = route.write
	op.method = route.method
	if op.fail != nil {
		return nil
	}
	if name == "get" && slotRaw != nil {
		op.handler = s.getSlot
		route.slot = true
	}
	if route.slot {
		if slotRaw == nil {
			op.fail = badRequest(fmt.Sprintf("op %s needs a slot", name))
			return nil
		}
		slot, err := decodeJSONString(slotRaw)
		switch {
		case err != nil:
			op.fail = badRequest("slot must be a string")
			return nil
		case slot == "":
			op.fail = badRequest("slot must not be empty")
			return nil
		}
		op.slot = slot
		rest = withoutMember(rest, "slot")
	}
	if idem != nil {
		if !route.idempotent {
			op.fail = badRequest(fmt.Sprintf("op %s takes no idempotencyKey", name))
			return nil
		}
		op.idemKey = idem
	}
	switch route.body {
	case bodyNone:
		if len(rest) > 0 {
			op.fail = badRequest(fmt.Sprintf("op %s takes no field %q", name, rest[0].name))
		}
	case bodyFields:
		if op.write != nil {
			op.fields = make(map[string]json.RawMessage, len(rest))
			for _, m := range rest { // a member repeated: the last, as encoding/json
				op.fields[m.name] = m.value
			}
			return nil
		}
		op.body = joinMembers(rest)
	case bodyOps:
		if len(rest) != 1 || rest[0].name != "ops" {
			op.fail = badRequest(`op transaction takes "ops": [...] and no other field`)
			return nil
		}
		op.body = rest[0].value
	case bodyQuery:
		q, aerr := queryOf(name, rest)
		if aerr != nil {
			op.fail = aerr
			return nil
		}
		op.query = q
	}
	return nil
}

// queryOf turns log.read's fields (from, limit: non-negative integers) into
// its route's query.
func queryOf(name string, fields []member) (string, *apiError) {
	var q []string
	for _, f := range fields {
		switch f.name {
		case "from", "limit":
		default:
			return "", badRequest(fmt.Sprintf("op %s takes no field %q", name, f.name))
		}
		var n json.Number
		d := json.NewDecoder(bytes.NewReader(f.value))
		d.UseNumber()
		if d.Decode(&n) != nil || strings.ContainsAny(n.String(), ".eE-") {
			return "", badRequest(f.name + " must be a non-negative integer")
		}
		q = append(q, f.name+"="+n.String())
	}
	return strings.Join(q, "&"), nil
}

func withoutMember(ms []member, name string) []member {
	out := ms[:0:0]
	for _, m := range ms {
		if m.name != name {
			out = append(out, m)
		}
	}
	return out
}

// joinMembers writes members back as a JSON object, in their order.
func joinMembers(ms []member) []byte {
	n := 2
	for _, m := range ms {
		n += len(m.name) + len(m.value) + 8
	}
	b := make([]byte, 0, n)
	b = append(b, '{')
	for i, m := range ms {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, m.name)
		b = append(b, ':')
		b = append(b, m.value...)
	}
	return append(b, '}')
}
