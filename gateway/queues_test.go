package gateway

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
)

const queuePath = "/api/v1/queues/app_test/jobs/q1"

func queueServer(t *testing.T, opts actors.QueueOptions) *testServer {
	t.Helper()
	return newTestServer(t, cluster.Config{TypeOptions: func(typ string) actors.TypeOptions {
		o := actors.DefaultTypeOptions()
		o.Queue = opts
		return o
	}})
}

type received struct {
	Messages []struct {
		ID, Topic, Receipt string
		Payload            json.RawMessage
		Attempt            int
		EnqueuedAt         int64
	}
}

func (ts *testServer) receive(t *testing.T, body string) received {
	t.Helper()
	r := ts.do("POST", queuePath+"/receive", body, nil)
	if r.status != 200 {
		t.Fatalf("receive: %d %s", r.status, r.body)
	}
	var got received
	if err := json.Unmarshal(r.body, &got); err != nil {
		t.Fatal(err)
	}
	return got
}

func TestQueues_EnqueueReceiveAckOverHTTP(t *testing.T) {
	ts := queueServer(t, actors.QueueOptions{})
	r := ts.do("POST", queuePath+"/messages", `{"messages":[{"id":"a","payload":{"n":1}},{"id":"b","topic":"mail","payload":"x","delayMs":60000}]}`, nil)
	wantJSON(t, r, 200, `{"ids":["a","b"]}`)
	// A retry of the same batch deduplicates.
	wantJSON(t, ts.do("POST", queuePath+"/messages", `{"messages":[{"id":"a","payload":{"n":2}}]}`, nil), 200, `{"ids":["a"]}`)
	wantJSON(t, ts.do("GET", queuePath+"/stats", nil, nil), 200, `{"pending":1,"delayed":1,"processing":0,"complete":0,"failed":0}`)

	got := ts.receive(t, `{"max":10}`)
	if len(got.Messages) != 1 || got.Messages[0].ID != "a" || string(got.Messages[0].Payload) != `{"n":1}` || got.Messages[0].Attempt != 1 || got.Messages[0].Topic != "default" {
		t.Fatalf("received %+v", got)
	}
	receipt := got.Messages[0].Receipt
	wantJSON(t, ts.do("POST", queuePath+"/ack", `{"receipts":["`+receipt+`"]}`, nil), 200, `{"acked":1}`)
	// Settled already: 409, and the reply counts what was acked.
	wantError(t, ts.do("POST", queuePath+"/ack", `{"receipts":["`+receipt+`"]}`, nil), 409, "lease_not_held",
		map[string]any{"acked": json.Number("0"), "notHeld": json.Number("1")})
	wantError(t, ts.do("POST", queuePath+"/nack", `{"receipt":"`+receipt+`"}`, nil), 409, "lease_not_held", nil)
	wantError(t, ts.do("POST", queuePath+"/dead", `{"receipt":"`+receipt+`"}`, nil), 409, "lease_not_held", nil)

	r = ts.do("GET", queuePath+"/messages/a", nil, nil)
	var m actors.QueueMessage
	if r.status != 200 || json.Unmarshal(r.body, &m) != nil || m.Targets["default"].State != "complete" || string(m.Payload) != `{"n":1}` {
		t.Fatalf("message: %d %s", r.status, r.body)
	}
	wantError(t, ts.do("GET", queuePath+"/messages/zz", nil, nil), 404, "not_found", nil)
	wantUnauthorized(t, ts.do("GET", queuePath+"/stats", nil, map[string]string{}))
}

func TestQueues_NackDeadAndLongPoll(t *testing.T) {
	ts := queueServer(t, actors.QueueOptions{MaxAttempts: 2})
	ts.do("POST", queuePath+"/messages", `{"messages":[{"id":"a","payload":1},{"id":"b","payload":2}]}`, nil)
	got := ts.receive(t, `{"max":2,"visibilityMs":60000}`)
	if len(got.Messages) != 2 {
		t.Fatalf("received %+v", got)
	}
	wantJSON(t, ts.do("POST", queuePath+"/nack", `{"receipt":"`+got.Messages[0].Receipt+`","delayMs":300,"error":"busy"}`, nil), 200, `{"state":"pending"}`)
	wantJSON(t, ts.do("POST", queuePath+"/dead", `{"receipt":"`+got.Messages[1].Receipt+`","reason":"malformed"}`, nil), 200, `{}`)

	// Nothing is due now; a long-poll waits for the nacked message's delay.
	start := time.Now()
	again := ts.receive(t, `{"waitMs":5000}`)
	if len(again.Messages) != 1 || again.Messages[0].ID != "a" || again.Messages[0].Attempt != 2 {
		t.Fatalf("long-poll received %+v", again)
	}
	if waited := time.Since(start); waited > 4*time.Second {
		t.Fatalf("the long-poll took %v for a message due after 300 ms", waited)
	}
	// A long-poll with nothing coming answers empty once its wait is over.
	if empty := ts.receive(t, `{"waitMs":200}`); len(empty.Messages) != 0 {
		t.Fatalf("received %+v", empty)
	}
	wantJSON(t, ts.do("GET", queuePath+"/stats", nil, nil), 200, `{"pending":0,"delayed":0,"processing":1,"complete":0,"failed":1}`)
}

func TestQueues_Refusals(t *testing.T) {
	ts := queueServer(t, actors.QueueOptions{MaxPending: 1})
	for _, body := range []string{
		`{}`, `{"messages":[{"payload":1}],"extra":1}`, `{"messages":[{"id":"a"}]}`,
		`{"messages":[{"payload":{]}`, `{"messages":[{"payload":1,"delayMs":-1}]}`, `{"messages":[{"payload":1,"delayMs":1,"deliverAt":5}]}`,
	} {
		wantError(t, ts.do("POST", queuePath+"/messages", body, nil), 400, "bad_request", nil)
	}
	// Well-formed, refused (spec/errors.md).
	for _, body := range []string{`{"messages":[]}`, `{"messages":[{"id":"","payload":1}]}`, `{"messages":[{"topic":"","payload":1}]}`} {
		wantError(t, ts.do("POST", queuePath+"/messages", body, nil), 422, "invalid", nil)
	}
	for _, body := range []string{`{"max":0}`, `{"waitMs":20001}`, `{"visibilityMs":0}`, `{"max":"x"}`} {
		wantError(t, ts.do("POST", queuePath+"/receive", body, nil), 400, "bad_request", nil)
	}
	wantError(t, ts.do("POST", queuePath+"/receive", `{"target":"nope"}`, nil), 404, "not_found", nil)
	big := `{"messages":[{"id":"big","payload":"` + strings.Repeat("x", 1<<20) + `"}]}`
	wantError(t, ts.do("POST", queuePath+"/messages", big, nil), 413, "too_large", nil)
	wantError(t, ts.do("GET", queuePath+"/messages/big", nil, nil), 404, "not_found", nil) // nothing written
	wantJSON(t, ts.do("POST", queuePath+"/receive", ``, nil), 200, `{"messages":[]}`)      // every field is optional
	wantError(t, ts.do("POST", queuePath+"/dead-letters/redrive", `{"ids":"a"}`, nil), 400, "bad_request", nil)
	wantError(t, ts.do("POST", queuePath+"/dead", `{"receipt":"r","why":1}`, nil), 400, "bad_request", nil)
	wantError(t, ts.do("POST", queuePath+"/ack", `{"receipts":[]}`, nil), 422, "invalid", nil)
	wantError(t, ts.do("POST", queuePath+"/ack", `{"receipts":"r"}`, nil), 400, "bad_request", nil)
	wantError(t, ts.do("POST", queuePath+"/nack", `{}`, nil), 400, "bad_request", nil)
	ts.do("POST", queuePath+"/messages", `{"messages":[{"id":"a","payload":1}]}`, nil)
	r := ts.do("POST", queuePath+"/messages", `{"messages":[{"id":"b","payload":1}]}`, nil)
	if r.status != 429 {
		t.Fatalf("past maxPending: %d %s", r.status, r.body)
	}
	var body map[string]any
	if json.Unmarshal(r.body, &body) != nil || body["retryAfterMs"] == nil || r.header.Get("Retry-After") == "" {
		t.Fatalf("429 without retryAfterMs: %s", r.body)
	}
}

func TestQueues_ReplayRoutes(t *testing.T) {
	ts := queueServer(t, actors.QueueOptions{})
	ts.do("POST", queuePath+"/messages", `{"messages":[{"id":"a","topic":"orders","payload":1},{"id":"b","topic":"pay","payload":2}]}`, nil)
	got := ts.receive(t, `{"max":2}`)
	for _, m := range got.Messages {
		ts.do("POST", queuePath+"/nack", `{"receipt":"`+m.Receipt+`","delayMs":3600000}`, nil)
	}
	wantJSON(t, ts.do("POST", queuePath+"/replay", `{"topics":["orders"]}`, nil), 200, `{"recovered":1,"delayed":0,"errors":[]}`)
	wantJSON(t, ts.do("POST", queuePath+"/replay", ``, nil), 200, `{"recovered":2,"delayed":0,"errors":[]}`)
	wantError(t, ts.do("POST", queuePath+"/replay", `{"topics":"orders"}`, nil), 400, "bad_request", nil)

	var sum map[string]any
	waitFor(t, "the start replay", func() bool {
		r := ts.do("GET", "/api/v1/admin/replay", nil, nil)
		return r.status == 200 && json.Unmarshal(r.body, &sum) == nil
	})
	if sum["recovered"] != float64(0) || sum["delayed"] != float64(0) {
		t.Fatalf("the start replay of a new node: %v", sum)
	}
	wantUnauthorized(t, ts.do("GET", "/api/v1/admin/replay", nil, map[string]string{}))
}

func TestQueues_DeadLetterRoutes(t *testing.T) {
	ts := queueServer(t, actors.QueueOptions{MaxAttempts: 1})
	ts.do("POST", queuePath+"/messages", `{"messages":[{"id":"a","topic":"x","payload":{"k":1}},{"id":"b","payload":2}]}`, nil)
	for _, m := range ts.receive(t, `{"max":2}`).Messages {
		ts.do("POST", queuePath+"/nack", `{"receipt":"`+m.Receipt+`","error":"no"}`, nil)
	}
	r := ts.do("GET", queuePath+"/dead-letters?topic=x", nil, nil)
	var list struct{ DeadLetters []map[string]any }
	if r.status != 200 || json.Unmarshal(r.body, &list) != nil || len(list.DeadLetters) != 1 {
		t.Fatalf("dead letters: %d %s", r.status, r.body)
	}
	d := list.DeadLetters[0]
	if d["id"] != "a" || d["target"] != "default" || d["reason"] != "exhausted" || d["lastError"] != "no" || d["attempts"] != float64(1) ||
		d["payload"].(map[string]any)["k"] != float64(1) || d["failedAt"] == nil {
		t.Fatalf("dead letter %v", d)
	}
	wantError(t, ts.do("GET", queuePath+"/dead-letters?limit=0", nil, nil), 400, "bad_request", nil)
	wantJSON(t, ts.do("POST", queuePath+"/dead-letters/redrive", `{"ids":["a"]}`, nil), 200, `{"redriven":1}`)
	wantJSON(t, ts.do("POST", queuePath+"/dead-letters/redrive", `{"ids":[]}`, nil), 200, `{"redriven":0}`)
	if r := ts.do("DELETE", queuePath+"/dead-letters/b", nil, nil); r.status != 204 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	wantError(t, ts.do("DELETE", queuePath+"/dead-letters/b", nil, nil), 404, "not_found", nil)
	wantJSON(t, ts.do("POST", queuePath+"/dead-letters/redrive", ``, nil), 200, `{"redriven":0}`)
	wantJSON(t, ts.do("GET", queuePath+"/stats", nil, nil), 200, `{"pending":1,"delayed":0,"processing":0,"complete":0,"failed":0}`)
}
